//! The thread pool of parallel regions: every chunk runs exactly once, whatever the sizes and
//! thread counts; a region completes while a worker is held back (a descheduled worker);
//! nested and concurrent regions run serially on their caller.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::*};
use std::sync::mpsc;
use std::thread::ThreadId;
use std::time::Duration;

use tilec_cpu::pool::Pool;

/// Runs `f` on another thread and fails if it does not return within `secs` (a region that
/// waits for a held worker would hang).
fn within<F: FnOnce() + Send + 'static>(secs: u64, f: F) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("the region did not complete");
}

/// Runs a region of `chunks` on `threads` threads and checks that each chunk ran once, with
/// the right chunk count.
fn check_once(pool: &Pool, chunks: i64, threads: usize) {
    let counts: Vec<AtomicU32> = (0..chunks).map(|_| AtomicU32::new(0)).collect();
    let bad_n = AtomicBool::new(false);
    pool.run(chunks, threads, &|c, n| {
        if n != chunks {
            bad_n.store(true, Relaxed);
        }
        counts[c as usize].fetch_add(1, Relaxed);
    });
    assert!(
        !bad_n.load(Relaxed),
        "{chunks} chunks, {threads} threads: wrong chunk count"
    );
    for (c, k) in counts.iter().enumerate() {
        assert_eq!(
            k.load(Relaxed),
            1,
            "chunk {c} of {chunks} on {threads} threads"
        );
    }
}

#[test]
fn every_chunk_runs_once() {
    let pool = Pool::new(Duration::from_micros(50));
    for threads in [1, 2, 3, 4, 8] {
        for chunks in [0, 1, 2, 3, 5, 8, 63, 1000, 4094, 4095] {
            check_once(&pool, chunks, threads);
        }
    }
    assert!(pool.workers() >= 7, "{} workers", pool.workers());
}

#[test]
fn back_to_back_regions_of_every_shape() {
    // Regions follow each other faster than sleeping workers wake: late workers meet newer
    // epochs than the one that woke them.
    for spin_us in [0, 200] {
        let pool = Pool::new(Duration::from_micros(spin_us));
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..3000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let chunks = (x % 40) as i64;
            let threads = 1 + (x >> 8) as usize % 4;
            check_once(&pool, chunks, threads);
        }
    }
}

#[test]
fn one_thread_runs_on_the_caller_in_order() {
    let pool = Pool::new(Duration::from_micros(50));
    let order = std::sync::Mutex::new(vec![]);
    let me = std::thread::current().id();
    pool.run(10, 1, &|c, _| {
        assert_eq!(std::thread::current().id(), me);
        order.lock().unwrap().push(c);
    });
    assert_eq!(*order.lock().unwrap(), (0..10).collect::<Vec<_>>());
    assert_eq!(pool.workers(), 0);
}

#[test]
fn a_held_worker_does_not_hold_the_region_back() {
    let pool = std::sync::Arc::new(Pool::new(Duration::from_micros(50)));
    check_once(&pool, 4, 2); // the worker exists
    pool.hold_workers(true);
    let p = pool.clone();
    within(20, move || {
        for _ in 0..50 {
            let me = std::thread::current().id();
            let ran: Vec<AtomicU32> = (0..64).map(|_| AtomicU32::new(0)).collect();
            p.run(64, 2, &|c, _| {
                assert_eq!(std::thread::current().id(), me, "a held worker ran a chunk");
                ran[c as usize].fetch_add(1, Relaxed);
            });
            assert!(ran.iter().all(|k| k.load(Relaxed) == 1));
        }
    });
    // Released in the middle of a region, the worker joins it and takes chunks left over: the
    // caller's first chunk waits for that (up to 10 s, however loaded the machine).
    let p = pool.clone();
    within(20, move || {
        let caller = std::thread::current().id();
        let by_worker = AtomicUsize::new(0);
        let ran: Vec<AtomicU32> = (0..256).map(|_| AtomicU32::new(0)).collect();
        p.run(256, 2, &|c, _| {
            let on: ThreadId = std::thread::current().id();
            if on != caller {
                by_worker.fetch_add(1, Relaxed);
            } else if c == 0 {
                p.hold_workers(false);
                let t = std::time::Instant::now();
                while by_worker.load(Relaxed) == 0 && t.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
            ran[c as usize].fetch_add(1, Relaxed);
        });
        assert!(ran.iter().all(|k| k.load(Relaxed) == 1));
        assert!(
            by_worker.load(Relaxed) > 0,
            "the released worker took no chunk"
        );
    });
}

#[test]
fn nested_regions_run_serially_on_their_thread() {
    let pool = Pool::new(Duration::from_micros(50));
    let total = AtomicU32::new(0);
    pool.run(8, 2, &|_, _| {
        let me = std::thread::current().id();
        pool.run(5, 2, &|_, _| {
            assert_eq!(std::thread::current().id(), me);
            total.fetch_add(1, Relaxed);
        });
    });
    assert_eq!(total.load(Relaxed), 40);
}

#[test]
fn concurrent_callers_all_complete() {
    let pool = std::sync::Arc::new(Pool::new(Duration::from_micros(50)));
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let p = pool.clone();
            std::thread::spawn(move || {
                for i in 0..500 {
                    check_once(&p, 1 + (i + t) % 17, 3);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn the_caller_takes_the_front_and_a_worker_the_back() {
    // Chunks are claimed from both ends; whoever runs them, each runs once (also checked
    // above). With the worker held, the caller takes every chunk in order from the front.
    let pool = Pool::new(Duration::from_micros(50));
    check_once(&pool, 2, 2);
    pool.hold_workers(true);
    let order = std::sync::Mutex::new(vec![]);
    pool.run(9, 2, &|c, _| order.lock().unwrap().push(c));
    pool.hold_workers(false);
    assert_eq!(*order.lock().unwrap(), (0..9).collect::<Vec<_>>());
}
