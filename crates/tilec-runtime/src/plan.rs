//! The static memory planner.
//!
//! Every buffer has a size, an alignment and a lifetime `[first, last]` (inclusive step
//! indices over the kernel order). Buffers are placed greedily, largest first; each goes into
//! the smallest free gap (best fit) left between the already-placed buffers whose lifetimes
//! overlap its own, or above all of them when no gap fits. A buffer with an in-place hint is
//! put at the offset of the buffer it may overwrite when that is legal.
//!
//! Placed buffers are kept sorted by offset, so finding the gaps for one buffer is a single
//! sweep: the planner is O(n²) in the number of buffers.

/// One buffer to place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferReq {
    /// Size in bytes (0 is allowed: such a buffer takes no memory).
    pub size: usize,
    /// Required alignment of the offset in bytes (0 is taken as 1).
    pub align: usize,
    /// First step (kernel index) at which the buffer is alive: usually its producer.
    pub first: usize,
    /// Last step at which the buffer is alive (inclusive): usually its last consumer.
    pub last: usize,
    /// `Some(j)`: this buffer may share buffer `j`'s memory, which is legal exactly when `j`'s
    /// last step is this buffer's first step (the kernel at that step reads `j` and writes
    /// this buffer element by element), this buffer is no larger than `j`, and `j`'s offset
    /// satisfies this buffer's alignment.
    pub inplace_of: Option<usize>,
}

impl BufferReq {
    /// A buffer without an in-place hint.
    pub fn new(size: usize, align: usize, first: usize, last: usize) -> Self {
        BufferReq {
            size,
            align,
            first,
            last,
            inplace_of: None,
        }
    }

    fn align(&self) -> usize {
        self.align.max(1)
    }

    fn lo(&self) -> usize {
        self.first.min(self.last)
    }

    fn hi(&self) -> usize {
        self.first.max(self.last)
    }

    fn overlaps_in_time(&self, other: &BufferReq) -> bool {
        self.lo() <= other.hi() && other.lo() <= self.hi()
    }
}

/// Where every buffer lives in the arena.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemoryPlan {
    /// Offset of each buffer, in the order of the requests.
    pub offsets: Vec<usize>,
    /// Bytes the arena needs: the largest `offset + size`.
    pub arena_bytes: usize,
    /// What laying the buffers out one after another, without reuse, takes: the sum of the
    /// sizes, each rounded up to its alignment. The plan never needs more when alignments
    /// are powers of two (`arena_bytes <= total_bytes`).
    pub total_bytes: usize,
    /// Number of in-place hints honoured.
    pub inplace: usize,
}

/// Whether `b` may legally alias `j` (`b.inplace_of == Some(j)`), ignoring the offsets.
fn alias_legal(reqs: &[BufferReq], b: usize, j: usize) -> bool {
    if b == j || j >= reqs.len() || reqs[b].inplace_of != Some(j) {
        return false;
    }
    let (rb, rj) = (&reqs[b], &reqs[j]);
    rj.hi() == rb.lo() && rb.size <= rj.size
}

fn round_up(x: usize, align: usize) -> Option<usize> {
    x.checked_next_multiple_of(align)
}

