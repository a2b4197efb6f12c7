//===- Prefill.cu - Causal attention of new tokens over pages ---*- C++ -*-===//
//
// Prefill (fill) attention: every new query row of a sequence attends the
// sequence's tokens up to its own position, on tensor cores (the
// FlashAttention-2 forward over pages).
//
// Grid: (64-row query tiles of all sequences, query heads). A CTA's 4 warps
// take 16 query rows each, their Q fragments in registers; the CTA streams
// key tiles (64 keys; 32 for head dim 256) of its kv head from the pages
// through two shared-memory stages (cp.async; 8-bit K/V are widened to f16
// on the way in, exactly: fp8 as value / 256, int8 as the code; their token
// scales ride beside the tile, a score multiplied by its key's K scale and a
// probability by its key's V scale over the tile's largest before P V, the
// output carried in units of that largest scale, as in decode). Per tile each
// warp computes S = Q K^T with mma.sync m16n8k16, masks keys past each row's
// position, keeps an online softmax per row in registers and adds P V, P taken
// from the score accumulators as the A operand. Tiles of a sequence run last
// row first, so the longest CTAs start first.
//
//===----------------------------------------------------------------------===//

#include "AttentionCommon.h"
#include "DeviceHelpers.cuh"
#include "LatentAttention.h"
#include "vflow/Runtime/cuda/IndexCheck.cuh"

#include <climits>
#include <string>

