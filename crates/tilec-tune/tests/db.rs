//! The tuning database: round trips, lookups exact and by bucket, stale and foreign entries,
//! corrupted files and rows, concurrent writers (threads and processes), export and import.
//! Every database lives in a fresh temporary folder, never the user's.

use std::path::PathBuf;
use std::sync::Arc;

use tilec_tune::db::{Context, Db, Match, Record};
use tilec_tune::key::ProblemKey;

fn tmp(name: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let d = std::env::temp_dir().join(format!(
        "tilec-tune-test-{}-{}-{nanos}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ctx() -> Context {
    Context {
        device: "Test CPU 9000".into(),
        capability: "avx2,fma; 2 threads".into(),
        tilec_version: "0.1.0+tilec-cpu-2".into(),
        compiler: "cc (Test) 1.0".into(),
    }
}

fn key(shape: &str, bucket: &str) -> ProblemKey {
    ProblemKey {
        fingerprint: "f00d".into(),
        shape: shape.into(),
        bucket: bucket.into(),
        dtype: "f32".into(),
        desc: "matmul(f32[..])".into(),
    }
}

fn record(shape: &str, bucket: &str, mr: i64) -> Record {
    let mut r = Record::new(&key(shape, bucket), "cpu.blis_gemm", &ctx(), vec![("mr".into(), mr), ("nr".into(), 32)]);
    r.default_ns = 2000.0;
    r.tuned_ns = 1000.0;
    r.measured = 5;
    r
}

#[test]
fn round_trip_exact_then_bucket() {
    let d = tmp("rt");
    let db = Db::open(&d.join("sub/tuning.sqlite")).unwrap();
    db.put(&record("100x64", "128x64", 8)).unwrap();
    let (r, m) = db.lookup(&key("100x64", "128x64"), "cpu.blis_gemm", &ctx()).unwrap();
    assert_eq!(m, Match::Exact);
    assert_eq!(r.params, vec![("mr".to_string(), 8), ("nr".to_string(), 32)]);
    assert_eq!(r, record("100x64", "128x64", 8).with_created(r.created));
    // Another shape of the same bucket.
    let (r, m) = db.lookup(&key("120x64", "128x64"), "cpu.blis_gemm", &ctx()).unwrap();
    assert_eq!((m, r.params[0].1), (Match::Bucket, 8));
    // Another bucket, another family: nothing.
    assert!(db.lookup(&key("130x64", "256x64"), "cpu.blis_gemm", &ctx()).is_none());
    assert!(db.lookup(&key("100x64", "128x64"), "cpu.direct", &ctx()).is_none());
    // Replaced by a newer measurement of the same key; an older one does not win.
    let mut newer = record("100x64", "128x64", 12);
    newer.created += 10;
    db.put(&newer).unwrap();
    let mut older = record("100x64", "128x64", 4);
    older.created -= 10;
    db.put(&older).unwrap();
    assert_eq!(db.lookup(&key("100x64", "128x64"), "cpu.blis_gemm", &ctx()).unwrap().0.params[0].1, 12);
    assert!(db.notes().is_empty(), "{:?}", db.notes());
    // Reopened from the file.
    drop(db);
    let db = Db::open_existing(&d.join("sub/tuning.sqlite")).unwrap().unwrap();
    assert_eq!(db.records().unwrap().0.len(), 1);
    // A file that does not exist is not created by a reader.
    assert!(Db::open_existing(&d.join("none.sqlite")).unwrap().is_none());
    assert!(!d.join("none.sqlite").exists());
}

trait WithCreated {
    fn with_created(self, c: i64) -> Self;
}
impl WithCreated for Record {
    fn with_created(mut self, c: i64) -> Record {
        self.created = c;
        self
    }
}

#[test]
fn stale_and_foreign_entries_are_ignored_with_a_note() {
    let d = tmp("stale");
    let db = Db::open(&d.join("t.sqlite")).unwrap();
    let mut foreign = record("1x1", "1x1", 4);
    foreign.device = "Other CPU".into();
    let mut stale = record("2x2", "2x2", 4);
    stale.tilec_version = "0.0.1".into();
    let mut old_cc = record("3x3", "4x4", 4);
    old_cc.compiler = "cc (Test) 0.9".into();
    db.put_all(&[foreign, stale, old_cc]).unwrap();
    for s in [("1x1", "1x1"), ("2x2", "2x2"), ("3x3", "4x4")] {
        assert!(db.lookup(&key(s.0, s.1), "cpu.blis_gemm", &ctx()).is_none(), "{s:?}");
    }
    let notes = db.notes().join("\n");
    assert!(notes.contains("foreign: measured on Other CPU"), "{notes}");
    assert!(notes.contains("stale: measured with tilec 0.0.1"), "{notes}");
    assert!(notes.contains("stale: measured with compiler"), "{notes}");
    // A valid entry next to a foreign one of the same key is used.
    db.put(&record("1x1", "1x1", 6)).unwrap();
    assert_eq!(db.lookup(&key("1x1", "1x1"), "cpu.blis_gemm", &ctx()).unwrap().0.params[0].1, 6);
}

#[test]
fn corrupted_files_and_rows() {
    let d = tmp("corrupt");
    // Not SQLite at all.
    let garbage = d.join("garbage.sqlite");
    std::fs::write(&garbage, b"this is not a database, just some text that is long enough").unwrap();
    let e = Db::open_existing(&garbage).unwrap_err().to_string();
    assert!(e.contains("not an SQLite file"), "{e}");
    assert!(Db::open(&garbage).unwrap_err().to_string().contains("not an SQLite file"));
    // SQLite's header, then garbage (a truncated or overwritten file).
    let broken = d.join("broken.sqlite");
    let mut bytes = b"SQLite format 3\0".to_vec();
    bytes.extend(std::iter::repeat_n(0xA5u8, 4096));
    std::fs::write(&broken, &bytes).unwrap();
    let e = Db::open_existing(&broken).unwrap_err().to_string();
    assert!(e.contains("tuning database"), "{e}");
    // A directory.
    assert!(Db::open_existing(&d).unwrap_err().to_string().contains("is a directory"));
    // Another program's SQLite database.
    let other = d.join("other.sqlite");
    {
        let c = rusqlite::Connection::open(&other).unwrap();
        c.execute_batch("CREATE TABLE users (name TEXT);").unwrap();
    }
    let e = Db::open_existing(&other).unwrap_err().to_string();
    assert!(e.contains("another program"), "{e}");
    assert!(Db::open(&other).is_err(), "never written into");
    // A tuning database of another schema version.
    let newer = d.join("newer.sqlite");
    drop(Db::open(&newer).unwrap());
    {
        let c = rusqlite::Connection::open(&newer).unwrap();
        c.execute("UPDATE meta SET value = '99' WHERE key = 'schema'", []).unwrap();
    }
    let e = Db::open_existing(&newer).unwrap_err().to_string();
    assert!(e.contains("schema version 99"), "{e}");
    // Rows that do not decode: bad JSON, a text where a number belongs.
    let ok = d.join("ok.sqlite");
    let db = Db::open(&ok).unwrap();
    db.put(&record("5x5", "8x8", 8)).unwrap();
    {
        let c = rusqlite::Connection::open(&ok).unwrap();
        c.execute("UPDATE tuning SET params = '{{not json' WHERE shape = '5x5'", []).unwrap();
    }
    assert!(db.lookup(&key("5x5", "8x8"), "cpu.blis_gemm", &ctx()).is_none());
    assert!(db.notes().join("\n").contains("parameters do not decode"), "{:?}", db.notes());
    db.put(&record("6x6", "8x8", 8)).unwrap();
    {
        let c = rusqlite::Connection::open(&ok).unwrap();
        c.execute("UPDATE tuning SET measured = 'lots' WHERE shape = '6x6'", []).unwrap();
    }
    assert!(db.lookup(&key("6x6", "8x8"), "cpu.blis_gemm", &ctx()).is_none());
    assert!(db.notes().join("\n").contains("a column does not decode"), "{:?}", db.notes());
    let (good, bad) = db.records().unwrap();
    assert_eq!((good.len(), bad.len()), (0, 2));
}

#[test]
fn concurrent_writers_in_threads() {
    let d = tmp("threads");
    let path = d.join("t.sqlite");
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let path = path.clone();
            std::thread::spawn(move || {
                // Each thread its own connection, as separate tilec processes would have.
                let db = Db::open(&path).unwrap();
                for i in 0..25 {
                    db.put(&record(&format!("{t}x{i}"), "b", i)).unwrap();
                    db.lookup(&key(&format!("{t}x{i}"), "b"), "cpu.blis_gemm", &ctx()).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // One connection shared by threads too.
    let db = Arc::new(Db::open(&path).unwrap());
    let handles: Vec<_> = (0..3)
        .map(|t| {
            let db = db.clone();
            std::thread::spawn(move || {
                for i in 0..10 {
                    db.put(&record(&format!("s{t}x{i}"), "b", i)).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(db.records().unwrap().0.len(), 4 * 25 + 3 * 10);
}

/// Run by [`concurrent_writers_in_processes`] in child processes: writes 20 records.
#[test]
#[ignore = "a child of concurrent_writers_in_processes"]
fn child_writer() {
    let (Some(path), Some(id)) = (std::env::var_os("TILEC_TUNE_TEST_DB"), std::env::var_os("TILEC_TUNE_TEST_WRITER")) else {
        return;
    };
    let id = id.to_string_lossy().to_string();
    let db = Db::open(&PathBuf::from(path)).unwrap();
    for i in 0..20 {
        db.put(&record(&format!("p{id}x{i}"), "b", i)).unwrap();
    }
}

#[test]
fn concurrent_writers_in_processes() {
    let d = tmp("procs");
    let path = d.join("t.sqlite");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..4)
        .map(|i| {
            std::process::Command::new(&exe)
                .args(["--exact", "child_writer", "--ignored", "--test-threads", "1"])
                .env("TILEC_TUNE_TEST_DB", &path)
                .env("TILEC_TUNE_TEST_WRITER", i.to_string())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let db = Db::open_existing(&path).unwrap().unwrap();
    let (good, bad) = db.records().unwrap();
    assert_eq!((good.len(), bad.len()), (80, 0));
}

#[test]
fn export_import_round_trip() {
    let d = tmp("export");
    let db = Db::open(&d.join("a.sqlite")).unwrap();
    let mut rs = vec![record("1x1", "1x1", 4), record("2x2", "2x2", 8)];
    rs[1].rank_corr = Some(0.5);
    db.put_all(&rs).unwrap();
    // JSON lines.
    assert_eq!(db.export(&d.join("out.jsonl")).unwrap(), 2);
    let text = std::fs::read_to_string(d.join("out.jsonl")).unwrap();
    assert_eq!(text.lines().count(), 2);
    let b = Db::open(&d.join("b.sqlite")).unwrap();
    let s = b.import(&d.join("out.jsonl")).unwrap();
    assert_eq!((s.imported, s.skipped), (2, 0));
    assert_eq!(b.records().unwrap().0, db.records().unwrap().0);
    // A copy of the database file.
    assert_eq!(db.export(&d.join("copy.sqlite")).unwrap(), 2);
    let c = Db::open(&d.join("c.sqlite")).unwrap();
    assert_eq!(c.import(&d.join("copy.sqlite")).unwrap().imported, 2);
    assert_eq!(c.records().unwrap().0, db.records().unwrap().0);
    // Exporting again replaces the copy.
    assert_eq!(db.export(&d.join("copy.sqlite")).unwrap(), 2);
    // Bad lines are skipped and counted; good ones still land.
    std::fs::write(d.join("mixed.jsonl"), format!("{}\nnot json\n{{\"a\": 1}}\n\n", text.lines().next().unwrap())).unwrap();
    let e = Db::open(&d.join("e.sqlite")).unwrap();
    let s = e.import(&d.join("mixed.jsonl")).unwrap();
    assert_eq!((s.imported, s.skipped), (1, 2));
    assert!(s.notes[0].contains("line 2"), "{:?}", s.notes);
    // A missing file is an error, not a crash.
    assert!(e.import(&d.join("missing.jsonl")).is_err());
}
