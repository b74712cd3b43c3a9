//! The on-disk cache of compiled kernels, shared by the CPU and CUDA back ends.
//!
//! - **Names.** An entry is `<dir>/<name>.<ext>`, `name` a digest of everything that decides
//!   its contents ([`Key`]: tilec's version, the compiler's path, version and flags, the
//!   sources).
//! - **Verification.** An entry starts with a header (magic, format, payload length and
//!   SHA-256, the key's digest, tilec's version, the compiler) that is checked on the bytes
//!   read into memory before anything uses them ([`Cache::get`]); so a library is loaded from a
//!   verified copy ([`Cache::private_copy`]), never from a file that can change under the
//!   loader. A truncated, garbage, foreign or corrupt entry is removed (a warning, once per
//!   process) and the caller rebuilds it.
//! - **Writes** go to the process's work folder and are renamed into place, so readers see
//!   whole entries and concurrent writers of one key leave one of them.
//! - **Trust.** The directory ([`default_dir`] unless given) is created with mode 0700; one
//!   owned by another user, writable by group or others, or where nothing can be written is
//!   refused with a warning, and a private temporary directory is used instead.
//! - **Leftovers.** Each process works in its own locked `tmp-<pid>-<n>` folder, removed when
//!   the cache is dropped; folders of processes that died (killed during a compile, say) are
//!   removed by the next process that opens the directory.

mod dir;
mod entry;

use std::collections::HashSet;
use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use dir::{default_dir, euid, STALE_AFTER};
pub use entry::{hex, Key, KeyBuilder, Rejection};

use dir::Owned;

/// Entries larger than this are not read (they cannot be ours).
const MAX_ENTRY_BYTES: u64 = 4 << 30;

/// A file's device and inode numbers.
type FileId = (u64, u64);

/// An open cache directory. Cheap to clone; the work folder (and a private fallback
/// directory) is removed when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct Cache {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    /// Declared before `private` so that it is removed first.
    work: Owned,
    /// The private directory standing in for a refused one.
    private: Option<Owned>,
    next: AtomicU64,
}

impl Cache {
    /// Opens (creating it if needed) the cache directory `dir`. If it cannot be trusted or
    /// written, warns and opens a private temporary directory instead; fails only when that
    /// cannot be created either.
    pub fn open(dir: &Path) -> io::Result<Cache> {
        let refusal = match dir::check(dir) {
            Ok(()) => match dir::work_folder(dir) {
                Ok(work) => return Ok(Cache::with(dir.to_path_buf(), work, None)),
                Err(e) => dir::Refusal::Work(e),
            },
            Err(r) => r,
        };
        let private = Owned::private()?;
        let work = Owned::create(private.path(), "tmp-")?;
        warn_once(
            "cache-dir",
            format_args!(
                "kernel cache directory {} {refusal}; using the private directory {} for this run",
                dir.display(),
                private.path().display()
            ),
        );
        Ok(Cache::with(
            private.path().to_path_buf(),
            work,
            Some(private),
        ))
    }

    fn with(dir: PathBuf, work: Owned, private: Option<Owned>) -> Cache {
        Cache {
            inner: Arc::new(Inner {
                dir,
                work,
                private,
                next: AtomicU64::new(0),
            }),
        }
    }

    /// The directory entries live in (a private temporary one if the requested directory was
    /// refused).
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Whether the requested directory was refused and a private one is used.
    pub fn is_private(&self) -> bool {
        self.inner.private.is_some()
    }

    /// Where the entry for `key` with extension `ext` is stored.
    pub fn entry_path(&self, key: &Key, ext: &str) -> PathBuf {
        self.inner.dir.join(format!("{}.{ext}", key.name()))
    }

