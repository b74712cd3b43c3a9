//! tilec's tuner: finds the best parameters of a kernel family for a problem on this machine
//! by measuring, remembers them in the tuning database, and hands them back to the family
//! dispatch ([`tilec_tile::family::Tuned`]) on later compiles.
//!
//! - [`key`]: what identifies a problem (fingerprint of its class, exact shape, power-of-two
//!   shape bucket).
//! - [`db`]: the SQLite tuning database (lookups exact, then by bucket; stale, foreign and
//!   corrupted entries ignored with a note; safe for concurrent writers; export/import).
//! - [`search`]: candidates from the family's space pruned by its constraints before any
//!   build, ordered by its cost model, measured within a budget by a back end's [`Measurer`]
//!   (`tilec::tune` has the CPU's).
//!
//! The crate knows no back end: a device contributes a [`db::Context`] (what its measurements
//! hold for) and a [`Measurer`].

pub mod db;
pub mod key;
pub mod search;

pub use db::{default_path, Context, Db, DbError, Match, Record};
pub use key::{problem_key, ProblemKey};
pub use search::{candidates, search, Candidate, Candidates, Measurer, Outcome, SearchOptions, SearchResult};

use tilec_tile::family::{Problem, Tuned, TunedParams};

/// The database as the family dispatch reads it, for one machine ([`Context`]).
#[derive(Debug)]
pub struct Tuning {
    pub db: Db,
    pub ctx: Context,
}

impl Tuned for Tuning {
    fn lookup(&self, family: &str, p: &Problem) -> Option<TunedParams> {
        let key = problem_key(p);
        let (r, m) = self.db.lookup(&key, family, &self.ctx)?;
        let matched = match m {
            Match::Exact => format!("tuned {} for this shape", r.date()),
            Match::Bucket => {
                let shape = r.shape.split('#').next().unwrap_or("");
                format!("tuned {} for a shape of the same bucket: {shape}", r.date())
            }
        };
        Some(TunedParams { values: r.params, matched })
    }
}
