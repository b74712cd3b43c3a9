//! The cache directory: where it is, whether it may be trusted, the process's private work
//! folder inside it, and the removal of work folders that dead processes left behind.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Work folders (`tmp-<pid>-<n>`) whose process is gone, or older than this, are removed.
pub const STALE_AFTER: Duration = Duration::from_secs(3600);

/// Prefix of the per-process work folders in a cache directory.
const WORK_PREFIX: &str = "tmp-";
/// Prefix of the private directories used when no cache directory can be trusted.
const PRIVATE_PREFIX: &str = "tilec-private-";

/// `$TILEC_CACHE_DIR`, else `$XDG_CACHE_HOME/tilec`, else `$HOME/.cache/tilec`, else
/// `tilec-<uid>` in the system's temporary directory. Only a path: [`super::Cache::open`]
/// creates it and decides whether to trust it.
pub fn default_dir() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = var("TILEC_CACHE_DIR") {
        return d;
    }
    if let Some(d) = var("XDG_CACHE_HOME") {
        return d.join("tilec");
    }
    if let Some(d) = var("HOME") {
        return d.join(".cache").join("tilec");
    }
    std::env::temp_dir().join(format!("tilec-{}", euid()))
}

/// The effective user id: the owner a cache directory must have.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Why a directory is not used as the cache.
#[derive(Debug)]
pub enum Refusal {
    Create(io::Error),
    NotADirectory,
    Owner(u32),
    Writable(u32),
    Work(io::Error),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Create(e) => write!(f, "cannot be created ({e})"),
            Refusal::NotADirectory => write!(f, "is not a directory"),
            Refusal::Owner(o) => write!(f, "is owned by uid {o}, not by uid {}", euid()),
            Refusal::Writable(m) => write!(f, "is writable by group or others (mode {m:o})"),
            Refusal::Work(e) => write!(f, "is not writable ({e})"),
        }
    }
}

/// Creates `dir` (mode 0700, parents too) if needed and checks that only the current user can
/// change it: the directory (and a symbolic link naming it) belongs to the effective user and is
/// not writable by group or others.
pub fn check(dir: &Path) -> Result<(), Refusal> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(Refusal::Create)?;
    let link = std::fs::symlink_metadata(dir).map_err(Refusal::Create)?;
    if link.file_type().is_symlink() && link.uid() != euid() && link.uid() != 0 {
        return Err(Refusal::Owner(link.uid()));
    }
    let m = std::fs::metadata(dir).map_err(Refusal::Create)?;
    if !m.is_dir() {
        return Err(Refusal::NotADirectory);
    }
    if m.uid() != euid() {
        return Err(Refusal::Owner(m.uid()));
    }
    if m.mode() & 0o022 != 0 {
        return Err(Refusal::Writable(m.mode() & 0o7777));
    }
    Ok(())
}

/// A directory only this process writes to, locked while it lives and removed when dropped:
/// the work folder in a cache directory, or a private cache directory of its own.
#[derive(Debug)]
pub struct Owned {
    path: PathBuf,
    /// Holds an exclusive `flock` on the directory: others see it is in use.
    _lock: File,
}

impl Owned {
    /// Creates `<parent>/<prefix><pid>-<n>` with mode 0700 (a name no one else has taken).
    pub fn create(parent: &Path, prefix: &str) -> io::Result<Owned> {
        let pid = std::process::id();
        for _ in 0..64 {
            let path = parent.join(format!("{prefix}{pid}-{:x}", unique()));
            match DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
            let lock = match open_dir(&path).and_then(|f| lock(&f, true).map(|_| f)) {
                Ok(f) => f,
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&path);
                    return Err(e);
                }
            };
            return Ok(Owned { path, _lock: lock });
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "no free name for a work folder",
        ))
    }

    /// A private directory under the system's temporary directory, for when the cache
    /// directory cannot be used.
    pub fn private() -> io::Result<Owned> {
        let tmp = std::env::temp_dir();
        sweep(&tmp, PRIVATE_PREFIX, true);
        Owned::create(&tmp, PRIVATE_PREFIX)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Creates this process's work folder in the checked directory `dir`, first removing stale
/// ones (once per directory and process).
pub fn work_folder(dir: &Path) -> io::Result<Owned> {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static SWEPT: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
    let first = SWEPT
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(dir.to_path_buf());
    if first {
        sweep(dir, WORK_PREFIX, false);
    }
    Owned::create(dir, WORK_PREFIX)
}

/// Removes the folders and files named `<prefix><pid>-...` in `dir` that no live process
/// holds: their lock is free, and their process is gone or they are older than
/// [`STALE_AFTER`]. Entries of other users are left alone when `own_only`. Errors are ignored:
/// a folder that cannot be removed now is tried again next time.
pub fn sweep(dir: &Path, prefix: &str, own_only: bool) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let me = std::process::id();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
            continue;
        };
        let pid = rest
            .split(['-', '.'])
            .next()
            .and_then(|p| p.parse::<u32>().ok());
        if pid == Some(me) {
            continue;
        }
        let path = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if own_only && meta.uid() != euid() {
            continue;
        }
        let old = meta
            .modified()
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age > STALE_AFTER);
        if !(old || pid.is_some_and(|p| !alive(p))) {
            continue;
        }
        if meta.is_dir() {
            // A live owner holds the lock; taking it means the owner is gone.
            let Ok(f) = open_dir(&path) else { continue };
            if lock(&f, false).is_err() {
                continue;
            }
            let _ = std::fs::remove_dir_all(&path);
        } else {
            let _ = std::fs::remove_file(&path);
        }
    }
}

fn open_dir(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Takes an exclusive `flock` on `f`, waiting for it when `wait`.
fn lock(f: &File, wait: bool) -> io::Result<()> {
    let op = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    // SAFETY: flock on a file descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether process `pid` exists (in this PID namespace).
fn alive(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if p <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let r = unsafe { libc::kill(p, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// A number not used before by this process (time-seeded, so other processes differ too).
pub fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    (t & 0xffff_ffff_ffff) ^ (N.fetch_add(1, Ordering::Relaxed) << 48)
}
