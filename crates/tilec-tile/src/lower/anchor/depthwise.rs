//! Depthwise and narrow grouped convolutions (`I <= 8` input channels per group, `M <= 8`
//! output channels per group: depthwise when `I = 1`, `M` its channel multiplier),
//! channels-last and 2-D, as loops vectorized along the groups with register blocks of
//! output pixels along W and no bounds checks at all. Only useful multiply-adds are done:
//! a vector lane is one group, and accumulates over that group's own input channels.
//!
//! The kernel: the weights transposed into a local `[taps, M, I, G]` buffer (so that a vector
//! of groups reads one tap's weights contiguously), a nest that reads only the weights, so
//! that the CPU back end prepares it once ahead of the calls when they are constants (a pack
//! slot) and per call otherwise; then, in parallel over
//! the output rows (`N × OH`), a row's pixels in *blocks*: per block one loop over the
//! groups (vectorized) holding one accumulator per pixel and output channel of the group
//! (`M` of them, output channels `g·M + j` a stride `M` apart), the taps and the group's
//! input channels `g·I + i` (a stride `I` apart) unrolled into straight-line multiply-adds
//! that load each input once for all `M`, then the bias and the group's epilogue per pixel
//! and output channel.
//!
//! Without `wide` (no AVX-512), a grouped convolution (`I > 1`) first copies each output
//! row's input rows group-minor into a local `[KH, W, I, G]` buffer, which the blocks read
//! contiguously: in place a vector of groups is `I` apart, a gather at every tap (AVX2 has no
//! cheap one), and each element is copied once per window row instead.
//!
//! Padding never becomes a condition: the rows and columns whose windows lie wholly inside
//! the input (the *interior*, a range of rows or columns computed here) read every tap; each
//! border row and border column is a separate block of code at its fixed coordinate in which
//! only the taps inside the input appear (a tap in the padding contributes nothing, exactly
//! as the reference's sum skips it). A row loop iteration branches once on its row (interior,
//! or which border row); inside, the border columns on the left, the interior in blocks of
//! `R` pixels, a last shorter block, the border columns on the right. Convolutions with more
//! than [`MAX_BORDER`] border rows or columns (padding far beyond the kernel) are refused.

use tilec_ir::op::Window;
use tilec_ir::{DType, NodeId};

use super::common::val;
use super::super::{bin, compute_dtype, lit, Lowerer, R};
use crate::ir::*;

/// Most border rows (or columns) on each side, each its own copy of the row (column) code.
pub const MAX_BORDER: i64 = 8;
/// Most multiply-adds in one block's straight-line body (pixels × taps).
const MAX_BLOCK_TERMS: i64 = 512;
/// Most pixels in a block: the accumulators, one vector register each, and the loaded
/// inputs and weights stay within the 16 (AVX2) or 32 (AVX-512) vector registers.
const MAX_BLOCK: i64 = 8;

/// The loop name prefixes the CPU family's schedule looks for.
pub const ROW_LOOP: &str = "dwrow";
pub const CHANNEL_LOOP: &str = "dwc";

/// Pixels per register block for a kernel of `taps` taps, `i` input and `m` output channels
/// per group (one accumulator per pixel and output channel). A grouped convolution (`i > 1`)
/// loads `m` weight vectors per tap and input channel, and with `wide` (32 vector registers)
/// its blocks hold at least two pixels, so that each weight serves two of them.
pub fn block_pixels(taps: i64, i: i64, m: i64, wide: bool) -> i64 {
    let m = m.max(1);
    let p = (MAX_BLOCK_TERMS / (taps.max(1) * i.max(1) * m)).clamp(1, (MAX_BLOCK / m).max(1));
    if i > 1 && wide {
        p.max(2)
    } else {
        p
    }
}

