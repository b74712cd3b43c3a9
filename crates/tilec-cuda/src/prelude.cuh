// Helpers shared by every generated kernel. No headers: NVRTC 13.0 has no built-in
// cuda_fp16.h/cuda_bf16.h, so the 16-bit types and their conversions are defined here.

#define TL_INF_F __int_as_float(0x7f800000)
#define TL_NAN_F __int_as_float(0x7fc00000)
#define TL_INF_D __longlong_as_double(0x7ff0000000000000LL)
#define TL_NAN_D __longlong_as_double(0x7ff8000000000000LL)

// 16-bit float storage types (IEEE binary16 and bfloat16 bit patterns).
struct __align__(2) tl_f16 { unsigned short bits; };
struct __align__(2) tl_bf16 { unsigned short bits; };

__device__ __forceinline__ float tl_ld_f16(tl_f16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
}
__device__ __forceinline__ tl_f16 tl_st_f16(float f) {
  tl_f16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
// Whole 16-byte global accesses of an epilogue's lanes. The store is written out because the
// optimizer may split a 16-byte copy of 16-bit lanes into 4-byte stores (NVRTC 13.0), four
// times the store instructions of a warp. Each lane touches addresses no other access of its
// thread does, so no memory clobber is needed. The load stays a plain C++ load: a 16-byte
// aligned uint4 load is one instruction, and unlike a volatile asm statement the compiler
// may issue it ahead of earlier stores (the loads of several column groups together).
__device__ __forceinline__ void tl_st_v4(void* p, uint4 v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}
__device__ __forceinline__ uint4 tl_ld_v4(const void* p) {
  return *reinterpret_cast<const uint4*>(p);
}
__device__ __forceinline__ float tl_ld_bf16(tl_bf16 h) { return __uint_as_float(((unsigned int)h.bits) << 16); }
__device__ __forceinline__ tl_bf16 tl_st_bf16(float f) {
  tl_bf16 h;
#if __CUDA_ARCH__ >= 800
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
#else
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    h.bits = (unsigned short)((u >> 16) | 0x40);
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
    h.bits = (unsigned short)(u >> 16);
  }
#endif
  return h;
}

// Rounding of float values to the precision of a 16-bit type (values of f16/bf16 type are
// computed in float and rounded after every operation).
// erf in f32 to about 2e-7 absolute: an odd polynomial below 0.5, Abramowitz-Stegun 7.1.26
// (one hardware exp) above. Used where results are rounded to 16-bit floats.
__device__ __forceinline__ float tl_erf_fast(float x) {
  const float a = fabsf(x);
  if (a < 0.5f) {
    const float x2 = x * x;
    float p = fmaf(x2, -1.0f / 1320.0f, 1.0f / 216.0f);
    p = fmaf(x2, p, -1.0f / 42.0f);
    p = fmaf(x2, p, 1.0f / 10.0f);
    p = fmaf(x2, p, -1.0f / 3.0f);
    p = fmaf(x2, p, 1.0f);
    return 1.1283791671f * x * p;
  }
  const float t = __fdividef(1.0f, fmaf(0.3275911f, a, 1.0f));
  float y = fmaf(t, 1.061405429f, -1.453152027f);
  y = fmaf(t, y, 1.421413741f);
  y = fmaf(t, y, -0.284496736f);
  y = fmaf(t, y, 0.254829592f);
  return copysignf(1.0f - t * y * __expf(-a * a), x);
}

// 1 + erf(x) without a branch: erfc(|x|) from the same Abramowitz-Stegun form, reflected for
// positive x. Computing erfc directly keeps the negative tail of GELU relatively accurate (7e-4
// at |x| = 3, 3e-3 at |x| = 4, where the values are below 2e-5). Used where results are rounded
// to 16-bit floats.
__device__ __forceinline__ float tl_one_plus_erf(float x) {
  const float a = fabsf(x);
  const float t = __fdividef(1.0f, fmaf(0.3275911f, a, 1.0f));
  float y = fmaf(t, 1.061405429f, -1.453152027f);
  y = fmaf(t, y, 1.421413741f);
  y = fmaf(t, y, -0.284496736f);
  y = fmaf(t, y, 0.254829592f);
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(-1.4426950409f * a * a));
  const float c = t * y * e;
  return x >= 0.0f ? 2.0f - c : c;
}

