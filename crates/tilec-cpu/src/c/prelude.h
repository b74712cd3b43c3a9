/* Runtime helpers shared by every generated kernel. */
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define TC_INLINE static inline __attribute__((always_inline))
#define TC_RESTRICT __restrict__

/* ---- parallel regions ----
   A region is n chunks, task(ctx, c, n) for c in [0, n); the thread pool the loader installs
   (tilec_cpu::pool) runs them on up to tc_nthreads threads, the calling thread included, and
   returns when all have run. Without a pool, or with one thread, they run here in order. */
typedef void (*tc_task)(void *ctx, int64_t chunk, int64_t chunks);
typedef void (*tc_pool_fn)(tc_task task, void *ctx, int64_t chunks, int64_t threads);
/* One copy per library (weak and hidden: the translation units share it). */
__attribute__((weak, visibility("hidden"))) tc_pool_fn tc_pool = 0;
__attribute__((weak, visibility("hidden"))) int tc_nthreads = 1;

__attribute__((weak)) void tilec_set_pool(tc_pool_fn pool) { tc_pool = pool; }
__attribute__((weak)) void tilec_set_threads(int n) { tc_nthreads = n > 0 ? n : 1; }

TC_INLINE int64_t tc_threads(void) { return tc_nthreads; }

/* Chunks of a parallel loop of `extent` iterations: a few per thread, so that a thread that
   runs late (another process holds its core) leaves little for the others to wait for. */
#define TC_CHUNKS_PER_THREAD 4
TC_INLINE int64_t tc_loop_chunks(int64_t extent) {
    int64_t n = tc_threads() * TC_CHUNKS_PER_THREAD;
    return extent < n ? extent : n;
}

/* The iterations [*lo, *hi) of chunk c of n over `extent`, balanced to within one. */
TC_INLINE void tc_chunk_range(int64_t extent, int64_t c, int64_t n, int64_t *lo, int64_t *hi) {
    const int64_t q = extent / n, r = extent % n;
    *lo = c * q + (c < r ? c : r);
    *hi = *lo + q + (c < r);
}

/* The most chunks of a region (tilec_cpu::pool::MAX_CHUNKS); tasks read the count they get. */
#define TC_MAX_CHUNKS 4094
TC_INLINE void tc_parallel(tc_task task, void *ctx, int64_t chunks) {
    if (chunks > TC_MAX_CHUNKS) chunks = TC_MAX_CHUNKS;
    if (chunks > 1 && tc_nthreads > 1 && tc_pool) {
        tc_pool(task, ctx, chunks, tc_nthreads);
    } else {
        for (int64_t c = 0; c < chunks; ++c) task(ctx, c, chunks);
    }
}

TC_INLINE void *tc_alloc(size_t bytes) {
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n ? n : 64);
    if (!p) abort();
    return p;
}

/* Per-thread scratch that survives between calls (GEMM packing buffers): allocating and
   first-touching megabytes on every call costs more than small products take. */
__attribute__((weak, visibility("hidden"))) void *tc_scratch(int slot, size_t bytes) {
    static __thread void *buf[4];
    static __thread size_t cap[4];
    if (cap[slot] < bytes) {
        free(buf[slot]);
        buf[slot] = tc_alloc(bytes);
        cap[slot] = bytes;
    }
    return buf[slot];
}

/* ---- checked indices ---- */
/* Records an out-of-range index in the run's status (tilec_tile::ir::STATUS_WORDS): the first
   violation of a run wins. Out of line and cold: it never runs on valid input. */
