//! The shuffled epilogue of the Hopper GEMM template ([`Params::shuffle`]): the accumulators
//! are regrouped in registers so that each lane stores 8 adjacent columns of one row.
//!
//! A consumer thread's wgmma accumulators hold, for every 8-column group `q` of its warp's 16
//! rows, the column pair `2 (lane % 4)` of rows `lane / 4` and `lane / 4 + 8`: the four lanes
//! of a quad share a row, two columns each. Four groups `4 g .. 4 g + 3` of one row are a 4 x 4
//! matrix over the quad (group by lane) of column pairs. Transposing it with two butterfly
//! exchanges (partner lanes `l ^ 1`, then `l ^ 2`: four shuffles of a pair each) leaves lane
//! `l` with group `4 g + l % 4` whole, in column order. The lane then hands those 8 columns to
//! the epilogue's vector function or the built-in store: a quad writes 32 adjacent columns of
//! a row (64 bytes in 16 bits), a warp 8 rows at once.
//!
//! Against the staged epilogue (accumulators parked in shared memory 16 x 32 at a time, read
//! back behind a warp barrier) this keeps every exchange independent of the others, so the
//! shuffles of a tile's 16 groups overlap instead of waiting out one shared-memory round trip
//! after another.

use std::fmt::Write;

use super::render::{activation, custom_args, load_out, short, storage};
use super::{Params, Problem};
use crate::render::EPILOGUE_VEC;
use tilec_ir::DType;

/// Device helper: one butterfly step of the quad transpose.
pub(crate) const HELPERS: &str = r#"
// One butterfly step of the quad transpose on column pairs: `a` is the pair whose index has the
// step's bit clear, `b` the one with it set. A lane whose own bit (`hi`) is set gives away `a`
// and takes its partner's `b` in its place; the partner gives `b` and takes `a`.
__device__ __forceinline__ void tl_quad_swap(float2& a, float2& b, bool hi, int mask) {
  const float2 give = hi ? a : b;
  float2 got;
  got.x = __shfl_xor_sync(0xffffffffu, give.x, mask);
  got.y = __shfl_xor_sync(0xffffffffu, give.y, mask);
  if (hi) a = got; else b = got;
}

// Halves `s .. s + 8` (0 <= s <= 7) of the 16 halves `a` then `b`: a shift by two words, by one,
// then by one half (selects and byte permutes, no indexed registers).
__device__ __forceinline__ uint4 tl_shift_halves(uint4 a, uint4 b, int s) {
  unsigned w0 = a.x, w1 = a.y, w2 = a.z, w3 = a.w, w4 = b.x, w5 = b.y, w6 = b.z, w7 = b.w;
  if (s & 4) { w0 = w2; w1 = w3; w2 = w4; w3 = w5; w4 = w6; w5 = w7; }
  if (s & 2) { w0 = w1; w1 = w2; w2 = w3; w3 = w4; w4 = w5; }
  if (s & 1) {
    w0 = __byte_perm(w0, w1, 0x5432); w1 = __byte_perm(w1, w2, 0x5432);
    w2 = __byte_perm(w2, w3, 0x5432); w3 = __byte_perm(w3, w4, 0x5432);
  }
  return make_uint4(w0, w1, w2, w3);
}
"#;

/// The exchange for one row of four fragments: declares `tl_x0 .. tl_x3` (column pairs) from
/// `frag(i, e)`, the C expression of fragment `i`'s element `e` (0 or 1) in this row, and
/// regroups them so that `tl_x<i>` holds columns `2 i, 2 i + 1` of the lane's own fragment
/// (needs `lane`, and `tl_h1`, `tl_h2` for its bits 0 and 1).
pub(crate) fn regroup(frag: &dyn Fn(usize, usize) -> String, ind: &str) -> String {
    let mut s = String::new();
    for i in 0..4 {
        let _ = writeln!(s, "{ind}float2 tl_x{i} = make_float2({}, {});", frag(i, 0), frag(i, 1));
    }
    for (a, b, bit) in [(0, 1, 1), (2, 3, 1), (0, 2, 2), (1, 3, 2)] {
        let _ = writeln!(s, "{ind}tl_quad_swap(tl_x{a}, tl_x{b}, tl_h{bit}, {bit});");
    }
    let _ = writeln!(
        s,
        "{ind}__align__(16) float tl_v[8] = {{tl_x0.x, tl_x0.y, tl_x1.x, tl_x1.y, tl_x2.x, tl_x2.y, tl_x3.x, tl_x3.y}};"
    );
    s
}

