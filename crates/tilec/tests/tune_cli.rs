//! The tuner end to end through the binary, on a small model: `tilec tune` stores parameters
//! for this machine, `run` and `explain` then use them (origin `tuned`, exact shape, then the
//! shape bucket for another size of the symbolic dimension), `--no-tuning` ignores them, the
//! outputs still match the reference; export and import carry them; a corrupted database is
//! ignored by `run` with a note and refused by `tune`; stale entries are ignored with a note.
//! Every database is in the test's scratch folder, never the user's.

use std::process::Command;

use tilec::Tensor;

mod common;
use common::*;

/// `relu(x @ w + b)` with x `[n, 64]`, w `[64, 96]`: one GEMM kernel with an epilogue.
fn gemm_model(dir: &std::path::Path) -> std::path::PathBuf {
    let konst = |name: &str, shape: &[usize]| {
        let n: usize = shape.iter().product();
        let vals = (0..n).map(|i| ((i * 7919) % 997) as f32 / 997.0 - 0.5).collect();
        tilec_onnx::tensor::tensor_to_proto(name, &Tensor::from_vec(shape.to_vec(), vals).unwrap())
    };
    let mut m = model(
        vec![
            node("mm", "MatMul", &["x", "w"], &["p"]),
            node("bias", "Add", &["p", "b"], &["q"]),
            node("relu", "Relu", &["q"], &["y"]),
        ],
        vec![vi("x", F32, &[D::P("n"), D::N(64)])],
        vec![vi("y", F32, &[D::P("n"), D::N(96)])],
    );
    let g = m.graph.as_mut().unwrap();
    g.initializer = vec![konst("w", &[64, 96]), konst("b", &[96])];
    save(dir, "gemm.onnx", &m)
}

/// Runs the binary with the tuning database at `db` and a private kernel cache.
fn tilec_db(db: &std::path::Path, args: &[&str]) -> Out {
    let cache = db.parent().unwrap().join("kernel-cache");
    let out = Command::new(env!("CARGO_BIN_EXE_tilec"))
        .args(args)
        .env("TILEC_TUNING_DB", db)
        .env("TILEC_CACHE_DIR", cache)
        .output()
        .expect("the tilec binary runs");
    let o = Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(!o.stderr.contains("panicked"), "tilec panicked:\n{}", o.stderr);
    o
}

#[test]
fn tune_then_run_uses_the_tuned_parameters() {
    let dir = scratch("tune_e2e");
    let m = gemm_model(&dir);
    let m = m.to_str().unwrap();
    let db = dir.join("db").join("tuning.sqlite");

    let o = tilec_db(&db, &["tune", m, "--dim", "n=100", "--budget", "3", "--max-candidates", "4"]);
    o.ok();
    assert!(o.stdout.contains("speedup") && o.stdout.contains("cpu.blis_gemm"), "{}", o.stdout);
    assert!(db.is_file());
    // Tuning again skips what the database knows.
    let o = tilec_db(&db, &["tune", m, "--dim", "n=100", "--budget", "3", "--max-candidates", "4"]);
    o.ok();
    assert!(o.stdout.contains("--retune measures again"), "{}", o.stdout);

    // explain and run take the tuned parameters for this shape; outputs still match.
    let o = tilec_db(&db, &["explain", m, "--dim", "n=100"]);
    o.ok();
    assert!(o.stdout.contains("cpu.blis_gemm (tuned: mr="), "{}", o.stdout);
    assert!(o.stdout.contains("for this shape"), "{}", o.stdout);
    let o = tilec_db(&db, &["run", m, "--dim", "n=100", "--compare-ref", "--stats"]);
    o.ok();
    assert!(o.stdout.contains("tuning: 1 kernels with tuned parameters"), "{}", o.stdout);
    assert!(o.stdout.contains("(tuned: mr="), "{}", o.stdout);
    assert!(o.stdout.contains("all 1 checked outputs match"), "{}", o.stdout);
    // Another size in the same power-of-two bucket (100 and 120 round up to 128).
    let o = tilec_db(&db, &["run", m, "--dim", "n=120", "--compare-ref", "--stats"]);
    o.ok();
    assert!(o.stdout.contains("for a shape of the same bucket"), "{}", o.stdout);
    assert!(o.stdout.contains("all 1 checked outputs match"), "{}", o.stdout);
    // Another bucket: the heuristic.
    let o = tilec_db(&db, &["run", m, "--dim", "n=300", "--stats"]);
    o.ok();
    assert!(o.stdout.contains("cpu.blis_gemm (heuristic"), "{}", o.stdout);
    // --no-tuning ignores the database.
    let o = tilec_db(&db, &["run", m, "--dim", "n=100", "--no-tuning", "--stats", "--json"]);
    o.ok();
    assert!(o.stdout.contains("cpu.blis_gemm (heuristic"), "{}", o.stdout);
    assert!(o.stdout.contains("\"tuned_kernels\":0"), "{}", o.stdout);

    // Export, import into another database: the entry travels.
    let lines = dir.join("export.jsonl");
    let o = tilec_db(&db, &["tune", "--export", lines.to_str().unwrap()]);
    o.ok();
    assert_eq!(std::fs::read_to_string(&lines).unwrap().lines().count(), 1);
    let other = dir.join("other.sqlite");
    tilec_db(&other, &["tune", "--import", lines.to_str().unwrap()]).ok();
    let o = tilec_db(&other, &["explain", m, "--dim", "n=100"]);
    assert!(o.ok().stdout.contains("(tuned: mr="), "{}", o.stdout);
    let copy = dir.join("copy.sqlite");
    tilec_db(&db, &["tune", "--export", copy.to_str().unwrap()]).ok();
    let o = tilec_db(&copy, &["explain", m, "--dim", "n=100"]);
    assert!(o.ok().stdout.contains("(tuned: mr="), "{}", o.stdout);

    // An entry of another tilec version is stale: ignored with a note.
    let text = std::fs::read_to_string(&lines).unwrap();
    let stale_lines = dir.join("stale.jsonl");
    let v = format!("\"tilec_version\":\"{}+", env!("CARGO_PKG_VERSION"));
    assert!(text.contains(&v), "{text}");
    std::fs::write(&stale_lines, text.replace(&v, "\"tilec_version\":\"0.0.0-old+")).unwrap();
    let stale = dir.join("stale.sqlite");
    tilec_db(&stale, &["tune", "--import", stale_lines.to_str().unwrap()]).ok();
    let o = tilec_db(&stale, &["run", m, "--dim", "n=100", "--stats"]);
    o.ok();
    assert!(o.stdout.contains("cpu.blis_gemm (heuristic"), "{}", o.stdout);
    assert!(o.stdout.contains("stale: measured with tilec 0.0.0-old"), "{}", o.stdout);
}

