//! The thread pool that runs the parallel regions of generated kernels.
//!
//! A region is `n` chunks of work, `task(ctx, c, n)` for every `c` in `0..n`. The calling thread
//! takes part: it and the workers claim chunks from one atomic word, and once no chunk is
//! left unclaimed the caller waits only for the chunks already started. A worker that has not
//! woken up (another process holds its core) therefore never holds a region back: the caller
//! runs the chunks it did not claim. OpenMP's fork/join, by contrast, waits at every region's
//! end for every thread of the team.
//!
//! Protocol. `state` holds the region's epoch (upper 40 bits) and the unclaimed chunks
//! `front..back` (12 bits each). The caller owns the pool for the whole region (`owned`); it
//! marks the new epoch busy, writes the region's description (release stores), then publishes
//! the epoch with `0..n`. The caller claims from the front, the workers from the back (a
//! compare-exchange that moves one end while `front < back`): when both keep pace, each thread
//! takes the same share of consecutive regions, as a static schedule would, and the data it
//! wrote stays in its core's caches. A worker that read a description and lost the processor
//! can no longer claim anything once the epoch has moved on: the description it read is then
//! older than the state its compare-exchange sees (the description's acquire loads order the
//! busy mark before it).
//! Every finished chunk adds one to `done` (release); the caller returns when `done == n`
//! (acquire), so the chunks' writes are visible to it and no worker touches the region after.
//!
//! Idle workers spin for a short while (`spin`), then sleep on a condition variable; the
//! caller notifies only when some worker sleeps. A region started while the pool is owned by
//! another thread, or from inside a chunk (nested), runs serially on its caller. Nothing is
//! allocated per region.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// One chunk of a region: `task(ctx, chunk, chunks)`.
pub type Task = unsafe extern "C" fn(*mut c_void, i64, i64);

/// The signature of [`run_chunks`] (`tc_pool_fn` in the prelude).
pub type RunChunks = unsafe extern "C" fn(Task, *mut c_void, i64, i64);

const END_BITS: u32 = 12;
const END_MASK: u64 = (1 << END_BITS) - 1;
/// Both ends of the chunks: the epoch's bits lie above.
const INDEX_BITS: u32 = 2 * END_BITS;
/// The front of an epoch whose description is being written.
const BUSY: u64 = END_MASK;
/// The most chunks a region may have (`TC_MAX_CHUNKS` in the prelude); larger regions run
/// serially.
pub const MAX_CHUNKS: i64 = (END_MASK - 1) as i64;
/// How long idle workers of the process's pool spin before they sleep (`TILEC_POOL_SPIN_US`
/// overrides it). Long enough to bridge the gaps between the kernels of a model on a quiet
/// machine, short enough that a spinning worker does not hold a shared core for long.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(100);

thread_local! {
    /// Set while the thread runs a chunk (always on workers): regions inside run serially.
    static IN_REGION: Cell<bool> = const { Cell::new(false) };
}

/// A pool of worker threads, started as regions ask for them.
pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    state: AtomicU64,
    // The region's description, valid for the epoch in `state`.
    task: AtomicUsize,
    ctx: AtomicUsize,
    chunks: AtomicU64,
    /// Workers that take part (the caller is one more).
    joining: AtomicUsize,
    done: AtomicU64,
    /// A thread runs a region on the pool.
    owned: AtomicBool,
    /// Workers started; only the owner starts more.
    workers: AtomicUsize,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    spin: Duration,
    /// Workers pause before claiming anything (tests: a descheduled worker).
    held: AtomicBool,
    shutdown: AtomicBool,
}

fn epoch(s: u64) -> u64 {
    s >> INDEX_BITS
}

fn front(s: u64) -> u64 {
    s >> END_BITS & END_MASK
}

fn back(s: u64) -> u64 {
    s & END_MASK
}

impl Pool {
    /// A pool whose idle workers spin for `spin` before they sleep. No thread starts yet.
    pub fn new(spin: Duration) -> Pool {
        Pool {
            inner: Arc::new(Inner {
                state: AtomicU64::new(0),
                task: AtomicUsize::new(0),
                ctx: AtomicUsize::new(0),
                chunks: AtomicU64::new(0),
                joining: AtomicUsize::new(0),
                done: AtomicU64::new(0),
                owned: AtomicBool::new(false),
                workers: AtomicUsize::new(0),
                sleepers: AtomicUsize::new(0),
                lock: Mutex::new(()),
                wake: Condvar::new(),
                spin,
                held: AtomicBool::new(false),
                shutdown: AtomicBool::new(false),
            }),
        }
    }