namespace vflow::rt::cuda::detail {
namespace {

constexpr int kPrefillWarps = 4;
constexpr int kPrefillThreads = kPrefillWarps * 32;
/// Query rows of one CTA.
constexpr int kTileRows = 16 * kPrefillWarps;

struct PrefillParams : KVParams {
  int batch;
  int totalTokens;
  const int32_t *qIndptr;
  const int32_t *seqLen;
  const int32_t *indptr;
  const int32_t *pages;
};

/// The kernel's compile-time geometry; shared memory holds 16-bit elements
/// (8-bit pools are widened to f16).
template <int D> struct PrefillGeometry {
  static constexpr int keys = D <= 128 ? 64 : 32; ///< keys per tile
  static constexpr int units = D * 2 / 16;        ///< 16-byte units of a row
  static constexpr int kSteps = D / 16;           ///< QK k-steps
  static constexpr int tileBytes = keys * D * 2;  ///< one K or V tile
  /// A stage: the K tile, the V tile, the keys' K scales, their V scales.
  static constexpr int stageBytes = 2 * tileBytes + 2 * keys * 4;
  static constexpr int smemBytes = 2 * stageBytes;
};

/// Byte offset in a tile of unit `u` of row `r`, XOR-swizzled within each
/// 128-byte line so that the 8 rows of one ldmatrix phase hit different
/// banks (rows hold >= 8 units).
template <int Units>
__device__ __forceinline__ uint32_t tileOffset(int r, int u) {
  static_assert(Units >= 8, "rows of at least 128 bytes");
  return static_cast<uint32_t>(r * Units + (u ^ (r & 7))) * 16u;
}

/// Tile `kt` of K and V (KT keys of kv head `kvh`, from the sequence's
/// `pages`) into stage `stage` of shared memory; keys past `len` are 0.
/// 8-bit K/V are widened to f16 exactly (fp8 as value / 256, int8 as the
/// code), their keys' token scales stored after the tiles (1 without them,
/// 0 past `len`).
template <int D, KVType T>
__device__ __forceinline__ void
loadTile(const PrefillParams &p, int kt, int stage, uint8_t *smem,
         const int32_t *pages, int len, int kvh, size_t rowBytes) {
  using G = PrefillGeometry<D>;
  constexpr bool kByte = T == KVType::FP8E4M3 || T == KVType::INT8;
  constexpr int KT = G::keys, U = G::units;
  constexpr int bytes = kByte ? 1 : 2;
  uint8_t *kS = smem + stage * G::stageBytes;
  uint8_t *vS = kS + G::tileBytes;
  float *kScaleS = reinterpret_cast<float *>(vS + G::tileBytes);
  float *vScaleS = kScaleS + KT;
  const int k0 = kt * KT;
  constexpr int GU = D * bytes / 16; // 16-byte units of a stored row
  for (int i = threadIdx.x; i < KT * GU; i += kPrefillThreads) {
    const int r = i / GU, u = i % GU, key = k0 + r;
    const bool ok = key < len;
    size_t slot = 0; // the key's (page, kv head, position)
    if (ok)
      slot =
          (static_cast<size_t>(vflow::rt::cuda::checkedIndex(
               "prefill: pages entry", pages[key / p.pageSize], p.numPages)) *
               p.numKVHeads +
           kvh) *
              p.pageSize +
          key % p.pageSize;
    const size_t at = slot * rowBytes + static_cast<size_t>(u) * 16;
    if constexpr (!kByte) {
      const uint32_t dst = tileOffset<U>(r, u);
      cpAsync16(smemAddress(kS) + dst, p.kPool + at, ok ? 16u : 0u);
      cpAsync16(smemAddress(vS) + dst, p.vPool + at, ok ? 16u : 0u);
    } else {
      const uint4 zero = make_uint4(0, 0, 0, 0);
      const uint4 kw =
          ok ? *reinterpret_cast<const uint4 *>(p.kPool + at) : zero;
      const uint4 vw =
          ok ? *reinterpret_cast<const uint4 *>(p.vPool + at) : zero;
      auto widen = [&](const uint4 &w, uint8_t *base) {
        const uint4 lo = make_uint4(
            bytePairToF16x2<T>(w.x, 0x1404u), bytePairToF16x2<T>(w.x, 0x3424u),
            bytePairToF16x2<T>(w.y, 0x1404u), bytePairToF16x2<T>(w.y, 0x3424u));
        const uint4 hi = make_uint4(
            bytePairToF16x2<T>(w.z, 0x1404u), bytePairToF16x2<T>(w.z, 0x3424u),
            bytePairToF16x2<T>(w.w, 0x1404u), bytePairToF16x2<T>(w.w, 0x3424u));
        *reinterpret_cast<uint4 *>(base + tileOffset<U>(r, 2 * u)) = lo;
        *reinterpret_cast<uint4 *>(base + tileOffset<U>(r, 2 * u + 1)) = hi;
      };
      widen(kw, kS);
      widen(vw, vS);
      if (u == 0) {
        const bool scaled = p.kTokenScale != nullptr;
        kScaleS[r] = !ok ? 0.0f : scaled ? p.kTokenScale[slot] : 1.0f;
        vScaleS[r] = !ok ? 0.0f : scaled ? p.vTokenScale[slot] : 1.0f;
      }
    }
  }
}

/// S = Q K^T for one key tile: 8-key column tiles j.
template <int D, KVType T>
__device__ __forceinline__ void
tileScores(uint32_t kBase, const uint32_t (&qf)[PrefillGeometry<D>::kSteps][4],
           int lane, float (&s)[PrefillGeometry<D>::keys / 8][4]) {
  using G = PrefillGeometry<D>;
  constexpr bool kHalf = T != KVType::BF16;
  constexpr int KT = G::keys, U = G::units;
#pragma unroll
  for (int j = 0; j < KT / 8; ++j) {
    s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    const int r = 8 * j + (lane & 7);
#pragma unroll
    for (int kk = 0; kk < G::kSteps; kk += 2) {
      uint32_t m[4];
      ldmatrix4(m, kBase + tileOffset<U>(r, 2 * kk + (lane >> 3)));
      const uint32_t b0[2] = {m[0], m[1]}, b1[2] = {m[2], m[3]};
      mma16816<kHalf>(s[j], qf[kk], b0);
      mma16816<kHalf>(s[j], qf[kk + 1], b1);
    }
  }
}

/// Masks keys past each row's position, then the online softmax of rows A
/// (g) and B (g + 8): the scores (times `scale` and, with `keyScale`, their
/// key's K scale) become probabilities (unnormalized), the running maxima
/// and sums move, `o` is rescaled (times `oFactor` too).
template <int D>
__device__ __forceinline__ void
softmaxTile(float (&s)[PrefillGeometry<D>::keys / 8][4], int kt, int firstPos,
            int posA, int posB, int window, int t4, float scale,
            const float *keyScale, float oFactor, float &mA, float &mB,
            float &lA, float &lB, float (&o)[D / 8][4]) {
  constexpr int KT = PrefillGeometry<D>::keys;
  const int k0 = kt * KT;
  // Each row's first key (a sliding window's start; INT_MIN: none).
  const int lowA = window > 0 ? posA - window + 1 : INT_MIN;
  const int lowB = window > 0 ? posB - window + 1 : INT_MIN;
  const bool mask = k0 + KT - 1 > firstPos || k0 < max(lowA, lowB);
  float maxA = mA, maxB = mB;
#pragma unroll
  for (int j = 0; j < KT / 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = k0 + 8 * j + 2 * t4 + e;
      const float f = keyScale ? scale * keyScale[8 * j + 2 * t4 + e] : scale;
      float a = s[j][e] * f, c = s[j][2 + e] * f;
      if (mask && (key > posA || key < lowA))
        a = -INFINITY;
      if (mask && (key > posB || key < lowB))
        c = -INFINITY;
      s[j][e] = a;
      s[j][2 + e] = c;
      maxA = fmaxf(maxA, a);
      maxB = fmaxf(maxB, c);
    }
#pragma unroll
  for (int offset = 1; offset <= 2; offset <<= 1) {
    maxA = fmaxf(maxA, __shfl_xor_sync(0xffffffffu, maxA, offset));
    maxB = fmaxf(maxB, __shfl_xor_sync(0xffffffffu, maxB, offset));
  }
  // Without a window key 0 lies in the first tile and before every row, so
  // the maxima are finite; with one a row may have no key yet (its max
  // stays -infinity: no NaN from -infinity minus -infinity).
  const float baseA = maxA == -INFINITY ? 0.0f : maxA;
  const float baseB = maxB == -INFINITY ? 0.0f : maxB;
  const float alphaA = ex2(mA - baseA), alphaB = ex2(mB - baseB);
  mA = maxA;
  mB = maxB;
  float sumA = 0.0f, sumB = 0.0f;
#pragma unroll
  for (int j = 0; j < KT / 8; ++j) {
    s[j][0] = ex2(s[j][0] - baseA);
    s[j][1] = ex2(s[j][1] - baseA);
    s[j][2] = ex2(s[j][2] - baseB);
    s[j][3] = ex2(s[j][3] - baseB);
    sumA += s[j][0] + s[j][1];
    sumB += s[j][2] + s[j][3];
  }
  lA = lA * alphaA + sumA;
  lB = lB * alphaB + sumB;
  const float oA = alphaA * oFactor, oB = alphaB * oFactor;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    o[n][0] *= oA;
    o[n][1] *= oA;
    o[n][2] *= oB;
    o[n][3] *= oB;
  }
}

/// O += P V: P's 16-key chunks c as A fragments (with `keyScale`, each
/// key's probabilities times its relative V scale), V through
/// ldmatrix.trans.
template <int D, KVType T>
__device__ __forceinline__ void
tilePV(uint32_t vBase, int lane,
       const float (&s)[PrefillGeometry<D>::keys / 8][4], const float *keyScale,
       float invUnit, float (&o)[D / 8][4]) {
  using G = PrefillGeometry<D>;
  constexpr bool kHalf = T != KVType::BF16;
  constexpr int KT = G::keys, U = G::units;
  const int t4 = lane & 3;
  auto pair = [&](int j, int k) {
    if (!keyScale)
      return packPair<kHalf>(s[j][k], s[j][k + 1]);
    const float *v = keyScale + 8 * j + 2 * t4;
    return packPair<kHalf>(s[j][k] * (v[0] * invUnit),
                           s[j][k + 1] * (v[1] * invUnit));
  };
#pragma unroll
  for (int c = 0; c < KT / 16; ++c) {
    const uint32_t a[4] = {pair(2 * c, 0), pair(2 * c, 2), pair(2 * c + 1, 0),
                           pair(2 * c + 1, 2)};
    const int r = 16 * c + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      uint32_t m[4];
      ldmatrix4Trans(m, vBase + tileOffset<U>(r, n + (lane >> 4)));
      const uint32_t b0[2] = {m[0], m[1]}, b1[2] = {m[2], m[3]};
      mma16816<kHalf>(o[n], a, b0);
      mma16816<kHalf>(o[n + 1], a, b1);
    }
  }
}

