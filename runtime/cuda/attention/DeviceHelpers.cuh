//===- DeviceHelpers.cuh - Device helpers for attention kernels -*- C++ -*-===//
//
// What the decode and prefill kernels share on the device: element
// conversions (fp8 e4m3 to f16 by bit moves), and thin wrappers of the PTX
// instructions the decode kernel is built from (cp.async, ldmatrix,
// movmatrix, mma.sync m16n8k16). Programmatic launches are GridDependency.cuh's
// (vd::awaitEarlierGrids), the contract every kernel of a step keeps.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_ATTENTION_DEVICEHELPERS_CUH
#define VFLOW_RUNTIME_CUDA_ATTENTION_DEVICEHELPERS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "vflow/Runtime/cuda/Attention.h"
#include "vflow/Runtime/cuda/GridDependency.cuh"

#include <cstdint>

namespace vflow::rt::cuda::detail {

/// The fp8 scale of kv head `kvh` (1 when the array is null).
__device__ __forceinline__ float headScale(const float *scales, int kvh) {
  return scales ? scales[kvh] : 1.0f;
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float bf16BitsToFloat(uint32_t bits) {
  return __uint_as_float(bits << 16);
}

/// Two fp8 e4m3 bytes of `word`, picked by the byte_perm selector `select`
/// into bytes 1 and 3 (bytes 0 and 2 zero), as f16x2 holding value / 256:
/// the sign stays at bit 15, exponent and mantissa move one bit down. Exact
/// for every finite e4m3 value, subnormals included.
__device__ __forceinline__ uint32_t fp8PairToF16x2(uint32_t word,
                                                   uint32_t select) {
  const uint32_t y = __byte_perm(word, 0u, select);
  return (y & 0x80008000u) | ((y >> 1) & 0x3F803F80u);
}

/// Two int8 bytes of `word`, picked by the same byte_perm selectors as
/// fp8PairToF16x2 (which put them in bytes 1 and 3), as f16x2 holding the
/// codes exactly: each byte goes to the low byte of its half, under 0x64
/// (f16 1024 + byte), its sign bit flipped (1152 + code), and 1152 is
/// subtracted.
__device__ __forceinline__ uint32_t int8PairToF16x2(uint32_t word,
                                                    uint32_t select) {
  const uint32_t low = ((select >> 4) & 0x0F0Fu) | 0x4040u;
  const uint32_t y = __byte_perm(word, 0x64646464u, low) ^ 0x00800080u;
  const __half2 h = __hsub2(*reinterpret_cast<const __half2 *>(&y),
                            __half2(__ushort_as_half(0x6480u),
                                    __ushort_as_half(0x6480u))); // 1152
  return *reinterpret_cast<const uint32_t *>(&h);
}

/// Two bytes of an 8-bit pool as f16x2 (the selectors above): fp8 as
/// value / 256, int8 as the code.
template <KVType T>
__device__ __forceinline__ uint32_t bytePairToF16x2(uint32_t word,
                                                    uint32_t select) {
  if constexpr (T == KVType::INT8)
    return int8PairToF16x2(word, select);
  else
    return fp8PairToF16x2(word, select);
}

/// What an 8-bit pool's scores (K) or outputs (V) are multiplied by: its
/// per-KV-head scale, times 256 for fp8 (widened to value / 256); 1 for
/// 16-bit pools.
template <KVType T>
__device__ __forceinline__ float byteFactor(const float *headScales, int kvh) {
  if constexpr (T == KVType::FP8E4M3)
    return 256.0f * headScale(headScales, kvh);
  else if constexpr (T == KVType::INT8)
    return headScale(headScales, kvh);
  else
    return 1.0f;
}

/// Moves the unit an attention accumulator is kept in (token-scaled 8-bit
/// V: probabilities times V scale / unit stay in [0, 1] for the f16 P V
/// product) to `top`, the largest V scale of the next keys, and returns the
/// factor the accumulator moves by. Keys of no scale (top 0) keep the unit;
/// the unit falls at most 2^60 at once, so the accumulator cannot overflow.
__device__ __forceinline__ float moveVUnit(float top, float &unit) {
  const float next = top > 0.0f ? fmaxf(top, unit * 0x1p-60f) : unit;
  const float factor = unit / next;
  unit = next;
  return factor;
}

/// Two bf16 values (low element first) as f16x2.
__device__ __forceinline__ uint32_t bf16x2ToF16x2(uint32_t bits) {
  const __half2 h = __floats2half2_rn(bf16BitsToFloat(bits & 0xFFFFu),
                                      bf16BitsToFloat(bits >> 16));
  return *reinterpret_cast<const uint32_t *>(&h);
}

template <bool Half>
__device__ __forceinline__ uint32_t packPair(float lo, float hi) {
  if constexpr (Half) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
  }
}

/// Split `split`'s entries [x, y) of a list of `count`: the list's own
/// entries (at most splits x entriesPerSplit of them) shared evenly by the
/// splits, at least minPerSplit a split (the later splits idle), so a short
/// list does not spread over many tiny CTAs and a long merge. The plan's
/// entriesPerSplit is for the longest list a step may have (a CUDA graph's
/// plan holds for the longest context a sequence may reach); fixed shares
/// of it would leave a shorter list's later splits idle instead.
__device__ __forceinline__ int2 splitShare(int count, int splits,
                                           int entriesPerSplit, int minPerSplit,
                                           int split) {
  const int planned = min(count, splits * entriesPerSplit);
  const int per = max((planned + splits - 1) / splits, minPerSplit);
  return make_int2(min(planned, split * per), min(planned, split * per + per));
}

__device__ __forceinline__ uint32_t smemAddress(const void *pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

/// 16 bytes global -> shared, bypassing L1; bytes [srcBytes, 16) are zeroed.
__device__ __forceinline__ void cpAsync16(uint32_t dst, const void *src,
                                          uint32_t srcBytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(src), "r"(srcBytes)
               : "memory");
}

__device__ __forceinline__ void cpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int Pending> __device__ __forceinline__ void cpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

__device__ __forceinline__ void ldmatrix4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix4Trans(uint32_t (&r)[4],
                                               uint32_t addr) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(addr));
}

/// The transpose of the 8x8 16-bit matrix held one register per lane in the
/// mma fragment layout.
__device__ __forceinline__ uint32_t movTrans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;"
               : "=r"(y)
               : "r"(x));
  return y;
}

/// d += a * b, m16n8k16, f32 accumulators; f16 operands when Half, else
/// bf16.
template <bool Half>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  if constexpr (Half)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]),
                   "r"(b[1]));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]),
                   "r"(b[1]));
}

} // namespace vflow::rt::cuda::detail

#endif // VFLOW_RUNTIME_CUDA_ATTENTION_DEVICEHELPERS_CUH
