//! Grouped convolutions with whole vectors of output channels per group (RegNet's and
//! ResNeXt's groups of 16 and 32), channels-last and 2-D, as a direct kernel vectorized
//! *within* each group: a vector's lanes are output channels of one group, each input
//! channel's value is broadcast to them, and a register block of output pixels shares every
//! weight vector. Only useful multiply-adds are done (no block-diagonal zeros, no im2col).
//!
//! The kernel: the weights transposed into a local `[G, taps, I, M]` buffer (a nest reading
//! only the weights, which the CPU back end runs once ahead of the calls when they are
//! constants), then one parallel loop over (image, group, output row), rows innermost so
//! that a thread's consecutive iterations keep one group's weights in L1. An iteration:
//!
//! 1. copies the group's `I` input channels of its window rows into a local `[KH, W, I]`
//!    buffer (read in place, pixels `C` floats apart — 4 KiB at ResNeXt's 1024 channels —
//!    would fall into a few L1 sets and evict one another);
//! 2. computes the row in blocks of up to `P` consecutive pixels (as even as the row allows):
//!    per block a loop over the group's `M` output channels, vectorized (the C compiler runs
//!    it a vector at a time), holding one accumulator per pixel; inside it a loop over the
//!    `I` input channels whose body is straight-line: per window row, each input column the
//!    block reads is loaded once (a broadcast) and multiplied into every (pixel, tap) that
//!    reads it; the sums go to a local `[OW, M]` buffer;
//! 3. runs the bias and the group's epilogue over the row's sums in a loop nest of its own
//!    (a branch in the epilogue, a ReLU's, would keep the compiler from vectorizing a loop
//!    around the input channels' loop; one store of the output lets the schedule prove the
//!    iterations apart).
//!
//! Padding never becomes a condition, as in `depthwise.rs` (its [`Axis`]): a row of the
//! border is its own copy of the code with only its window rows inside the input, and a
//! block's border pixels have only their taps inside the input; a row branches once on
//! which row it is. Blocks at fixed columns hold the border pixels, a loop runs the interior
//! blocks between them.

use tilec_ir::op::Window;
use tilec_ir::{DType, NodeId};

use super::common::val;
use super::depthwise::{border_refusal, Axis};
use super::super::{bin, compute_dtype, lit, Lowerer, R};
use crate::ir::*;

/// The loop name prefixes the CPU family's schedule looks for.
pub const ROW_LOOP: &str = "gdrow";
pub const LANE_LOOP: &str = "gdj";
/// Most input channels per group: the loop over them sits inside the vectorized loop, which
/// takes serial nests of at most this many iterations.
pub const MAX_IN_CHANNELS: i64 = crate::schedule::MAX_INNER_TRIPS;
/// Most multiply-adds in the straight-line body of one input channel (pixels × taps).
const MAX_TERMS: i64 = 512;

/// Pixels per register block for rows of `width` output pixels: at most `pixels` and
/// [`MAX_TERMS`] multiply-adds per input channel, as even as the row allows (a row of 14 in
/// two blocks of 7 rather than 8 and 6: a short block has too few accumulators to hide the
/// latency of its multiply-adds).
pub fn block_pixels(width: i64, taps: i64, pixels: i64) -> i64 {
    let most = pixels.clamp(1, (MAX_TERMS / taps.max(1)).max(1));
    let blocks = (width.max(1) + most - 1) / most;
    (width.max(1) + blocks - 1) / blocks
}

/// Why a convolution is not one this lowering takes (`None`: it is), from its shapes.
pub fn refusal(xs: &[i64], ws: &[i64], group: usize, channels_last: bool, w: &Window, geo: &[(i64, i64, i64)]) -> Option<String> {
    if xs.len() != 4 || ws.len() != 4 {
        return Some(format!("a {}-D convolution, not 2-D", xs.len().saturating_sub(2)));
    }
    if !channels_last {
        return Some("not channels-last".into());
    }
    let (c, g) = (xs[3], group as i64);
    if g < 2 || c % g != 0 || ws[1] != c / g || ws[0] % g != 0 || ws[0] == 0 {
        return Some(format!("not a grouped convolution ({group} groups, {c} input and {} output channels)", ws[0]));
    }
    if ws[1] > MAX_IN_CHANNELS {
        return Some(format!("{} input channels per group, more than {MAX_IN_CHANNELS}", ws[1]));
    }
    border_refusal(xs, ws, w, geo)
}