__attribute__((weak, visibility("hidden"), noinline, cold))
void tc_index_fault(int64_t *st, int64_t site, int64_t i, int64_t n) {
    int64_t none = 0;
    if (__atomic_compare_exchange_n(&st[0], &none, site + 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        __atomic_store_n(&st[1], i, __ATOMIC_RELAXED);
        __atomic_store_n(&st[2], n, __ATOMIC_RELAXED);
    }
}

/* An index read from data for a dimension of n >= 1: negative values count from the end once
   when `wrap`; anything else outside 0..n is recorded and clamped, so memory stays in bounds. */
TC_INLINE int64_t tc_index(int64_t *st, int64_t site, int64_t i, int64_t n, int wrap) {
    int64_t j = (wrap && i < 0) ? i + n : i;
    if (__builtin_expect((uint64_t)j >= (uint64_t)n, 0)) {
        tc_index_fault(st, site, i, n);
        j = j < 0 ? 0 : n - 1;
    }
    return j;
}

/* ---- bit casts ---- */
TC_INLINE uint32_t tc_fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
TC_INLINE float tc_bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* double -> float rounding to odd: a following rounding to any format with at most 22
   significand bits is then correctly rounded (no double-rounding error). */
TC_INLINE float tc_d2f_odd(double x) {
    float f = (float)x;
    if ((double)f == x || f != f) return f;
    uint32_t b = tc_fbits(f);
    if (__builtin_fabs((double)f) > __builtin_fabs(x)) b -= 1u;
    return tc_bitsf(b | 1u);
}

/* ---- f16 (IEEE binary16), round to nearest even ---- */
TC_INLINE uint16_t tc_f2h(float f) {
    uint32_t x = tc_fbits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7fffffffu;
    uint32_t r;
    if (a > 0x7f800000u) {
        r = 0x7e00u | ((a >> 13) & 0x3ffu);            /* NaN, quiet */
    } else if (a >= 0x47800000u) {
        r = 0x7c00u;                                    /* >= 65536: infinity */
    } else if (a < 0x38800000u) {
        /* Subnormal or zero: adding 0.5 puts the f16 quantum (2^-24) at the float's last bit. */
        float t = tc_bitsf(a) + 0.5f;
        r = tc_fbits(t) - 0x3f000000u;
    } else {
        uint32_t odd = (a >> 13) & 1u;
        r = (a + 0xc8000fffu + odd) >> 13;              /* rebias exponent by -112, round */
    }
    return (uint16_t)(sign | r);
}
TC_INLINE float tc_h2f(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t bits;
    if (em >= 0x7c00u) bits = 0x7f800000u | ((em & 0x3ffu) << 13);
    else if (em >= 0x0400u) bits = (em << 13) + 0x38000000u;
    else bits = tc_fbits((float)em * 5.9604644775390625e-8f);
    return tc_bitsf(sign | bits);
}
TC_INLINE float tc_rnd_f16(float f) { return tc_h2f(tc_f2h(f)); }

/* ---- bf16 ---- */
TC_INLINE uint16_t tc_f2bf(float f) {
    uint32_t x = tc_fbits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
TC_INLINE float tc_bf2f(uint16_t h) { return tc_bitsf((uint32_t)h << 16); }
TC_INLINE float tc_rnd_bf16(float f) { return tc_bf2f(tc_f2bf(f)); }

/* ---- fp8 e4m3fn (no infinities; out of range saturates to +-448) ---- */
TC_INLINE uint8_t tc_f2e4m3(float f) {
    uint32_t x = tc_fbits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t a = x & 0x7fffffffu;
    uint32_t r;
    if (a > 0x7f800000u) r = 0x7fu;
    else if (a >= 0x43e00000u) r = 0x7eu;               /* >= 448 (and inf): saturate */
    else if (a < 0x3c800000u) {                         /* below 2^-6: subnormal */
        float t = tc_bitsf(a) + 16384.0f;
        r = tc_fbits(t) - 0x46800000u;
    } else {
        uint32_t odd = (a >> 20) & 1u;
        r = ((a + 0x7ffffu + odd) >> 20) - (120u << 3);
        if (r > 0x7eu) r = 0x7eu;
    }
    return (uint8_t)(sign | r);
}
TC_INLINE float tc_e4m32f(uint8_t b) {
    uint32_t sign = ((uint32_t)b & 0x80u) << 24;
    uint32_t em = b & 0x7fu;
    uint32_t bits;
    if (em == 0x7fu) bits = 0x7fc00000u;
    else if (em >= 0x08u) bits = (em << 20) + (120u << 23);
    else bits = tc_fbits((float)em * 0.001953125f);
    return tc_bitsf(sign | bits);
}
TC_INLINE float tc_rnd_e4m3(float f) { return tc_e4m32f(tc_f2e4m3(f)); }

/* ---- fp8 e5m2 (saturating conversion: out of range and infinities become +-57344) ---- */
TC_INLINE uint8_t tc_f2e5m2(float f) {
    uint32_t x = tc_fbits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t a = x & 0x7fffffffu;
    uint32_t r;
    if (a > 0x7f800000u) r = 0x7fu;
    else if (a >= 0x47700000u) r = 0x7bu;               /* >= 61440 rounds past the max */
    else if (a < 0x38800000u) {                         /* below 2^-14: subnormal */
        float t = tc_bitsf(a) + 128.0f;
        r = tc_fbits(t) - 0x43000000u;
    } else {
        uint32_t odd = (a >> 21) & 1u;
        r = ((a + 0xfffffu + odd) >> 21) - (112u << 2);
        if (r > 0x7bu) r = 0x7bu;
    }
    return (uint8_t)(sign | r);
}
TC_INLINE float tc_e5m22f(uint8_t b) { return tc_h2f((uint16_t)((uint16_t)b << 8)); }
TC_INLINE float tc_rnd_e5m2(float f) { return tc_e5m22f(tc_f2e5m2(f)); }

/* ---- float -> integer conversions without undefined behaviour (saturate to 64 bits, NaN -> 0) ---- */
TC_INLINE int64_t tc_f2i64(double x) {
    if (x != x) return 0;
    if (x >= 9223372036854775808.0) return INT64_MAX;
    if (x <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)x;
}
TC_INLINE uint64_t tc_f2u64(double x) {
    if (!(x > -1.0)) return 0;
    if (x >= 18446744073709551616.0) return UINT64_MAX;
    return (uint64_t)x;
}

/* ---- integer arithmetic without undefined behaviour ---- */
TC_INLINE int64_t tc_sdiv(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return (int64_t)(0 - (uint64_t)a);
    return a / b;
}
TC_INLINE int64_t tc_srem(int64_t a, int64_t b) {
    if (b == 0 || b == -1) return 0;
    return a % b;
}
TC_INLINE int64_t tc_sfloordiv(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return (int64_t)(0 - (uint64_t)a);
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
    return q;
}
TC_INLINE int64_t tc_sfloormod(int64_t a, int64_t b) {
    if (b == 0 || b == -1) return 0;
    int64_t r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}
TC_INLINE uint64_t tc_udiv(uint64_t a, uint64_t b) { return b ? a / b : 0; }
TC_INLINE uint64_t tc_urem(uint64_t a, uint64_t b) { return b ? a % b : 0; }
TC_INLINE uint64_t tc_upow(uint64_t a, uint64_t e) {
    uint64_t r = 1;
    while (e) { if (e & 1u) r *= a; a *= a; e >>= 1; }
    return r;
}
TC_INLINE int64_t tc_spow(int64_t a, int64_t e) {
    if (e < 0) return 0;
    if (e > 4294967295LL) e = 4294967295LL;
    return (int64_t)tc_upow((uint64_t)a, (uint64_t)e);
}
TC_INLINE int64_t tc_sshl(int64_t a, int64_t b) {
    uint32_t s = (uint32_t)b;
    return s >= 64 ? 0 : (int64_t)((uint64_t)a << s);
}
TC_INLINE int64_t tc_sshr(int64_t a, int64_t b) {
    uint32_t s = (uint32_t)b;
    return s >= 64 ? 0 : a >> s;
}
TC_INLINE uint64_t tc_ushl(uint64_t a, uint64_t b) {
    uint32_t s = (uint32_t)b;
    return s >= 64 ? 0 : a << s;
}
TC_INLINE uint64_t tc_ushr(uint64_t a, uint64_t b) {
    uint32_t s = (uint32_t)b;
    return s >= 64 ? 0 : a >> s;
}
/* Index floor division / modulo (fast when the divisor is a positive constant). */
TC_INLINE int64_t tc_ifloordiv(int64_t a, int64_t b) {
    if (b > 0) { int64_t q = a / b; return q - ((a % b) < 0); }
    return tc_sfloordiv(a, b);
}
TC_INLINE int64_t tc_ifloormod(int64_t a, int64_t b) {
    if (b > 0) { int64_t r = a % b; return r < 0 ? r + b : r; }
    return tc_sfloormod(a, b);
}

/* Float floor modulo (sign of the divisor), in double like the interpreter. */
TC_INLINE double tc_ffloormod(double a, double b) { return a - b * floor(a / b); }

/* ---- NaN-propagating min / max ---- */
/* A NaN `a` is returned, else a NaN `b`, else the larger (smaller) with ties going to `b`.
   Written as one unordered compare (`!(a <= b)` holds when a > b or either is NaN) whose
   NaN-`b` case is corrected by a second select: when `b` is a constant (a ReLU, ReLU6 or clip
   epilogue) the correction folds away and each bound is one compare and one blend. The
   earlier form (`m = a > b ? a : b; a != a ? a : m`) gave gcc 12 chains of mask operations:
   a ReLU6 epilogue took as long as the 16-channel 1x1 convolution under it. Both forms
   vectorize (window maxima included) and agree bit for bit on every pair of signed zeros,
   infinities, NaNs and finite values. */
TC_INLINE float tc_fminf(float a, float b) { return !(a >= b) ? ((a == a && b != b) ? b : a) : b; }
TC_INLINE float tc_fmaxf(float a, float b) { return !(a <= b) ? ((a == a && b != b) ? b : a) : b; }
TC_INLINE double tc_fmin(double a, double b) { return !(a >= b) ? ((a == a && b != b) ? b : a) : b; }
TC_INLINE double tc_fmax(double a, double b) { return !(a <= b) ? ((a == a && b != b) ? b : a) : b; }

/* ---- vectorizable single-precision math (branch-free; about 1-2 ulp) ---- */
/* exp(xc) / 2^n for n = rint(xc / ln2): exp of the reduced argument r = xc - n ln2,
   |r| <= ln2/2, by a degree-6 polynomial (shared by tc_expf and tc_expnegf). */
TC_INLINE float tc_exp_reduced(float xc, float n) {
    float r = __builtin_fmaf(n, -0.693145751953125f, xc);
    r = __builtin_fmaf(n, -1.428606765330187045e-06f, r);
    float p = 1.9875691500e-4f;
    p = __builtin_fmaf(p, r, 1.3981999507e-3f);
    p = __builtin_fmaf(p, r, 8.3334519073e-3f);
    p = __builtin_fmaf(p, r, 4.1665795894e-2f);
    p = __builtin_fmaf(p, r, 1.6666665459e-1f);
    p = __builtin_fmaf(p, r, 5.0000001201e-1f);
    p = __builtin_fmaf(p * r, r, r) + 1.0f;
    return p;
}
TC_INLINE float tc_expf(float x) {
    /* exp(x) = 2^n * exp(r), r = x - n ln2, |r| <= ln2/2. */
    float xc = x > 88.7228394f ? 88.7228394f : (x < -103.972084f ? -103.972084f : x);
    float n = __builtin_rintf(xc * 1.44269504088896341f);
    float p = tc_exp_reduced(xc, n);
    /* Scale in two steps so that n in [-150, 128] never overflows the exponent field. */
    int32_t ni = (int32_t)n;
    int32_t n1 = ni / 2, n2 = ni - n1;
    float s1 = tc_bitsf((uint32_t)(n1 + 127) << 23);
    float s2 = tc_bitsf((uint32_t)(n2 + 127) << 23);
    float y = p * s1 * s2;
    y = x > 88.7228394f ? __builtin_inff() : y;
    y = x < -103.972084f ? 0.0f : y;
    return x != x ? x : y;
}
/* exp(min(x, 0)), 0 below 2^-126 (x < -87.34), NaN kept (`UnOp::ExpNeg`: a softmax's logits
   less their maximum): tc_expf's reduction and polynomial with one scaling step and no
   overflow checks, about a quarter fewer vector instructions. */
TC_INLINE float tc_expnegf(float x) {
    float xc = x < 0.0f ? x : 0.0f;
    xc = xc > -87.3365448f ? xc : -87.3365448f;
    float n = __builtin_rintf(xc * 1.44269504088896341f);
    float p = tc_exp_reduced(xc, n);
    float y = p * tc_bitsf((uint32_t)((int32_t)n + 127) << 23);
    y = x < -87.3365448f ? 0.0f : y;
    return x != x ? x : y;
}
/* 1 / (1 + exp(-x)) from e = exp(-|x|) in (0, 1]: 1 / (1 + e) for x >= 0, e / (1 + e) below.
   e never overflows, so it is 2^n exp(r) with the exponent added to exp(r)'s bits (n in
   [-126, 0] keeps it a normal number) and none of tc_expf's range checks: about a quarter
   faster (SiLU epilogues pay it on every element), within 3 ulp; results below 2^-126 (x
   under -87.3) are 0. */
TC_INLINE float tc_sigmoidf(float x) {
    float a = __builtin_fabsf(x);
    float xc = a < 87.3365448f ? -a : -87.3365448f;
    float n = __builtin_rintf(xc * 1.44269504088896341f);
    float p = tc_exp_reduced(xc, n);
    float e = tc_bitsf(tc_fbits(p) + ((uint32_t)(int32_t)n << 23));
    e = a < 87.3365448f ? e : 0.0f;
    float s = 1.0f / (1.0f + e);
    float y = x >= 0.0f ? s : e * s;
    return x != x ? x : y;
}
TC_INLINE float tc_tanhf(float x) {
    float a = __builtin_fabsf(x);
    float x2 = x * x;
    /* Taylor series near zero. */
    float p = -1.4558343870513183e-3f;     /* x^15 coefficient; x^13 ... x^3 follow */
    p = __builtin_fmaf(p, x2, 3.5921280365724810e-3f);
    p = __builtin_fmaf(p, x2, -8.8632355299021966e-3f);
    p = __builtin_fmaf(p, x2, 2.1869488536155203e-2f);
    p = __builtin_fmaf(p, x2, -5.3968253968253968e-2f);
    p = __builtin_fmaf(p, x2, 1.3333333333333333e-1f);
    p = __builtin_fmaf(p, x2, -3.3333333333333333e-1f);
    float small = __builtin_fmaf(p * x2, x, x);
    /* exp(2a) for 2a in [0, 20] (from a = 10 on, tanh rounds to 1; a cap at 9 left it an ulp
       short of 1, which a tanh-GELU's 1 + tanh turned into -4e-6 for large negative x): 2^n
       exp(r) with n in [0, 29] added to exp(r)'s exponent, no range checks needed. */
    float t = 2.0f * (a < 10.0f ? a : 10.0f);
    float n = __builtin_rintf(t * 1.44269504088896341f);
    float e = tc_bitsf(tc_fbits(tc_exp_reduced(t, n)) + ((uint32_t)(int32_t)n << 23));
    float big = 1.0f - 2.0f / (e + 1.0f);
    big = __builtin_copysignf(big, x);
    float y = a < 0.25f ? small : big;
    return x != x ? x : y;
}
/* erf as x P(x^2) / Q(x^2) on [-4, 4] (beyond, erf rounds to +-1 in f32), P of degree 6 and
   Q of degree 4 in x^2: the rational approximation of XLA's and Eigen's f32 erf. Within
   4e-7 of erf everywhere (relative near 0), one division and no exponential: about a fifth
   of the time of the erfc-through-exp form it replaced, which GELU epilogues paid on every
   element. */
TC_INLINE float tc_erff(float x) {
    float xc = x > 4.0f ? 4.0f : (x < -4.0f ? -4.0f : x);
    float x2 = xc * xc;
    float p = -2.72614225801306e-10f;
    p = __builtin_fmaf(p, x2, 2.77068142495902e-08f);
    p = __builtin_fmaf(p, x2, -2.10102402082508e-06f);
    p = __builtin_fmaf(p, x2, -5.69250639462346e-05f);
    p = __builtin_fmaf(p, x2, -7.34990630326855e-04f);
    p = __builtin_fmaf(p, x2, -2.95459980854025e-03f);
    p = __builtin_fmaf(p, x2, -1.60960333262415e-02f);
    float q = -1.45660718464996e-05f;
    q = __builtin_fmaf(q, x2, -2.13374055278905e-04f);
    q = __builtin_fmaf(q, x2, -1.68282697438203e-03f);
    q = __builtin_fmaf(q, x2, -7.37332916720468e-03f);
    q = __builtin_fmaf(q, x2, -1.42647390514189e-02f);
    float y = xc * p / q;
    /* The fit overshoots 1 by 2 ulp near 4. */
    y = y > 1.0f ? 1.0f : (y < -1.0f ? -1.0f : y);
    return x != x ? x : y;
}
TC_INLINE double tc_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
/* The named activations, in the operation order their formulas were lowered in before. */
TC_INLINE float tc_gelu_erff(float x) { return (0.5f * x) * (1.0f + tc_erff(x * 0.70710678118654752f)); }
TC_INLINE double tc_gelu_erf(double x) { return (0.5 * x) * (1.0 + erf(x * 0.70710678118654752)); }
TC_INLINE float tc_gelu_tanhf(float x) {
    return (0.5f * x) * (1.0f + tc_tanhf(0.79788456080286536f * (x + 0.044715f * ((x * x) * x))));
}
TC_INLINE double tc_gelu_tanh(double x) {
    return (0.5 * x) * (1.0 + tanh(0.79788456080286536 * (x + 0.044715 * ((x * x) * x))));
}
TC_INLINE float tc_siluf(float x) { return x * tc_sigmoidf(x); }
TC_INLINE double tc_silu(double x) { return x * tc_sigmoid(x); }