/// Places the buffers; see the module documentation for the strategy.
///
/// Alignments should be powers of two (others are honoured, but `arena_bytes <= total_bytes`
/// is then not guaranteed). Lifetimes given with `first > last` are read as `[last, first]`.
/// Hints naming a buffer out of range, or whose conditions do not hold, are ignored.
pub fn plan(reqs: &[BufferReq]) -> MemoryPlan {
    let n = reqs.len();
    let total_bytes = reqs.iter().fold(0usize, |acc, r| {
        acc.saturating_add(round_up(r.size, r.align()).unwrap_or(usize::MAX))
    });
    // Reverse hints: buffers that would like to alias buffer i.
    let mut wanted_by: Vec<Vec<usize>> = vec![Vec::new(); n];
    for b in 0..n {
        if let Some(j) = reqs[b].inplace_of {
            if alias_legal(reqs, b, j) {
                wanted_by[j].push(b);
            }
        }
    }

    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| {
        reqs[b]
            .size
            .cmp(&reqs[a].size)
            .then(reqs[a].lo().cmp(&reqs[b].lo()))
            .then(a.cmp(&b))
    });

    let mut offsets = vec![0usize; n];
    let mut placed_at: Vec<bool> = vec![false; n];
    // Placed buffers of non-zero size, sorted by offset.
    let mut placed: Vec<(usize, usize)> = Vec::with_capacity(n); // (offset, index)
    let mut inplace = 0usize;

    for &i in &order {
        let r = &reqs[i];
        if r.size == 0 {
            offsets[i] = 0;
            placed_at[i] = true;
            continue;
        }
        // In place: on the buffer this one may overwrite, or on one that may overwrite it.
        let mut chosen = None;
        let mut partners: Vec<usize> = Vec::new();
        if let Some(j) = r.inplace_of {
            if alias_legal(reqs, i, j) && placed_at[j] && reqs[j].size > 0 {
                partners.push(j);
            }
        }
        partners.extend(
            wanted_by[i]
                .iter()
                .copied()
                .filter(|&b| placed_at[b] && reqs[b].size > 0),
        );
        for p in partners {
            let off = offsets[p];
            if off % r.align() != 0 {
                continue;
            }
            let end = match off.checked_add(r.size) {
                Some(e) => e,
                None => continue,
            };
            let clash = placed.iter().any(|&(o, k)| {
                k != p && reqs[k].overlaps_in_time(r) && o < end && off < o + reqs[k].size
            });
            if !clash {
                chosen = Some(off);
                inplace += 1;
                break;
            }
        }

        let off = match chosen {
            Some(off) => off,
            None => best_fit(reqs, &placed, r),
        };
        offsets[i] = off;
        placed_at[i] = true;
        let pos = placed.partition_point(|&(o, k)| (o, k) < (off, i));
        placed.insert(pos, (off, i));
    }

    let arena_bytes = reqs
        .iter()
        .zip(&offsets)
        .map(|(r, &o)| {
            if r.size == 0 {
                0
            } else {
                o.saturating_add(r.size)
            }
        })
        .max()
        .unwrap_or(0);
    if arena_bytes > total_bytes {
        // Alignment padding between reused gaps made the greedy layout worse than none at
        // all (possible only for small, oddly aligned buffers): lay the buffers out one after
        // another, most strictly aligned first, which needs no padding beyond each buffer's
        // own rounding when alignments are powers of two.
        return sequential(reqs, total_bytes);
    }
    MemoryPlan {
        offsets,
        arena_bytes,
        total_bytes,
        inplace,
    }
}

fn sequential(reqs: &[BufferReq], total_bytes: usize) -> MemoryPlan {
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_by(|&a, &b| reqs[b].align().cmp(&reqs[a].align()).then(a.cmp(&b)));
    let mut offsets = vec![0usize; reqs.len()];
    let mut cursor = 0usize;
    let mut arena_bytes = 0usize;
    for i in order {
        let r = &reqs[i];
        if r.size == 0 {
            continue;
        }
        let off = round_up(cursor, r.align()).unwrap_or(usize::MAX - r.size);
        offsets[i] = off;
        arena_bytes = arena_bytes.max(off.saturating_add(r.size));
        cursor = off.saturating_add(round_up(r.size, r.align()).unwrap_or(r.size));
    }
    MemoryPlan {
        offsets,
        arena_bytes,
        total_bytes,
        inplace: 0,
    }
}

/// The lowest offset of the smallest gap between the placed buffers alive with `r` that fits
/// it, or the first aligned offset above all of them.
fn best_fit(reqs: &[BufferReq], placed: &[(usize, usize)], r: &BufferReq) -> usize {
    let align = r.align();
    let mut best: Option<(usize, usize)> = None; // (gap size, offset)
    let mut cursor = 0usize; // end of the memory in use so far, in offset order
    for &(o, k) in placed {
        let rk = &reqs[k];
        if !rk.overlaps_in_time(r) {
            continue;
        }
        if o > cursor {
            if let Some(start) = round_up(cursor, align) {
                if start.checked_add(r.size).is_some_and(|e| e <= o) {
                    let gap = o - cursor;
                    if !matches!(best, Some((g, _)) if g <= gap) {
                        best = Some((gap, start));
                    }
                }
            }
        }
        cursor = cursor.max(o.saturating_add(rk.size));
    }
    match best {
        Some((_, off)) => off,
        None => round_up(cursor, align).unwrap_or(usize::MAX - r.size),
    }
}