/// One spatial axis: output size, the interior range `[lo, hi)` of output positions whose
/// window lies inside the input, and for each border position the taps inside.
pub(super) struct Axis {
    pub(super) out: i64,
    pub(super) lo: i64,
    pub(super) hi: i64,
    pub(super) stride: i64,
    pub(super) dil: i64,
    pub(super) pad: i64,
    pub(super) size: i64,
    pub(super) k: i64,
}

impl Axis {
    pub(super) fn new(size: i64, k: i64, stride: i64, dil: i64, pad: i64, out: i64) -> Axis {
        // o*s - pad >= 0  and  o*s - pad + (k-1)*dil <= size - 1.
        let lo = ((pad + stride - 1) / stride).min(out);
        let top = size - 1 + pad - (k - 1) * dil;
        let hi = if top < 0 { lo } else { (top / stride + 1).clamp(lo, out) };
        Axis { out, lo, hi, stride, dil, pad, size, k }
    }

    /// The output positions outside the interior.
    pub(super) fn border(&self) -> Vec<i64> {
        (0..self.lo).chain(self.hi..self.out).collect()
    }

    /// The taps of output position `o` that fall inside the input.
    pub(super) fn taps_at(&self, o: i64) -> Vec<i64> {
        (0..self.k).filter(|t| (0..self.size).contains(&(o * self.stride + t * self.dil - self.pad))).collect()
    }

    /// The input coordinate of tap `t` at output position `o`.
    pub(super) fn coord(&self, l: &Lowerer, o: &Expr, t: i64) -> Expr {
        l.simp(bin(BinOp::Add, bin(BinOp::Mul, o.clone(), Expr::Int(self.stride)), Expr::Int(t * self.dil - self.pad)))
    }
}

/// Why a convolution is not one this lowering takes (`None`: it is), from its shapes.
pub fn refusal(xs: &[i64], ws: &[i64], group: usize, channels_last: bool, w: &Window, geo: &[(i64, i64, i64)]) -> Option<String> {
    if xs.len() != 4 {
        return Some(format!("a {}-D convolution, not 2-D", xs.len().saturating_sub(2)));
    }
    if !channels_last {
        return Some("not channels-last".into());
    }
    let (c, g) = (xs[3], group as i64);
    if g < 1 || c % g != 0 || ws[1] != c / g || ws[0] % g != 0 || ws[0] == 0 {
        return Some(format!("not a grouped convolution ({group} groups, {c} input and {} output channels)", ws[0]));
    }
    if ws[1] > MAX_BLOCK {
        return Some(format!("{} input channels per group, more than {MAX_BLOCK}", ws[1]));
    }
    if ws[0] / g > MAX_BLOCK {
        return Some(format!("{} output channels per group, more than {MAX_BLOCK}", ws[0] / g));
    }
    border_refusal(xs, ws, w, geo)
}

/// Why a channels-last window over `xs` with weights `ws` has too many border positions on
/// some spatial axis (more than [`MAX_BORDER`]: padding far beyond the kernel), if it does.
pub(super) fn border_refusal(xs: &[i64], ws: &[i64], w: &Window, geo: &[(i64, i64, i64)]) -> Option<String> {
    for (j, &(o, pb, _)) in geo.iter().enumerate() {
        let a = Axis::new(xs[1 + j], ws[2 + j], w.strides[j] as i64, w.dilations[j] as i64, pb, o);
        if a.lo > MAX_BORDER || a.out - a.hi > MAX_BORDER {
            return Some(format!(
                "{} border positions on axis {j} (padding far beyond the kernel), more than {MAX_BORDER}",
                a.lo.max(a.out - a.hi)
            ));
        }
    }
    None
}