// GELU, x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt 2)), in one branchless piece: the
// Abramowitz-Stegun erfc form above with the 1/sqrt(2) and the 1/2 folded into its constants,
// approximate reciprocal and exp2 (two special-function operations per element). Used where
// results are rounded to 16-bit floats.
__device__ __forceinline__ float tl_gelu_erf(float x) {
  const float u = fabsf(x);
  float t;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(t) : "f"(fmaf(0.3275911f * 0.70710678f, u, 1.0f)));
  float y = fmaf(t, 0.5f * 1.061405429f, 0.5f * -1.453152027f);
  y = fmaf(t, y, 0.5f * 1.421413741f);
  y = fmaf(t, y, 0.5f * -0.284496736f);
  y = fmaf(t, y, 0.5f * 0.254829592f);
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"((u * -0.72134752f) * u));
  const float h = t * y * e;  // 0.5 * erfc(|x| / sqrt 2)
  return x * (x >= 0.0f ? 1.0f - h : h);
}

// GELU in its tanh form (GPT-2's MLP) as x * sigmoid(2 u), u = sqrt(2/pi) (x + 0.044715 x^3):
// 1 + tanh(u) = 2 sigmoid(2 u), so 0.5 x (1 + tanh u) = x / (1 + exp(-2 u)). Approximate exp2
// and reciprocal (two special-function operations, about 1e-6 relative) in place of tanhf's
// thirty-odd instructions, which a product's epilogue pays per element. The exponent is held
// below 2^126 so that the reciprocal stays normal (x tiny times the reciprocal: about -0).
// Used where results are rounded to 16-bit floats.
__device__ __forceinline__ float tl_gelu_tanh_fast(float x) {
  const float u = x * fmaf(0.044715f * 0.79788456080286536f, x * x, 0.79788456080286536f);
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(fminf(-2.8853900817779268f * u, 126.0f)));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
  return x * r;
}

// The named activations where results are f32 or f64, in the operation order of their formulas.
__device__ __forceinline__ float tl_gelu_erf_exact(float x) {
  return (0.5f * x) * (1.0f + erff(x * 0.70710678118654752f));
}
__device__ __forceinline__ double tl_gelu_erf_d(double x) {
  return (0.5 * x) * (1.0 + erf(x * 0.70710678118654752));
}
__device__ __forceinline__ float tl_gelu_tanh(float x) {
  return (0.5f * x) * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * ((x * x) * x))));
}
__device__ __forceinline__ double tl_gelu_tanh_d(double x) {
  return (0.5 * x) * (1.0 + tanh(0.79788456080286536 * (x + 0.044715 * ((x * x) * x))));
}
__device__ __forceinline__ float tl_silu(float x) { return x * (1.0f / (1.0f + __expf(-x))); }
__device__ __forceinline__ double tl_silu_d(double x) { return x * (1.0 / (1.0 + exp(-x))); }

// Native 16-bit add, subtract and multiply on raw bit patterns, each rounded once (fma with
// 1.0 or -0.0 as the other operand); through float before sm_80 (f16 before sm_53).
__device__ __forceinline__ float tl_bits_bf16(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ float tl_bits_f16(unsigned short b) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(b));
  return f;
}
__device__ __forceinline__ tl_bf16 tl_mk_bf16(unsigned short b) { tl_bf16 h; h.bits = b; return h; }
__device__ __forceinline__ tl_f16 tl_mk_f16(unsigned short b) { tl_f16 h; h.bits = b; return h; }
__device__ __forceinline__ unsigned short tl_add_bf16(unsigned short a, unsigned short b) {
#if __CUDA_ARCH__ >= 800
  unsigned short r;
  asm("fma.rn.bf16 %0, %1, %2, %3;" : "=h"(r) : "h"(a), "h"((unsigned short)0x3f80), "h"(b));
  return r;
#else
  const float x = tl_bits_bf16(a), y = tl_bits_bf16(b);
  return tl_st_bf16(x + y).bits;
#endif
}
__device__ __forceinline__ unsigned short tl_sub_bf16(unsigned short a, unsigned short b) {
#if __CUDA_ARCH__ >= 800
  unsigned short r;
  asm("fma.rn.bf16 %0, %1, %2, %3;" : "=h"(r) : "h"(b), "h"((unsigned short)0xbf80), "h"(a));
  return r;
#else
  const float x = tl_bits_bf16(a), y = tl_bits_bf16(b);
  return tl_st_bf16(x - y).bits;
#endif
}
__device__ __forceinline__ unsigned short tl_mul_bf16(unsigned short a, unsigned short b) {
#if __CUDA_ARCH__ >= 800
  unsigned short r;
  asm("fma.rn.bf16 %0, %1, %2, %3;" : "=h"(r) : "h"(a), "h"(b), "h"((unsigned short)0x8000));
  return r;
#else
  const float x = tl_bits_bf16(a), y = tl_bits_bf16(b);
  return tl_st_bf16(x * y).bits;
#endif
}
__device__ __forceinline__ unsigned short tl_add_f16(unsigned short a, unsigned short b) {
#if __CUDA_ARCH__ >= 530
  unsigned short r;
  asm("fma.rn.f16 %0, %1, %2, %3;" : "=h"(r) : "h"(a), "h"((unsigned short)0x3c00), "h"(b));
  return r;
#else
  const float x = tl_bits_f16(a), y = tl_bits_f16(b);
  return tl_st_f16(x + y).bits;
#endif
}
__device__ __forceinline__ unsigned short tl_sub_f16(unsigned short a, unsigned short b) {
#if __CUDA_ARCH__ >= 530
  unsigned short r;
  asm("fma.rn.f16 %0, %1, %2, %3;" : "=h"(r) : "h"(b), "h"((unsigned short)0xbc00), "h"(a));
  return r;
#else
  const float x = tl_bits_f16(a), y = tl_bits_f16(b);
  return tl_st_f16(x - y).bits;
#endif
}
__device__ __forceinline__ unsigned short tl_mul_f16(unsigned short a, unsigned short b) {
#if __CUDA_ARCH__ >= 530
  unsigned short r;
  asm("fma.rn.f16 %0, %1, %2, %3;" : "=h"(r) : "h"(a), "h"(b), "h"((unsigned short)0x8000));
  return r;
#else
  const float x = tl_bits_f16(a), y = tl_bits_f16(b);
  return tl_st_f16(x * y).bits;
#endif
}