/// Verifies a plan against its requests: one offset per buffer, every offset aligned, every
/// buffer inside the arena, and no two buffers alive at a common step overlapping in memory
/// unless one is the legal in-place alias of the other (same offset, the hint's conditions
/// hold). The error names the buffers and what is wrong.
pub fn check(reqs: &[BufferReq], plan: &MemoryPlan) -> Result<(), String> {
    if plan.offsets.len() != reqs.len() {
        return Err(format!(
            "plan has {} offsets for {} buffers",
            plan.offsets.len(),
            reqs.len()
        ));
    }
    for (i, (r, &o)) in reqs.iter().zip(&plan.offsets).enumerate() {
        if o % r.align() != 0 {
            return Err(format!(
                "buffer {i}: offset {o} is not a multiple of its alignment {}",
                r.align()
            ));
        }
        match o.checked_add(r.size) {
            Some(end) if r.size == 0 || end <= plan.arena_bytes => {}
            _ => {
                return Err(format!(
                    "buffer {i}: [{o}, {o}+{}) ends outside the arena of {} bytes",
                    r.size, plan.arena_bytes
                ))
            }
        }
    }
    // Sweep over buffers sorted by offset; compare each with the ones before it that still
    // reach past its start.
    let mut idx: Vec<usize> = (0..reqs.len()).filter(|&i| reqs[i].size > 0).collect();
    idx.sort_by_key(|&i| (plan.offsets[i], i));
    for (pos, &b) in idx.iter().enumerate() {
        let ob = plan.offsets[b];
        for &a in idx[..pos].iter().rev() {
            let oa = plan.offsets[a];
            if oa + reqs[a].size <= ob {
                // Earlier buffers may still reach further (they are sorted by start only).
                continue;
            }
            if !reqs[a].overlaps_in_time(&reqs[b]) {
                continue;
            }
            let legal_alias = oa == ob && (alias_legal(reqs, a, b) || alias_legal(reqs, b, a));
            if !legal_alias {
                return Err(format!(
                    "buffers {a} (bytes [{oa}, {}), steps {}..={}) and {b} (bytes [{ob}, {}), steps {}..={}) \
                     are alive at the same step and overlap in memory",
                    oa + reqs[a].size,
                    reqs[a].lo(),
                    reqs[a].hi(),
                    ob + reqs[b].size,
                    reqs[b].lo(),
                    reqs[b].hi()
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Largest sum of bytes alive at one step, counting a honoured in-place pair once.
    fn live_lower_bound(reqs: &[BufferReq], plan: &MemoryPlan) -> usize {
        let steps = reqs.iter().map(|r| r.hi() + 1).max().unwrap_or(0);
        let mut best = 0;
        for t in 0..steps {
            let mut live = 0;
            for (b, r) in reqs.iter().enumerate() {
                if r.lo() <= t && t <= r.hi() {
                    live += r.size;
                    if let Some(j) = r.inplace_of {
                        let honoured = alias_legal(reqs, b, j)
                            && plan.offsets[b] == plan.offsets[j]
                            && r.size > 0
                            && reqs[j].size > 0;
                        if honoured && t == r.lo() {
                            live -= r.size;
                        }
                    }
                }
            }
            best = best.max(live);
        }
        best
    }

    fn random_reqs(rng: &mut StdRng, n: usize, steps: usize, hints: bool) -> Vec<BufferReq> {
        let mut reqs: Vec<BufferReq> = Vec::with_capacity(n);
        for i in 0..n {
            let size = match rng.gen_range(0..10) {
                0 => 0,
                1..=3 => rng.gen_range(1..64),
                4..=7 => rng.gen_range(1..4096),
                _ => rng.gen_range(1..1 << 20),
            };
            let align = [1, 4, 8, 16, 64, 256][rng.gen_range(0..6)];
            let first = rng.gen_range(0..steps);
            let last = (first + rng.gen_range(0..steps / 2 + 1)).min(steps - 1);
            let mut r = BufferReq::new(size, align, first, last);
            if hints && i > 0 && rng.gen_bool(0.4) {
                let j = rng.gen_range(0..i);
                if rng.gen_bool(0.8) {
                    // Make the hint legal in time (and usually in size).
                    r.first = reqs[j].hi();
                    r.last = r.first + rng.gen_range(0..4);
                    if rng.gen_bool(0.8) {
                        r.size = r.size.min(reqs[j].size);
                    }
                }
                r.inplace_of = Some(j);
            }
            reqs.push(r);
        }
        reqs
    }

    fn check_all(reqs: &[BufferReq]) -> MemoryPlan {
        let p = plan(reqs);
        if let Err(e) = check(reqs, &p) {
            panic!("{e}\nreqs: {reqs:?}\nplan: {p:?}");
        }
        assert!(
            p.arena_bytes <= p.total_bytes,
            "arena {} > total {}",
            p.arena_bytes,
            p.total_bytes
        );
        let lb = live_lower_bound(reqs, &p);
        assert!(
            p.arena_bytes >= lb,
            "arena {} below the live bytes {lb}",
            p.arena_bytes
        );
        assert_eq!(
            p.total_bytes,
            reqs.iter()
                .map(|r| r.size.next_multiple_of(r.align()))
                .sum::<usize>()
        );
        p
    }

    #[test]
    fn random_plans_are_valid() {
        let mut rng = StdRng::seed_from_u64(0x7117ec);
        let mut honoured = 0;
        for case in 0..3000 {
            let n = rng.gen_range(0..if case % 100 == 0 { 400 } else { 40 });
            let steps = rng.gen_range(1..50);
            let reqs = random_reqs(&mut rng, n, steps, case % 2 == 1);
            honoured += check_all(&reqs).inplace;
        }
        assert!(honoured > 1000, "only {honoured} in-place hints honoured");
    }

    #[test]
    fn thousands_of_buffers() {
        let mut rng = StdRng::seed_from_u64(7);
        let reqs = random_reqs(&mut rng, 3000, 1000, true);
        let t = std::time::Instant::now();
        let p = check_all(&reqs);
        let lb = live_lower_bound(&reqs, &p);
        assert!(
            p.arena_bytes < p.total_bytes / 3,
            "{} vs {}",
            p.arena_bytes,
            p.total_bytes
        );
        eprintln!(
            "3000 buffers: arena {} total {} live bound {lb}",
            p.arena_bytes, p.total_bytes
        );
        assert!(
            (p.arena_bytes as f64) < 1.5 * lb as f64,
            "arena {} vs live bound {lb}",
            p.arena_bytes
        );
        // Generous: O(n^2) with n = 3000 is a few tens of milliseconds.
        assert!(
            t.elapsed().as_secs_f64() < 20.0,
            "planning took {:?}",
            t.elapsed()
        );
    }

    #[test]
    fn chain_reuses_memory() {
        // a -> b -> c -> d: each value is read only by the next step.
        let reqs: Vec<BufferReq> = (0..4).map(|i| BufferReq::new(1000, 64, i, i + 1)).collect();
        let p = check_all(&reqs);
        assert!(p.arena_bytes < p.total_bytes);
        // a at 0, b above it (aligned to 1024), c back at 0 once a is dead, d at 1024.
        assert_eq!(p.offsets, vec![0, 1024, 0, 1024]);
        assert_eq!(p.arena_bytes, 2024);
        assert_eq!(p.inplace, 0);
    }

    #[test]
    fn chain_in_place_uses_one_buffer() {
        let reqs: Vec<BufferReq> = (0..4usize)
            .map(|i| BufferReq {
                inplace_of: i.checked_sub(1),
                ..BufferReq::new(1000, 64, i, i + 1)
            })
            .collect();
        let p = check_all(&reqs);
        assert_eq!(p.arena_bytes, 1000);
        assert_eq!(p.offsets, vec![0; 4]);
        assert_eq!(p.inplace, 3);
    }

    #[test]
    fn illegal_hints_are_ignored() {
        // j still alive after b's first step; b larger than j; j out of range.
        let reqs = vec![
            BufferReq::new(100, 4, 0, 3),
            BufferReq {
                inplace_of: Some(0),
                ..BufferReq::new(100, 4, 1, 2)
            },
            BufferReq {
                inplace_of: Some(0),
                ..BufferReq::new(200, 4, 3, 4)
            },
            BufferReq {
                inplace_of: Some(99),
                ..BufferReq::new(10, 4, 0, 0)
            },
        ];
        let p = check_all(&reqs);
        assert_eq!(p.inplace, 0);
        assert_ne!(p.offsets[1], p.offsets[0]);
    }

    #[test]
    fn hint_refused_when_a_third_buffer_would_clash() {
        // b wants a's memory (a dies at step 2, b starts there), but c (alive at steps 2..=3,
        // smaller, placed after) cannot move b; two hints on one buffer at the same step: only
        // one may be honoured.
        let reqs = vec![
            BufferReq::new(512, 64, 0, 2),
            BufferReq {
                inplace_of: Some(0),
                ..BufferReq::new(512, 64, 2, 3)
            },
            BufferReq {
                inplace_of: Some(0),
                ..BufferReq::new(256, 64, 2, 3)
            },
        ];
        let p = check_all(&reqs);
        assert_eq!(p.inplace, 1);
        assert_eq!(p.offsets[1], p.offsets[0]);
        assert_ne!(p.offsets[2], p.offsets[0]);
    }

    #[test]
    fn best_fit_picks_the_smallest_gap() {
        // Placed largest first: S1 at 0, L1 at 500, S2 at 900, L2 at 1200. S1 and S2 die after
        // step 0, leaving gaps of 500 and 300 bytes between L1 and L2 for later steps.
        let reqs = vec![
            BufferReq::new(500, 1, 0, 0), // S1
            BufferReq::new(400, 1, 0, 9), // L1
            BufferReq::new(300, 1, 0, 0), // S2
            BufferReq::new(200, 1, 0, 9), // L2
            BufferReq::new(150, 1, 5, 6), // X: fits both gaps; best fit is the 300-byte one
            BufferReq::new(120, 1, 5, 6), // W: the 150 bytes left after X are the best fit
            BufferReq::new(100, 8, 5, 5), // V: 30 bytes are left above W: into the 500-byte gap
        ];
        let p = check_all(&reqs);
        assert_eq!(p.offsets, vec![0, 500, 900, 1200, 900, 1050, 0]);
        assert_eq!(p.arena_bytes, 1400);
    }

    #[test]
    fn check_rejects_bad_plans() {
        let reqs = vec![BufferReq::new(64, 16, 0, 1), BufferReq::new(64, 16, 1, 2)];
        let ok = plan(&reqs);
        assert!(check(&reqs, &ok).is_ok());
        let overlap = MemoryPlan {
            offsets: vec![0, 32],
            arena_bytes: 96,
            total_bytes: 128,
            inplace: 0,
        };
        assert!(check(&reqs, &overlap).unwrap_err().contains("overlap"));
        let misaligned = MemoryPlan {
            offsets: vec![0, 72],
            arena_bytes: 160,
            total_bytes: 128,
            inplace: 0,
        };
        assert!(check(&reqs, &misaligned).unwrap_err().contains("alignment"));
        let outside = MemoryPlan {
            offsets: vec![0, 64],
            arena_bytes: 100,
            total_bytes: 128,
            inplace: 0,
        };
        assert!(check(&reqs, &outside).unwrap_err().contains("outside"));
        let short = MemoryPlan {
            offsets: vec![0],
            arena_bytes: 64,
            total_bytes: 128,
            inplace: 0,
        };
        assert!(check(&reqs, &short).is_err());
        // Same offset without a hint is an overlap; with a legal hint it is fine.
        let same = MemoryPlan {
            offsets: vec![0, 0],
            arena_bytes: 64,
            total_bytes: 128,
            inplace: 1,
        };
        assert!(check(&reqs, &same).is_err());
        let mut hinted = reqs.clone();
        hinted[1].inplace_of = Some(0);
        assert!(check(&hinted, &same).is_ok());
        assert_eq!(plan(&hinted), same);
    }

    #[test]
    fn odd_alignments_stay_valid() {
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..500 {
            let n = rng.gen_range(1..30);
            let mut reqs = random_reqs(&mut rng, n, 20, true);
            for r in &mut reqs {
                r.align = [3, 5, 12, 1][rng.gen_range(0..4)];
            }
            let p = plan(&reqs);
            check(&reqs, &p).unwrap_or_else(|e| panic!("{e}\n{reqs:?}\n{p:?}"));
        }
        // Tiny buffers with large alignment: reuse would need more padding than it saves.
        let reqs: Vec<BufferReq> = (0..8)
            .map(|i| BufferReq::new(if i % 2 == 0 { 64 } else { 4 }, 64, i, i + 1))
            .collect();
        let p = check_all(&reqs);
        assert!(p.arena_bytes <= p.total_bytes);
    }

    #[test]
    fn empty_and_zero_sized() {
        assert_eq!(plan(&[]), MemoryPlan::default());
        let reqs = vec![BufferReq::new(0, 64, 0, 5), BufferReq::new(10, 0, 5, 0)];
        let p = check_all(&reqs);
        assert_eq!(p.arena_bytes, 10);
    }
}