/// Lowers the depthwise conv `n` (see the module doc); anything [`refusal`] names is
/// `Unsupported` with its reason.
pub(crate) fn conv(l: &mut Lowerer, n: NodeId, w: &Window, group: usize, cl: bool, geo: &[(i64, i64, i64)], wide: bool) -> R<Vec<Stmt>> {
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
    let (nb, h, wd) = (xs[0], xs[1], xs[2]);
    let (c, cin) = (group as i64, ws[1]);
    let (kh, kw) = (ws[2], ws[3]);
    let taps = kh * kw;
    let mult = ws[0] / c;
    let ay = Axis::new(h, kh, w.strides[0] as i64, w.dilations[0] as i64, geo[0].1, geo[0].0);
    let ax = Axis::new(wd, kw, w.strides[1] as i64, w.dilations[1] as i64, geo[1].1, geo[1].0);
    let rb = block_pixels(taps, cin, mult, wide);

    // Weights transposed to [taps, M, I, G].
    let wbuf = l.scratch(cd, vec![taps, mult, cin, c]);
    let tv = l.loop_var("dwt", taps);
    let jv = l.loop_var("dwj", mult);
    let iv = l.loop_var("dwi", cin);
    let cv = l.loop_var(CHANNEL_LOOP, c);
    let m = l.begin_block();
    let oc = l.simp(bin(BinOp::Add, bin(BinOp::Mul, Expr::Var(cv), Expr::Int(mult)), Expr::Var(jv)));
    let wv = val(l, wt, &[oc, Expr::Var(iv), bin(BinOp::Div, Expr::Var(tv), Expr::Int(kw)), bin(BinOp::Rem, Expr::Var(tv), Expr::Int(kw))]);
    let mut wbody = l.end_block(m);
    wbody.push(Stmt::store(wbuf, vec![Expr::Var(tv), Expr::Var(jv), Expr::Var(iv), Expr::Var(cv)], wv?));
    let transpose = Lowerer::nest(&[(tv, taps), (jv, mult), (iv, cin), (cv, c)], wbody);

    // Every pixel of every block runs the epilogue from the same state.
    let stored = l.stored();
    // Without AVX-512, a grouped convolution's rows of input are first copied group-minor
    // (`[KH, W, I, G]`), so that the blocks read a vector of groups contiguously: in place,
    // its lanes are `I` apart, a gather at each of the taps that read the element.
    let rows = (cin > 1 && !wide).then(|| l.scratch(cd, vec![kh, wd, cin, c]));
    let cx = Cx { x, bias, out, d, cd, c, cin, mult, kw, wbuf, rows, ay: &ay, ax: &ax, stored };
    let row = l.loop_var(ROW_LOOP, nb * ay.out);
    let n_e = l.simp(bin(BinOp::Div, Expr::Var(row), Expr::Int(ay.out)));
    let oh_e = l.simp(bin(BinOp::Rem, Expr::Var(row), Expr::Int(ay.out)));
    // The row kinds: interior rows (any of them at run time) and each border row.
    let all_kh: Vec<i64> = (0..kh).collect();
    let interior = if ay.hi > ay.lo { Some(cx.row(l, &n_e, &oh_e, &all_kh, rb)?) } else { None };
    let mut chain: Vec<Stmt> = vec![];
    for &r in ay.border().iter().rev() {
        // The row index stays an expression of the row loop (equal to `r` here), so that the
        // schedule sees the rows' stores apart.
        let body = cx.row(l, &n_e, &oh_e, &ay.taps_at(r), rb)?;
        let cond = bin(BinOp::Eq, oh_e.clone(), Expr::Int(r));
        chain = if chain.is_empty() { body } else { vec![Stmt::If { cond, then_: body, else_: chain }] };
    }
    let mut row_body: Vec<Stmt> = rows.map(Stmt::Alloc).into_iter().collect();
    row_body.extend(match interior {
        Some(body) if chain.is_empty() => body,
        Some(body) => {
            let inside = bin(BinOp::And, bin(BinOp::Ge, oh_e.clone(), Expr::Int(ay.lo)), bin(BinOp::Lt, oh_e.clone(), Expr::Int(ay.hi)));
            vec![Stmt::If { cond: l.simp(inside), then_: body, else_: chain }]
        }
        None => chain,
    });
    let mut st = vec![Stmt::Alloc(wbuf)];
    st.extend(transpose);
    st.push(Stmt::for_(row, nb * ay.out, row_body));
    Ok(st)
}

