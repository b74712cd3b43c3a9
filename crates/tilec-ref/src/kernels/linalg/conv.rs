//! Conv, ConvInteger, QLinearConv, ConvTranspose, DeformConv.
//!
//! Spatial ranks 1 to 3 run through one 3-D loop nest (missing leading axes have size 1).
//! The direct convolution walks, for each output plane (batch, output channel): each input
//! channel of its group, each kernel tap, each output row, and accumulates a contiguous
//! output row with a (strided) input row times the tap's weight.

use super::matmul::{param_at, requantize, round_to};
use super::{f32_vec, from_f32, par_chunks, threads_for, Num};
use tilec_ir::op::{window_geometry, Window};
use tilec_ir::{DType, Tensor};

/// Concrete geometry of one convolution, spatial axes padded to 3.
#[derive(Clone, Debug)]
struct Geom {
    n: usize,
    c: usize,
    m: usize,
    group: usize,
    ins: [usize; 3],
    outs: [usize; 3],
    k: [usize; 3],
    s: [usize; 3],
    d: [usize; 3],
    /// Begin padding (may be negative for transposed convolutions).
    pb: [isize; 3],
}

impl Geom {
    fn in_plane(&self) -> usize {
        self.ins.iter().product()
    }
    fn out_plane(&self) -> usize {
        self.outs.iter().product()
    }
    fn taps(&self) -> usize {
        self.k.iter().product()
    }
}

/// Pads a per-axis list of length `n <= 3` to 3 entries with leading `fill`s.
fn pad3<T: Copy>(v: &[T], fill: T) -> Result<[T; 3], String> {
    if v.len() > 3 {
        return Err(format!(
            "{} spatial axes are not supported (at most 3)",
            v.len()
        ));
    }
    let mut o = [fill; 3];
    o[3 - v.len()..].copy_from_slice(v);
    Ok(o)
}

/// Geometry of a (forward) convolution of `x [N, C, *S]` with `w [M, C/group, *K]`.
fn conv_geom(xs: &[usize], ws: &[usize], window: &Window, group: usize) -> Result<Geom, String> {
    if xs.len() < 3 || ws.len() != xs.len() {
        return Err(format!(
            "input {xs:?} and weights {ws:?} must be [N, C, spatial...] of equal rank"
        ));
    }
    let sp = xs.len() - 2;
    if window.rank() != sp {
        return Err(format!(
            "window has {} axes, input has {sp} spatial axes",
            window.rank()
        ));
    }
    let (n, c, m) = (xs[0], xs[1], ws[0]);
    if group == 0 || c != ws[1] * group || m % group != 0 {
        return Err(format!(
            "channels do not match: input {xs:?}, weights {ws:?}, group {group}"
        ));
    }
    if ws[2..] != window.kernel[..] {
        return Err(format!(
            "weights {ws:?} do not match kernel {:?}",
            window.kernel
        ));
    }
    let mut outs = Vec::new();
    let mut pbs = Vec::new();
    for (i, &len) in xs[2..].iter().enumerate() {
        let (o, pb, _) = window_geometry(len, window, i, false)?;
        outs.push(o);
        pbs.push(pb as isize);
    }
    Ok(Geom {
        n,
        c,
        m,
        group,
        ins: pad3(&xs[2..], 1)?,
        outs: pad3(&outs, 1)?,
        k: pad3(&window.kernel, 1)?,
        s: pad3(&window.strides, 1)?,
        d: pad3(&window.dilations, 1)?,
        pb: pad3(&pbs, 0)?,
    })
}

/// Output positions `o` in `[lo, hi)` with `0 <= o * s + off < len`.
#[inline]
fn valid_range(out_len: usize, in_len: usize, s: usize, off: isize) -> (usize, usize) {
    let s = s as isize;
    let lo = if off >= 0 { 0 } else { ((-off) + s - 1) / s };
    let last = in_len as isize - 1 - off;
    if last < 0 {
        return (0, 0);
    }
    let hi = ((last / s) + 1).min(out_len as isize);
    let lo = lo.min(hi);
    (lo as usize, hi as usize)
}

/// Register tile of the matrix-product kernel: output channels x output positions.
const MR: usize = 4;
const NR: usize = 8;

