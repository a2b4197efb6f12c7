//===- FlowDevice.cuh - Device templates for generated flows -----*- CUDA
//-*-===//
//
// The CUDA backend's generated code (compiler/backends/CudaEmitter.cpp)
// includes this header and nothing else; NVRTC gets it from the runtime
// library (it is embedded at build time), so a machine without the source
// tree compiles generated code. It holds what the runtime owns: the argument
// struct, storage types, the names of the element functions, CTA reductions
// and scans; the exact top-k (radix select with ties to the lower index)
// and the writer of the sparse block table are in FlowSelect.cuh, which it
// includes at its end.
//
// The numeric rules themselves (storage encodings, element functions and
// their NaN rules, reduction steps, the rank order and its radix key,
// budgets' rounding, the kept blocks) are NumericRules.h's, the same text
// the interpreter and the CPU backend compile (it is embedded next to this
// header); what is here is the device's algorithms on them. Transcendental
// functions are CUDA's (within a few ulps of the host's libm).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_FLOWDEVICE_CUH
#define VFLOW_RUNTIME_CUDA_FLOWDEVICE_CUH

/// What every generated kernel receives (by value). Arrays are device
/// pointers; `r` below is a list: r = b * numKVHeads + kvHead.
struct VflowGpuArgs {
  int batch, numKVHeads, maxBlocks, pageSize;
  const int *seqLen;     ///< [batch] tokens (this step's token included)
  const int *blockTable; ///< [batch, maxBlocks] physical page per block
  const int *slot;       ///< [batch] state slot of each row
  const int *step;       ///< [batch] decode steps taken (the `step` input)
  const double *params;  ///< every vt.param, declaration order
  const float *const *consts;
  void *kPool, *vPool; ///< [pages, numKVHeads, P, D] (this layer)
  /// 8-bit pools (fp8e4m3, int8): each stored row's scale ([pages,
  /// numKVHeads, P]; NumericRules' scaled 8-bit KV); null for 16-bit ones.
  float *kTokenScale, *vTokenScale;
  void *const *fields;     ///< per field: [pages, numKVHeads, elems]
  float *const *statesOld; ///< per state: [slots, numKVHeads, elems]
  float *const *statesNew; ///< written by stores; committed after
  const unsigned short *q; ///< bf16 [batch, numKVHeads * G, D]
  const float *mass;       ///< [slots, numKVHeads, maxBlocks, G] last step's
  float *workspace;        ///< values passed between kernels
  const int *tableIndptr;  ///< [lists + 1] capacity of each list
  int *tableCount;         ///< [lists] entries written
  int *tablePages, *tableBlocks;
  /// Append: the new token of every row ([batch, numKVHeads, D], bf16);
  /// fields: the pages whose fields to compute.
  const unsigned short *kNew, *vNew;
  const int *pages;
  int numPages;
  /// Tile kernels: each CTA takes TILE / tileSplit blocks (at least one),
  /// the runtime's choice for the step's grid; 0 or 1: TILE.
  int tileSplit;
  /// The model's index of this launch's layer and of its first KV head (the
  /// inputs `layer` and `kv_head` = kvHeadBase + kvh).
  int layer, kvHeadBase;
  /// A flow with a retain block: where its retain kernel writes the score
  /// of each list's complete blocks ([lists, maxBlocks], or at token grain
  /// [lists, maxBlocks, P]); null: it does not run.
  float *retainScore;
  /// `first_token`: each row's blocks' first tokens' original positions
  /// ([batch, maxBlocks]); null: block * pageSize.
  const int *firstToken;
};

// Host code (the GPU session) includes this header for VflowGpuArgs only.
#ifdef __CUDACC__

#include "vflow/Runtime/NumericRules.h"
#include "vflow/Runtime/cuda/GridDependency.cuh"

