//! The kernel cache as the `tilec` binary meets it: corrupt, garbage and foreign entries,
//! cache directories that cannot be used or trusted, no `HOME`, and a compile killed by a
//! signal. Every case must end in a correct run (checked against the reference interpreter).

use prost::Message;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use tilec_onnx::proto::{GraphProto, ModelProto, NodeProto, OperatorSetIdProto, ValueInfoProto};

mod common;
use common::{vi, D};

fn scratch(test: &str) -> PathBuf {
    common::scratch(&format!("cache-{test}"))
}

fn f32_value(name: &str) -> ValueInfoProto {
    vi(name, 1, &[D::N(4), D::N(8)])
}



/// `y = op(x * x, x)` over f32[4, 8]: one fused elementwise kernel, different for each `op`.
fn save_model(dir: &Path, op: &str) -> PathBuf {
    let node = |name: &str, op_type: &str, inputs: &[&str], output: &str| NodeProto {
        name: name.into(),
        op_type: op_type.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    };
    let m = ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 17 }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: vec![node("square", "Mul", &["x", "x"], "t"), node("combine", op, &["t", "x"], "y")],
            input: vec![f32_value("x")],
            output: vec![f32_value("y")],
            ..Default::default()
        }),
        ..Default::default()
    };
    let p = dir.join(format!("{op}.onnx"));
    std::fs::write(&p, m.encode_to_vec()).unwrap();
    p
}

struct Run {
    stdout: String,
    stderr: String,
}

impl Run {
    fn from_cache(&self) -> bool {
        self.stdout.contains("from the cache")
    }
    fn warnings(&self) -> usize {
        self.stderr.matches("tilec: warning:").count()
    }
}

/// Runs the model compiled, checked against the reference interpreter, with the cache
/// variables cleared and then `env` set; asserts success.
fn run(model: &Path, env: &[(&str, &Path)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tilec"));
    cmd.args([Path::new("run"), model, Path::new("--compare-ref"), Path::new("--seed"), Path::new("3")]);
    for v in ["TILEC_CACHE_DIR", "XDG_CACHE_HOME", "HOME"] {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("the tilec binary runs");
    let r = Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        out.status.success() && r.stdout.contains("check 'y' against the reference interpreter: ok"),
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        r.stdout,
        r.stderr
    );
    r
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".so.tilec"))
        .collect();
    v.sort();
    v
}

#[test]
fn corrupt_garbage_and_foreign_entries_are_rebuilt() {
    let dir = scratch("corrupt");
    let cache = dir.join("cache");
    let model = save_model(&dir, "Sub");
    let env = [("TILEC_CACHE_DIR", cache.as_path())];
    let first = run(&model, &env);
    assert!(!first.from_cache() && first.warnings() == 0, "{}", first.stderr);
    let [entry] = &entries(&cache)[..] else { panic!("{:?}", entries(&cache)) };
    let good = std::fs::read(entry).unwrap();
    // Another model's entry in the same cache, to copy over this one.
    run(&save_model(&dir, "Add"), &env);
    let foreign = entries(&cache).into_iter().find(|p| p != entry).unwrap();
    let foreign = std::fs::read(foreign).unwrap();
    let damages: [(&str, Vec<u8>); 4] = [
        ("truncated", good[..good.len() / 3].to_vec()),
        ("empty", vec![]),
        ("garbage", b"\x7fELF\x02\x01\x01".repeat(1000)),
        ("foreign", foreign),
    ];
    for (what, bytes) in damages {
        std::fs::write(entry, bytes).unwrap();
        let r = run(&model, &env);
        assert!(!r.from_cache(), "{what}: used a damaged entry");
        assert_eq!(r.warnings(), 1, "{what}:\n{}", r.stderr);
        assert!(r.stderr.contains("removed the kernel cache entry"), "{what}:\n{}", r.stderr);
        let again = run(&model, &env);
        assert!(again.from_cache() && again.warnings() == 0, "{what}: not rebuilt\n{}", again.stderr);
    }
}

#[test]
fn unusable_cache_directories_fall_back_to_a_private_one() {
    let dir = scratch("unusable");
    let model = save_model(&dir, "Sub");
    let file = dir.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let open = dir.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut cases = vec![(file.join("cache"), "cannot be created"), (open.clone(), "writable by group or others")];
    if tilec::runtime::cache::euid() == 0 {
        let theirs = dir.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        cases.push((theirs, "owned by uid 65534"));
    }
    for (cache, why) in cases {
        let r = run(&model, &[("TILEC_CACHE_DIR", &cache)]);
        assert_eq!(r.warnings(), 1, "{}", r.stderr);
        assert!(r.stderr.contains(why) && r.stderr.contains("private directory"), "{}", r.stderr);
        if cache.is_dir() {
            assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 0, "wrote into {}", cache.display());
        }
    }
}

