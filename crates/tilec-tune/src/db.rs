//! The tuning database: one SQLite file (`rusqlite`, SQLite compiled in) of measured best
//! parameters.
//!
//! A row is keyed by the problem ([`ProblemKey`]: fingerprint and exact shape), the family,
//! and the machine it was measured on ([`Context`]: device and capability, tilec's version,
//! the compiler's). Lookups try the exact shape, then the shape bucket; rows measured on
//! another device or by another version are *foreign* or *stale* and are ignored, as are rows
//! that do not decode (bad JSON, wrong column types): each with a note, never an error.
//! A file that is not a tilec tuning database (not SQLite, another schema, unreadable) makes
//! [`Db::open`] fail with a message saying so; `tilec run` then goes on without tuning.
//!
//! Several processes may write at once: the file is in WAL mode, writers wait for each other
//! (busy timeout) and every write is one transaction. [`Db::export`] writes JSON lines (one
//! [`Record`] per line) or, for a `.sqlite`/`.db` name, a copy of the database;
//! [`Db::import`] reads either.

use std::fmt;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use serde::{Deserialize, Serialize};

use crate::key::ProblemKey;

/// The layout of the tables; a file with another is refused (a note for `run`).
pub const SCHEMA_VERSION: i64 = 1;
const APP: &str = "tilec-tuning";
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";
/// How long a writer waits for another's transaction.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// The machine and software a measurement holds for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Context {
    /// The device: the CPU's model name, or the GPU's.
    pub device: String,
    /// What the code may use on it: the CPU's ISA and threads, a GPU's compute capability.
    pub capability: String,
    /// tilec's version and the code generator's format.
    pub tilec_version: String,
    /// The C compiler's version, or the CUDA driver's and NVRTC's.
    pub compiler: String,
}

/// One tuned problem: the key, the best parameters and the measurements.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub fingerprint: String,
    pub shape: String,
    pub bucket: String,
    pub dtype: String,
    pub family: String,
    pub device: String,
    pub capability: String,
    pub tilec_version: String,
    pub compiler: String,
    /// The best parameters, by name.
    pub params: Vec<(String, i64)>,
    /// Median time with the heuristic's parameters, nanoseconds.
    pub default_ns: f64,
    /// Median time with `params`, nanoseconds.
    pub tuned_ns: f64,
    /// Candidates measured (the heuristic included), and of those, how many failed.
    pub measured: u32,
    pub failed: u32,
    /// Points of the family's space, and how many its constraints pruned before any build.
    pub space: u32,
    pub pruned: u32,
    /// Spearman correlation of the cost model's order with the measured one.
    pub rank_corr: Option<f64>,
    /// When it was measured, Unix seconds.
    pub created: i64,
    /// The problem as people read it.
    pub desc: String,
}

impl Record {
    /// A record of `key` for `family` measured in `ctx` (measurements zero).
    pub fn new(key: &ProblemKey, family: &str, ctx: &Context, params: Vec<(String, i64)>) -> Record {
        Record {
            fingerprint: key.fingerprint.clone(),
            shape: key.shape.clone(),
            bucket: key.bucket.clone(),
            dtype: key.dtype.clone(),
            family: family.to_string(),
            device: ctx.device.clone(),
            capability: ctx.capability.clone(),
            tilec_version: ctx.tilec_version.clone(),
            compiler: ctx.compiler.clone(),
            params,
            default_ns: 0.0,
            tuned_ns: 0.0,
            measured: 0,
            failed: 0,
            space: 0,
            pruned: 0,
            rank_corr: None,
            created: now(),
            desc: key.desc.clone(),
        }
    }

    /// `mr=8 nr=32 ...`.
    pub fn params_text(&self) -> String {
        self.params.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(" ")
    }

    /// `YYYY-MM-DD` of `created` (UTC).
    pub fn date(&self) -> String {
        date_of(self.created)
    }

    /// Why the record does not hold in `ctx`, if it does not: another device (foreign) or
    /// another version of tilec or the compiler (stale).
    pub fn mismatch(&self, ctx: &Context) -> Option<String> {
        if self.device != ctx.device || self.capability != ctx.capability {
            return Some(format!("foreign: measured on {} ({})", self.device, self.capability));
        }
        if self.tilec_version != ctx.tilec_version {
            return Some(format!("stale: measured with tilec {}, this is {}", self.tilec_version, ctx.tilec_version));
        }
        if self.compiler != ctx.compiler {
            return Some(format!("stale: measured with compiler '{}', this is '{}'", self.compiler, ctx.compiler));
        }
        None
    }
}

