//! The kernel cache: entries verified before use, bad ones removed, directories that cannot be
//! trusted or written replaced by a private one, and work folders of dead processes removed.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tilec_runtime::cache::{euid, Cache, Key};

fn fresh(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("runtime-cache")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn key(source: &str) -> Key {
    Key::builder("test-library", "cc 1.0")
        .part("-O2")
        .part(source)
        .finish()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn entries_round_trip_and_keys_discriminate() {
    let dir = fresh("roundtrip");
    let c = Cache::open(&dir).unwrap();
    assert!(!c.is_private());
    assert_eq!(c.dir(), dir);
    let k = key("int f() { return 1; }");
    assert_eq!(c.get(&k, "so.tilec"), None);
    let path = c.put(&k, "so.tilec", b"payload bytes").unwrap();
    assert_eq!(path, c.entry_path(&k, "so.tilec"));
    assert_eq!(
        c.get(&k, "so.tilec").as_deref(),
        Some(&b"payload bytes"[..])
    );
    // Another process sees the same entry.
    let c2 = Cache::open(&dir).unwrap();
    assert_eq!(
        c2.get(&k, "so.tilec").as_deref(),
        Some(&b"payload bytes"[..])
    );
    // Sources, flags, compiler and kind all name different entries; parts do not run together.
    let names: Vec<String> = [
        key("int f() { return 2; }"),
        Key::builder("test-library", "cc 1.0")
            .part("-O3")
            .part("int f() { return 1; }")
            .finish(),
        Key::builder("test-library", "cc 1.1")
            .part("-O2")
            .part("int f() { return 1; }")
            .finish(),
        Key::builder("other-kind", "cc 1.0")
            .part("-O2")
            .part("int f() { return 1; }")
            .finish(),
        Key::builder("test-library", "cc 1.0")
            .part("-O2int f() { return 1; }")
            .finish(),
    ]
    .iter()
    .map(|k| k.name())
    .collect();
    for (i, n) in names.iter().enumerate() {
        assert_ne!(n, &k.name());
        assert!(!names[..i].contains(n));
        assert_eq!(n.len(), 32);
    }
    // The directory was created private.
    assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
}

#[test]
fn bad_entries_are_removed_and_missed() {
    let dir = fresh("bad");
    let c = Cache::open(&dir).unwrap();
    let k = key("kernel a");
    let other = key("kernel b");
    let good_path = c.put(&k, "bin", &vec![7u8; 4096]).unwrap();
    let good = std::fs::read(&good_path).unwrap();
    let other_entry = std::fs::read(c.put(&other, "bin", &vec![9u8; 4096]).unwrap()).unwrap();
    let mut flipped = good.clone();
    *flipped.last_mut().unwrap() ^= 1;
    let mut longer = good.clone();
    longer.push(0);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("truncated header", good[..20].to_vec()),
        ("truncated payload", good[..good.len() - 1].to_vec()),
        ("garbage", b"\x7fELF not really a library".to_vec()),
        ("foreign entry", other_entry),
        ("checksum", flipped),
        ("trailing bytes", longer),
    ];
    for (what, bytes) in cases {
        std::fs::write(&good_path, &bytes).unwrap();
        assert_eq!(c.get(&k, "bin"), None, "{what}: a bad entry was used");
        assert!(!good_path.exists(), "{what}: the bad entry was not removed");
        // Rebuilt, it is used again.
        c.put(&k, "bin", &vec![7u8; 4096]).unwrap();
        assert_eq!(c.get(&k, "bin"), Some(vec![7u8; 4096]), "{what}");
    }
    // The same entry under another compiler description is foreign too.
    let other_cc = Key::builder("test-library", "cc 2.0")
        .part("-O2")
        .part("kernel a")
        .finish();
    std::fs::copy(&good_path, c.entry_path(&other_cc, "bin")).unwrap();
    assert_eq!(c.get(&other_cc, "bin"), None);
    // Not a regular file: a symbolic link (to a valid entry even) or a directory.
    std::fs::remove_file(&good_path).unwrap();
    let target = dir.join("elsewhere");
    std::fs::write(&target, &good).unwrap();
    std::os::unix::fs::symlink(&target, &good_path).unwrap();
    assert_eq!(c.get(&k, "bin"), None);
    assert!(std::fs::symlink_metadata(&good_path).is_err() && target.exists());
    std::fs::create_dir(&good_path).unwrap();
    assert_eq!(c.get(&k, "bin"), None);
}

#[test]
fn untrusted_directories_are_replaced_by_a_private_one() {
    let base = fresh("untrusted");
    std::fs::create_dir_all(&base).unwrap();
    // Below a regular file: cannot be created, whoever we are.
    let file = base.join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let c = Cache::open(&file.join("cache")).unwrap();
    assert!(c.is_private());
    let private = c.dir().to_path_buf();
    assert!(
        private.starts_with(std::env::temp_dir()),
        "{}",
        private.display()
    );
    let m = std::fs::metadata(&private).unwrap();
    assert_eq!((m.mode() & 0o777, m.uid()), (0o700, euid()));
    // It works as a cache for this process, and is removed with it.
    let k = key("k");
    c.put(&k, "bin", b"code").unwrap();
    assert_eq!(c.get(&k, "bin").as_deref(), Some(&b"code"[..]));
    drop(c);
    assert!(!private.exists());
    // Writable by others.
    let open = base.join("world-writable");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let c = Cache::open(&open).unwrap();
    assert!(c.is_private() && c.dir() != open);
    assert!(names(&open).is_empty(), "wrote into a refused directory");
    // Owned by someone else (only root can arrange that).
    if euid() == 0 {
        let theirs = base.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let c = Cache::open(&theirs).unwrap();
        assert!(c.is_private() && c.dir() != theirs);
        // And a directory we own but may not write (root may write anywhere: skipped).
    } else {
        let ro = base.join("read-only");
        std::fs::create_dir(&ro).unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o500)).unwrap();
        assert!(Cache::open(&ro).unwrap().is_private());
    }
    // A symbolic link to a trusted directory is fine.
    let real = base.join("real");
    let link = base.join("link");
    std::os::unix::fs::symlink(&real, &link).ok();
    std::fs::create_dir(&real).unwrap();
    assert!(!Cache::open(&link).unwrap().is_private());
}