/// Rows A and B of the output (null: not stored): `o` times `factor` over
/// the rows' softmax sums (each lane holds a quarter of `lA`, `lB`).
template <int D>
__device__ __forceinline__ void
storeRows(const float (&o)[D / 8][4], float lA, float lB, float factor,
          uint16_t *outA, uint16_t *outB, int t4) {
#pragma unroll
  for (int offset = 1; offset <= 2; offset <<= 1) {
    lA += __shfl_xor_sync(0xffffffffu, lA, offset);
    lB += __shfl_xor_sync(0xffffffffu, lB, offset);
  }
  const float invA = factor / lA, invB = factor / lB;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    if (outA)
      reinterpret_cast<uint32_t *>(outA)[4 * n + t4] =
          packPair<false>(o[n][0] * invA, o[n][1] * invA);
    if (outB)
      reinterpret_cast<uint32_t *>(outB)[4 * n + t4] =
          packPair<false>(o[n][2] * invB, o[n][3] * invB);
  }
}

/// The largest of `n` floats in shared memory.
template <int N> __device__ __forceinline__ float tileMax(const float *x) {
  float top = 0.0f;
#pragma unroll 8
  for (int i = 0; i < N; ++i)
    top = fmaxf(top, x[i]);
  return top;
}

/// This CTA's sequence (returned; p.batch when the CTA has none) and its
/// query tile in `tile`: the last tile of a sequence first.
__device__ __forceinline__ int ctaTile(const PrefillParams &p, int &tile) {
  tile = blockIdx.x;
  int b = 0;
  for (; b < p.batch; ++b) {
    const int tiles =
        (p.qIndptr[b + 1] - p.qIndptr[b] + kTileRows - 1) / kTileRows;
    if (tile < tiles) {
      tile = tiles - 1 - tile;
      break;
    }
    tile -= tiles;
  }
  return b;
}