/// Convolution as a matrix product per (batch, group): `out[oc, j] = bias[oc] +
/// sum_r w[oc, r] * col[r, j]` where row `r = (icl, tap)` of the implicit im2col matrix
/// holds the input value output position `j` sees through that tap (0 in padding).
///
/// Columns are packed NR positions at a time into a small `[R][NR]` panel straight from
/// the input (no full im2col buffer); an MR x NR tile of accumulators then runs down `r`,
/// reading each panel row once for MR channels and each weight once for NR positions.
/// Threads take disjoint ranges of panels.
fn conv_core<A: Num>(x: &[A], w: &[A], bias: &[A], g: &Geom) -> Vec<A> {
    let (ip, op, taps) = (g.in_plane(), g.out_plane(), g.taps());
    let cg = g.c / g.group;
    let mg = g.m / g.group;
    let r_n = cg * taps;
    let mut out = vec![A::default(); g.n * g.m * op];
    if op == 0 || mg == 0 {
        return out;
    }
    // Per row r: input channel base and the tap's offsets on each axis.
    let mut rows: Vec<(usize, [isize; 3])> = Vec::with_capacity(r_n);
    for icl in 0..cg {
        for kd in 0..g.k[0] {
            for kh in 0..g.k[1] {
                for kw in 0..g.k[2] {
                    let off = [
                        (kd * g.d[0]) as isize - g.pb[0],
                        (kh * g.d[1]) as isize - g.pb[1],
                        (kw * g.d[2]) as isize - g.pb[2],
                    ];
                    rows.push((icl * ip, off));
                }
            }
        }
    }
    let panels = op.div_ceil(NR);
    let threads = threads_for(mg * r_n * op).min(panels);
    for b in 0..g.n {
        for grp in 0..g.group {
            let xg = &x[(b * g.c + grp * cg) * ip..][..cg * ip];
            let wg = &w[grp * mg * r_n..][..mg * r_n];
            let run =
                |p0: usize, p1: usize| -> Vec<A> { gemm_panels(xg, wg, &rows, g, mg, p0, p1) };
            let per = panels.div_ceil(threads.max(1));
            let parts: Vec<(usize, Vec<A>)> = if threads <= 1 {
                vec![(0, run(0, panels))]
            } else {
                std::thread::scope(|s| {
                    let hs: Vec<_> = (0..panels)
                        .step_by(per)
                        .map(|p0| {
                            let run = &run;
                            (p0, s.spawn(move || run(p0, (p0 + per).min(panels))))
                        })
                        .collect();
                    hs.into_iter()
                        .map(|(p0, h)| (p0, h.join().unwrap_or_default()))
                        .collect()
                })
            };
            // Scatter the [panel][oc][NR] tiles into [oc][position], adding the bias.
            for (p0, res) in parts {
                for (pi, tile) in res.chunks(mg * NR).enumerate() {
                    let j0 = (p0 + pi) * NR;
                    let valid = NR.min(op - j0);
                    for oc in 0..mg {
                        let m = grp * mg + oc;
                        let bv = bias[m];
                        let dst = &mut out[(b * g.m + m) * op + j0..][..valid];
                        for (d, &v) in dst.iter_mut().zip(&tile[oc * NR..oc * NR + valid]) {
                            *d = bv.plus(v);
                        }
                    }
                }
            }
        }
    }
    out
}

/// One MR x NR output tile: `sum_r wp[r][k] * panel[r][l]` (kept small and separate so
/// the compiler keeps the accumulators in vector registers).
#[inline(never)]
fn tile<A: Num>(panel: &[A], wp: &[A]) -> [[A; NR]; MR] {
    let mut acc = [[A::default(); NR]; MR];
    for (c, wv) in panel.chunks_exact(NR).zip(wp.chunks_exact(MR)) {
        let (Ok(c), Ok(wv)) = (<&[A; NR]>::try_from(c), <&[A; MR]>::try_from(wv)) else {
            continue;
        };
        for k in 0..MR {
            for l in 0..NR {
                acc[k][l] = acc[k][l].madd(wv[k], c[l]);
            }
        }
    }
    acc
}