/// Seconds since the Unix epoch.
pub fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// `YYYY-MM-DD` of Unix seconds (UTC; the civil-from-days algorithm).
pub fn date_of(secs: i64) -> String {
    let z = secs.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// What went wrong with the database file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbError(pub String);

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DbError {}

fn sql_err<'a>(path: &'a Path, what: &str) -> impl Fn(rusqlite::Error) -> DbError + 'a {
    let what = what.to_string();
    move |e| {
        let hint = match &e {
            rusqlite::Error::SqliteFailure(f, _)
                if matches!(f.code, rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt) =>
            {
                " (the file is corrupted or not a tuning database)"
            }
            _ => "",
        };
        DbError(format!("tuning database {}: {what}: {e}{hint}", path.display()))
    }
}

/// How a lookup matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Match {
    /// The same problem, same shape.
    Exact,
    /// The same problem class in the same power-of-two shape bucket.
    Bucket,
}

/// What [`Db::import`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportStats {
    /// Records read and written (an older entry of the same key is replaced).
    pub imported: usize,
    /// Lines or rows that did not decode, with why (the first few).
    pub skipped: usize,
    pub notes: Vec<String>,
}

/// The tuning database (see the module documentation).
pub struct Db {
    path: PathBuf,
    conn: Mutex<Connection>,
    /// Entries ignored by lookups, and why (each message once).
    notes: Mutex<Vec<String>>,
}

impl fmt::Debug for Db {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Db({})", self.path.display())
    }
}

/// `$TILEC_TUNING_DB`, else `$XDG_CACHE_HOME/tilec/tuning.sqlite`, else
/// `$HOME/.cache/tilec/tuning.sqlite`, else `tilec-tuning.sqlite` in the temporary directory.
pub fn default_path() -> PathBuf {
    if let Some(p) = std::env::var_os("TILEC_TUNING_DB").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let abs = |v: Option<std::ffi::OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(d) = abs(std::env::var_os("XDG_CACHE_HOME")) {
        return d.join("tilec").join("tuning.sqlite");
    }
    if let Some(h) = abs(std::env::var_os("HOME")) {
        return h.join(".cache").join("tilec").join("tuning.sqlite");
    }
    std::env::temp_dir().join("tilec-tuning.sqlite")
}

/// Whether the file starts like an SQLite database (an empty file counts: SQLite fills it).
fn check_magic(path: &Path) -> Result<(), DbError> {
    use std::io::Read;
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(DbError(format!("tuning database {}: cannot read it: {e}", path.display()))),
    };
    let mut head = [0u8; 16];
    let mut n = 0;
    while n < 16 {
        match f.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => return Err(DbError(format!("tuning database {}: cannot read it: {e}", path.display()))),
        }
    }
    if n == 0 || (n == 16 && &head == SQLITE_MAGIC) {
        return Ok(());
    }
    Err(DbError(format!("tuning database {}: not an SQLite file (corrupted, or another kind of file)", path.display())))
}

const COLUMNS: &str = "fingerprint, shape, bucket, dtype, family, device, capability, tilec_version, compiler, \
                       params, default_ns, tuned_ns, measured, failed, space, pruned, rank_corr, created, descr";