    /// Worker threads started so far.
    pub fn workers(&self) -> usize {
        self.inner.workers.load(Relaxed)
    }

    /// Runs `task(ctx, c, chunks)` for every `c` in `0..chunks` on up to `threads` threads, the
    /// caller included, and returns when all have run.
    ///
    /// # Safety
    /// `task` must be safe to call with `ctx` for each chunk, concurrently from several threads.
    pub unsafe fn run_raw(&self, task: Task, ctx: *mut c_void, chunks: i64, threads: usize) {
        if chunks <= 0 {
            return;
        }
        let joining = threads.saturating_sub(1).min(chunks as usize - 1);
        let nested = IN_REGION.with(|f| f.get());
        if joining == 0 || nested || chunks > MAX_CHUNKS || !self.inner.acquire() {
            serial(task, ctx, chunks);
            return;
        }
        let joining = self.inner.start_workers(joining, &self.inner);
        if joining == 0 {
            self.inner.owned.store(false, Release);
            serial(task, ctx, chunks);
            return;
        }
        IN_REGION.with(|f| f.set(true));
        self.inner.region(task, ctx, chunks as u64, joining);
        IN_REGION.with(|f| f.set(false));
        self.inner.owned.store(false, Release);
    }

    /// [`Pool::run_raw`] for a Rust closure, `f(chunk, chunks)`.
    pub fn run<F: Fn(i64, i64) + Sync>(&self, chunks: i64, threads: usize, f: &F) {
        unsafe extern "C" fn call<F: Fn(i64, i64) + Sync>(ctx: *mut c_void, c: i64, n: i64) {
            // SAFETY: `ctx` is the `&F` passed below, alive until `run_raw` returns.
            unsafe { (*(ctx as *const F))(c, n) }
        }
        // SAFETY: `F: Sync`, so calling it from several threads at once is sound.
        unsafe { self.run_raw(call::<F>, f as *const F as *mut c_void, chunks, threads) }
    }

    /// Holds the workers back before they claim a chunk (while `on`), as if the operating
    /// system had not scheduled them: regions must still complete. For tests.
    #[doc(hidden)]
    pub fn hold_workers(&self, on: bool) {
        self.inner.held.store(on, SeqCst);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, SeqCst);
        let _g = self.inner.guard();
        self.inner.wake.notify_all();
    }
}

fn serial(task: Task, ctx: *mut c_void, chunks: i64) {
    for c in 0..chunks {
        // SAFETY: the caller of `run_raw` vouches for `task` and `ctx`.
        unsafe { task(ctx, c, chunks) };
    }
}