#[test]
fn a_corrupted_database_is_ignored_by_run_and_refused_by_tune() {
    let dir = scratch("tune_corrupt");
    let m = gemm_model(&dir);
    let m = m.to_str().unwrap();
    let bad = dir.join("bad.sqlite");
    std::fs::write(&bad, b"definitely not a database").unwrap();
    let o = tilec_db(&bad, &["run", m, "--dim", "n=8", "--compare-ref", "--stats"]);
    o.ok();
    assert!(o.stdout.contains("not an SQLite file") && o.stdout.contains("tuning ignored"), "{}", o.stdout);
    assert!(o.stdout.contains("all 1 checked outputs match"), "{}", o.stdout);
    let o = tilec_db(&bad, &["tune", m, "--dim", "n=8", "--budget", "1"]);
    o.fails_with(&["not an SQLite file", "TILEC_TUNING_DB"]);
    assert_eq!(std::fs::read(&bad).unwrap(), b"definitely not a database", "left as it was");
    // Bad arguments fail cleanly.
    tilec_db(&dir.join("x.sqlite"), &["tune"]).fails_with(&["nothing to do"]);
    tilec_db(&dir.join("x.sqlite"), &["tune", m, "--target", "cuda", "--threads", "2"]).fails_with(&["--threads"]);
    tilec_db(&dir.join("x.sqlite"), &["tune", m, "--budget", "0"]).fails_with(&["budget"]);
    tilec_db(&dir.join("x.sqlite"), &["tune", "--import", dir.join("missing.jsonl").to_str().unwrap()])
        .fails_with(&["missing.jsonl"]);
}

/// The real GEMM family: every candidate passes its constraints, the refused points are
/// pruned before anything is built (`candidates` builds nothing), and the measurer builds
/// exactly what it is handed.
#[test]
fn blis_gemm_candidates_are_pruned_before_building() {
    use tilec::ir::op::LinalgOp;
    use tilec::ir::{DType, Graph, Op, TensorType};
    use tilec_opt::target::Target;
    use tilec_tile::family::Problem;
    let mut g = Graph::new("t");
    let a = g.add_input("a", TensorType::fixed(DType::F32, &[40, 64]));
    let b = g.add_input("b", TensorType::fixed(DType::F32, &[64, 48]));
    let c = g.add(Op::Linalg(LinalgOp::MatMul), &[a, b]).unwrap();
    g.set_outputs(vec![c]);
    let p = Problem::of_node(&g, g.node_ids().next().unwrap(), "k0");
    let t = Target::host_cpu();
    let f = tilec_cpu::families::registry().get("cpu.blis_gemm").unwrap();
    let cands = tilec::tuner::candidates(f, &p, &t);
    assert!(!cands.pruned.is_empty(), "some points of the space break the constraints");
    // The heuristic is measured first whether or not it is a point of the space.
    assert!(cands.list.len() + cands.pruned.len() >= cands.space);
    for x in &cands.list {
        assert!(f.check(&p, &t, &x.params).is_ok(), "{}", x.params);
    }
    for (q, _) in &cands.pruned {
        assert!(f.check(&p, &t, q).is_err(), "{q}");
    }
    assert!(cands.list[0].heuristic && cands.modeled);
    // The measurer builds only what it is given: 3 candidates, 3 builds.
    let mut m = tilec::tune::CpuMeasurer::new(&p, f, &t, 1, tilec::tune::Timing { min_runs: 1, max_runs: 2, ..Default::default() })
        .unwrap();
    let batch: Vec<_> = cands.list.iter().take(3).map(|c| c.params.clone()).collect();
    let outs = tilec::tuner::Measurer::measure(&mut m, &batch);
    assert_eq!(m.builds, 3);
    assert!(outs.iter().all(|o| o.ns().is_some()), "{outs:?}");
}
