//===- NumericRules.h - The numeric rules every backend shares --*- C++ -*-===//
//
// One copy of each numeric rule of vflow: the storage encodings (bf16, f16,
// fp8 e4m3/e5m2), the element functions with their NaN rules, the steps and
// finishes of reductions, the lines along `block` (softmax, normalize, conv),
// the rank order of blocks (highest first, NaN last, ties to the lower
// index) and its radix key, the threshold test, the rounding of budgets and
// the kept first/last blocks.
//
// The same text is compiled into every place that computes these:
//   - the runtime's storage conversions (DType.cpp: the paged KV cache);
//   - the reference interpreter (compiler/Interpreter.cpp);
//   - the CPU backend's generated C++, through KernelABI.h (vflow::kabi);
//   - the CUDA backend's generated code (NVRTC) and the runtime's .cu files
//     (nvcc), through cuda/FlowDevice.cuh (vd::).
// Both JITs embed this header and hash it into their cache keys.
//
// So it depends on nothing: no standard header under NVRTC (which has none),
// only <math.h> elsewhere, and no int64_t (`long long` is 64 bits on every
// platform vflow runs on). Every function is `VFLOW_HD inline` except
// toppCount, which the host's selections share.
//
// The transcendental functions (expf, logf, powf, tanhf, exp) are the
// platform's: libm on the host, CUDA's on the device (within a few ulps of
// each other). Everything else is exact and gives the same bits everywhere.
// Algorithms stay with their platform (the host's nth_element, the device's
// radix select): they implement the rules here.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_NUMERICRULES_H
#define VFLOW_RUNTIME_NUMERICRULES_H

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define VFLOW_HD __host__ __device__
#else
#define VFLOW_HD
#endif

#ifndef __CUDACC_RTC__
#include <math.h>
#endif