/// A lane's 8 columns `tl_v` from `col` handed to the vector epilogue function `vf`, or element
/// by element to `f` past the right edge `n` (the call arguments `args` come first, then the
/// batch `eb` and row `er`).
pub(crate) fn vector_call(vf: &str, f: &str, args: &str, n: &str, ind: &str) -> String {
    format!(
        "{ind}if (col + 8 <= {n}) {{\n{ind}  {vf}({args}eb, er, col / 8, tl_v);\n{ind}}} else {{\n#pragma unroll\n{ind}  for (int tl_x = 0; tl_x < 8; ++tl_x)\n{ind}    if (col + tl_x < {n}) {f}({args}eb, er, col + tl_x, tl_v[tl_x]);\n{ind}}}"
    )
}

/// The epilogue code of the consumer loop (after the tile's last wgmma has completed):
/// `scale` is the factor applied to each accumulator (empty, or ` * ab_scale`).
///
/// A tile wholly inside C takes a copy of the loop without edge checks. Behind per-group
/// checks the compiler keeps each group's loads (a residual's, say) after the previous group's
/// stores; unguarded, it can issue the loads of several groups before their stores.
pub(super) fn render(p: &Problem, q: &Params, scale: &str) -> String {
    assert_eq!(EPILOGUE_VEC, 8, "a lane regroups one 8-column group");
    let (edge, interior) = match &p.custom {
        Some(c) => {
            let (args, bexpr, rexpr) = custom_args(c);
            let vf = c.vector.as_deref().unwrap_or("tl_missing_vector_epilogue");
            let head = format!("const long long eb = {bexpr}, er = {rexpr};\n");
            (
                format!("{head}{}", vector_call(vf, &c.name, &args, "N", "                ")),
                format!("{head}                {vf}({args}eb, er, col / 8, tl_v);"),
            )
        }
        None => (builtin_sink(p, false), builtin_sink(p, true)),
    };
    let mut s = String::from(
        "      {\n        const bool tl_h1 = (lane & 1) != 0, tl_h2 = (lane & 2) != 0;\n",
    );
    if p.custom.is_none() {
        s.push_str(
            "        const bool tl_vec = ((ldc | batch_stride_c) & 7) == 0 && (reinterpret_cast<unsigned long long>(c) & 15) == 0;\n",
        );
    }
    let mut inside = row_blocks(q, scale, &interior, None);
    if q.rowstore && p.custom.is_none() && matches!(p.out_dtype, DType::F16 | DType::BF16) {
        inside = format!("        if (tl_vec) {{\n{inside}        }} else {{\n{}        }}\n", row_stores(p, q, scale));
    }
    let _ = write!(
        s,
        "        if (m0 + {bm} <= M && n0 + {bn} <= N) {{\n{}        }} else {{\n{}        }}\n",
        inside,
        row_blocks(q, scale, &edge, Some("row < M && col < N")),
        bm = q.tile_m,
        bn = q.tile_n,
    );
    s.push_str("      }\n");
    s
}

/// The loops over a consumer's 64-row blocks and 8-column groups, each group regrouped and
/// handed to `sink`, behind `guard` where given.
fn row_blocks(q: &Params, scale: &str, sink: &str, guard: Option<&str>) -> String {
    let mblocks = q.warp_m() / 64;
    // The warpgroup's first 64-row block of the tile (in ping-pong each owns a whole tile).
    let wg = if q.pingpong { "0".to_string() } else { format!("cw * {mblocks}") };
    let (open, close) = match guard {
        Some(g) => (format!("if ({g}) {{"), "}"),
        None => ("{".to_string(), "}"),
    };
    let mut s = String::new();
    for j in 0..mblocks {
        let _ = write!(
            s,
            r#"        {{
          const int row0 = m0 + ({wg} + {j}) * 64 + warp * 16 + (lane >> 2);
#pragma unroll
          for (int g = 0; g < {groups}; ++g) {{
#pragma unroll
            for (int h = 0; h < 2; ++h) {{
{regroup}              const int row = row0 + 8 * h, col = n0 + 32 * g + 8 * (lane & 3);
              {open}
                {sink}
              {close}
            }}
          }}
        }}
"#,
            groups = q.tile_n / 32,
            regroup = regroup(&|i, e| format!("acc[{j}][16 * g + {} + 2 * h + {e}]{scale}", 4 * i), "              "),
        );
    }
    s
}