/// Lowers the grouped conv `n` (see the module doc) in blocks of `pixels` output pixels;
/// anything [`refusal`] names is `Unsupported` with its reason.
pub(crate) fn conv(l: &mut Lowerer, n: NodeId, w: &Window, group: usize, cl: bool, geo: &[(i64, i64, i64)], pixels: i64) -> R<Vec<Stmt>> {
    let node = l.node(n);
    let (x, wt, bias, out) = (node.inputs[0], node.inputs[1], node.inputs[2], node.outputs[0]);
    let (xs, ws) = (l.shape(x), l.shape(wt));
    if let Some(why) = refusal(&xs, &ws, group, cl, w, geo) {
        return l.unsupported(n, why);
    }
    if !l.dtype(x).is_float() || !l.dtype(out).is_float() || !l.dtype(wt).is_float() {
        return l.unsupported(n, "not a floating-point convolution");
    }
    let d = l.dtype(out);
    let cd = compute_dtype(d);
    let (nb, g) = (xs[0], group as i64);
    let (cin, kh, kw) = (ws[1], ws[2], ws[3]);
    let m = ws[0] / g;
    let taps = kh * kw;
    let ay = Axis::new(xs[1], kh, w.strides[0] as i64, w.dilations[0] as i64, geo[0].1, geo[0].0);
    let ax = Axis::new(xs[2], kw, w.strides[1] as i64, w.dilations[1] as i64, geo[1].1, geo[1].0);
    let rb = block_pixels(ax.out, taps, pixels);

    // Weights transposed to [G, taps, I, M].
    let wbuf = l.scratch(cd, vec![g, taps, cin, m]);
    let (gv, tv, iv, jv) = (l.loop_var("gdwg", g), l.loop_var("gdwt", taps), l.loop_var("gdwi", cin), l.loop_var("gdwj", m));
    let mark = l.begin_block();
    let oc = l.simp(bin(BinOp::Add, bin(BinOp::Mul, Expr::Var(gv), Expr::Int(m)), Expr::Var(jv)));
    let tap_h = bin(BinOp::Div, Expr::Var(tv), Expr::Int(kw));
    let tap_w = bin(BinOp::Rem, Expr::Var(tv), Expr::Int(kw));
    let wv = val(l, wt, &[oc, Expr::Var(iv), tap_h, tap_w]);
    let mut wbody = l.end_block(mark);
    let at = vec![Expr::Var(gv), Expr::Var(tv), Expr::Var(iv), Expr::Var(jv)];
    wbody.push(Stmt::store(wbuf, at, wv?));
    let transpose = Lowerer::nest(&[(gv, g), (tv, taps), (iv, cin), (jv, m)], wbody);

    let sums = l.scratch(cd, vec![ax.out, m]);
    let rows = l.scratch(cd, vec![kh, ax.size, cin]);
    let cx = Cx { x, bias, out, d, cd, cin, m, kw, wbuf, sums, rows, ay: &ay, ax: &ax };
    // One parallel iteration per (image, group, output row), rows innermost: a thread's
    // consecutive iterations share a group's weights, which stay in L1. (The quotient `q`
    // stays one expression in the image and the group, so that the schedule sees it pinned
    // down by both.)
    let it = l.loop_var(ROW_LOOP, nb * g * ay.out);
    let q = l.simp(bin(BinOp::Div, Expr::Var(it), Expr::Int(ay.out)));
    let n_e = bin(BinOp::Div, q.clone(), Expr::Int(g));
    let g_e = bin(BinOp::Rem, q, Expr::Int(g));
    let oh_e = l.simp(bin(BinOp::Rem, Expr::Var(it), Expr::Int(ay.out)));
    let all_kh: Vec<i64> = (0..kh).collect();
    let interior = if ay.hi > ay.lo { Some(cx.row(l, &g_e, &n_e, &oh_e, &all_kh, rb)?) } else { None };
    let mut chain: Vec<Stmt> = vec![];
    for &r in ay.border().iter().rev() {
        let body = cx.row(l, &g_e, &n_e, &oh_e, &ay.taps_at(r), rb)?;
        let cond = bin(BinOp::Eq, oh_e.clone(), Expr::Int(r));
        chain = if chain.is_empty() { body } else { vec![Stmt::If { cond, then_: body, else_: chain }] };
    }
    let mut row_body = vec![Stmt::Alloc(sums), Stmt::Alloc(rows)];
    row_body.extend(match interior {
        Some(body) if chain.is_empty() => body,
        Some(body) => {
            let inside = bin(BinOp::And, bin(BinOp::Ge, oh_e.clone(), Expr::Int(ay.lo)), bin(BinOp::Lt, oh_e.clone(), Expr::Int(ay.hi)));
            vec![Stmt::If { cond: l.simp(inside), then_: body, else_: chain }]
        }
        None => chain,
    });
    row_body.push(cx.epilogue(l, &g_e, &n_e, &oh_e)?);
    let mut st = vec![Stmt::Alloc(wbuf)];
    st.extend(transpose);
    st.push(Stmt::for_(it, nb * g * ay.out, row_body));
    Ok(st)
}