/// One 1 x NR output tile (channel counts that are not a multiple of MR).
#[inline(never)]
fn row_tile<A: Num>(panel: &[A], w: &[A]) -> [A; NR] {
    let mut acc = [A::default(); NR];
    for (c, &wv) in panel.chunks_exact(NR).zip(w) {
        let Ok(c) = <&[A; NR]>::try_from(c) else {
            continue;
        };
        for l in 0..NR {
            acc[l] = acc[l].madd(wv, c[l]);
        }
    }
    acc
}

/// Computes panels `[p0, p1)` of one (batch, group) product; returns `[panel][oc][NR]`.
fn gemm_panels<A: Num>(
    xg: &[A],
    wg: &[A],
    rows: &[(usize, [isize; 3])],
    g: &Geom,
    mg: usize,
    p0: usize,
    p1: usize,
) -> Vec<A> {
    let op = g.out_plane();
    let r_n = rows.len();
    let [_, oh_n, ow_n] = g.outs;
    let [id_n, ih_n, iw_n] = g.ins;
    let mut res = vec![A::default(); (p1 - p0) * mg * NR];
    let mut panel = vec![A::default(); r_n * NR];
    // Weights of full MR-channel blocks, interleaved: wpack[blk][r][k].
    let full = mg / MR * MR;
    let mut wpack = vec![A::default(); full * r_n];
    for blk in 0..full / MR {
        for r in 0..r_n {
            for k in 0..MR {
                wpack[(blk * r_n + r) * MR + k] = wg[(blk * MR + k) * r_n + r];
            }
        }
    }
    for p in p0..p1 {
        // Output coordinates of the panel's positions (None past the end).
        let mut pos = [None; NR];
        for (l, slot) in pos.iter_mut().enumerate() {
            let j = p * NR + l;
            if j < op {
                let (od, rem) = (j / (oh_n * ow_n), j % (oh_n * ow_n));
                *slot = Some([
                    (od * g.s[0]) as isize,
                    ((rem / ow_n) * g.s[1]) as isize,
                    ((rem % ow_n) * g.s[2]) as isize,
                ]);
            }
        }
        for (r, &(base, off)) in rows.iter().enumerate() {
            let dst = &mut panel[r * NR..(r + 1) * NR];
            for (d, slot) in dst.iter_mut().zip(&pos) {
                *d = match slot {
                    Some(c) => {
                        let (i0, i1, i2) = (c[0] + off[0], c[1] + off[1], c[2] + off[2]);
                        if i0 >= 0
                            && i1 >= 0
                            && i2 >= 0
                            && (i0 as usize) < id_n
                            && (i1 as usize) < ih_n
                            && (i2 as usize) < iw_n
                        {
                            xg[base + (i0 as usize * ih_n + i1 as usize) * iw_n + i2 as usize]
                        } else {
                            A::default()
                        }
                    }
                    None => A::default(),
                };
            }
        }
        let out = &mut res[(p - p0) * mg * NR..][..mg * NR];
        for (blk, wp) in wpack.chunks_exact(r_n * MR).enumerate() {
            let acc = tile(&panel, wp);
            for k in 0..MR {
                let oc = blk * MR + k;
                out[oc * NR..(oc + 1) * NR].copy_from_slice(&acc[k]);
            }
        }
        for oc in full..mg {
            let acc = row_tile(&panel, &wg[oc * r_n..(oc + 1) * r_n]);
            out[oc * NR..(oc + 1) * NR].copy_from_slice(&acc);
        }
    }
    res
}

fn out_shape(g: &Geom, sp: usize) -> Vec<usize> {
    let mut s = vec![g.n, g.m];
    s.extend_from_slice(&g.outs[3 - sp..]);
    s
}

pub fn conv(args: &[&Tensor], window: &Window, group: usize) -> Result<Tensor, String> {
    let (x, w, b) = (args[0], args[1], args[2]);
    let g = conv_geom(x.shape(), w.shape(), window, group)?;
    if b.numel() != g.m {
        return Err(format!("bias has {} elements, expected {}", b.numel(), g.m));
    }
    let shape = out_shape(&g, x.rank() - 2);
    let dt = x.dtype();
    if dt == DType::F64 {
        let out = conv_core(&x.to_f64_vec(), &w.to_f64_vec(), &b.to_f64_vec(), &g);
        return super::from_f64(dt, shape, &out);
    }
    let out = conv_core(&f32_vec(x), &f32_vec(w), &f32_vec(b), &g);
    from_f32(dt, shape, out)
}