__device__ __forceinline__ float tl_r_f16(float x) { return tl_ld_f16(tl_st_f16(x)); }
__device__ __forceinline__ float tl_r_bf16(float x) { return tl_ld_bf16(tl_st_bf16(x)); }

// fp8 storage formats: decode to float, saturating round-to-nearest-even encode.
__device__ __forceinline__ float tl_f8_dec(unsigned char b, int mb, int bias, bool has_inf) {
  float sign = (b & 0x80) ? -1.0f : 1.0f;
  int e = (b & 0x7f) >> mb;
  int m = b & ((1 << mb) - 1);
  int e_all = (1 << (7 - mb)) - 1;
  if (has_inf && e == e_all) return m == 0 ? sign * TL_INF_F : TL_NAN_F;
  if (!has_inf && e == e_all && m == (1 << mb) - 1) return TL_NAN_F;
  if (e == 0) return sign * (float)m * ldexpf(1.0f, 1 - bias - mb);
  return sign * (1.0f + (float)m / (float)(1 << mb)) * ldexpf(1.0f, e - bias);
}
__device__ __forceinline__ unsigned char tl_f8_enc(float x, int mb, int bias, float maxv, unsigned char max_bits) {
  unsigned char sign = signbit(x) ? 0x80 : 0;
  if (isnan(x)) return sign | 0x7f;
  float a = fabsf(x);
  if (isinf(a)) return sign | max_bits;
  if (a == 0.0f) return sign;
  int emin = 1 - bias;
  int e = max(ilogbf(a), emin);
  float quantum = ldexpf(1.0f, e - mb);
  float q = rintf(a / quantum) * quantum;
  if (q > maxv) return sign | max_bits;
  if (q == 0.0f) return sign;
  if (q < ldexpf(1.0f, emin)) return sign | (unsigned char)rintf(q / ldexpf(1.0f, emin - mb));
  int e2 = ilogbf(q);
  int m = (int)rintf(q / ldexpf(1.0f, e2 - mb)) - (1 << mb);
  return sign | (unsigned char)(((e2 + bias) << mb) | m);
}
__device__ __forceinline__ float tl_ld_f8e4m3(unsigned char b) { return tl_f8_dec(b, 3, 7, false); }
__device__ __forceinline__ float tl_ld_f8e5m2(unsigned char b) { return tl_f8_dec(b, 2, 15, true); }
__device__ __forceinline__ unsigned char tl_st_f8e4m3(float x) { return tl_f8_enc(x, 3, 7, 448.0f, 0x7e); }
__device__ __forceinline__ unsigned char tl_st_f8e5m2(float x) { return tl_f8_enc(x, 2, 15, 57344.0f, 0x7b); }
__device__ __forceinline__ float tl_r_f8e4m3(float x) { return tl_ld_f8e4m3(tl_st_f8e4m3(x)); }
__device__ __forceinline__ float tl_r_f8e5m2(float x) { return tl_ld_f8e5m2(tl_st_f8e5m2(x)); }