template <int D, KVType T>
__global__ void __launch_bounds__(kPrefillThreads)
    prefillKernel(const PrefillParams p) {
  using G = PrefillGeometry<D>;
  constexpr bool kHalf = T != KVType::BF16;
  constexpr bool kByte = T == KVType::FP8E4M3 || T == KVType::INT8;
  constexpr int KT = G::keys;
  constexpr int bytes = kByte ? 1 : 2;
  extern __shared__ __align__(16) uint8_t smem[];

  int tile = 0;
  const int b = ctaTile(p, tile);
  if (b == p.batch)
    return;
  const int head = blockIdx.y;
  const int numHeads = p.numKVHeads * p.group;
  const int kvh = head / p.group;
  const int rows = p.qIndptr[b + 1] - p.qIndptr[b];
  const int len = p.seqLen[b];
  const int row0 = tile * kTileRows;
  const int validRows = min(kTileRows, rows - row0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int rA = warp * 16 + g, rB = rA + 8;
  const bool okA = rA < validRows, okB = rB < validRows;
  const int64_t tokenA = p.qIndptr[b] + row0 + rA;
  uint16_t *outA = p.out + (tokenA * numHeads + head) * D;
  uint16_t *outB = outA + int64_t(8) * numHeads * D;
  if (rows > len) { // more new rows than tokens: nothing to attend
    for (int n = t4; n < D / 2; n += 4) {
      if (okA)
        reinterpret_cast<uint32_t *>(outA)[n] = 0u;
      if (okB)
        reinterpret_cast<uint32_t *>(outB)[n] = 0u;
    }
    return;
  }
  const int firstPos = len - rows + row0;
  const int lastPos = firstPos + validRows - 1;
  // Rows past the sequence's end act as its last row (never stored).
  const int posA = okA ? firstPos + rA : lastPos;
  const int posB = okB ? firstPos + rB : lastPos;
  const int numTiles = lastPos / KT + 1;
  // A sliding window: tiles wholly before the first row's window are
  // skipped.
  const int firstTile = p.window > 0 ? max(0, firstPos - p.window + 1) / KT : 0;
  const int32_t *pages = p.pages + p.indptr[b];
  const size_t rowBytes = static_cast<size_t>(D) * bytes;
  const float vFactor = byteFactor<T>(p.vScale, kvh);
  const float scale = p.scaleLog2 * byteFactor<T>(p.kScale, kvh);

  // Q as A fragments (rows g and g + 8 of the warp's 16).
  uint32_t qf[G::kSteps][4];
  {
    const uint32_t *qa = reinterpret_cast<const uint32_t *>(
        p.q + (tokenA * numHeads + head) * D);
    const uint32_t *qb = qa + int64_t(8) * numHeads * D / 2;
#pragma unroll
    for (int kk = 0; kk < G::kSteps; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t *row = (i & 1) ? qb : qa;
        const bool ok = (i & 1) ? okB : okA;
        uint32_t w = ok ? row[kk * 8 + (i >> 1) * 4 + t4] : 0u;
        qf[kk][i] = kHalf ? bf16x2ToF16x2(w) : w;
      }
  }

  auto load = [&](int kt, int stage) {
    loadTile<D, T>(p, kt, stage, smem, pages, len, kvh, rowBytes);
  };

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
    o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float mA = -INFINITY, mB = -INFINITY, lA = 0.0f, lB = 0.0f;
  // 8-bit pools: the V scale `o` is in units of (the last tile's largest).
  float vUnit = 1.0f;

  load(firstTile, 0);
  cpAsyncCommit();
  for (int kt = firstTile; kt < numTiles; ++kt) {
    const int stage = (kt - firstTile) & 1;
    if (kt + 1 < numTiles)
      load(kt + 1, stage ^ 1);
    cpAsyncCommit();
    cpAsyncWait<1>();
    __syncthreads();
    const uint8_t *stageBase = smem + stage * G::stageBytes;
    const uint32_t kBase = smemAddress(stageBase);
    const uint32_t vBase = kBase + G::tileBytes;
    // 8-bit pools: the keys' K scales, then V's; the output moves to the
    // tile's V unit.
    const float *kScales = nullptr, *vScales = nullptr;
    float oFactor = 1.0f;
    if (kByte) {
      kScales = reinterpret_cast<const float *>(stageBase + 2 * G::tileBytes);
      vScales = kScales + KT;
      oFactor = moveVUnit(tileMax<KT>(vScales), vUnit);
    }

    float s[KT / 8][4];
    tileScores<D, T>(kBase, qf, lane, s);
    softmaxTile<D>(s, kt, firstPos, posA, posB, p.window, t4, scale, kScales,
                   oFactor, mA, mB, lA, lB, o);
    tilePV<D, T>(vBase, lane, s, vScales, 1.0f / vUnit, o);
    // Every warp is done with this stage before the next load refills it.
    __syncthreads();
  }

  storeRows<D>(o, lA, lB, vFactor * vUnit, okA ? outA : nullptr,
               okB ? outB : nullptr, t4);
}

template <int D, KVType T>
void launchPrefill(const PrefillParams &params, int tiles,
                   cudaStream_t stream) {
  constexpr int bytes = PrefillGeometry<D>::smemBytes;
  checkCuda(cudaFuncSetAttribute(prefillKernel<D, T>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 bytes),
            "prefillAttention: setting the kernel's shared memory");
  const int numHeads = params.numKVHeads * params.group;
  prefillKernel<D, T>
      <<<dim3(tiles, numHeads), kPrefillThreads, bytes, stream>>>(params);
  checkCuda(cudaGetLastError(), "prefillAttention: launch");
}

template <int D>
void dispatchPrefill(KVType type, const PrefillParams &params, int tiles,
                     cudaStream_t stream) {
  switch (type) {
  case KVType::BF16:
    return launchPrefill<D, KVType::BF16>(params, tiles, stream);
  case KVType::F16:
    return launchPrefill<D, KVType::F16>(params, tiles, stream);
  case KVType::FP8E4M3:
    return launchPrefill<D, KVType::FP8E4M3>(params, tiles, stream);
  case KVType::INT8:
    return launchPrefill<D, KVType::INT8>(params, tiles, stream);
  }
}

} // namespace
} // namespace vflow::rt::cuda::detail