/// `w - zp` with a scalar or per-output-channel zero point.
fn sub_channel_zp(w: &Tensor, zp: &Tensor, what: &str) -> Result<Vec<i64>, String> {
    let mut v = w.to_i64_vec();
    let z = zp.to_i64_vec();
    let m = w.shape().first().copied().unwrap_or(1);
    if z.len() == 1 {
        v.iter_mut().for_each(|x| *x -= z[0]);
    } else if z.len() == m {
        let per = v.len() / m.max(1);
        for (i, x) in v.iter_mut().enumerate() {
            *x -= z[i / per.max(1)];
        }
    } else {
        return Err(format!(
            "{what} has {} elements, expected 1 or {m}",
            z.len()
        ));
    }
    Ok(v)
}

fn scalar_zp(x: &Tensor, zp: &Tensor, what: &str) -> Result<Vec<i64>, String> {
    let z = zp.to_i64_vec();
    if z.len() != 1 {
        return Err(format!("{what} must be a scalar, has {} elements", z.len()));
    }
    Ok(x.to_i64_vec().into_iter().map(|v| v - z[0]).collect())
}

pub fn conv_integer(args: &[&Tensor], window: &Window, group: usize) -> Result<Tensor, String> {
    let (x, w) = (args[0], args[1]);
    let g = conv_geom(x.shape(), w.shape(), window, group)?;
    let xv = scalar_zp(x, args[2], "x_zero_point")?;
    let wv = sub_channel_zp(w, args[3], "w_zero_point")?;
    let out = conv_core(&xv, &wv, &vec![0i64; g.m], &g);
    Tensor::from_i64s(DType::I32, out_shape(&g, x.rank() - 2), &out).map_err(|e| e.to_string())
}

pub fn qlinear_conv(args: &[&Tensor], window: &Window, group: usize) -> Result<Tensor, String> {
    let (x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, b) = (
        args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8],
    );
    let g = conv_geom(x.shape(), w.shape(), window, group)?;
    let xv = scalar_zp(x, x_zp, "x_zero_point")?;
    let wv = sub_channel_zp(w, w_zp, "w_zero_point")?;
    let bias = b.to_i64_vec();
    if bias.len() != g.m {
        return Err(format!(
            "bias has {} elements, expected {}",
            bias.len(),
            g.m
        ));
    }
    let acc = conv_core(&xv, &wv, &bias, &g);
    let (sx, sw, sy) = (
        x_scale.to_f64_vec(),
        w_scale.to_f64_vec(),
        y_scale.to_f64_vec(),
    );
    let yz = y_zp.to_i64_vec();
    if sx.len() != 1 || sy.len() != 1 || yz.len() != 1 || (sw.len() != 1 && sw.len() != g.m) {
        return Err(
            "x_scale, y_scale, y_zero_point must be scalars; w_scale scalar or per output channel"
                .into(),
        );
    }
    let sdt = x_scale.dtype();
    let op = g.out_plane().max(1);
    let odt = y_zp.dtype();
    let out: Vec<i64> = acc
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let oc = (i / op) % g.m.max(1);
            let mult = round_to(sdt, round_to(sdt, sx[0] * param_at(&sw, oc)) / sy[0]);
            requantize(c, mult, yz[0], odt)
        })
        .collect();
    Tensor::from_i64s(odt, out_shape(&g, x.rank() - 2), &out).map_err(|e| e.to_string())
}

pub struct TransposeParams<'a> {
    pub kernel: &'a [usize],
    pub strides: &'a [usize],
    pub dilations: &'a [usize],
    pub pads: &'a [i64],
    pub output_padding: &'a [usize],
    pub group: usize,
}