namespace vd {

typedef unsigned short u16;
typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

/// The type of a flat element index over at most `Count` elements (the
/// generated loops' `e`): int while the count and a step of the CTA stay
/// below 2^31, so that hot loops keep 32-bit arithmetic, else 64-bit.
template <bool Wide> struct IndexType { typedef int type; };
template <> struct IndexType<true> { typedef long long type; };
template <long long Count>
using Index = typename IndexType<(Count > 0x7fffffffLL - 65536)>::type;

/// The shared numeric rules (NumericRules.h) under the names generated code
/// calls.
using vflow::rules::isNaN;
__device__ __forceinline__ float inf() { return vflow::rules::infinity(); }
__device__ __forceinline__ float nan() { return vflow::rules::quietNaN(); }

using vflow::rules::decodeBF16;
using vflow::rules::encodeBF16;

/// Storage types: Store<T>::encode/decode between f32 and the stored code.
struct F32 {
  typedef float Code;
  static __device__ __forceinline__ Code encode(float v) { return v; }
  static __device__ __forceinline__ float decode(Code c) { return c; }
};
struct BF16 {
  typedef u16 Code;
  static __device__ __forceinline__ Code encode(float v) {
    return encodeBF16(v);
  }
  static __device__ __forceinline__ float decode(Code c) {
    return decodeBF16(c);
  }
};
struct F16 {
  typedef u16 Code;
  static __device__ __forceinline__ Code encode(float v) {
    return vflow::rules::encodeF16(v);
  }
  static __device__ __forceinline__ float decode(Code c) {
    return vflow::rules::decodeF16(c);
  }
};
struct FP8E4M3 {
  typedef u8 Code;
  static __device__ __forceinline__ Code encode(float v) {
    return vflow::rules::encodeFP8E4M3(v);
  }
  static __device__ __forceinline__ float decode(Code c) {
    return vflow::rules::decodeFP8E4M3(c);
  }
};
/// int8: KV storage only, always with token scales.
struct INT8 {
  typedef signed char Code;
  static __device__ __forceinline__ Code encode(float v) {
    return vflow::rules::encodeInt8(v);
  }
  static __device__ __forceinline__ float decode(Code c) {
    return vflow::rules::decodeInt8(c);
  }
};
struct FP8E5M2 {
  typedef u8 Code;
  static __device__ __forceinline__ Code encode(float v) {
    return vflow::rules::encodeFP8E5M2(v);
  }
  static __device__ __forceinline__ float decode(Code c) {
    return vflow::rules::decodeFP8E5M2(c);
  }
};

/// Reads element `i` of a storage array of type T.
template <class T>
__device__ __forceinline__ float load(const void *base, long long i) {
  return T::decode(static_cast<const typename T::Code *>(base)[i]);
}
/// Rounds `v` to T and writes its code at element `i`.
template <class T>
__device__ __forceinline__ void store(void *base, long long i, float v) {
  static_cast<typename T::Code *>(base)[i] = T::encode(v);
}
/// `v` rounded to T, as f32 (states are stored as rounded f32).
template <class T> __device__ __forceinline__ float round(float v) {
  return T::decode(T::encode(v));
}

/// Element `i` of a K/V pool of kind T holding rows of D, times its row's
/// token scale when the pool has them (8-bit pools), as f32.
template <class T, int D>
__device__ __forceinline__ float loadKV(const void *pool, long long i,
                                        const float *tokenScale) {
  float v = load<T>(pool, i);
  return tokenScale ? v * tokenScale[i / D] : v;
}

/// The largest value of a scaled 8-bit KV kind (NumericRules).
template <class T> struct KVFormat { static constexpr float max = 0.0f; };
template <> struct KVFormat<INT8> {
  static constexpr float max = vflow::rules::kInt8Max;
};
template <> struct KVFormat<FP8E4M3> {
  static constexpr float max = vflow::rules::kFP8E4M3Max;
};

/// One warp (lane 0..31) stores a (token, KV head) row of `d` bf16 values
/// at element `dst` (a multiple of d) of a pool of kind T. With
/// `tokenScale` (8-bit pools) by NumericRules' scaled rule, as the CPU
/// cache writes it: scale = the row's largest magnitude / the format's
/// largest value (at tokenScale[dst / d]), code = encode(x / scale).
template <class T>
__device__ __forceinline__ void storeKVRow(void *pool, float *tokenScale,
                                           long long dst, const u16 *src, int d,
                                           int lane) {
  if (!tokenScale) {
    for (int i = lane; i < d; i += 32)
      store<T>(pool, dst + i, decodeBF16(src[i]));
    return;
  }
  float absMax = 0.0f;
  for (int i = lane; i < d; i += 32)
    absMax = vflow::rules::maximum(absMax, fabsf(decodeBF16(src[i])));
  for (int offset = 16; offset > 0; offset >>= 1)
    absMax = vflow::rules::maximum(
        absMax, __shfl_xor_sync(0xffffffffu, absMax, offset));
  const float scale = vflow::rules::kvScale(absMax, KVFormat<T>::max);
  if (lane == 0)
    tokenScale[dst / d] = scale;
  for (int i = lane; i < d; i += 32)
    store<T>(pool, dst + i, vflow::rules::kvScaled(decodeBF16(src[i]), scale));
}

//===----------------------------------------------------------------------===//
// Element functions (NumericRules.h)
//===----------------------------------------------------------------------===//

using vflow::rules::abs;
using vflow::rules::add;
using vflow::rules::clamp;
using vflow::rules::cmpEq;
using vflow::rules::cmpGe;
using vflow::rules::cmpGt;
using vflow::rules::cmpLe;
using vflow::rules::cmpLt;
using vflow::rules::cmpNe;
using vflow::rules::div;
using vflow::rules::exp;
using vflow::rules::hash01;
using vflow::rules::log;
using vflow::rules::logicalAnd;
using vflow::rules::logicalNot;
using vflow::rules::logicalOr;
using vflow::rules::maximum;
using vflow::rules::minimum;
using vflow::rules::mul;
using vflow::rules::neg;
using vflow::rules::pow;
using vflow::rules::relu;
using vflow::rules::rsqrt;
using vflow::rules::sigmoid;
using vflow::rules::silu;
using vflow::rules::sqrt;
using vflow::rules::sub;
using vflow::rules::tanh;
using vflow::rules::where;

//===----------------------------------------------------------------------===//
// Reductions: accumulate, finish to float (NumericRules.h)
//===----------------------------------------------------------------------===//

/// A reduction for the CTA primitives: init, acc (one input), merge (two
/// partials) in double; initf/accf and merge in float for the wide
/// reductions' lanes (a wide sum's f32 lanes, NumericRules' kSumLanes).
struct Sum {
  static __device__ __forceinline__ double init() {
    return vflow::rules::sumInit();
  }
  static __device__ __forceinline__ void acc(double &a, double x) {
    vflow::rules::accSum(a, x);
  }
  static __device__ __forceinline__ float initf() { return 0.0f; }
  static __device__ __forceinline__ void accf(float &a, float x) {
    vflow::rules::accSumLane(a, x);
  }
  static __device__ __forceinline__ double merge(double a, double b) {
    return a + b;
  }
  static __device__ __forceinline__ float merge(float a, float b) {
    return a + b;
  }
};
struct Squares : Sum {
  static __device__ __forceinline__ void acc(double &a, double x) {
    vflow::rules::accSquares(a, x);
  }
  static __device__ __forceinline__ void accf(float &a, float x) {
    vflow::rules::accSquaresLane(a, x);
  }
};
struct Max {
  static __device__ __forceinline__ double init() {
    return vflow::rules::maxInit();
  }
  static __device__ __forceinline__ float initf() { return -inf(); }
  static __device__ __forceinline__ void accf(float &a, float x) {
    a = maximum(a, x);
  }
  static __device__ __forceinline__ double merge(double a, double x) {
    return vflow::rules::mergeMax(a, x);
  }
  static __device__ __forceinline__ float merge(float a, float x) {
    return maximum(a, x);
  }
  static __device__ __forceinline__ void acc(double &a, double x) {
    vflow::rules::accMax(a, x);
  }
};
struct Min {
  static __device__ __forceinline__ double init() {
    return vflow::rules::minInit();
  }
  static __device__ __forceinline__ float initf() { return inf(); }
  static __device__ __forceinline__ void accf(float &a, float x) {
    a = minimum(a, x);
  }
  static __device__ __forceinline__ double merge(double a, double x) {
    return vflow::rules::mergeMin(a, x);
  }
  static __device__ __forceinline__ float merge(float a, float x) {
    return minimum(a, x);
  }
  static __device__ __forceinline__ void acc(double &a, double x) {
    vflow::rules::accMin(a, x);
  }
};

/// std::max's rule (a NaN argument loses to the other), as softmax's
/// running maximum uses it (rules::softmaxLine).
struct HostMax {
  static __device__ __forceinline__ double init() {
    return vflow::rules::maxInit();
  }
  static __device__ __forceinline__ double merge(double a, double x) {
    return vflow::rules::stdMax(a, x);
  }
  static __device__ __forceinline__ void acc(double &a, double x) {
    a = merge(a, x);
  }
};

using vflow::rules::finishL2;
using vflow::rules::finishMean;
using vflow::rules::finishPlain;

/// std::max / std::min on doubles, as the host's budget code uses them.
__device__ __forceinline__ double dmax(double a, double b) {
  return vflow::rules::stdMax(a, b);
}
__device__ __forceinline__ double dmin(double a, double b) {
  return vflow::rules::stdMin(a, b);
}

using vflow::rules::roundBudget;

//===----------------------------------------------------------------------===//
// CTA primitives (blockDim.x threads, a multiple of 32, at most 1024)
//===----------------------------------------------------------------------===//

/// Scratch a CTA primitive needs in shared memory.
struct CtaScratch {
  double values[32];
  int counts[256];
  int total;
  u32 prefix;
  int remaining;
  int bucket;
  /// The radix select's: the other pass's digit counts, the AND and OR of
  /// the keys, and the (key, index) pairs of a bucket a warp finishes.
  int nextCounts[256];
  u32 keyAnd, keyOr;
  int listSize;
  u32 listKeys[32];
  int listIndex[32];
};

/// Combines one double per lane of a warp with Op::merge; every lane gets
/// it.
/// An xor butterfly (16, 8, 4, 2, 1) with Op::merge: every lane gets the
/// total. On f32 lane sums it is NumericRules' combineSumLanes.
template <class Op, class T> __device__ __forceinline__ T warpReduce(T v) {
  for (int o = 16; o > 0; o >>= 1)
    v = Op::merge(v, T(__shfl_xor_sync(0xffffffffu, v, o)));
  return v;
}

/// Combines NG partials per lane (one per query head of the group) across a
/// warp and hands each total to store(head, total) on one lane. With NG a
/// power of two up to 32 the partials are transposed while they are
/// reduced: at each of the first log2(NG) steps a lane keeps half of its
/// partials and trades the other half with its partner, so a warp
/// shuffles NG - 1 + 5 - log2(NG) values instead of 5 * NG; lane l ends
/// with head l / (32 / NG). Other NG reduce head by head. Either way each
/// head's total is warpReduce's xor butterfly over the lanes' partials
/// (addition commutes exactly), so f32 lane sums follow NumericRules'
/// combineSumLanes bit for bit.
template <class Op, int NG, class T, class StoreFn>
__device__ __forceinline__ void warpReduceGroup(T (&part)[NG], StoreFn store) {
  const int lane = threadIdx.x & 31;
  if constexpr (NG <= 32 && (NG & (NG - 1)) == 0) {
    constexpr int steps = NG >= 32   ? 5
                          : NG >= 16 ? 4
                          : NG >= 8  ? 3
                          : NG >= 4  ? 2
                          : NG >= 2  ? 1
                                     : 0;
#pragma unroll
    for (int step = 0; step < steps; ++step) {
      const int half = (NG >> step) / 2, o = 16 >> step;
      const bool upper = (lane & o) != 0;
#pragma unroll
      for (int i = 0; i < NG / 2; ++i) {
        if (i >= half)
          break;
        T send = upper ? part[i] : part[i + half];
        T keep = upper ? part[i + half] : part[i];
        T got = __shfl_xor_sync(0xffffffffu, send, o);
        part[i] = Op::merge(keep, got);
      }
    }
    constexpr int lanesPerHead = 32 / NG;
    T v = part[0];
#pragma unroll
    for (int o = lanesPerHead / 2; o > 0; o >>= 1)
      v = Op::merge(v, T(__shfl_xor_sync(0xffffffffu, v, o)));
    if ((lane & (lanesPerHead - 1)) == 0)
      store(lane / lanesPerHead, double(v));
  } else {
#pragma unroll
    for (int h = 0; h < NG; ++h) {
      const T total = warpReduce<Op>(part[h]);
      if (lane == 0)
        store(h, total);
    }
  }
}

/// Combines one double per thread with Op::merge; every thread gets it.
template <class Op> __device__ double ctaReduce(double v, CtaScratch &s) {
  for (int o = 16; o > 0; o >>= 1)
    v = Op::merge(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();
  if ((threadIdx.x & 31) == 0)
    s.values[warp] = v;
  __syncthreads();
  double out = s.values[0];
  for (int w = 1; w < warps; ++w)
    out = Op::merge(out, s.values[w]);
  __syncthreads();
  return out;
}

/// The largest of its arguments, at compile time.
__host__ __device__ constexpr int constMax(int a) { return a; }
template <class... Rest>
__host__ __device__ constexpr int constMax(int a, int b, Rest... rest) {
  return constMax(a > b ? a : b, rest...);
}

/// The shared-space address of `p` (a pointer into shared memory), for
/// warpCopyAsync: computed once, outside a loop of copies.
__device__ __forceinline__ unsigned sharedAddress(const void *p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

/// Starts a warp's asynchronous copy of `bytes` (a multiple of 16; both
/// addresses 16-byte aligned) from global `from` to shared-space address
/// `to` (sharedAddress), 16 bytes per lane at a time (cp.async: no
/// registers wait for the data, so the copies of several blocks are in
/// flight together). asyncCommit() closes a group; asyncWait<n>() waits
/// until at most n groups are pending (then __syncwarp() before reading).
__device__ __forceinline__ void warpCopyAsync(unsigned to, const void *from,
                                              int bytes) {
  const int lane = threadIdx.x & 31;
  for (int c = lane * 16; c < bytes; c += 32 * 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to + c),
                 "l"(static_cast<const char *>(from) + c)
                 : "memory");
}
__device__ __forceinline__ void asyncCommit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void asyncWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/// Rounds this thread takes part in of a CTA-wide pass over n floats: round
/// r starts at first + r * step and covers kInFlight * blockDim.x elements;
/// the thread loads its kInFlight of them, then hands each (index, value)
/// to store. A loop of one load and one store per element waits a memory
/// round trip for each (the compiler may not move a load above a store that
/// may alias it); here kInFlight loads are in flight together. The commit
/// kernel and the session's mass carry move their rows with it.
constexpr int kInFlight = 8;
template <class Store>
__device__ __forceinline__ void copyInFlight(const float *from, long long n,
                                             long long first, long long step,
                                             Store store) {
  for (long long r = first; r < n; r += step) {
    float v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const long long e = r + (long long)u * blockDim.x + threadIdx.x;
      v[u] = e < n ? from[e] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const long long e = r + (long long)u * blockDim.x + threadIdx.x;
      if (e < n)
        store(e, v[u]);
    }
  }
}

/// Exclusive prefix sum of one int per thread (thread order); `total` gets
/// the sum. All threads must call it. Warp 0 scans the warps' totals with
/// shuffles (one thread summing 32 totals in turn was the slow part).
__device__ int ctaExclusiveScan(int v, int &total, CtaScratch &s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int warps = int(blockDim.x / 32);
  int x = v;
  for (int o = 1; o < 32; o <<= 1) {
    int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o)
      x += y;
  }
  // counts[64, 96) take the warps' totals, counts[0, 32) their offsets;
  // whoever read counts before this call did so before its last barrier.
  if (lane == 31)
    s.counts[64 + warp] = x;
  __syncthreads();
  if (warp == 0) {
    const int c = lane < warps ? s.counts[64 + lane] : 0;
    int run = c;
    for (int o = 1; o < 32; o <<= 1) {
      int y = __shfl_up_sync(0xffffffffu, run, o);
      if (lane >= o)
        run += y;
    }
    s.counts[lane] = run - c;
    if (lane == 31)
      s.total = run;
  }
  __syncthreads();
  int out = s.counts[warp] + x - v;
  total = s.total;
  __syncthreads();
  return out;
}

} // namespace vd

// The selections (top-k, top-p, k-th largest) and the block-table writer.
#include "vflow/Runtime/cuda/FlowSelect.cuh"

#endif // __CUDACC__

#endif // VFLOW_RUNTIME_CUDA_FLOWDEVICE_CUH
