//! The cost of one parallel region on the thread pool: regions of `threads` chunks that do
//! nothing, back to back (workers spinning) and 2 ms apart (workers asleep, woken by each).
//!
//! cargo run --release -p tilec-cpu --example pool_overhead -- [--threads N] [--regions N]

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use tilec_cpu::pool::{Pool, DEFAULT_SPIN};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let get = |flag: &str, default: usize| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let threads = get("--threads", 2);
    let regions = get("--regions", 200_000);
    let pool = Pool::new(DEFAULT_SPIN);
    let sink = AtomicU64::new(0);
    let body = |c: i64, _: i64| {
        sink.fetch_add(c as u64, Relaxed);
    };
    pool.run(threads as i64, threads, &body);

    let mut per = vec![];
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..regions {
            pool.run(threads as i64, threads, &body);
        }
        per.push(t.elapsed().as_secs_f64() / regions as f64 * 1e9);
    }
    per.sort_by(f64::total_cmp);
    println!(
        "back to back: {:.0} ns per region (median of 5 x {regions}, {threads} threads)",
        per[2]
    );

    let mut lat = vec![];
    for _ in 0..200 {
        std::thread::sleep(Duration::from_millis(2));
        let t = Instant::now();
        pool.run(threads as i64, threads, &body);
        lat.push(t.elapsed().as_secs_f64() * 1e9);
    }
    lat.sort_by(f64::total_cmp);
    println!(
        "after 2 ms idle (workers asleep): {:.0} ns median, {:.0} ns 90th percentile",
        lat[lat.len() / 2],
        lat[lat.len() * 9 / 10]
    );
}