// NaN-propagating minimum and maximum.
__device__ __forceinline__ float tl_min(float a, float b) { return (isnan(a) || isnan(b)) ? TL_NAN_F : fminf(a, b); }
__device__ __forceinline__ float tl_max(float a, float b) { return (isnan(a) || isnan(b)) ? TL_NAN_F : fmaxf(a, b); }
__device__ __forceinline__ double tl_min(double a, double b) { return (isnan(a) || isnan(b)) ? TL_NAN_D : fmin(a, b); }
__device__ __forceinline__ double tl_max(double a, double b) { return (isnan(a) || isnan(b)) ? TL_NAN_D : fmax(a, b); }
template <typename T> __device__ __forceinline__ T tl_min(T a, T b) { return a < b ? a : b; }
template <typename T> __device__ __forceinline__ T tl_max(T a, T b) { return a < b ? b : a; }

__device__ __forceinline__ float tl_sign(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x); }
__device__ __forceinline__ double tl_sign(double x) { return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : x); }
template <typename T> __device__ __forceinline__ T tl_isign(T x) { return (T)((x > 0) - (x < 0)); }

template <typename T> __device__ __forceinline__ T tl_iabs(T x) { return x < 0 ? (T)(0ull - (unsigned long long)x) : x; }

// NaN-propagating minimum and maximum under the names the expression printer uses.
__device__ __forceinline__ float tl_fminf(float a, float b) { return tl_min(a, b); }
__device__ __forceinline__ float tl_fmaxf(float a, float b) { return tl_max(a, b); }
__device__ __forceinline__ double tl_fmin(double a, double b) { return tl_min(a, b); }
__device__ __forceinline__ double tl_fmax(double a, double b) { return tl_max(a, b); }
__device__ __forceinline__ double tl_ffloormod(double a, double b) { return a - b * floor(a / b); }

// Conversions without undefined behaviour: float to 64-bit integers saturating (NaN to 0);
// double to float rounding to odd (a second rounding to a narrower float is then exact).
__device__ __forceinline__ long long tl_f2i64(double x) {
  if (x != x) return 0;
  if (x >= 9223372036854775808.0) return 0x7fffffffffffffffLL;
  if (x <= -9223372036854775808.0) return -0x7fffffffffffffffLL - 1;
  return (long long)x;
}
__device__ __forceinline__ unsigned long long tl_f2u64(double x) {
  if (!(x > -1.0)) return 0;
  if (x >= 18446744073709551616.0) return 0xffffffffffffffffULL;
  return (unsigned long long)x;
}
__device__ __forceinline__ float tl_d2f_odd(double x) {
  float f = (float)x;
  if ((double)f == x || f != f) return f;
  unsigned int b = __float_as_uint(f);
  if (fabs((double)f) > fabs(x)) b -= 1u;
  return __uint_as_float(b | 1u);
}