    /// The verified payload of the entry for `key`, or `None` on a miss. An entry that is not
    /// an intact entry for `key` is removed (with a warning) and reported as a miss.
    pub fn get(&self, key: &Key, ext: &str) -> Option<Vec<u8>> {
        let path = self.entry_path(key, ext);
        let (mut bytes, ino) = match read_entry(&path) {
            Ok(Some(r)) => r,
            Ok(None) => return None,
            Err(why) => {
                self.reject(&path, None, &why);
                return None;
            }
        };
        match entry::decode(key, &bytes) {
            Ok(payload) => {
                let start = bytes.len() - payload.len();
                bytes.drain(..start);
                Some(bytes)
            }
            Err(why) => {
                self.reject(&path, Some(ino), &why.to_string());
                None
            }
        }
    }

    /// Removes a bad entry (unless another process has already replaced it) and warns.
    fn reject(&self, path: &Path, ino: Option<FileId>, why: &str) {
        let now = std::fs::symlink_metadata(path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        if ino.is_none() || now == ino {
            let _ = std::fs::remove_file(path);
        }
        warn_once(
            "bad-entry",
            format_args!(
                "removed the kernel cache entry {} ({why}); rebuilding it",
                path.display()
            ),
        );
    }

    /// Stores `payload` as the entry for `key`: written in the work folder, then renamed into
    /// place. Returns the entry's path, or `None` (after a warning) if it could not be stored;
    /// the caller goes on with its payload either way.
    pub fn put(&self, key: &Key, ext: &str, payload: &[u8]) -> Option<PathBuf> {
        let path = self.entry_path(key, ext);
        let tmp = self.fresh_path("entry");
        let r = write_new(&tmp, &entry::encode(key, payload), 0o600)
            .and_then(|()| std::fs::rename(&tmp, &path));
        match r {
            Ok(()) => Some(path),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                warn_once(
                    "store",
                    format_args!(
                        "cannot store the kernel cache entry {}: {e}",
                        path.display()
                    ),
                );
                None
            }
        }
    }

    /// Writes `bytes` to a new file in the work folder (mode 0700, a name never used before)
    /// that is removed when the returned guard drops: a copy nobody else can change, for
    /// loaders that need a path (`dlopen`).
    pub fn private_copy(&self, bytes: &[u8], suffix: &str) -> io::Result<TempPath> {
        let path = self.fresh_path(&format!("load{suffix}"));
        write_new(&path, bytes, 0o700)?;
        Ok(TempPath(path))
    }

    /// A new empty folder in the work folder, removed when the guard drops.
    pub fn scratch(&self) -> io::Result<TempPath> {
        let path = self.fresh_path("build");
        std::fs::create_dir(&path)?;
        Ok(TempPath(path))
    }

    fn fresh_path(&self, what: &str) -> PathBuf {
        let n = self.inner.next.fetch_add(1, Ordering::Relaxed);
        self.inner.work.path().join(format!("{what}-{n}"))
    }
}

/// A file or folder removed when dropped.
#[derive(Debug)]
pub struct TempPath(PathBuf);

impl TempPath {
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        if self.0.is_dir() {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// Reads the entry at `path` through one descriptor: `Ok(None)` if there is none, an error
/// saying what is wrong with it if it is not a readable regular file of plausible size.
fn read_entry(path: &Path) -> Result<Option<(Vec<u8>, FileId)>, String> {
    let mut f = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot be opened: {e}")),
    };
    let m = f.metadata().map_err(|e| e.to_string())?;
    if !m.is_file() {
        return Err("not a regular file".into());
    }
    if m.len() > MAX_ENTRY_BYTES {
        return Err(format!("{} bytes", m.len()));
    }
    let mut bytes = Vec::with_capacity(m.len() as usize);
    f.read_to_end(&mut bytes)
        .map_err(|e| format!("cannot be read: {e}"))?;
    Ok(Some((bytes, (m.dev(), m.ino()))))
}

/// Creates `path` (which must not exist) with `mode` and writes `bytes` to it.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)?;
    f.write_all(bytes)
}

/// Prints `tilec: warning: <msg>` on stderr, the first time only for each `what`.
pub fn warn_once(what: &'static str, msg: std::fmt::Arguments<'_>) {
    static SEEN: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let first = SEEN
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(what);
    if first {
        eprintln!("tilec: warning: {msg}");
    }
}