/// What every block of one convolution shares.
struct Cx<'a> {
    x: tilec_ir::ValueId,
    bias: tilec_ir::ValueId,
    out: tilec_ir::ValueId,
    d: DType,
    cd: DType,
    /// Input channels per group.
    cin: i64,
    /// Output channels per group.
    m: i64,
    kw: i64,
    wbuf: BufId,
    /// A row's sums `[OW, M]` (per row, so per thread), which the epilogue reads.
    sums: BufId,
    /// The group's input channels of a row's window rows, `[KH, W, I]`.
    rows: BufId,
    ay: &'a Axis,
    ax: &'a Axis,
}

impl Cx<'_> {
    /// The code of output row `oh_e` (of image `n_e`) whose windows have the rows `khs`
    /// inside the input, in blocks of `rb` pixels: blocks at fixed columns up to the first
    /// whose pixels are all interior (border pixels in them with their own taps), a loop over
    /// interior blocks, blocks at fixed columns for the rest.
    fn row(&self, l: &mut Lowerer, ge: &Expr, n_e: &Expr, oh_e: &Expr, khs: &[i64], rb: i64) -> R<Vec<Stmt>> {
        let ax = self.ax;
        let fixed = |o0: i64, o1: i64| -> Vec<(Expr, Vec<i64>)> { (o0..o1).map(|o| (Expr::Int(o), ax.taps_at(o))).collect() };
        let mut st = self.stage(l, ge, n_e, oh_e, khs)?;
        let mut start = 0;
        while start < ax.lo.min(ax.out) {
            let end = (start + rb).min(ax.out);
            st.push(self.block(l, ge, khs, &fixed(start, end))?);
            start = end;
        }
        let blocks = if ax.hi > start { (ax.hi - start) / rb } else { 0 };
        if blocks > 0 {
            let all_kw: Vec<i64> = (0..ax.k).collect();
            let bv = (blocks > 1).then(|| l.loop_var("gdb", blocks));
            let base = match bv {
                Some(v) => bin(BinOp::Add, bin(BinOp::Mul, Expr::Var(v), Expr::Int(rb)), Expr::Int(start)),
                None => Expr::Int(start),
            };
            let cols: Vec<(Expr, Vec<i64>)> =
                (0..rb).map(|i| (l.simp(bin(BinOp::Add, base.clone(), Expr::Int(i))), all_kw.clone())).collect();
            let b = self.block(l, ge, khs, &cols)?;
            st.push(match bv {
                Some(v) => Stmt::for_(v, blocks, vec![b]),
                None => b,
            });
            start += blocks * rb;
        }
        while start < ax.out {
            let end = (start + rb).min(ax.out);
            st.push(self.block(l, ge, khs, &fixed(start, end))?);
            start = end;
        }
        Ok(st)
    }

    /// Copies the group's input channels of the window rows `khs` of output row `oh_e` into
    /// `rows`, whose pixels are `I` apart: read in place, pixels `C` apart (4 KiB at 1024
    /// channels) would fall into the same few L1 sets and evict one another.
    fn stage(&self, l: &mut Lowerer, ge: &Expr, n_e: &Expr, oh_e: &Expr, khs: &[i64]) -> R<Vec<Stmt>> {
        let mut st = vec![];
        for &r in khs {
            let ih = self.ay.coord(l, oh_e, r);
            let iw = l.loop_var("gdw", self.ax.size);
            let ci = l.loop_var(LANE_LOOP, self.cin);
            let mark = l.begin_block();
            let xc = l.simp(bin(BinOp::Add, bin(BinOp::Mul, ge.clone(), Expr::Int(self.cin)), Expr::Var(ci)));
            let xv = val(l, self.x, &[n_e.clone(), ih, Expr::Var(iw), xc]);
            let mut body = l.end_block(mark);
            body.push(Stmt::store(self.rows, vec![Expr::Int(r), Expr::Var(iw), Expr::Var(ci)], xv?));
            st.push(Stmt::for_(iw, self.ax.size, vec![Stmt::for_(ci, self.cin, body)]));
        }
        Ok(st)
    }

    /// The loop over group `ge`'s output channels computing the consecutive pixels `cols`
    /// (column, taps inside the input) of a row whose window rows `khs` lie inside the input,
    /// from the staged `rows` into `sums`.
    fn block(&self, l: &mut Lowerer, ge: &Expr, khs: &[i64], cols: &[(Expr, Vec<i64>)]) -> R<Stmt> {
        let jv = l.loop_var(LANE_LOOP, self.m);
        let je = Expr::Var(jv);
        let mark = l.begin_block();
        let mut body = vec![];
        // accs[p]: pixel p, output channel g·M + j.
        let mut accs = Vec::with_capacity(cols.len());
        for _ in 0..cols.len() {
            let a = l.elem_var("acc", self.cd, true);
            body.push(Stmt::Let { var: a, value: lit(0.0, self.cd) });
            accs.push(a);
        }
        let ci = l.loop_var("gdi", self.cin);
        let inner_mark = l.begin_block();
        let mut inner = vec![];
        let (s, dil) = (self.ax.stride, self.ax.dil);
        for &r in khs {
            // The input columns the block reads on this window row, as offsets from its first
            // pixel's `ow · s`, each with the (pixel, tap) pairs that read it.
            let mut reads: Vec<(i64, Vec<(usize, i64)>)> = vec![];
            for (p, (_, ts)) in cols.iter().enumerate() {
                for &t in ts {
                    let off = p as i64 * s + t * dil;
                    match reads.iter_mut().find(|(o, _)| *o == off) {
                        Some((_, users)) => users.push((p, t)),
                        None => reads.push((off, vec![(p, t)])),
                    }
                }
            }
            reads.sort_by_key(|(o, _)| *o);
            for (_, users) in &reads {
                let (p0, t0) = users[0];
                let iw = self.ax.coord(l, &cols[p0].0, t0);
                let xv = Expr::Load(self.rows, vec![Expr::Int(r), iw, Expr::Var(ci)]);
                for &(p, t) in users {
                    let at = vec![ge.clone(), Expr::Int(r * self.kw + t), Expr::Var(ci), je.clone()];
                    let prod = bin(BinOp::Mul, xv.clone(), Expr::Load(self.wbuf, at));
                    let a = accs[p];
                    inner.push(Stmt::Assign { var: a, value: bin(BinOp::Add, Expr::Var(a), prod) });
                }
            }
        }
        inner.extend(l.end_block(inner_mark));
        body.push(Stmt::for_(ci, self.cin, inner));
        for (&a, (ow, _)) in accs.iter().zip(cols) {
            body.push(Stmt::store(self.sums, vec![ow.clone(), je.clone()], Expr::Var(a)));
        }
        l.end_block(mark);
        Ok(Stmt::for_(jv, self.m, body))
    }

    /// The bias and the group's epilogue over a row's sums, in a loop of its own: a branch in
    /// it (a ReLU's) would keep the C compiler from vectorizing the loop around the input
    /// channels' loop, and a single store of the output lets the schedule see the rows'
    /// iterations apart.
    fn epilogue(&self, l: &mut Lowerer, ge: &Expr, n_e: &Expr, oh_e: &Expr) -> R<Stmt> {
        let ow = l.loop_var("gdo", self.ax.out);
        let ev = l.loop_var(LANE_LOOP, self.m);
        let mark = l.begin_block();
        let mut tail = vec![];
        let oc = l.simp(bin(BinOp::Add, bin(BinOp::Mul, ge.clone(), Expr::Int(self.m)), Expr::Var(ev)));
        let bv = val(l, self.bias, std::slice::from_ref(&oc))?;
        tail.extend(l.take_lets());
        let sum = Expr::Load(self.sums, vec![Expr::Var(ow), Expr::Var(ev)]);
        let e = l.down(bin(BinOp::Add, sum, bv), self.d);
        let oidx = vec![n_e.clone(), oh_e.clone(), Expr::Var(ow), oc];
        tail.extend(l.epilogue(self.out, &oidx, e)?);
        tail.extend(l.take_lets());
        tail.extend(l.end_block(mark));
        Ok(Stmt::for_(ow, self.ax.out, vec![Stmt::for_(ev, self.m, tail)]))
    }
}