fn age(path: &Path, by: Duration) {
    let f = File::open(path).unwrap();
    f.set_modified(SystemTime::now() - by).unwrap();
}

fn dead_pid() -> u32 {
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

#[test]
fn work_folders_of_dead_processes_are_removed() {
    let dir = fresh("stale");
    std::fs::create_dir_all(&dir).unwrap();
    let parent = std::os::unix::process::parent_id();
    let make = |name: &str| {
        let p = dir.join(name);
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("unit0.c"), b"half written").unwrap();
        p
    };
    let dead = make(&format!("tmp-{}-1", dead_pid()));
    let live = make(&format!("tmp-{parent}-2"));
    let old = make(&format!("tmp-{parent}-3"));
    age(&old, Duration::from_secs(7200));
    let unparsable_old = make("tmp-0123456789abcdef-99-1");
    age(&unparsable_old, Duration::from_secs(7200));
    // Old, but a live process holds its lock: still in use.
    let held = make(&format!("tmp-{parent}-4"));
    age(&held, Duration::from_secs(7200));
    let lock = File::open(&held).unwrap();
    // SAFETY: flock on an open descriptor.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    // Entries and unrelated files are never touched.
    let c0 = Cache::open(&fresh("stale-entries")).unwrap();
    let k = key("k");
    let entry = c0.put(&k, "bin", b"code").unwrap();
    std::fs::copy(&entry, dir.join(entry.file_name().unwrap())).unwrap();
    std::fs::write(dir.join("notes.txt"), b"mine").unwrap();

    let c = Cache::open(&dir).unwrap();
    assert!(!c.is_private());
    for p in [&dead, &old, &unparsable_old] {
        assert!(!p.exists(), "{} was left", p.display());
    }
    for p in [&live, &held] {
        assert!(p.exists(), "{} was removed", p.display());
    }
    assert_eq!(c.get(&k, "bin").as_deref(), Some(&b"code"[..]));
    assert!(dir.join("notes.txt").exists());
    // This process's own work folder exists while the cache is open, locked against sweeps.
    let own: Vec<String> = names(&dir)
        .into_iter()
        .filter(|n| n.starts_with(&format!("tmp-{}-", std::process::id())))
        .collect();
    assert_eq!(own.len(), 1, "{:?}", names(&dir));
    let own_file = File::open(dir.join(&own[0])).unwrap();
    // SAFETY: as above.
    let r = unsafe { libc::flock(own_file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(r, -1, "the work folder is not locked");
    drop(c);
    assert!(!dir.join(&own[0]).exists());
}

#[test]
fn concurrent_writers_leave_one_whole_entry() {
    let dir = fresh("concurrent");
    let k = key("shared kernel");
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let c = Cache::open(&dir).unwrap();
                for _ in 0..20 {
                    c.put(&k, "bin", &payload).unwrap();
                    assert_eq!(c.get(&k, "bin").as_ref(), Some(&payload));
                }
            });
        }
    });
    assert_eq!(names(&dir), vec![format!("{}.bin", k.name())]);
}