namespace vflow::rt::cuda {

using namespace detail;

void prefillAttention(const PrefillAttentionArgs &args, cudaStream_t stream) {
  if (args.valueDim > 0)
    return latentPrefillAttention(args, stream);
  const char *op = "prefillAttention";
  checkKVArgs(op, args);
  require(args.totalTokens >= 0, op,
          "totalTokens must not be negative, got " +
              std::to_string(args.totalTokens));
  require(args.qIndptr && args.seqLen && args.indptr && args.pages, op,
          "qIndptr, seqLen, indptr and pages must not be null");
  require(args.numKVHeads * args.group <= 65535, op,
          "more than 65535 query heads");
  // Every sequence's rows in 64-row tiles: at most this many (CTAs past
  // the last tile return at once).
  const int64_t tiles =
      (static_cast<int64_t>(args.totalTokens) + kTileRows - 1) / kTileRows +
      args.batch;
  require(tiles <= INT_MAX, op, "too many query rows for one launch");
  if (args.totalTokens == 0)
    return;

  PrefillParams params{kvParams(args)};
  params.batch = args.batch;
  params.totalTokens = args.totalTokens;
  params.qIndptr = args.qIndptr;
  params.seqLen = args.seqLen;
  params.indptr = args.indptr;
  params.pages = args.pages;
  const int grid = static_cast<int>(tiles);
  switch (args.headDim) {
  case 64:
    dispatchPrefill<64>(args.kvType, params, grid, stream);
    break;
  case 128:
    dispatchPrefill<128>(args.kvType, params, grid, stream);
    break;
  default:
    dispatchPrefill<256>(args.kvType, params, grid, stream);
    break;
  }
}

} // namespace vflow::rt::cuda
