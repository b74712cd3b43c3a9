use tilec_cuda::*;
use tilec_ir::DType;
use tilec_tile::*;

#[test]
fn smoke() {
    let mut k = Kernel::new("add1");
    let x = k.param("x", DType::BF16, vec![64, 128]);
    let y = k.param("y", DType::BF16, vec![64, 128]);
    let b = k.index_var("b");
    let t = k.index_var("t");
    let v = k.index_var("v");
    let col = Expr::add(Expr::mul(Expr::var(t), Expr::Int(8)), Expr::var(v));
    let val = Expr::bin(BinOp::Add, Expr::cast(DType::F32, Expr::load(x, vec![Expr::var(b), col.clone()])), Expr::f32(1.0));
    let st = Stmt::store(y, vec![Expr::var(b), col], Expr::cast(DType::BF16, val));
    k.body.push(Stmt::For(Loop { var: b, extent: 64, kind: LoopKind::Bound(GpuAxis::BlockX), body: vec![
        Stmt::For(Loop { var: t, extent: 16, kind: LoopKind::Bound(GpuAxis::ThreadX), body: vec![
            Stmt::For(Loop { var: v, extent: 8, kind: LoopKind::Vectorized, body: vec![st] })]})]}));
    let src = render(&k).unwrap();
    println!("{}", &src.source[src.source.find("extern \"C\"").unwrap()..]);
    println!("{:?}", src.launch);
    let nv = match Nvrtc::load() { Ok(n) => n, Err(e) => { println!("skip: {e}"); return; } };
    println!("{nv:?}");
    let c = Compiler::new(nv, "sm_90a").with_cache_dir(None);
    let r = c.compile("add1", &src.source);
    match r { Ok(c) => println!("cubin {} bytes", c.image.len()), Err(e) => panic!("{e}") }
}