impl Inner {
    fn guard(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn acquire(&self) -> bool {
        self.owned
            .compare_exchange(false, true, Acquire, Relaxed)
            .is_ok()
    }

    /// Starts workers until `want` exist (or the system refuses more); returns how many do.
    fn start_workers(&self, want: usize, this: &Arc<Inner>) -> usize {
        let mut have = self.workers.load(Relaxed);
        while have < want {
            let inner = Arc::clone(this);
            let index = have;
            // The epoch before the region about to start: a worker whose thread starts after
            // that region is published still joins it.
            let seen = epoch(self.state.load(Relaxed));
            let spawned = std::thread::Builder::new()
                .name(format!("tilec-pool-{index}"))
                .stack_size(8 << 20)
                .spawn(move || inner.worker(index, seen));
            if spawned.is_err() {
                break;
            }
            have += 1;
            self.workers.store(have, Relaxed);
        }
        have.min(want)
    }

    /// The caller's side of a region (the pool is owned).
    fn region(&self, task: Task, ctx: *mut c_void, chunks: u64, joining: usize) {
        let e = epoch(self.state.load(Relaxed)) + 1;
        self.state
            .store(e << INDEX_BITS | BUSY << END_BITS, Relaxed);
        // Release: a worker that reads any of these also sees the busy mark above.
        self.task.store(task as usize, Release);
        self.ctx.store(ctx as usize, Release);
        self.chunks.store(chunks, Release);
        self.joining.store(joining, Release);
        self.done.store(0, Relaxed);
        // SeqCst with the sleepers' count (see `sleep`): either a worker about to sleep sees
        // the new epoch, or the caller sees it counted and wakes it.
        self.state.store(e << INDEX_BITS | chunks, SeqCst);
        if self.sleepers.load(SeqCst) > 0 {
            let _g = self.guard();
            self.wake.notify_all();
        }
        self.claim_all(e, task, ctx, chunks, false);
        // Only chunks already started remain.
        let mut spins = 0u32;
        while self.done.load(Acquire) < chunks {
            spins += 1;
            if spins < 1 << 12 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Claims and runs chunks of epoch `e`, from the front or the back, until none is left.
    fn claim_all(&self, e: u64, task: Task, ctx: *mut c_void, chunks: u64, from_back: bool) {
        let mut cur = self.state.load(Acquire);
        loop {
            // A busy front is never below the back of a published epoch.
            if epoch(cur) != e || front(cur) >= back(cur) || back(cur) > chunks {
                return;
            }
            let (next, chunk) = if from_back {
                (cur - 1, back(cur) - 1)
            } else {
                (cur + (1 << END_BITS), front(cur))
            };
            match self
                .state
                .compare_exchange_weak(cur, next, Acquire, Acquire)
            {
                Ok(_) => {
                    // SAFETY: the region's caller vouches for `task` and `ctx` until every
                    // chunk is done, and this chunk is not done yet.
                    unsafe { task(ctx, chunk as i64, chunks as i64) };
                    self.done.fetch_add(1, Release);
                    cur = self.state.load(Acquire);
                }
                Err(now) => cur = now,
            }
        }
    }

    fn worker(&self, index: usize, mut seen: u64) {
        IN_REGION.with(|f| f.set(true));
        loop {
            if !self.wait(seen) {
                return;
            }
            while self.held.load(SeqCst) && !self.shutdown.load(Relaxed) {
                std::thread::sleep(Duration::from_micros(50));
            }
            let s = self.published();
            seen = epoch(s);
            let joining = self.joining.load(Acquire);
            let chunks = self.chunks.load(Acquire);
            let ctx = self.ctx.load(Acquire) as *mut c_void;
            let task = self.task.load(Acquire);
            if index >= joining || task == 0 {
                continue;
            }
            // SAFETY: `task` was stored from a `Task`; if it belongs to another epoch than
            // `seen`, every claim below fails.
            let task: Task = unsafe { std::mem::transmute::<usize, Task>(task) };
            self.claim_all(seen, task, ctx, chunks, true);
        }
    }

    /// The state once its epoch's description is written.
    fn published(&self) -> u64 {
        let mut spins = 0u32;
        loop {
            let s = self.state.load(Acquire);
            if front(s) != BUSY {
                return s;
            }
            spins += 1;
            if spins < 1 << 10 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Waits for an epoch other than `seen`: spins, then sleeps. False on shutdown.
    fn wait(&self, seen: u64) -> bool {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if epoch(self.state.load(Acquire)) != seen {
                return true;
            }
            if self.shutdown.load(Relaxed) {
                return false;
            }
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins % 64 == 0 && start.elapsed() >= self.spin {
                break;
            }
        }
        let mut g = self.guard();
        loop {
            self.sleepers.fetch_add(1, SeqCst);
            let moved = epoch(self.state.load(SeqCst)) != seen;
            if moved || self.shutdown.load(SeqCst) {
                self.sleepers.fetch_sub(1, SeqCst);
                return moved;
            }
            g = self.wake.wait(g).unwrap_or_else(|e| e.into_inner());
            self.sleepers.fetch_sub(1, SeqCst);
        }
    }
}

/// The process's pool, which every loaded kernel library calls (see [`run_chunks`]).
pub fn global() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let spin = std::env::var("TILEC_POOL_SPIN_US")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Duration::from_micros)
            .unwrap_or(DEFAULT_SPIN);
        Pool::new(spin)
    })
}

/// The entry point the generated code calls for a parallel region (`tc_parallel` in the
/// prelude): the chunks on [`global`] with up to `threads` threads.
///
/// # Safety
/// As [`Pool::run_raw`].
pub unsafe extern "C" fn run_chunks(task: Task, ctx: *mut c_void, chunks: i64, threads: i64) {
    let threads = usize::try_from(threads).unwrap_or(1);
    // SAFETY: forwarded from the caller.
    unsafe { global().run_raw(task, ctx, chunks, threads) }
}

/// Threads a module uses when nobody says otherwise: the cores this process may run on.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
