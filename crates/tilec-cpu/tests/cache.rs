//! The library cache from the compiler's side: damaged, garbage and foreign entries are
//! rebuilt, a library that changes on disk after loading does not affect the loaded one, an
//! unusable cache directory only costs the cache, and concurrent compiles share one entry.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use tilec_cpu::{CompileOptions, Compiler, Module};
use tilec_ir::DType;
use tilec_tile::ir::*;

fn affine_kernel(name: &str, n: i64, a: f32, b: f32) -> Kernel {
    let mut k = Kernel::new(name);
    let x = k.param("x", DType::F32, vec![n]);
    let y = k.param("y", DType::F32, vec![n]);
    let i = k.index_var("i");
    let ax = Expr::bin(BinOp::Mul, Expr::load(x, vec![v(i)]), Expr::f32(a));
    k.body.push(Stmt::For(Loop {
        var: i,
        extent: n,
        kind: LoopKind::Vectorized,
        body: vec![Stmt::store(
            y,
            vec![v(i)],
            Expr::bin(BinOp::Add, ax, Expr::f32(b)),
        )],
    }));
    k
}

fn fresh_dir(name: &str) -> PathBuf {
    let d = cache_dir(&format!("cache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn compiler_in(dir: &Path) -> Compiler {
    Compiler::new(CompileOptions {
        cache_dir: Some(dir.to_path_buf()),
        jobs: 1,
        ..CompileOptions::default()
    })
}

/// Runs `k` from `m` and compares with the tile interpreter.
fn check(m: &Module, k: &Kernel, seed: u64) {
    let args = make_args(k, &mut rng(seed), true);
    let mut want = args.clone();
    tilec_tile::interp::run(k, &mut want).unwrap();
    let mut got = args;
    m.run(&k.name, &mut got).unwrap();
    assert_close(&k.name, &got[1], &want[1], tol_for(DType::F32));
}

/// Compiles `k` with a fresh compiler (another process, as far as the cache can tell).
fn compile_fresh(dir: &Path, k: &Kernel) -> Module {
    compiler_in(dir).compile(std::slice::from_ref(k)).unwrap()
}

#[test]
fn damaged_and_foreign_libraries_are_rebuilt() {
    let dir = fresh_dir("damaged");
    let k = affine_kernel("affine", 100, 2.0, 1.0);
    let other = affine_kernel("affine", 100, -3.0, 0.5);
    let m = compile_fresh(&dir, &k);
    assert!(!m.stats().cache_hit);
    let entry = m.stats().library.clone();
    assert!(
        entry.starts_with(&dir) && entry.is_file(),
        "{}",
        entry.display()
    );
    let good = std::fs::read(&entry).unwrap();
    let foreign_path = compile_fresh(&dir, &other).stats().library.clone();
    let foreign = std::fs::read(&foreign_path).unwrap();
    // A bare shared object of the other kernel, as an older tilec would have cached it.
    let elf = foreign.windows(4).position(|w| w == b"\x7fELF").unwrap();
    let bare_so = foreign[elf..].to_vec();
    let mut flipped = good.clone();
    let mid = good.len() / 2;
    flipped[mid] ^= 0x40;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated to nothing", vec![]),
        ("truncated by half", good[..good.len() / 2].to_vec()),
        ("garbage", vec![0xa5; good.len()]),
        ("another kernel's entry", foreign),
        ("another kernel's bare library", bare_so),
        ("a flipped byte", flipped),
    ];
    for (what, bytes) in cases {
        std::fs::write(&entry, &bytes).unwrap();
        let m = compile_fresh(&dir, &k);
        assert!(!m.stats().cache_hit, "{what}: the damaged entry was used");
        check(&m, &k, 1);
        assert_eq!(
            std::fs::read(&entry).unwrap().len(),
            good.len(),
            "{what}: not rebuilt"
        );
        let again = compile_fresh(&dir, &k);
        assert!(
            again.stats().cache_hit,
            "{what}: the rebuilt entry is not used"
        );
        check(&again, &k, 2);
    }
}

#[test]
fn a_loaded_library_does_not_change_with_its_entry() {
    let dir = fresh_dir("changed");
    let k = affine_kernel("affine", 257, 0.5, -1.0);
    compile_fresh(&dir, &k);
    let m = compile_fresh(&dir, &k);
    assert!(m.stats().cache_hit);
    let entry = m.stats().library.clone();
    let len = std::fs::metadata(&entry).unwrap().len();
    // Truncating the file a library was mapped from makes the next access fault (SIGBUS);
    // overwriting it changes the code under the caller. Neither reaches a loaded module.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&entry)
        .unwrap()
        .set_len(64)
        .unwrap();
    check(&m, &k, 3);
    std::fs::write(&entry, vec![0xcc; len as usize]).unwrap();
    check(&m, &k, 4);
    // The compilers are gone, and so are their work folders with the copies they loaded.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(left, vec![entry]);
}

#[test]
fn an_unusable_cache_directory_only_costs_the_cache() {
    let base = fresh_dir("unusable");
    std::fs::create_dir_all(&base).unwrap();
    let file = base.join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let k = affine_kernel("affine", 64, 3.0, 0.25);
    // Below a regular file (fails for root too), and a directory others may write to.
    let open = base.join("open");
    std::fs::create_dir(&open).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    for dir in [file.join("cache"), open.clone()] {
        let c = compiler_in(&dir);
        let m = c.compile(std::slice::from_ref(&k)).unwrap();
        check(&m, &k, 5);
        assert!(
            !m.stats().library.starts_with(&dir),
            "{}",
            m.stats().library.display()
        );
        // Compiling again in the same process uses the private directory.
        assert!(
            c.compile(std::slice::from_ref(&k))
                .unwrap()
                .stats()
                .cache_hit
        );
    }
    assert_eq!(std::fs::read_dir(&open).unwrap().count(), 0);
}

#[test]
fn a_cache_directory_of_another_user_is_not_used() {
    if tilec_runtime::cache::euid() != 0 {
        eprintln!("skipped: only root can give a directory to another user");
        return;
    }
    let dir = fresh_dir("theirs");
    let k = affine_kernel("affine", 64, -1.0, 2.0);
    let entry = compile_fresh(&dir, &k).stats().library.clone();
    // Someone else's now, with a valid-looking library inside.
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    let m = compile_fresh(&dir, &k);
    assert!(
        !m.stats().cache_hit,
        "loaded a library from another user's directory"
    );
    assert!(!m.stats().library.starts_with(&dir));
    check(&m, &k, 6);
    assert!(entry.is_file());
}

#[test]
fn concurrent_compiles_share_one_entry() {
    let dir = fresh_dir("concurrent");
    let ks: Vec<Kernel> = (0..3)
        .map(|i| affine_kernel(&format!("k{i}"), 40 + i, i as f32, 1.0))
        .collect();
    std::thread::scope(|s| {
        for t in 0..3 {
            let (dir, ks) = (&dir, &ks);
            s.spawn(move || {
                let m = compiler_in(dir).compile(ks).unwrap();
                for k in ks {
                    check(&m, k, 10 + t);
                }
            });
        }
    });
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].ends_with(".so.tilec"));
    assert!(compiler_in(&dir).compile(&ks).unwrap().stats().cache_hit);
}
