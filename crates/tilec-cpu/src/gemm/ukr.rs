//! The micro-kernels: an `mr × nr` register tile of FMA vector accumulators over one K slice,
//! `A` broadcast from packed panels or read through row pointers (`tilec_tile::indirect`),
//! `B` from packed panels; generated per tile shape and vector ISA.

use super::Blocking;
use crate::cpuinfo::CpuInfo;
/// Intrinsics for one vector type.
pub(super) struct Isa {
    pub(super) vty: &'static str,
    pub(super) load: &'static str,
    pub(super) loadu: &'static str,
    pub(super) storeu: &'static str,
    pub(super) set1: &'static str,
    pub(super) fma: Option<&'static str>,
    pub(super) add: &'static str,
    pub(super) mul: &'static str,
    pub(super) zero: &'static str,
    /// Preprocessor condition under which the intrinsics exist.
    pub(super) cond: &'static str,
}

pub(super) fn isa(double: bool, vector_bytes: usize, fma: bool) -> Isa {
    match (double, vector_bytes) {
        (false, 64) => Isa {
            vty: "__m512",
            load: "_mm512_load_ps",
            loadu: "_mm512_loadu_ps",
            storeu: "_mm512_storeu_ps",
            set1: "_mm512_set1_ps",
            fma: Some("_mm512_fmadd_ps"),
            add: "_mm512_add_ps",
            mul: "_mm512_mul_ps",
            zero: "_mm512_setzero_ps",
            cond: "defined(__AVX512F__)",
        },
        (true, 64) => Isa {
            vty: "__m512d",
            load: "_mm512_load_pd",
            loadu: "_mm512_loadu_pd",
            storeu: "_mm512_storeu_pd",
            set1: "_mm512_set1_pd",
            fma: Some("_mm512_fmadd_pd"),
            add: "_mm512_add_pd",
            mul: "_mm512_mul_pd",
            zero: "_mm512_setzero_pd",
            cond: "defined(__AVX512F__)",
        },
        (false, 32) => Isa {
            vty: "__m256",
            load: "_mm256_load_ps",
            loadu: "_mm256_loadu_ps",
            storeu: "_mm256_storeu_ps",
            set1: "_mm256_set1_ps",
            fma: if fma { Some("_mm256_fmadd_ps") } else { None },
            add: "_mm256_add_ps",
            mul: "_mm256_mul_ps",
            zero: "_mm256_setzero_ps",
            cond: if fma {
                "defined(__AVX2__) && defined(__FMA__)"
            } else {
                "defined(__AVX__)"
            },
        },
        (true, 32) => Isa {
            vty: "__m256d",
            load: "_mm256_load_pd",
            loadu: "_mm256_loadu_pd",
            storeu: "_mm256_storeu_pd",
            set1: "_mm256_set1_pd",
            fma: if fma { Some("_mm256_fmadd_pd") } else { None },
            add: "_mm256_add_pd",
            mul: "_mm256_mul_pd",
            zero: "_mm256_setzero_pd",
            cond: if fma {
                "defined(__AVX2__) && defined(__FMA__)"
            } else {
                "defined(__AVX__)"
            },
        },
        (false, _) => Isa {
            vty: "__m128",
            load: "_mm_load_ps",
            loadu: "_mm_loadu_ps",
            storeu: "_mm_storeu_ps",
            set1: "_mm_set1_ps",
            fma: None,
            add: "_mm_add_ps",
            mul: "_mm_mul_ps",
            zero: "_mm_setzero_ps",
            cond: "defined(__SSE2__)",
        },
        (true, _) => Isa {
            vty: "__m128d",
            load: "_mm_load_pd",
            loadu: "_mm_loadu_pd",
            storeu: "_mm_storeu_pd",
            set1: "_mm_set1_pd",
            fma: None,
            add: "_mm_add_pd",
            mul: "_mm_mul_pd",
            zero: "_mm_setzero_pd",
            cond: "defined(__SSE2__)",
        },
    }
}

/// The micro-kernel `cout[mr × nr] = (cin ? cin : 0) + a_panel · b_panel` (file-scope C code,
/// guarded so that it is defined once per translation unit) and its name.
pub(super) fn micro_kernel(double: bool, b: &Blocking, cpu: &CpuInfo) -> (String, String) {
    ukr_source(double, None, b, cpu)
}

/// The indirect micro-kernel: like [`micro_kernel`], but `A` is read in place through one
/// pointer per row and piece (`ptrs[q * mr + i]`, `pl[q]` elements each, see
/// [`tilec_tile::indirect`]); the `B` panel runs through the pieces in order. With `skip`
/// (an operand with bounds checks), a piece whose every row points at the zero buffer `z`
/// (the tap of a padded convolution that reads only padding for all the tile's positions:
/// most of a dilated one's) adds nothing and is skipped; without, `z` is not read.
pub(super) fn micro_kernel_indirect(skip: bool, b: &Blocking, cpu: &CpuInfo) -> (String, String) {
    ukr_source(false, Some(skip), b, cpu)
}