/// The built-in epilogue of an interior tile whose rows in C are not 16-byte aligned
/// ([`Params::rowstore`]): per 64-row block and row half, the warp parks its 8 rows (bias and
/// activation applied, rounded to C's dtype) in its shared-memory slice, then stores each row
/// with all lanes: lane `l` the `l`-th whole aligned 16-byte vector of the row (two 16-byte
/// reads of the slice shifted by the row's misalignment), and lanes 0-7 and 8-15 the elements
/// before the first and after the last vector, one instruction each.
fn row_stores(p: &Problem, q: &Params, scale: &str) -> String {
    let od = p.out_dtype;
    let out_t = storage(od);
    let pack = format!("tl_pack_{}x2", short(od));
    let bias = |x: &str| match p.epilogue.bias {
        Some(d) => format!(" + {}", load_out(d, &format!("bias[col{x}]"))),
        None => String::new(),
    };
    let (b0, b1) = (bias(""), bias(" + 1"));
    let (a0, a1) = (activation(p, "x0"), activation(p, "x1"));
    let mblocks = q.warp_m() / 64;
    let wg = if q.pingpong { "0".to_string() } else { format!("cw * {mblocks}") };
    let rs = q.tile_n + 8;
    let bn = q.tile_n;
    let mut s = format!(
        "          {out_t}* tl_rs = ({out_t}*)tl_dyn_stage + (cw * 4 + warp) * {slice};\n          {out_t}* tl_cb = c + (long long)b * batch_stride_c;\n",
        slice = 8 * rs
    );
    for j in 0..mblocks {
        let _ = write!(
            s,
            r#"          {{
            const int row0 = m0 + ({wg} + {j}) * 64 + warp * 16;
#pragma unroll
            for (int h = 0; h < 2; ++h) {{
              __syncwarp();
#pragma unroll
              for (int q = 0; q < {nq}; ++q) {{
                const int col = n0 + 8 * q + 2 * (lane & 3);
                const float x0 = acc[{j}][4 * q + 2 * h]{scale}{b0}, x1 = acc[{j}][4 * q + 2 * h + 1]{scale}{b1};
                *reinterpret_cast<unsigned*>(tl_rs + (lane >> 2) * {rs} + 8 * q + 2 * (lane & 3)) = {pack}({a0}, {a1});
              }}
              __syncwarp();
#pragma unroll
              for (int r = 0; r < 8; ++r) {{
                {out_t}* dst = tl_cb + (long long)(row0 + 8 * h + r) * ldc + n0;
                const {out_t}* src = tl_rs + r * {rs};
                const int tl_s = (8 - (int)((reinterpret_cast<unsigned long long>(dst) >> 1) & 7)) & 7;
                const int tl_full = ({bn} - tl_s) >> 3;
                if (lane < tl_full) {{
                  const uint4 tl_a = *reinterpret_cast<const uint4*>(src + 8 * lane);
                  const uint4 tl_b = *reinterpret_cast<const uint4*>(src + 8 * lane + 8);
                  *reinterpret_cast<uint4*>(dst + tl_s + 8 * lane) = tl_shift_halves(tl_a, tl_b, tl_s);
                }}
                const int tl_e = lane < 8 ? lane : tl_s + 8 * tl_full + (lane - 8);
                if (lane < 8 ? lane < tl_s : (lane < 16 && tl_e < {bn})) dst[tl_e] = src[tl_e];
              }}
            }}
          }}
"#,
            nq = bn / 8,
        );
    }
    s
}

/// The built-in epilogue on a lane's 8 columns `tl_v` of `row` from `col`: bias, activation,
/// and one 16-byte store (two for f32) where C's rows keep the alignment, else element by
/// element. `interior`: all 8 columns are inside C, no edge checks.
fn builtin_sink(p: &Problem, interior: bool) -> String {
    let od = p.out_dtype;
    let bias = match p.epilogue.bias {
        Some(d) if interior => format!(" + {}", load_out(d, "bias[col + x]")),
        Some(d) => format!(" + (col + x < N ? {} : 0.0f)", load_out(d, "bias[col + x]")),
        None => String::new(),
    };
    let (fits, inside) = if interior { ("", "") } else { (" && col + 8 <= N", "if (col + x < N) ") };
    let act = activation(p, "tl_t");
    let (vector, one) = match od {
        DType::F16 | DType::BF16 => {
            let pack = format!("tl_pack_{}x2", short(od));
            (
                format!(
                    "*reinterpret_cast<uint4*>(dst) = make_uint4({pack}(tl_y[0], tl_y[1]), {pack}(tl_y[2], tl_y[3]), {pack}(tl_y[4], tl_y[5]), {pack}(tl_y[6], tl_y[7]));"
                ),
                format!("dst[x] = tl_st_{}(tl_y[x]);", short(od)),
            )
        }
        _ => (
            "reinterpret_cast<float4*>(dst)[0] = make_float4(tl_y[0], tl_y[1], tl_y[2], tl_y[3]);\n                  reinterpret_cast<float4*>(dst)[1] = make_float4(tl_y[4], tl_y[5], tl_y[6], tl_y[7]);".to_string(),
            "dst[x] = tl_y[x];".to_string(),
        ),
    };
    format!(
        r#"{out_t}* dst = c + (long long)b * batch_stride_c + (long long)row * ldc + col;
                float tl_y[8];
#pragma unroll
                for (int x = 0; x < 8; ++x) {{
                  const float tl_t = tl_v[x]{bias};
                  tl_y[x] = {act};
                }}
                if (tl_vec{fits}) {{
                  {vector}
                }} else {{
#pragma unroll
                  for (int x = 0; x < 8; ++x)
                    {inside}{one}
                }}"#,
        out_t = storage(od),
    )
}
