//===- Limits.h - Bounds every accepted input stays within -------*- C++
//-*-===//
//
// One copy of the size limits that the checker (frontend/Sema), the artifact
// validator and the runtime's sessions all apply, so that a program the
// compiler accepts never overflows an element count and an artifact that
// passes validation never asks the runtime for more than these bounds.
// Header-only and dependency-free: the frontend, the runtime and generated
// code's hosts can all include it.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_LIMITS_H
#define VFLOW_RUNTIME_LIMITS_H

#include <cstdint>
#include <vector>

namespace vflow::limits {

/// The largest size of one user axis (`axis m = 65536;`).
constexpr int64_t kMaxAxisSize = 65536;

/// The largest head dimension any flow can be attached to (`head_dim` param
/// range); the size model uses it for the symbolic `dim` axis (D).
constexpr int64_t kMaxHeadDim = 1024;

/// The largest GQA group (query heads per KV head); the size model uses it
/// for the symbolic `head` axis (G).
constexpr int64_t kMaxGroup = 64;

/// The most elements one value may have with D and G at their maxima
/// (kMaxHeadDim, kMaxGroup): per block for values with the `block` axis
/// (fields, per-block states and index-stage intermediates; the block axis
/// is not counted), in all for consts and per-sequence states. It keeps
/// every per-block offset within int32 and N times it within int64, on
/// every backend. Whether a flow fits in memory with the real D and G is
/// checked when it is attached to a cache (sessions, `vflowc run`).
constexpr int64_t kMaxElements = (int64_t(1) << 31) - 1;

/// The most elements the static axes of one value may have together (user
/// axes and `token`; D, G and N not counted): what the compiler itself may
/// have to materialize (consts, literals). 2^24 f32 elements are 64 MiB.
constexpr int64_t kMaxStaticElements = int64_t(1) << 24;

/// The most elements of literal data (`tensor(...)`, `load("x.npy", ...)`):
/// the data is compiled into the flow's generated C++ and CUDA as tables, so
/// host and device compile time grow with it. 2^20 f32 values (4 MiB, a
/// 1024 x 1024 matrix) compile in about 3 s; 2^24 took about a minute and
/// 5.5 GB.
constexpr int64_t kMaxLiteralElements = int64_t(1) << 20;

/// The head dimensions an artifact carries the consts' values for (so that
/// a GPU session needs no host compiler), unless the flow fixes head_dim:
/// the GPU attention kernels' 64, 128 and 256, and 576, the latent row of
/// DeepSeek-V2/V3's multi-head latent attention (kv_lora_rank 512 +
/// qk_rope_head_dim 64) that flows see as K on a latent cache.
inline constexpr int64_t kConstValueHeadDims[] = {64, 128, 256, 576};

/// The most elements all consts of one flow may hold together, with D at
/// the largest head dimension the artifact carries their values for (the
/// last of kConstValueHeadDims, or head_dim when the flow fixes it). The
/// artifact holds them as text for each of those head dimensions: 2^20
/// values keep it far below kMaxArtifactBytes (about 21 bytes a value, at
/// most (64 + 128 + 256 + 576) / 576 = 1.8 copies of 2^20 values, 39 MB), so
/// every artifact the compiler writes loads.
constexpr int64_t kMaxConstElements = int64_t(1) << 20;

/// The most vt operations one stage of a flow (its consts, its cache stage,
/// its index stage) may lower to. Backends compile one function per stage,
/// and host and device compilers take superlinear time on huge functions;
/// stock programs use a few dozen.
constexpr int64_t kMaxOpsPerStage = 2048;

/// Int params and int literals must be exactly representable in the f64 the
/// runtime carries params in: |value| <= 2^53.
constexpr int64_t kMaxExactInt = int64_t(1) << 53;

/// The numbers of complete blocks at which a flow's budgets are checked
/// (the checker with the params given, the runtime when a param is set): 0
/// to 4 and every power of two up to 2^20, each with the context lengths
/// N * block_size and N * block_size + block_size - 1. A budget that is NaN
/// or negative at any of them is an error.
inline std::vector<int64_t> budgetSampleBlocks() {
  std::vector<int64_t> blocks = {0, 1, 2, 3};
  for (int64_t n = 4; n <= (int64_t(1) << 20); n *= 2)
    blocks.push_back(n);
  return blocks;
}

/// The group sizes (query heads per KV head) at which the checker tries a
/// budget that reads `group`: 1 to 8 and the powers of two up to kMaxGroup.
/// The runtime checks its budgets at the session's own group.
inline std::vector<int64_t> budgetSampleGroups() {
  std::vector<int64_t> groups = {1, 2, 3, 4, 5, 6, 7, 8};
  for (int64_t g = 16; g <= kMaxGroup; g *= 2)
    groups.push_back(g);
  return groups;
}

/// The layer and KV head indices at which the checker tries a budget that
/// reads `layer` or `kv_head` (the model is not known at compile time): 0
/// to 3 and 2^n - 1 up to 127 (models have up to ~128 layers and KV heads).
/// A session checks its budgets at each of its own layers and KV heads.
inline std::vector<int64_t> budgetSampleIndices() {
  std::vector<int64_t> indices = {0, 1, 2, 3};
  for (int64_t n = 8; n <= 128; n *= 2)
    indices.push_back(n - 1);
  return indices;
}

/// `a * b` when it stays <= `limit` (both non-negative); otherwise -1. Used
/// to multiply axis sizes without overflowing int64.
constexpr int64_t boundedProduct(int64_t a, int64_t b, int64_t limit) {
  if (a < 0 || b < 0)
    return -1;
  if (a == 0 || b == 0)
    return 0;
  return a > limit / b ? -1 : a * b;
}

} // namespace vflow::limits

#endif // VFLOW_RUNTIME_LIMITS_H
