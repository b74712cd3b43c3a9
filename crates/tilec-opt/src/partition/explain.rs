//! Human-readable account of a partition: groups with their ops and roofline numbers,
//! refused fusions with the cost model's reasons, and a summary.

use super::{intensity, Partition, Target};
use std::collections::BTreeMap;
use std::fmt::Write;
use tilec_ir::{Graph, ValueId};

fn vname(g: &Graph, v: ValueId) -> String {
    let n = &g.value(v).name;
    if n.is_empty() {
        format!("%{}", v.0)
    } else {
        format!("%{} \"{}\"", v.0, n)
    }
}

fn bytes(b: f64) -> String {
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else {
        format!("{:.1} KB", b / 1e3)
    }
}

fn flops(f: f64) -> String {
    if f >= 1e9 {
        format!("{:.2} GFLOP", f / 1e9)
    } else {
        format!("{:.3} MFLOP", f / 1e6)
    }
}

/// One group: header with kind, cost and bound, then one line per op.
pub fn explain_group(g: &Graph, p: &Partition, t: &Target, id: usize) -> String {
    let mut s = String::new();
    let gr = match p.groups.get(id) {
        Some(gr) => gr,
        None => return s,
    };
    let ai = intensity(gr.bytes, gr.flops);
    let bound = if ai >= t.ridge(gr.peak) {
        "compute-bound"
    } else {
        "memory-bound"
    };
    let anchor = gr
        .anchor
        .map(|a| format!(" anchor '{}'", g.node(a).name))
        .unwrap_or_default();
    let sib = if gr.siblings.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = gr
            .siblings
            .iter()
            .map(|a| g.node(*a).name.as_str())
            .collect();
        format!(" + horizontal [{}]", names.join(", "))
    };
    let _ = writeln!(
        s,
        "group #{} {}{}{} ({} ops)",
        gr.id,
        gr.kind,
        anchor,
        sib,
        gr.nodes.len()
    );
    let _ = writeln!(
        s,
        "  cost: {} moved, {}, AI {:.2} FLOP/B (ridge {:.1}), {}, est {:.2} us",
        bytes(gr.bytes),
        flops(gr.flops),
        ai,
        t.ridge(gr.peak),
        bound,
        gr.time_s * 1e6
    );
    if let Some(n) = &gr.note {
        let _ = writeln!(s, "  note: {n}");
    }
    for n in &gr.nodes {
        let node = g.node(*n);
        let outs: Vec<String> = node.outputs.iter().map(|&v| vname(g, v)).collect();
        let ins: Vec<String> = node.inputs.iter().map(|v| format!("%{}", v.0)).collect();
        let _ = writeln!(
            s,
            "    {} = {}({})",
            outs.join(", "),
            node.op.name(),
            ins.join(", ")
        );
    }
    let ins: Vec<String> = gr.inputs.iter().map(|&v| vname(g, v)).collect();
    let outs: Vec<String> = gr.outputs.iter().map(|&v| vname(g, v)).collect();
    let _ = writeln!(s, "  reads: {}", ins.join(", "));
    let _ = writeln!(s, "  writes: {}", outs.join(", "));
    s
}

/// The whole partition: groups, rejected fusions, summary.
pub fn explain(g: &Graph, p: &Partition, t: &Target) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "partition of '{}' for {} ({} units, {:.0} GB/s, {:.0}/{:.0} GFLOP/s mma16/f32, {} KB scratch/unit, launch {:.1} us)",
        g.name,
        t.name,
        t.units,
        t.mem_bw / 1e9,
        t.peak_mma_16 / 1e9,
        t.peak_f32 / 1e9,
        t.scratch_per_unit / 1024,
        t.launch_s * 1e6
    );
    for gr in &p.groups {
        s.push_str(&explain_group(g, p, t, gr.id));
    }
    let _ = writeln!(s, "rejected fusions ({}):", p.rejected.len());
    for r in &p.rejected {
        let _ = writeln!(
            s,
            "  #{} -> #{}: {:?}: {}",
            r.producer, r.consumer, r.reason, r.detail
        );
    }
    let mut by: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    for gr in &p.groups {
        let e = by.entry(gr.kind.to_string()).or_insert((0, 0.0));
        e.0 += 1;
        e.1 += gr.time_s;
    }
    let parts: Vec<String> = by
        .iter()
        .map(|(k, (n, ts))| format!("{k} {n} ({:.1} us)", ts * 1e6))
        .collect();
    let _ = writeln!(
        s,
        "summary: {} groups: {}; total est {:.1} us",
        p.groups.len(),
        parts.join(", "),
        p.total_time() * 1e6
    );
    s
}