#[test]
fn the_cache_directory_follows_the_environment() {
    let dir = scratch("env");
    let model = save_model(&dir, "Sub");
    let (home, xdg, own) = (dir.join("home"), dir.join("xdg"), dir.join("own"));
    run(&model, &[("HOME", &home)]);
    assert_eq!(entries(&home.join(".cache/tilec")).len(), 1);
    run(&model, &[("HOME", &home), ("XDG_CACHE_HOME", &xdg)]);
    assert_eq!(entries(&xdg.join("tilec")).len(), 1);
    let r = run(&model, &[("HOME", &home), ("XDG_CACHE_HOME", &xdg), ("TILEC_CACHE_DIR", &own)]);
    assert!(!r.from_cache());
    assert_eq!(entries(&own).len(), 1);
    for d in [home.join(".cache/tilec"), xdg.join("tilec"), own] {
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700, "{}", d.display());
    }
}

#[test]
fn without_home_the_cache_is_a_private_per_user_directory() {
    let dir = scratch("nohome");
    let model = save_model(&dir, "Sub");
    let tmp = dir.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let euid = tilec::runtime::cache::euid();
    let cache = tmp.join(format!("tilec-{euid}"));
    let env = [("TMPDIR", tmp.as_path())];
    let r = run(&model, &env);
    assert_eq!(r.warnings(), 0, "{}", r.stderr);
    let m = std::fs::metadata(&cache).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (euid, 0o700));
    assert_eq!(entries(&cache).len(), 1);
    assert!(run(&model, &env).from_cache());
    // Someone else made that directory first and put a library in it: it is not used.
    std::fs::remove_dir_all(&cache).unwrap();
    std::fs::create_dir(&cache).unwrap();
    std::fs::write(cache.join("planted.so"), b"\x7fELF").unwrap();
    if euid == 0 {
        std::os::unix::fs::chown(&cache, Some(65534), Some(65534)).unwrap();
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o755)).unwrap();
    } else {
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let r = run(&model, &env);
    assert!(!r.from_cache());
    assert_eq!(r.warnings(), 1, "{}", r.stderr);
    assert!(r.stderr.contains(&cache.display().to_string()), "{}", r.stderr);
    let names: Vec<_> = std::fs::read_dir(&cache).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("planted.so")]);
}

#[test]
fn a_compile_killed_by_a_signal_leaves_nothing_that_breaks_the_next_run() {
    let dir = scratch("killed");
    let cache = dir.join("cache");
    let model = save_model(&dir, "Sub");
    // A C compiler that never finishes.
    let cc = dir.join("slow-cc");
    std::fs::write(&cc, "#!/bin/sh\n[ \"$1\" = --version ] && { echo slow-cc 1; exit 0; }\nexec sleep 60\n").unwrap();
    std::fs::set_permissions(&cc, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut child = {
        use std::os::unix::process::CommandExt;
        Command::new(env!("CARGO_BIN_EXE_tilec"))
            .args([Path::new("run"), &model])
            .env("TILEC_CACHE_DIR", &cache)
            .env("CC", &cc)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap()
    };
    // Wait until it compiles, then terminate it and its compiler.
    let work = format!("tmp-{}-", child.id());
    let started = std::time::Instant::now();
    let building = || {
        std::fs::read_dir(&cache).ok()?.flatten().find(|e| e.file_name().to_string_lossy().starts_with(&work)).and_then(
            |e| {
                std::fs::read_dir(e.path())
                    .ok()?
                    .flatten()
                    .find(|b| b.path().join("unit0.c").exists())
                    .map(|_| e.path())
            },
        )
    };
    let left = loop {
        if let Some(p) = building() {
            break p;
        }
        assert!(started.elapsed().as_secs() < 60, "the compile never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let kill = Command::new("kill").args(["-s", "TERM", "--", &format!("-{}", child.id())]).status().unwrap();
    assert!(kill.success());
    let status = child.wait().unwrap();
    assert!(!status.success());
    assert!(left.exists(), "the killed compile left nothing (the test proves nothing)");
    // The next run compiles, loads and removes the dead process's folder.
    let r = run(&model, &[("TILEC_CACHE_DIR", cache.as_path())]);
    assert!(!r.from_cache() && r.warnings() == 0, "{}", r.stderr);
    assert!(!left.exists(), "{} was not removed", left.display());
    let rest: Vec<_> = std::fs::read_dir(&cache).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(rest, entries(&cache));
}