/// Transposed convolution: each input element scatters `x * w[tap]` to output position
/// `i * stride + tap * dilation - pad_begin`. Parallel over output planes; for each, the
/// group's input channels and taps accumulate output rows from input rows.
fn conv_transpose_core<A: Num>(x: &[A], w: &[A], bias: &[A], g: &Geom) -> Vec<A> {
    let (ip, op, taps) = (g.in_plane(), g.out_plane(), g.taps());
    let cg = g.c / g.group;
    let mg = g.m / g.group;
    let mut out = vec![A::default(); g.n * g.m * op];
    let threads = threads_for(g.n * g.m * ip * cg * taps);
    let [od_n, oh_n, ow_n] = g.outs;
    let [id_n, ih_n, iw_n] = g.ins;
    par_chunks(&mut out, op, threads, |plane, o| {
        let (b, oc) = (plane / g.m, plane % g.m);
        o.iter_mut().for_each(|v| *v = bias[oc]);
        let (grp, ocl) = (oc / mg, oc % mg);
        for icl in 0..cg {
            let ic = grp * cg + icl;
            let xp = &x[(b * g.c + ic) * ip..(b * g.c + ic + 1) * ip];
            // w is [C, M/group, *K].
            let wk = &w[(ic * mg + ocl) * taps..(ic * mg + ocl + 1) * taps];
            let mut t = 0;
            for kd in 0..g.k[0] {
                for kh in 0..g.k[1] {
                    for kw in 0..g.k[2] {
                        let wv = wk[t];
                        t += 1;
                        let offd = (kd * g.d[0]) as isize - g.pb[0];
                        let offh = (kh * g.d[1]) as isize - g.pb[1];
                        let offw = (kw * g.d[2]) as isize - g.pb[2];
                        // Input positions i with 0 <= i*s + off < out_len.
                        let (d_lo, d_hi) = valid_range(id_n, od_n, g.s[0], offd);
                        let (h_lo, h_hi) = valid_range(ih_n, oh_n, g.s[1], offh);
                        let (w_lo, w_hi) = valid_range(iw_n, ow_n, g.s[2], offw);
                        if w_lo >= w_hi {
                            continue;
                        }
                        for id in d_lo..d_hi {
                            let od = ((id * g.s[0]) as isize + offd) as usize;
                            for ih in h_lo..h_hi {
                                let oh = ((ih * g.s[1]) as isize + offh) as usize;
                                let xrow = &xp[(id * ih_n + ih) * iw_n..][..iw_n];
                                let orow = &mut o[(od * oh_n + oh) * ow_n..][..ow_n];
                                let ow0 = ((w_lo * g.s[2]) as isize + offw) as usize;
                                let sw = g.s[2];
                                for (j, &xv) in xrow[w_lo..w_hi].iter().enumerate() {
                                    let ov = &mut orow[ow0 + j * sw];
                                    *ov = ov.madd(wv, xv);
                                }
                            }
                        }
                    }
                }
            }
        }
    });
    out
}

pub fn conv_transpose(args: &[&Tensor], p: &TransposeParams) -> Result<Tensor, String> {
    let (x, w, b) = (args[0], args[1], args[2]);
    let (xs, ws) = (x.shape(), w.shape());
    if xs.len() < 3 || ws.len() != xs.len() {
        return Err(format!(
            "input {xs:?} and weights {ws:?} must be [N, C, spatial...] of equal rank"
        ));
    }
    let sp = xs.len() - 2;
    let group = p.group;
    if group == 0 || ws[0] != xs[1] || ws[2..] != p.kernel[..] {
        return Err(format!(
            "weights {ws:?} do not match input {xs:?} and kernel {:?}",
            p.kernel
        ));
    }
    let m = ws[1] * group;
    let mut outs = Vec::new();
    for i in 0..sp {
        let v = p.strides[i] as i64 * (xs[2 + i] as i64 - 1)
            + p.output_padding[i] as i64
            + ((p.kernel[i] as i64 - 1) * p.dilations[i] as i64 + 1)
            - p.pads[i]
            - p.pads[sp + i];
        if v <= 0 {
            return Err(format!(
                "spatial axis {i}: output length {v} is not positive"
            ));
        }
        outs.push(v as usize);
    }
    let pbs: Vec<isize> = p.pads[..sp].iter().map(|&v| v as isize).collect();
    let g = Geom {
        n: xs[0],
        c: xs[1],
        m,
        group,
        ins: pad3(&xs[2..], 1)?,
        outs: pad3(&outs, 1)?,
        k: pad3(p.kernel, 1)?,
        s: pad3(p.strides, 1)?,
        d: pad3(p.dilations, 1)?,
        pb: pad3(&pbs, 0)?,
    };
    if b.numel() != m {
        return Err(format!("bias has {} elements, expected {m}", b.numel()));
    }
    let shape = out_shape(&g, sp);
    let dt = x.dtype();
    if dt == DType::F64 {
        let out = conv_transpose_core(&x.to_f64_vec(), &w.to_f64_vec(), &b.to_f64_vec(), &g);
        return super::from_f64(dt, shape, &out);
    }
    let out = conv_transpose_core(&f32_vec(x), &f32_vec(w), &f32_vec(b), &g);
    from_f32(dt, shape, out)
}