namespace vflow {
namespace rules {

//===----------------------------------------------------------------------===//
// Bits
//===----------------------------------------------------------------------===//

/// The bits of `from` as a `To` of the same size (what the device's
/// __float_as_uint and __uint_as_float do).
template <class To, class From> VFLOW_HD inline To bitCast(From from) {
  static_assert(sizeof(To) == sizeof(From), "bitCast keeps the size");
  To to;
  __builtin_memcpy(&to, &from, sizeof(to));
  return to;
}

VFLOW_HD inline unsigned floatBits(float value) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(value);
#else
  return bitCast<unsigned>(value);
#endif
}

VFLOW_HD inline float bitsFloat(unsigned bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  return bitCast<float>(bits);
#endif
}

/// The number of leading zero bits of a nonzero `x`.
VFLOW_HD inline int leadingZeros(unsigned x) {
#ifdef __CUDA_ARCH__
  return __clz(static_cast<int>(x));
#else
  return __builtin_clz(x);
#endif
}

constexpr unsigned kInfinityBits = 0x7F800000u;
/// The NaN every rule produces (std::numeric_limits<float>::quiet_NaN()).
constexpr unsigned kQuietNaNBits = 0x7FC00000u;

VFLOW_HD inline float infinity() { return bitsFloat(kInfinityBits); }
VFLOW_HD inline float quietNaN() { return bitsFloat(kQuietNaNBits); }
VFLOW_HD inline bool isNaN(float x) { return x != x; }
VFLOW_HD inline bool isNaN(double x) { return x != x; }

//===----------------------------------------------------------------------===//
// Storage encodings: round to nearest, ties to even
//===----------------------------------------------------------------------===//
//
// bf16, f16 and fp8 e5m2 are IEEE-style: finite values past the largest
// finite value round to infinity, infinities stay infinities. fp8 e4m3 (the
// "fn" variant: no infinities, one NaN code per sign) saturates: finite
// values past 448 and infinities become +-448. NaN stays NaN with its sign
// (and the upper payload bits where the format has room for them);
// subnormals of every format are exact. Decoding is exact.

/// A binary float format narrower than f32: a sign bit, `exponentBits`,
/// then `mantissaBits` fraction bits. IEEE formats reserve the all-ones
/// exponent for infinities and NaNs; e4m3fn uses only the all-ones code for
/// NaN.
struct NarrowFormat {
  int mantissaBits, bias, exponentBits;
  bool hasInfinity;
  unsigned signBit, maxFiniteCode, canonicalNaN;
};

VFLOW_HD constexpr NarrowFormat f16Format() {
  return {10, 15, 5, true, 0x8000, 0x7BFF, 0x7E00};
}
VFLOW_HD constexpr NarrowFormat fp8E5M2Format() {
  return {2, 15, 5, true, 0x80, 0x7B, 0x7E};
}
VFLOW_HD constexpr NarrowFormat fp8E4M3Format() {
  return {3, 7, 4, false, 0x80, 0x7E, 0x7F};
}

VFLOW_HD inline unsigned encodeNarrow(float value, NarrowFormat format) {
  unsigned bits = floatBits(value);
  unsigned sign = (bits >> 31) ? format.signBit : 0;
  unsigned magnitude = bits & 0x7FFFFFFFu;
  const int m = format.mantissaBits;
  if (magnitude > kInfinityBits) {
    if (!format.hasInfinity)
      return sign | format.canonicalNaN;
    // Keep the upper payload bits; the quiet bit makes it a NaN for sure.
    return sign | format.canonicalNaN | ((magnitude & 0x7FFFFF) >> (23 - m));
  }
  if (magnitude == kInfinityBits)
    return sign | (format.hasInfinity ? format.maxFiniteCode + 1
                                      : format.maxFiniteCode);
  if (magnitude == 0)
    return sign;

  // magnitude = significand * 2^scale, exactly, with `exponent` the unbiased
  // exponent of its leading bit.
  unsigned biasedExponent = magnitude >> 23;
  unsigned fraction = magnitude & 0x7FFFFF;
  unsigned significand;
  int scale, exponent;
  if (biasedExponent == 0) {
    significand = fraction;
    scale = -149;
    exponent = (31 - leadingZeros(fraction)) - 149;
  } else {
    significand = fraction | 0x800000u;
    scale = static_cast<int>(biasedExponent) - 150;
    exponent = static_cast<int>(biasedExponent) - 127;
  }

  // Quantize to the target's spacing at this magnitude: 2^(e - m) in a normal
  // binade, 2^(emin - m) in the subnormal range.
  const int minExponent = 1 - format.bias;
  int quantum = (exponent < minExponent ? minExponent : exponent) - m;
  int shift = quantum - scale; // > 0: every target is narrower than f32
  unsigned units = 0;
  if (shift < 32) {
    units = significand >> shift;
    unsigned remainder = significand & ((1u << shift) - 1);
    unsigned half = 1u << (shift - 1);
    if (remainder > half || (remainder == half && (units & 1)))
      ++units;
  }

  // A subnormal count of 2^m is the smallest normal; a normal count of
  // 2^(m+1) carries into the next exponent: the encoding is continuous.
  unsigned long long code;
  if (exponent < minExponent)
    code = units;
  else
    code = (static_cast<unsigned long long>(exponent + format.bias) << m) +
           (units - (1u << m));
  if (code > format.maxFiniteCode)
    code = format.hasInfinity ? format.maxFiniteCode + 1 : format.maxFiniteCode;
  return sign | static_cast<unsigned>(code);
}

VFLOW_HD inline float decodeNarrow(unsigned code, NarrowFormat format) {
  const int m = format.mantissaBits;
  unsigned sign = (code & format.signBit) ? 0x80000000u : 0;
  unsigned magnitude = code & (format.signBit - 1);
  unsigned exponentField = magnitude >> m;
  unsigned fraction = magnitude & ((1u << m) - 1);
  unsigned allOnes = (1u << format.exponentBits) - 1;
  if (format.hasInfinity && exponentField == allOnes)
    return bitsFloat(fraction == 0
                         ? sign | kInfinityBits
                         : sign | kQuietNaNBits | (fraction << (23 - m)));
  if (!format.hasInfinity && magnitude == format.canonicalNaN)
    return bitsFloat(sign | kQuietNaNBits);
  if (exponentField == 0) {
    float value = ldexpf(static_cast<float>(fraction), 1 - format.bias - m);
    return sign ? -value : value;
  }
  unsigned exponent = exponentField - format.bias + 127;
  return bitsFloat(sign | (exponent << 23) | (fraction << (23 - m)));
}

/// bf16 is the upper half of an f32: adding 0x7FFF plus the lowest kept bit
/// rounds to nearest, ties to even, and a carry out of the fraction bumps
/// the exponent (up to infinity). NaN keeps its upper payload, made quiet.
VFLOW_HD inline unsigned short encodeBF16(float value) {
  unsigned bits = floatBits(value);
  if ((bits & 0x7FFFFFFFu) > kInfinityBits)
    return static_cast<unsigned short>((bits >> 16) | 0x0040u);
  bits += 0x7FFFu + ((bits >> 16) & 1);
  return static_cast<unsigned short>(bits >> 16);
}
VFLOW_HD inline float decodeBF16(unsigned short code) {
  return bitsFloat(static_cast<unsigned>(code) << 16);
}

VFLOW_HD inline unsigned short encodeF16(float value) {
  return static_cast<unsigned short>(encodeNarrow(value, f16Format()));
}
VFLOW_HD inline float decodeF16(unsigned short code) {
  return decodeNarrow(code, f16Format());
}
VFLOW_HD inline unsigned char encodeFP8E4M3(float value) {
  return static_cast<unsigned char>(encodeNarrow(value, fp8E4M3Format()));
}
VFLOW_HD inline float decodeFP8E4M3(unsigned char code) {
  return decodeNarrow(code, fp8E4M3Format());
}
VFLOW_HD inline unsigned char encodeFP8E5M2(float value) {
  return static_cast<unsigned char>(encodeNarrow(value, fp8E5M2Format()));
}
VFLOW_HD inline float decodeFP8E5M2(unsigned char code) {
  return decodeNarrow(code, fp8E5M2Format());
}

/// int8 (KV storage only, always with a scale): round to nearest, ties to
/// even, saturating at +-127 (-128 is never written, so the range is
/// symmetric); NaN becomes 0.
VFLOW_HD inline signed char encodeInt8(float value) {
  if (isNaN(value))
    return 0;
  float c = value < -127.0f ? -127.0f : value > 127.0f ? 127.0f : value;
  float f = ::floorf(c);
  float d = c - f; // exact: |c| <= 127
  int i = static_cast<int>(f);
  if (d > 0.5f || (d == 0.5f && (i & 1) != 0))
    ++i;
  return static_cast<signed char>(i);
}
VFLOW_HD inline float decodeInt8(signed char code) {
  return static_cast<float>(code);
}

/// Scaled 8-bit KV (int8, fp8): each (token, KV head) row of K or V is
/// stored as code = encode(x / scale) with scale = (the row's largest
/// magnitude) / (the format's largest finite value), and read as
/// decode(code) * scale. A row of zeros has scale 0 and reads as zeros; a
/// non-finite value makes its row read as NaN.
constexpr float kInt8Max = 127.0f, kFP8E4M3Max = 448.0f, kFP8E5M2Max = 57344.0f;
VFLOW_HD inline float kvScale(float absMax, float formatMax) {
  return absMax / formatMax;
}
VFLOW_HD inline float kvScaled(float value, float scale) {
  return scale == 0.0f ? 0.0f : value / scale;
}

/// What storing a value keeps: encoded and decoded again.
VFLOW_HD inline float roundBF16(float value) {
  return decodeBF16(encodeBF16(value));
}
VFLOW_HD inline float roundF16(float value) {
  return decodeF16(encodeF16(value));
}
VFLOW_HD inline float roundFP8E4M3(float value) {
  return decodeFP8E4M3(encodeFP8E4M3(value));
}
VFLOW_HD inline float roundFP8E5M2(float value) {
  return decodeFP8E5M2(encodeFP8E5M2(value));
}
VFLOW_HD inline float roundInt8(float value) {
  return decodeInt8(encodeInt8(value));
}
VFLOW_HD inline float roundF32(float value) { return value; }

//===----------------------------------------------------------------------===//
// Element functions
//===----------------------------------------------------------------------===//
//
// maximum and minimum are IEEE 754-2019's: NaN when either argument is
// NaN, and -0 below +0, so the result does not depend on the order of the
// arguments (max and min reductions are exact in any order); the
// comparisons are IEEE's (false
// against NaN, except !=); logical ops read nonzero as true (NaN included)
// and give 0 or 1; relu and clamp keep a NaN input. clamp's bounds apply
// with std::max/std::min's rule, so a NaN bound leaves the value alone.

VFLOW_HD inline float add(float a, float b) { return a + b; }
VFLOW_HD inline float sub(float a, float b) { return a - b; }
VFLOW_HD inline float mul(float a, float b) { return a * b; }
VFLOW_HD inline float div(float a, float b) { return a / b; }
VFLOW_HD inline float pow(float a, float b) { return ::powf(a, b); }

/// std::max's and std::min's rule, (a < b) ? b : a and (b < a) ? b : a: a
/// NaN `b` loses, a NaN `a` wins. Softmax's running maximum and the host's
/// budget arithmetic use it.
VFLOW_HD inline double stdMax(double a, double b) { return a < b ? b : a; }
VFLOW_HD inline double stdMin(double a, double b) { return b < a ? b : a; }
VFLOW_HD inline float stdMax(float a, float b) { return a < b ? b : a; }
VFLOW_HD inline float stdMin(float a, float b) { return b < a ? b : a; }

VFLOW_HD inline bool signBit(float x) { return (floatBits(x) >> 31) != 0; }
VFLOW_HD inline bool signBit(double x) {
#ifdef __CUDA_ARCH__
  return __double_as_longlong(x) < 0;
#else
  return bitCast<long long>(x) < 0;
#endif
}

/// maximum and minimum in any precision (equal values differ at most in
/// the sign of zero: +0 wins the maximum, -0 the minimum).
template <class T> VFLOW_HD inline T maximumOf(T a, T b) {
  if (isNaN(a) || isNaN(b))
    return T(quietNaN());
  if (a == b)
    return signBit(a) ? b : a;
  return a < b ? b : a;
}
template <class T> VFLOW_HD inline T minimumOf(T a, T b) {
  if (isNaN(a) || isNaN(b))
    return T(quietNaN());
  if (a == b)
    return signBit(a) ? a : b;
  return b < a ? b : a;
}

/// One instruction on sm_80 and later (max.NaN and min.NaN order -0 below
/// +0; tests/cuda/DriverTest.cpp checks them against the host's).
VFLOW_HD inline float maximum(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return maximumOf(a, b);
#endif
}
VFLOW_HD inline float minimum(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return minimumOf(a, b);
#endif
}
VFLOW_HD inline float logicalAnd(float a, float b) {
  return float(a != 0 && b != 0);
}
VFLOW_HD inline float logicalOr(float a, float b) {
  return float(a != 0 || b != 0);
}
VFLOW_HD inline float cmpLt(float a, float b) { return float(a < b); }
VFLOW_HD inline float cmpLe(float a, float b) { return float(a <= b); }
VFLOW_HD inline float cmpGt(float a, float b) { return float(a > b); }
VFLOW_HD inline float cmpGe(float a, float b) { return float(a >= b); }
VFLOW_HD inline float cmpEq(float a, float b) { return float(a == b); }
VFLOW_HD inline float cmpNe(float a, float b) { return float(a != b); }
VFLOW_HD inline float neg(float a) { return -a; }
VFLOW_HD inline float logicalNot(float a) { return float(a == 0); }
VFLOW_HD inline float exp(float a) { return ::expf(a); }
VFLOW_HD inline float log(float a) { return ::logf(a); }
VFLOW_HD inline float sqrt(float a) { return ::sqrtf(a); }
VFLOW_HD inline float rsqrt(float a) { return 1.0f / ::sqrtf(a); }
VFLOW_HD inline float abs(float a) { return ::fabsf(a); }
VFLOW_HD inline float relu(float a) {
  return a > 0 ? a : (isNaN(a) ? a : 0.0f);
}
VFLOW_HD inline float sigmoid(float a) { return 1.0f / (1.0f + ::expf(-a)); }
VFLOW_HD inline float silu(float a) { return a / (1.0f + ::expf(-a)); }
VFLOW_HD inline float tanh(float a) { return ::tanhf(a); }
/// A uniform value in [0, 1) from the bits of `a`: splitmix64 of its f32
/// bit pattern, the top 24 bits as a fraction (exact in f32), the same on
/// every backend; +0 and -0 differ, each NaN hashes its own bits.
VFLOW_HD inline float hash01(float a) {
  unsigned long long x = floatBits(a) + 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return float(unsigned(x >> 40)) * (1.0f / 16777216.0f);
}
VFLOW_HD inline float clamp(float x, float lo, float hi) {
  return isNaN(x) ? x : stdMin(stdMax(x, lo), hi);
}
VFLOW_HD inline float where(float c, float a, float b) {
  return c != 0 ? a : b;
}

//===----------------------------------------------------------------------===//
// Reductions: accumulate, finish to float
//===----------------------------------------------------------------------===//
//
// sum, mean and l2norm start at 0, max at -inf, min at +inf; max and min
// propagate NaN; mean of nothing is NaN. max and min are exact in any order.
//
// A wide sum (vt::ReduceOp::sumsInLanes: over the head dim or over at least
// 32 elements, not over `block`) accumulates in f32 in one fixed order that
// every backend follows bit for bit: element e of the reduced elements (row
// major over the reduced axes, in the input's axis order) goes to lane
// e % kSumLanes, each lane adds its elements in increasing e starting from
// 0, and combineSumLanes adds the lanes pairwise, lane l with l + 16, then
// l + 8, 4, 2, 1 (a warp's xor butterfly: addition is commutative, so every
// lane of the warp ends with the same total). Other sums (few elements,
// over `block`) accumulate in f64 in the input's order.

constexpr int kSumLanes = 32;

VFLOW_HD inline void accSumLane(float &a, float x) { a += x; }
/// x * x rounds to f32 before the add: no fused multiply-add.
VFLOW_HD inline void accSquaresLane(float &a, float x) {
  const float sq = x * x;
  a += sq;
}
/// The total of kSumLanes lane partials (overwritten).
VFLOW_HD inline float combineSumLanes(float *lane) {
  for (int o = kSumLanes / 2; o > 0; o >>= 1)
    for (int l = 0; l < o; ++l)
      lane[l] = lane[l] + lane[l + o];
  return lane[0];
}

VFLOW_HD inline double sumInit() { return 0.0; }
VFLOW_HD inline double maxInit() { return -double(infinity()); }
VFLOW_HD inline double minInit() { return double(infinity()); }

/// Two partial maxima (or minima) combined: maximum's (minimum's) rule.
VFLOW_HD inline double mergeMax(double a, double x) { return maximumOf(a, x); }
VFLOW_HD inline double mergeMin(double a, double x) { return minimumOf(a, x); }

VFLOW_HD inline void accSum(double &a, double x) { a += x; }
VFLOW_HD inline void accSquares(double &a, double x) { a += x * x; }
VFLOW_HD inline void accMax(double &a, double x) { a = mergeMax(a, x); }
VFLOW_HD inline void accMin(double &a, double x) { a = mergeMin(a, x); }

VFLOW_HD inline float finishPlain(double a, double) {
  return static_cast<float>(a);
}
VFLOW_HD inline float finishMean(double a, double count) {
  return static_cast<float>(count > 0 ? a / count : double(quietNaN()));
}
VFLOW_HD inline float finishL2(double a, double) {
  return static_cast<float>(::sqrt(a));
}

//===----------------------------------------------------------------------===//
// Along block: one line of `n` values at `x` with stride `xs`, into `y`
//===----------------------------------------------------------------------===//
//
// The host runs these as they are; the device splits the same steps over a
// CTA (the CUDA emitter's softmax, normalize and conv).

/// exp(x * scale - m) / sum in double, m the largest x * scale by stdMax.
VFLOW_HD inline void softmaxLine(const float *x, long long xs, float *y,
                                 long long ys, long long n, float scale) {
  double m = maxInit();
  for (long long j = 0; j < n; ++j)
    m = stdMax(m, double(x[j * xs]) * scale);
  double sum = 0;
  for (long long j = 0; j < n; ++j)
    sum += ::exp(double(x[j * xs]) * scale - m);
  for (long long j = 0; j < n; ++j)
    y[j * ys] = static_cast<float>(::exp(double(x[j * xs]) * scale - m) / sum);
}

/// x / sum(x), the sum in double.
VFLOW_HD inline void normalizeLine(const float *x, long long xs, float *y,
                                   long long ys, long long n) {
  double sum = 0;
  for (long long j = 0; j < n; ++j)
    sum += x[j * xs];
  for (long long j = 0; j < n; ++j)
    y[j * ys] = static_cast<float>(x[j * xs] / sum);
}

/// A centered convolution with `taps` weights (tap t reads j + t - taps/2),
/// zero outside the line, accumulated in double.
VFLOW_HD inline void convLine(const float *x, long long xs, float *y,
                              long long ys, long long n, const float *w,
                              long long taps) {
  long long half = taps / 2;
  for (long long j = 0; j < n; ++j) {
    double acc = 0;
    for (long long t = 0; t < taps; ++t) {
      long long src = j + t - half;
      if (src >= 0 && src < n)
        acc += double(w[t]) * x[src * xs];
    }
    y[j * ys] = static_cast<float>(acc);
  }
}

//===----------------------------------------------------------------------===//
// Ranking and selections
//===----------------------------------------------------------------------===//

/// Descending by value, NaN below every number, -0 equal to +0 (values
/// only: the k-th largest).
VFLOW_HD inline bool valueRanksBefore(float x, float y) {
  bool nx = isNaN(x), ny = isNaN(y);
  if (nx != ny)
    return ny;
  return !nx && x > y;
}

/// Blocks by score: descending, NaN last, ties (and two NaNs) toward the
/// lower index.
VFLOW_HD inline bool ranksBefore(float a, long long ia, float b, long long ib) {
  bool na = isNaN(a), nb = isNaN(b);
  if (na != nb)
    return nb;
  if (!na && a != b)
    return a > b;
  return ia < ib;
}

/// valueRanksBefore as an unsigned key for a radix select: x ranks before y
/// exactly when rankKey(x) > rankKey(y). -0 and +0 share a key; NaN is 0,
/// below -inf (0x007FFFFF).
VFLOW_HD inline unsigned rankKey(float x) {
  if (isNaN(x))
    return 0;
  if (x == 0)
    x = 0;
  unsigned b = floatBits(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/// kth_largest of a line of `n` values reads the value at this rank (0 is
/// the largest): the smallest when k > n, none (-1: the answer is +inf) when
/// k < 1 or the line is empty.
VFLOW_HD inline long long kthLargestRank(long long k, long long n) {
  if (n == 0 || k < 1)
    return -1;
  return (k < n ? k : n) - 1;
}

/// kth_largest's answer from the value at that rank: values of equal rank
/// may differ in the sign of zero (and NaN payload); a zero is +0.
VFLOW_HD inline float kthLargestValue(float atRank) {
  return atRank == 0 ? 0.0f : atRank;
}

/// threshold keeps a candidate whose score is >= t; NaN never passes.
VFLOW_HD inline bool passesThreshold(float score, float t) {
  return !isNaN(score) && score >= t;
}

/// topp(score, p, max = k) weighs a candidate by its share of the softmax
/// mass over the candidates, exp(score - top) with `top` the largest score,
/// in fixed point (2^40 is a weight of 1, truncated): sums of up to 2^20
/// weights are exact and do not depend on their order, so every backend
/// finds the same cut. NaN weighs 0; a score equal to the top (also an
/// infinite one) weighs 1.
constexpr unsigned long long kTopPOne = 1ull << 40;
VFLOW_HD inline unsigned long long toppWeight(float score, float top) {
  if (isNaN(score))
    return 0;
  if (score == top)
    return kTopPOne;
  double w = ::exp(double(score) - double(top));
  return static_cast<unsigned long long>(w * double(kTopPOne));
}

/// The weight topp's kept blocks must reach out of `total`: none for p <= 0
/// (or NaN), all for p >= 1, else ceil(p * total).
VFLOW_HD inline unsigned long long toppTarget(float p,
                                              unsigned long long total) {
  if (!(p > 0) || total == 0)
    return 0;
  if (p >= 1)
    return total;
  double t = ::ceil(double(p) * double(total));
  return t >= double(total) ? total : static_cast<unsigned long long>(t);
}

/// How many of `n` candidates topp keeps before its max: the shortest
/// prefix of the ranking (ranksBefore; rankedScore(i) is the i-th best
/// score) whose weight reaches the target. Host code (the GPU finds the
/// same count by a weighted radix select, FlowDevice.cuh ctaTopPCount).
template <class RankedScore>
inline long long toppCount(long long n, float p, RankedScore rankedScore) {
  if (n == 0 || isNaN(rankedScore(0)))
    return 0;
  const float top = rankedScore(0);
  unsigned long long total = 0;
  for (long long i = 0; i < n; ++i)
    total += toppWeight(rankedScore(i), top);
  const unsigned long long target = toppTarget(p, total);
  unsigned long long sum = 0;
  long long count = 0;
  while (sum < target && count < n)
    sum += toppWeight(rankedScore(count++), top);
  return count;
}

/// A budget (topk's k, threshold's max, kth_largest's k) evaluated in f64,
/// rounded down; NaN and negatives select nothing, and it stops at 9e15.
VFLOW_HD inline long long roundBudget(double v) {
  if (isNaN(v) || v <= 0)
    return 0;
  if (v > 9.0e15)
    return 9000000000000000LL;
  return static_cast<long long>(::floor(v));
}

/// A retain block's scores combined over KV heads and flow layers, in that
/// order from retainInit: summed (`combine = sum`, H2O's total attention
/// received) or their max (`combine = max`). The CPU session folds on the
/// host, the GPU session in a kernel: the same f32 steps in the same order.
VFLOW_HD inline float retainInit(bool max) { return max ? -infinity() : 0.0f; }
VFLOW_HD inline float retainFold(bool max, float acc, float score) {
  return max ? maximum(acc, score) : add(acc, score);
}

/// The blocks of a sequence of `numBlocks` complete blocks that every step
/// attends: the first `keepFirst` and the last `keepLast`. They are never
/// candidates of a selection; the final block list adds them (and the
/// partial last block) to the selection.
struct KeptBlocks {
  long long numBlocks, keepFirst, keepLast;
  VFLOW_HD bool contains(long long j) const {
    long long firstEnd = keepFirst < numBlocks ? keepFirst : numBlocks;
    long long lastBegin = numBlocks - keepLast > 0 ? numBlocks - keepLast : 0;
    return j < firstEnd || j >= lastBegin;
  }
  /// How many of the blocks are not kept (a selection's candidates).
  VFLOW_HD long long candidates() const {
    long long firstEnd = keepFirst < numBlocks ? keepFirst : numBlocks;
    long long lastBegin = numBlocks - keepLast > 0 ? numBlocks - keepLast : 0;
    return lastBegin > firstEnd ? lastBegin - firstEnd : 0;
  }
};

} // namespace rules
} // namespace vflow

#endif // VFLOW_RUNTIME_NUMERICRULES_H