/// `indirect`: `None` for the packed micro-kernel, else whether it skips zero pieces.
pub(super) fn ukr_source(double: bool, indirect: Option<bool>, b: &Blocking, cpu: &CpuInfo) -> (String, String) {
    let skip = indirect == Some(true);
    let indirect = indirect.is_some();
    let t = if double { "double" } else { "float" };
    let eb = if double { 8 } else { 4 };
    let vb = b.lanes as usize * eb;
    let is = isa(double, vb, cpu.fma);
    let nv = b.nr / b.lanes;
    let (mr, nr, lanes) = (b.mr, b.nr, b.lanes);
    let name = if skip {
        format!("tc_ukriz_{t}_{mr}x{nr}_w{vb}")
    } else if indirect {
        format!("tc_ukri_{t}_{mr}x{nr}_w{vb}")
    } else {
        format!("tc_ukr_{t}_{mr}x{nr}_w{vb}")
    };
    let guard = name.to_uppercase();
    let mut s = String::new();
    s.push_str(&format!("#ifndef {guard}\n#define {guard}\n"));
    s.push_str(&format!("#if !({})\n#error \"the GEMM micro-kernel needs a {}-byte vector ISA: compile for the CPU it was generated for\"\n#endif\n", is.cond, vb));
    s.push_str("#include <immintrin.h>\n");
    let a_param = if indirect {
        format!("int64_t np, const int32_t *TC_RESTRICT pl, const {t} *const *TC_RESTRICT ptrs, const {t} *z")
    } else {
        format!("int64_t kc, const {t} *TC_RESTRICT a")
    };
    s.push_str(&format!(
        "static __attribute__((noinline)) void {name}({a_param}, const {t} *TC_RESTRICT b, const {t} *TC_RESTRICT cin, int64_t ldi, {t} *TC_RESTRICT cout, int64_t ldo) {{\n"
    ));
    for i in 0..mr {
        for v in 0..nv {
            s.push_str(&format!("    {} c{i}_{v} = {}();\n", is.vty, is.zero));
        }
    }
    // The partial sums are needed only after the K loop: start fetching them now.
    s.push_str(&format!(
        "    if (cin) for (int64_t p = 0; p < {}; p += 64) __builtin_prefetch((const char *)cin + p, 0, 3);\n",
        mr * nr * eb as i64
    ));
    let pad = if indirect { "    " } else { "" };
    if indirect {
        s.push_str("    for (int64_t q = 0; q < np; ++q) {\n");
        for i in 0..mr {
            s.push_str(&format!("        const {t} *TC_RESTRICT a{i} = ptrs[q * {mr} + {i}];\n"));
        }
        s.push_str("        const int64_t kc = pl[q];\n");
        if skip {
            let all_zero = (0..mr).map(|i| format!("a{i} == z")).collect::<Vec<_>>().join(" && ");
            s.push_str(&format!("        if ({all_zero}) {{ b += kc * {nr}; continue; }}\n"));
        } else {
            s.push_str("        (void)z;\n");
        }
    }
    s.push_str(&format!("{pad}    #pragma GCC unroll 4\n{pad}    for (int64_t k = 0; k < kc; ++k) {{\n"));
    for v in 0..nv {
        s.push_str(&format!(
            "{pad}        {} b{v} = {}(b + k * {nr} + {});\n",
            is.vty,
            is.load,
            v * lanes
        ));
    }
    for i in 0..mr {
        let a = if indirect { format!("a{i}[k]") } else { format!("a[k * {mr} + {i}]") };
        s.push_str(&format!("{pad}        {{ {} ai = {}({a});", is.vty, is.set1));
        for v in 0..nv {
            match is.fma {
                Some(f) => s.push_str(&format!(" c{i}_{v} = {f}(ai, b{v}, c{i}_{v});")),
                None => s.push_str(&format!(
                    " c{i}_{v} = {}(c{i}_{v}, {}(ai, b{v}));",
                    is.add, is.mul
                )),
            }
        }
        s.push_str(" }\n");
    }
    s.push_str(&format!("{pad}    }}\n"));
    if indirect {
        s.push_str(&format!("        b += kc * {nr};\n    }}\n"));
    }
    s.push_str("    if (cin) {\n");
    for i in 0..mr {
        for v in 0..nv {
            s.push_str(&format!(
                "        c{i}_{v} = {}(c{i}_{v}, {}(cin + {i} * ldi + {}));\n",
                is.add,
                is.loadu,
                v * lanes
            ));
        }
    }
    s.push_str("    }\n");
    for i in 0..mr {
        for v in 0..nv {
            s.push_str(&format!(
                "    {}(cout + {i} * ldo + {}, c{i}_{v});\n",
                is.storeu,
                v * lanes
            ));
        }
    }
    s.push_str("}\n#endif\n");
    (s, name)
}