/// Bilinear sample of a plane at fractional `(h, w)`; zero outside.
fn bilinear(p: &[f64], hn: usize, wn: usize, h: f64, w: f64) -> f64 {
    let (h0, w0) = (h.floor(), w.floor());
    let (fh, fw) = (h - h0, w - w0);
    let at = |y: f64, x: f64| -> f64 {
        if y < 0.0 || x < 0.0 || y >= hn as f64 || x >= wn as f64 {
            0.0
        } else {
            p[y as usize * wn + x as usize]
        }
    };
    at(h0, w0) * (1.0 - fh) * (1.0 - fw)
        + at(h0, w0 + 1.0) * (1.0 - fh) * fw
        + at(h0 + 1.0, w0) * fh * (1.0 - fw)
        + at(h0 + 1.0, w0 + 1.0) * fh * fw
}

/// Deformable convolution (2-D, and 1-D as a height-1 image).
pub fn deform_conv(
    args: &[&Tensor],
    window: &Window,
    group: usize,
    offset_group: usize,
) -> Result<Tensor, String> {
    let (x, w, offset, b, mask) = (args[0], args[1], args[2], args[3], args[4]);
    let g = conv_geom(x.shape(), w.shape(), window, group)?;
    if g.ins[0] != 1 || g.outs[0] != 1 {
        return Err("deformable convolution supports 1-D and 2-D inputs".into());
    }
    let sp = x.rank() - 2;
    let [_, oh_n, ow_n] = g.outs;
    let [_, ih_n, iw_n] = g.ins;
    let [_, kh_n, kw_n] = g.k;
    let taps = kh_n * kw_n;
    let og = offset_group;
    if g.c % og != 0 {
        return Err(format!(
            "{} input channels are not divisible by offset_group {og}",
            g.c
        ));
    }
    let op = oh_n * ow_n;
    let want_off = g.n * og * taps * sp * op;
    if offset.numel() != want_off {
        return Err(format!(
            "offset has {} elements, expected {want_off}",
            offset.numel()
        ));
    }
    let want_mask = g.n * og * taps * op;
    if mask.numel() != want_mask && mask.numel() != 1 {
        return Err(format!(
            "mask has {} elements, expected {want_mask}",
            mask.numel()
        ));
    }
    let (xv, wv, ov, bv, mv) = (
        x.to_f64_vec(),
        w.to_f64_vec(),
        offset.to_f64_vec(),
        b.to_f64_vec(),
        mask.to_f64_vec(),
    );
    let cg = g.c / g.group;
    let mg = g.m / g.group;
    let cpo = g.c / og;
    let ip = ih_n * iw_n;
    let mut out = vec![0.0; g.n * g.m * op];
    for bn in 0..g.n {
        for oc in 0..g.m {
            let grp = oc / mg;
            let o = &mut out[(bn * g.m + oc) * op..][..op];
            o.iter_mut().for_each(|v| *v = bv[oc]);
            for icl in 0..cg {
                let ic = grp * cg + icl;
                let ogi = ic / cpo;
                let plane = &xv[(bn * g.c + ic) * ip..][..ip];
                for kh in 0..kh_n {
                    for kw in 0..kw_n {
                        let t = kh * kw_n + kw;
                        let wt = wv[(oc * cg + icl) * taps + t];
                        for oh in 0..oh_n {
                            for ow in 0..ow_n {
                                let pos = oh * ow_n + ow;
                                // offset [N, og, kh, kw, sp, oh, ow]; for 1-D only the w offset.
                                let obase = ((bn * og + ogi) * taps + t) * sp;
                                let (dh, dw) = if sp == 2 {
                                    (ov[obase * op + pos], ov[(obase + 1) * op + pos])
                                } else {
                                    (0.0, ov[obase * op + pos])
                                };
                                let m = if mv.len() == 1 {
                                    mv[0]
                                } else {
                                    mv[((bn * og + ogi) * taps + t) * op + pos]
                                };
                                let h = (oh * g.s[1]) as f64 - g.pb[1] as f64
                                    + (kh * g.d[1]) as f64
                                    + dh;
                                let ww = (ow * g.s[2]) as f64 - g.pb[2] as f64
                                    + (kw * g.d[2]) as f64
                                    + dw;
                                o[pos] += wt * m * bilinear(plane, ih_n, iw_n, h, ww);
                            }
                        }
                    }
                }
            }
        }
    }
    super::from_f64(x.dtype(), out_shape(&g, sp), &out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tilec_ir::op::Padding;

    /// Textbook convolution straight from the definition, for comparison.
    fn naive_2d(
        x: &[f64],
        xs: [usize; 4],
        w: &[f64],
        ws: [usize; 4],
        g: usize,
        s: [usize; 2],
        d: [usize; 2],
        p: [usize; 4],
    ) -> (Vec<f64>, [usize; 4]) {
        let [n, c, h, wd] = xs;
        let [m, cg, kh, kw] = ws;
        let oh = (h + p[0] + p[2] - (kh - 1) * d[0] - 1) / s[0] + 1;
        let ow = (wd + p[1] + p[3] - (kw - 1) * d[1] - 1) / s[1] + 1;
        let mut out = vec![0.0; n * m * oh * ow];
        for b in 0..n {
            for oc in 0..m {
                let grp = oc / (m / g);
                for y in 0..oh {
                    for xo in 0..ow {
                        let mut acc = 0.0;
                        for icl in 0..cg {
                            let ic = grp * cg + icl;
                            for i in 0..kh {
                                for j in 0..kw {
                                    let iy = (y * s[0] + i * d[0]) as isize - p[0] as isize;
                                    let ix = (xo * s[1] + j * d[1]) as isize - p[1] as isize;
                                    if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < wd
                                    {
                                        acc += x
                                            [((b * c + ic) * h + iy as usize) * wd + ix as usize]
                                            * w[((oc * cg + icl) * kh + i) * kw + j];
                                    }
                                }
                            }
                        }
                        out[((b * m + oc) * oh + y) * ow + xo] = acc;
                    }
                }
            }
        }
        (out, [n, m, oh, ow])
    }

    #[test]
    fn conv_matches_naive() {
        let cases = [
            ([2, 4, 7, 9], [6, 2, 3, 2], 2, [2, 1], [1, 2], [1, 0, 2, 1]),
            ([1, 3, 5, 5], [2, 3, 3, 3], 1, [1, 1], [1, 1], [1, 1, 1, 1]),
            ([1, 2, 6, 8], [4, 1, 2, 3], 2, [3, 3], [2, 1], [0, 2, 0, 2]),
            ([2, 6, 3, 4], [20, 3, 1, 1], 2, [1, 1], [1, 1], [0, 0, 0, 0]),
        ];
        for (xs, ws, grp, s, d, p) in cases {
            let xv: Vec<f64> = (0..xs.iter().product::<usize>())
                .map(|i| ((i * 7 % 13) as f64) - 6.0)
                .collect();
            let wv: Vec<f64> = (0..ws.iter().product::<usize>())
                .map(|i| ((i * 5 % 11) as f64) * 0.5 - 2.0)
                .collect();
            let (want, shape) = naive_2d(&xv, xs, &wv, ws, grp, s, d, p);
            let window = Window {
                kernel: vec![ws[2], ws[3]],
                strides: s.to_vec(),
                dilations: d.to_vec(),
                pads: Padding::Explicit(p.to_vec()),
            };
            let x = Tensor::from_vec(xs.to_vec(), xv).unwrap();
            let w = Tensor::from_vec(ws.to_vec(), wv).unwrap();
            let b = Tensor::from_vec(vec![ws[0]], vec![0.0f64; ws[0]]).unwrap();
            let y = conv(&[&x, &w, &b], &window, grp).unwrap();
            assert_eq!(y.shape(), &shape);
            assert_eq!(y.to_f64_vec(), want);
        }
    }

    /// f32 accumulation over long reductions (R = 512 * 9) stays far inside the
    /// conformance tolerance (rtol 1e-3) relative to an f64 computation.
    #[test]
    fn f32_accumulation_is_accurate() {
        let (xs, ws) = ([1usize, 512, 7, 7], [8usize, 512, 3, 3]);
        let xv: Vec<f64> = (0..xs.iter().product::<usize>())
            .map(|i| ((i * 7919 % 1000) as f64 / 500.0 - 1.0).abs())
            .collect();
        let wv: Vec<f64> = (0..ws.iter().product::<usize>())
            .map(|i| (i * 104729 % 1000) as f64 / 500.0 - 1.0)
            .collect();
        let window = Window {
            kernel: vec![3, 3],
            strides: vec![1, 1],
            dilations: vec![1, 1],
            pads: Padding::Explicit(vec![1; 4]),
        };
        let b64 = Tensor::from_vec(vec![8], vec![0.0f64; 8]).unwrap();
        let x64 = Tensor::from_vec(xs.to_vec(), xv.clone()).unwrap();
        let w64 = Tensor::from_vec(ws.to_vec(), wv.clone()).unwrap();
        let want = conv(&[&x64, &w64, &b64], &window, 1).unwrap().to_f64_vec();
        let x32 = x64.cast(DType::F32);
        let w32 = w64.cast(DType::F32);
        let b32 = b64.cast(DType::F32);
        let got = conv(&[&x32, &w32, &b32], &window, 1).unwrap().to_f64_vec();
        let scale = want.iter().map(|v| v.abs()).fold(0.0, f64::max);
        let err = want
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(err / scale < 1e-5, "max error {err} vs scale {scale}");
    }

    #[test]
    fn valid_ranges() {
        // o*1 + (-1) in [0, 5) → o in [1, 6) ∩ [0, 5)
        assert_eq!(valid_range(5, 5, 1, -1), (1, 5));
        // o*2 + 1 in [0, 4) → o in {0, 1}
        assert_eq!(valid_range(10, 4, 2, 1), (0, 2));
        assert_eq!(valid_range(3, 2, 1, 5), (0, 0));
    }

    fn time_conv(xs: [usize; 4], ws: [usize; 4], stride: usize, pad: usize) {
        let x = Tensor::from_vec(
            xs.to_vec(),
            (0..xs.iter().product::<usize>())
                .map(|i| (i % 17) as f32 * 0.1)
                .collect(),
        )
        .unwrap();
        let w = Tensor::from_vec(
            ws.to_vec(),
            (0..ws.iter().product::<usize>())
                .map(|i| (i % 7) as f32 * 0.01)
                .collect(),
        )
        .unwrap();
        let b = Tensor::from_vec(vec![ws[0]], vec![0.0f32; ws[0]]).unwrap();
        let window = Window {
            kernel: vec![ws[2], ws[3]],
            strides: vec![stride; 2],
            dilations: vec![1, 1],
            pads: Padding::Explicit(vec![pad; 4]),
        };
        let t = std::time::Instant::now();
        let y = conv(&[&x, &w, &b], &window, 1).unwrap();
        let dt = t.elapsed();
        let macs = (y.numel() * ws[1] * ws[2] * ws[3]) as f64;
        eprintln!(
            "conv {xs:?} * {ws:?} s{stride}: {dt:?} ({:.1} GFLOP/s)",
            2.0 * macs / 1e9 / dt.as_secs_f64()
        );
    }

    /// Times VGG/ResNet-sized convs: `cargo test -p tilec-ref conv_timing -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn conv_timing() {
        time_conv([1, 64, 224, 224], [64, 64, 3, 3], 1, 1);
        time_conv([1, 512, 14, 14], [512, 512, 3, 3], 1, 1);
        time_conv([1, 512, 7, 7], [2048, 512, 1, 1], 1, 0);
        time_conv([1, 3, 224, 224], [64, 3, 7, 7], 2, 3);
    }
}