/// What every block of one convolution shares.
struct Cx<'a> {
    x: tilec_ir::ValueId,
    bias: tilec_ir::ValueId,
    out: tilec_ir::ValueId,
    d: DType,
    cd: DType,
    /// Groups.
    c: i64,
    /// Input channels per group.
    cin: i64,
    /// Output channels per group.
    mult: i64,
    kw: i64,
    wbuf: BufId,
    /// The grouped convolution's input rows of an output row, `[KH, W, I, G]` (see `conv`).
    rows: Option<BufId>,
    ay: &'a Axis,
    ax: &'a Axis,
    /// The group outputs stored before the convolution.
    stored: std::collections::HashSet<tilec_ir::ValueId>,
}

impl Cx<'_> {
    /// The code of one output row `oh` (of image `n_e`) whose windows have the rows `khs`
    /// inside the input: border columns, interior blocks of `rb` pixels, a shorter last block.
    fn row(&self, l: &mut Lowerer, n_e: &Expr, oh_e: &Expr, khs: &[i64], rb: i64) -> R<Vec<Stmt>> {
        let ax = self.ax;
        let all_kw: Vec<i64> = (0..ax.k).collect();
        let mut st = vec![];
        if let Some(rows) = self.rows {
            for &r in khs {
                let ih = self.ay.coord(l, oh_e, r);
                let (wv, iv, cv) = (l.loop_var("dww", ax.size), l.loop_var("dwi", self.cin), l.loop_var(CHANNEL_LOOP, self.c));
                let mark = l.begin_block();
                let xc = l.simp(bin(BinOp::Add, bin(BinOp::Mul, Expr::Var(cv), Expr::Int(self.cin)), Expr::Var(iv)));
                let xv = val(l, self.x, &[n_e.clone(), ih, Expr::Var(wv), xc]);
                let mut body = l.end_block(mark);
                body.push(Stmt::store(rows, vec![Expr::Int(r), Expr::Var(wv), Expr::Var(iv), Expr::Var(cv)], xv?));
                st.extend(Lowerer::nest(&[(wv, ax.size), (iv, self.cin), (cv, self.c)], body));
            }
        }
        for o in 0..ax.lo {
            st.push(self.block(l, n_e, oh_e, khs, &[(Expr::Int(o), ax.taps_at(o))])?);
        }
        let inner = ax.hi - ax.lo;
        let (blocks, rem) = (inner / rb, inner % rb);
        if blocks > 0 {
            let bv = (blocks > 1).then(|| l.loop_var("dwb", blocks));
            let base = match bv {
                Some(v) => bin(BinOp::Add, bin(BinOp::Mul, Expr::Var(v), Expr::Int(rb)), Expr::Int(ax.lo)),
                None => Expr::Int(ax.lo),
            };
            let cols: Vec<(Expr, Vec<i64>)> =
                (0..rb).map(|i| (l.simp(bin(BinOp::Add, base.clone(), Expr::Int(i))), all_kw.clone())).collect();
            let b = self.block(l, n_e, oh_e, khs, &cols)?;
            st.push(match bv {
                Some(v) => Stmt::for_(v, blocks, vec![b]),
                None => b,
            });
        }
        if rem > 0 {
            let start = ax.lo + blocks * rb;
            let cols: Vec<(Expr, Vec<i64>)> = (0..rem).map(|i| (Expr::Int(start + i), all_kw.clone())).collect();
            st.push(self.block(l, n_e, oh_e, khs, &cols)?);
        }
        for o in ax.hi..ax.out {
            st.push(self.block(l, n_e, oh_e, khs, &[(Expr::Int(o), ax.taps_at(o))])?);
        }
        Ok(st)
    }

    /// One loop over the groups computing the pixels `cols` (column, taps inside the input) of row
    /// `oh_e`, rows `khs` of the window inside the input.
    fn block(&self, l: &mut Lowerer, n_e: &Expr, oh_e: &Expr, khs: &[i64], cols: &[(Expr, Vec<i64>)]) -> R<Stmt> {
        let cv = l.loop_var(CHANNEL_LOOP, self.c);
        let ch = Expr::Var(cv);
        let mark = l.begin_block();
        let mut body = vec![];
        let mult = self.mult as usize;
        // accs[i * M + j]: pixel i, output channel g·M + j.
        let mut accs: Vec<Option<VarId>> = vec![None; cols.len() * mult];
        for &r in khs {
            let ih = self.ay.coord(l, oh_e, r);
            for t in 0..self.kw {
                if !cols.iter().any(|(_, ts)| ts.contains(&t)) {
                    continue;
                }
                // Input channel g·I + ci of each pixel, against output channels g·M + j.
                for ci in 0..self.cin {
                    let mut wvs = Vec::with_capacity(mult);
                    for j in 0..mult {
                        let wv = l.elem_var("w", self.cd, false);
                        let at = vec![Expr::Int(r * self.kw + t), Expr::Int(j as i64), Expr::Int(ci), ch.clone()];
                        body.push(Stmt::Let { var: wv, value: Expr::Load(self.wbuf, at) });
                        wvs.push(wv);
                    }
                    let xc = l.simp(bin(BinOp::Add, bin(BinOp::Mul, ch.clone(), Expr::Int(self.cin)), Expr::Int(ci)));
                    for (i, (ow, ts)) in cols.iter().enumerate() {
                        if !ts.contains(&t) {
                            continue;
                        }
                        let iw = self.ax.coord(l, ow, t);
                        let xv = match self.rows {
                            Some(rows) => Expr::Load(rows, vec![Expr::Int(r), iw, Expr::Int(ci), ch.clone()]),
                            None => val(l, self.x, &[n_e.clone(), ih.clone(), iw, xc.clone()])?,
                        };
                        body.extend(l.take_lets());
                        let xv = if mult > 1 { l.hoist(xv, self.cd) } else { xv };
                        body.extend(l.take_lets());
                        for (j, &wv) in wvs.iter().enumerate() {
                            let prod = bin(BinOp::Mul, xv.clone(), Expr::Var(wv));
                            match accs[i * mult + j] {
                                None => {
                                    let a = l.elem_var("acc", self.cd, true);
                                    body.push(Stmt::Let { var: a, value: prod });
                                    accs[i * mult + j] = Some(a);
                                }
                                Some(a) => body.push(Stmt::Assign { var: a, value: bin(BinOp::Add, Expr::Var(a), prod) }),
                            }
                        }
                    }
                }
            }
        }

        let mut ocs = Vec::with_capacity(mult);
        let mut bvs = Vec::with_capacity(mult);
        for j in 0..mult as i64 {
            let oc = if mult > 1 { l.simp(bin(BinOp::Add, bin(BinOp::Mul, ch.clone(), Expr::Int(self.mult)), Expr::Int(j))) } else { ch.clone() };
            bvs.push(val(l, self.bias, std::slice::from_ref(&oc))?);
            ocs.push(oc);
        }
        body.extend(l.take_lets());
        for (i, (ow, _)) in cols.iter().enumerate() {
            for j in 0..mult {
                l.restore_stored(self.stored.clone());
                let sum = match accs[i * mult + j] {
                    Some(a) => bin(BinOp::Add, Expr::Var(a), bvs[j].clone()),
                    // Every tap in the padding: the bias alone.
                    None => bin(BinOp::Add, lit(0.0, self.cd), bvs[j].clone()),
                };
                let e = l.down(sum, self.d);
                let oidx = vec![n_e.clone(), oh_e.clone(), ow.clone(), ocs[j].clone()];
                body.extend(l.epilogue(self.out, &oidx, e)?);
            }
        }
        l.end_block(mark);
        Ok(Stmt::for_(cv, self.c, body))
    }
}