// 64-bit integer arithmetic without undefined behaviour (the interpreter's): division and
// remainder by 0 give 0, by -1 wrapping negation and 0; shifts by 64 or more give 0.
__device__ __forceinline__ long long tl_sdiv(long long a, long long b) {
  if (b == 0) return 0;
  if (b == -1) return (long long)(0ull - (unsigned long long)a);
  return a / b;
}
__device__ __forceinline__ long long tl_srem(long long a, long long b) { return (b == 0 || b == -1) ? 0 : a % b; }
__device__ __forceinline__ long long tl_sfloordiv(long long a, long long b) {
  if (b == 0) return 0;
  if (b == -1) return (long long)(0ull - (unsigned long long)a);
  long long q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
__device__ __forceinline__ long long tl_sfloormod(long long a, long long b) {
  if (b == 0 || b == -1) return 0;
  long long r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
__device__ __forceinline__ unsigned long long tl_udiv(unsigned long long a, unsigned long long b) { return b ? a / b : 0; }
__device__ __forceinline__ unsigned long long tl_urem(unsigned long long a, unsigned long long b) { return b ? a % b : 0; }
__device__ __forceinline__ unsigned long long tl_upow(unsigned long long a, unsigned long long e) {
  unsigned long long r = 1;
  while (e) { if (e & 1ull) r *= a; a *= a; e >>= 1; }
  return r;
}
__device__ __forceinline__ long long tl_spow(long long a, long long e) {
  if (e < 0) return 0;
  if (e > 4294967295LL) e = 4294967295LL;
  return (long long)tl_upow((unsigned long long)a, (unsigned long long)e);
}
__device__ __forceinline__ long long tl_sshl(long long a, long long b) {
  unsigned int s = (unsigned int)b;
  return s >= 64 ? 0 : (long long)((unsigned long long)a << s);
}
__device__ __forceinline__ long long tl_sshr(long long a, long long b) {
  unsigned int s = (unsigned int)b;
  return s >= 64 ? 0 : a >> s;
}
__device__ __forceinline__ unsigned long long tl_ushl(unsigned long long a, unsigned long long b) {
  unsigned int s = (unsigned int)b;
  return s >= 64 ? 0 : a << s;
}
__device__ __forceinline__ unsigned long long tl_ushr(unsigned long long a, unsigned long long b) {
  unsigned int s = (unsigned int)b;
  return s >= 64 ? 0 : a >> s;
}
// Index floor division and modulo: plain for a positive divisor, else as above.
template <typename T> __device__ __forceinline__ T tl_ifloordiv(T a, T b) {
  if (b > 0) { T q = a / b; return q - ((a % b) < 0); }
  return (T)tl_sfloordiv((long long)a, (long long)b);
}
template <typename T> __device__ __forceinline__ T tl_ifloormod(T a, T b) {
  if (b > 0) { T r = a % b; return r < 0 ? r + b : r; }
  return (T)tl_sfloormod((long long)a, (long long)b);
}

// Block-wide all-reduce over the threads of a one-dimensional block of NT threads (a multiple
// of 32): warp shuffles, then one value per warp through shared memory. Every thread returns
// the reduction.
template <typename T> __device__ __forceinline__ T tl_shfl_xor(T v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ bool tl_shfl_xor(bool v, int m) { return __shfl_xor_sync(0xffffffffu, (int)v, m) != 0; }
__device__ __forceinline__ signed char tl_shfl_xor(signed char v, int m) { return (signed char)__shfl_xor_sync(0xffffffffu, (int)v, m); }
__device__ __forceinline__ unsigned char tl_shfl_xor(unsigned char v, int m) { return (unsigned char)__shfl_xor_sync(0xffffffffu, (int)v, m); }
__device__ __forceinline__ short tl_shfl_xor(short v, int m) { return (short)__shfl_xor_sync(0xffffffffu, (int)v, m); }
__device__ __forceinline__ unsigned short tl_shfl_xor(unsigned short v, int m) { return (unsigned short)__shfl_xor_sync(0xffffffffu, (int)v, m); }

struct TlAdd { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; } };
struct TlMul { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a * b; } };
struct TlMin { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return tl_min(a, b); } };
struct TlMax { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return tl_max(a, b); } };
struct TlAnd { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a && b; } };
struct TlOr { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a || b; } };
struct TlBitAnd { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a & b; } };
struct TlBitOr { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a | b; } };
struct TlBitXor { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a ^ b; } };

// All-reduce within aligned segments of NT lanes (a power of two up to 32) of every warp: the
// rows of a multi-row block.
template <int NT, typename Op, typename T>
__device__ __forceinline__ T tl_warp_allreduce(T v, Op op) {
#pragma unroll
  for (int m = NT / 2; m > 0; m >>= 1) v = op(v, tl_shfl_xor(v, m));
  return v;
}

template <int NT, typename Op, typename T>
__device__ __forceinline__ T tl_block_allreduce(T v, Op op, T* scratch) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = op(v, tl_shfl_xor(v, m));
  if (NT > 32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = scratch[0];
#pragma unroll
    for (int w = 1; w < NT / 32; ++w) v = op(v, scratch[w]);
    __syncthreads();
  }
  return v;
}

// An index read from data for a dimension of n >= 1 (tilec_tile::IndexCheck): negative values
// count from the end once when `wrap`; anything else outside 0..n is recorded in the kernel's
// status words (site + 1, the index as read, n; the first violation wins) and clamped, so that
// memory stays in bounds.
__device__ __noinline__ void tl_index_fault(long long* st, long long site, long long i, long long n) {
  if (atomicCAS((unsigned long long*)st, 0ull, (unsigned long long)(site + 1)) == 0ull) {
    st[1] = i;
    st[2] = n;
  }
}
__device__ __forceinline__ long long tl_index(long long* st, long long site, long long i, long long n, bool wrap) {
  long long j = (wrap && i < 0) ? i + n : i;
  if ((unsigned long long)j >= (unsigned long long)n) {
    tl_index_fault(st, site, i, n);
    j = j < 0 ? 0 : n - 1;
  }
  return j;
}