impl Db {
    /// Opens the database at `path`, creating the file (and its folder) and the tables if
    /// missing. Fails on a file that is not a tilec tuning database of this schema.
    pub fn open(path: &Path) -> Result<Db, DbError> {
        if path.is_dir() {
            return Err(DbError(format!("tuning database {}: is a directory", path.display())));
        }
        check_magic(path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| DbError(format!("tuning database {}: cannot create its folder: {e}", path.display())))?;
        }
        let conn = Connection::open(path).map_err(sql_err(path, "cannot open it"))?;
        let db = Db::with(path, conn)?;
        db.init(true)?;
        Ok(db)
    }

    /// Opens an existing database to read it (`None` when there is no file): nothing is
    /// created. Read-only when the file cannot be written.
    pub fn open_existing(path: &Path) -> Result<Option<Db>, DbError> {
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(DbError(format!("tuning database {}: {e}", path.display()))),
            Ok(m) if m.is_dir() => return Err(DbError(format!("tuning database {}: is a directory", path.display()))),
            Ok(_) => {}
        }
        check_magic(path)?;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = match Connection::open_with_flags(path, flags) {
            Ok(c) => c,
            Err(_) => Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
                .map_err(sql_err(path, "cannot open it"))?,
        };
        let db = Db::with(path, conn)?;
        db.init(false)?;
        Ok(Some(db))
    }

    fn with(path: &Path, conn: Connection) -> Result<Db, DbError> {
        conn.busy_timeout(BUSY_TIMEOUT).map_err(sql_err(path, "setting the busy timeout"))?;
        Ok(Db { path: path.to_path_buf(), conn: Mutex::new(conn), notes: Mutex::new(vec![]) })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves the connection usable: SQLite rolls back.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checks (and with `create`, makes) the tables; refuses another schema or another
    /// program's database.
    fn init(&self, create: bool) -> Result<(), DbError> {
        let p = &self.path;
        let mut c = self.conn();
        if create {
            // WAL lets readers run beside one writer; a file system without shared memory
            // keeps the rollback journal, which is still safe.
            let _ = c.pragma_update(None, "journal_mode", "WAL");
        }
        let tables: Vec<String> = {
            let mut st = c
                .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
                .map_err(sql_err(p, "reading its tables"))?;
            let rows = st.query_map([], |r| r.get::<_, String>(0)).map_err(sql_err(p, "reading its tables"))?;
            rows.collect::<Result<_, _>>().map_err(sql_err(p, "reading its tables"))?
        };
        let foreign: Vec<&String> = tables.iter().filter(|t| *t != "meta" && *t != "tuning").collect();
        if !foreign.is_empty() || (tables.iter().any(|t| t == "tuning") && !tables.iter().any(|t| t == "meta")) {
            return Err(DbError(format!(
                "tuning database {}: an SQLite database of another program (tables: {})",
                p.display(),
                tables.join(", ")
            )));
        }
        if tables.iter().any(|t| t == "meta") {
            return self.check_meta(&c);
        }
        if !create {
            // An empty file: nothing tuned yet.
            return Ok(());
        }
        let tx = c
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql_err(p, "creating the tables"))?;
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS tuning (
                fingerprint TEXT NOT NULL, shape TEXT NOT NULL, bucket TEXT NOT NULL, dtype TEXT NOT NULL,
                family TEXT NOT NULL, device TEXT NOT NULL, capability TEXT NOT NULL,
                tilec_version TEXT NOT NULL, compiler TEXT NOT NULL,
                params TEXT NOT NULL, default_ns REAL, tuned_ns REAL, measured INTEGER, failed INTEGER,
                space INTEGER, pruned INTEGER, rank_corr REAL, created INTEGER, descr TEXT,
                PRIMARY KEY (fingerprint, shape, family, device, capability, tilec_version, compiler));
             CREATE INDEX IF NOT EXISTS tuning_bucket ON tuning (fingerprint, bucket, family);",
        )
        .map_err(sql_err(p, "creating the tables"))?;
        tx.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('app', ?1)", [APP])
            .map_err(sql_err(p, "creating the tables"))?;
        tx.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', ?1)", [SCHEMA_VERSION.to_string()])
            .map_err(sql_err(p, "creating the tables"))?;
        self.check_meta(&tx)?;
        tx.commit().map_err(sql_err(p, "creating the tables"))
    }

    fn check_meta(&self, c: &Connection) -> Result<(), DbError> {
        let p = &self.path;
        let get = |k: &str| -> Result<Option<String>, DbError> {
            c.query_row("SELECT value FROM meta WHERE key = ?1", [k], |r| r.get::<_, String>(0))
                .optional()
                .map_err(sql_err(p, "reading its schema"))
        };
        match get("app")? {
            Some(a) if a == APP => {}
            other => {
                return Err(DbError(format!(
                    "tuning database {}: not a tilec tuning database (app: {})",
                    p.display(),
                    other.unwrap_or_else(|| "none".into())
                )))
            }
        }
        match get("schema")?.and_then(|s| s.parse::<i64>().ok()) {
            Some(SCHEMA_VERSION) => Ok(()),
            v => Err(DbError(format!(
                "tuning database {}: schema version {} where this tilec reads {SCHEMA_VERSION}; remove the file or set TILEC_TUNING_DB to another",
                p.display(),
                v.map_or("unknown".to_string(), |v| v.to_string())
            ))),
        }
    }

    fn has_table(&self, c: &Connection) -> bool {
        c.query_row("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tuning'", [], |_| Ok(()))
            .optional()
            .ok()
            .flatten()
            .is_some()
    }

    /// Stores records in one transaction (an entry of the same key is replaced unless it is
    /// newer).
    pub fn put_all(&self, records: &[Record]) -> Result<(), DbError> {
        let p = &self.path;
        let mut c = self.conn();
        if !self.has_table(&c) {
            return Err(DbError(format!("tuning database {}: opened for reading only", p.display())));
        }
        let tx = c
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql_err(p, "starting a write"))?;
        {
            let mut st = tx
                .prepare(&format!(
                    "INSERT INTO tuning ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)
                     ON CONFLICT (fingerprint, shape, family, device, capability, tilec_version, compiler) DO UPDATE SET
                       bucket = excluded.bucket, dtype = excluded.dtype, params = excluded.params,
                       default_ns = excluded.default_ns, tuned_ns = excluded.tuned_ns, measured = excluded.measured,
                       failed = excluded.failed, space = excluded.space, pruned = excluded.pruned,
                       rank_corr = excluded.rank_corr, created = excluded.created, descr = excluded.descr
                     WHERE excluded.created >= tuning.created"
                ))
                .map_err(sql_err(p, "writing"))?;
            for r in records {
                let params = serde_json::to_string(&r.params).map_err(|e| DbError(e.to_string()))?;
                st.execute(params![
                    r.fingerprint,
                    r.shape,
                    r.bucket,
                    r.dtype,
                    r.family,
                    r.device,
                    r.capability,
                    r.tilec_version,
                    r.compiler,
                    params,
                    r.default_ns,
                    r.tuned_ns,
                    r.measured,
                    r.failed,
                    r.space,
                    r.pruned,
                    r.rank_corr,
                    r.created,
                    r.desc
                ])
                .map_err(sql_err(p, "writing"))?;
            }
        }
        tx.commit().map_err(sql_err(p, "committing a write"))
    }

    /// Stores one record.
    pub fn put(&self, r: &Record) -> Result<(), DbError> {
        self.put_all(std::slice::from_ref(r))
    }

    fn row(r: &rusqlite::Row) -> rusqlite::Result<Result<Record, String>> {
        let params: String = r.get(9)?;
        let params: Vec<(String, i64)> = match serde_json::from_str(&params) {
            Ok(p) => p,
            Err(e) => return Ok(Err(format!("its parameters do not decode ({e})"))),
        };
        Ok(Ok(Record {
            fingerprint: r.get(0)?,
            shape: r.get(1)?,
            bucket: r.get(2)?,
            dtype: r.get(3)?,
            family: r.get(4)?,
            device: r.get(5)?,
            capability: r.get(6)?,
            tilec_version: r.get(7)?,
            compiler: r.get(8)?,
            params,
            default_ns: r.get::<_, Option<f64>>(10)?.unwrap_or(0.0),
            tuned_ns: r.get::<_, Option<f64>>(11)?.unwrap_or(0.0),
            measured: r.get::<_, Option<u32>>(12)?.unwrap_or(0),
            failed: r.get::<_, Option<u32>>(13)?.unwrap_or(0),
            space: r.get::<_, Option<u32>>(14)?.unwrap_or(0),
            pruned: r.get::<_, Option<u32>>(15)?.unwrap_or(0),
            rank_corr: r.get(16)?,
            created: r.get::<_, Option<i64>>(17)?.unwrap_or(0),
            desc: r.get::<_, Option<String>>(18)?.unwrap_or_default(),
        }))
    }

    /// Rows selected by a `WHERE` clause; rows that do not decode come back as `Err(why)`.
    fn select(&self, clause: &str, args: &[&dyn rusqlite::ToSql]) -> Result<Vec<Result<Record, String>>, DbError> {
        let p = &self.path;
        let c = self.conn();
        if !self.has_table(&c) {
            return Ok(vec![]);
        }
        let mut st = c
            .prepare(&format!("SELECT {COLUMNS} FROM tuning {clause}"))
            .map_err(sql_err(p, "reading"))?;
        let rows = st.query_map(args, |r| Ok(Db::row(r).unwrap_or_else(|e| Err(format!("a column does not decode ({e})")))));
        let rows = rows.map_err(sql_err(p, "reading"))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(sql_err(p, "reading"))
    }

    /// Every record; rows that do not decode are counted and noted.
    pub fn records(&self) -> Result<(Vec<Record>, Vec<String>), DbError> {
        let mut good = vec![];
        let mut bad = vec![];
        for r in self.select("ORDER BY created, fingerprint, shape", &[])? {
            match r {
                Ok(r) => good.push(r),
                Err(why) => bad.push(format!("a row of {} ignored: {why}", self.path.display())),
            }
        }
        Ok((good, bad))
    }

    fn note(&self, msg: String) {
        let mut n = self.notes.lock().unwrap_or_else(|e| e.into_inner());
        if !n.contains(&msg) {
            n.push(msg);
        }
    }

    /// What lookups ignored so far, and why (each message once).
    pub fn notes(&self) -> Vec<String> {
        self.notes.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The record for `family` on the problem `key` in `ctx`: the exact shape first, then the
    /// shape bucket (the most recent entry). Foreign, stale and undecodable entries are
    /// skipped with a note; a database that cannot be read gives `None` and a note.
    pub fn lookup(&self, key: &ProblemKey, family: &str, ctx: &Context) -> Option<(Record, Match)> {
        for (m, clause, second) in [
            (Match::Exact, "WHERE fingerprint = ?1 AND family = ?2 AND shape = ?3 ORDER BY created DESC", &key.shape),
            (Match::Bucket, "WHERE fingerprint = ?1 AND family = ?2 AND bucket = ?3 ORDER BY created DESC", &key.bucket),
        ] {
            let rows = match self.select(clause, &[&key.fingerprint, &family, second]) {
                Ok(r) => r,
                Err(e) => {
                    self.note(format!("{e}; tuning ignored"));
                    return None;
                }
            };
            let mut found = None;
            for r in rows {
                match r {
                    Ok(r) => match r.mismatch(ctx) {
                        None if found.is_none() => found = Some(r),
                        None => {}
                        Some(why) => self.note(format!("an entry for {family} ignored ({why})")),
                    },
                    Err(why) => self.note(format!("an entry for {family} in {} ignored: {why}", self.path.display())),
                }
            }
            if let Some(r) = found {
                return Some((r, m));
            }
        }
        None
    }

    /// Writes every record to `path`: a copy of the database for a `.sqlite` or `.db` name,
    /// else JSON lines. Returns how many records were written.
    pub fn export(&self, path: &Path) -> Result<usize, DbError> {
        let (records, bad) = self.records()?;
        for b in bad {
            self.note(b);
        }
        let is_sqlite = matches!(path.extension().and_then(|e| e.to_str()), Some("sqlite" | "db" | "sqlite3"));
        if is_sqlite {
            if path.exists() {
                std::fs::remove_file(path).map_err(|e| DbError(format!("--export {}: cannot replace it: {e}", path.display())))?;
            }
            let c = self.conn();
            if !self.has_table(&c) {
                drop(c);
                let out = Db::open(path)?;
                out.put_all(&records)?;
                return Ok(records.len());
            }
            c.execute("VACUUM INTO ?1", [path.to_string_lossy()])
                .map_err(|e| DbError(format!("--export {}: {e}", path.display())))?;
            return Ok(records.len());
        }
        let f = std::fs::File::create(path).map_err(|e| DbError(format!("--export {}: {e}", path.display())))?;
        let mut w = std::io::BufWriter::new(f);
        for r in &records {
            let line = serde_json::to_string(r).map_err(|e| DbError(e.to_string()))?;
            writeln!(w, "{line}").map_err(|e| DbError(format!("--export {}: {e}", path.display())))?;
        }
        w.flush().map_err(|e| DbError(format!("--export {}: {e}", path.display())))?;
        Ok(records.len())
    }

    /// Reads records from `path` (a tuning database file, or JSON lines) into this database.
    /// Lines or rows that do not decode are skipped and counted; a file that cannot be read
    /// at all is an error.
    pub fn import(&self, path: &Path) -> Result<ImportStats, DbError> {
        let mut stats = ImportStats::default();
        let mut head = [0u8; 16];
        let is_sqlite = std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
            .map(|()| &head == SQLITE_MAGIC)
            .unwrap_or(false);
        let records = if is_sqlite {
            let other = Db::open_existing(path)?.ok_or_else(|| DbError(format!("--import {}: no such file", path.display())))?;
            let (records, bad) = other.records()?;
            stats.skipped = bad.len();
            stats.notes = bad.into_iter().take(5).collect();
            records
        } else {
            let f = std::fs::File::open(path).map_err(|e| DbError(format!("--import {}: {e}", path.display())))?;
            let mut out = vec![];
            for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
                let line = match line {
                    Ok(l) => l,
                    Err(e) => {
                        stats.skipped += 1;
                        if stats.notes.len() < 5 {
                            stats.notes.push(format!("--import {} line {}: {e}", path.display(), i + 1));
                        }
                        continue;
                    }
                };
                if line.trim().is_empty() {
                    continue;
                }
                match serde_json::from_str::<Record>(&line) {
                    Ok(r) => out.push(r),
                    Err(e) => {
                        stats.skipped += 1;
                        if stats.notes.len() < 5 {
                            stats.notes.push(format!("--import {} line {}: not a tuning record ({e})", path.display(), i + 1));
                        }
                    }
                }
            }
            out
        };
        self.put_all(&records)?;
        stats.imported = records.len();
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(date_of(0), "1970-01-01");
        assert_eq!(date_of(1_764_633_600), "2025-12-02");
        assert_eq!(date_of(951_782_400), "2000-02-29");
    }
}
