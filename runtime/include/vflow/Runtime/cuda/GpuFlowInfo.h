//===- GpuFlowInfo.h - What the runtime needs to launch a flow ---*- C++
//-*-===//
//
// The CUDA backend (compiler/backends/CudaEmitter.cpp) emits one CUDA
// source per flow and this description of it; the artifact carries both.
// The runtime compiles the source with NVRTC for its device, group, head
// dimension and KV dtype (macros VFLOW_G, VFLOW_D, VFLOW_KV and one
// VFLOW_TILE_<i> per tile kernel) and launches the kernels in order.
//
// Sizes are lists as in CpuTensorSpec: > 0 static, -2 the group (G), -3 the
// head dimension (D); their product is a number of f32 elements.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_GPUFLOWINFO_H
#define VFLOW_RUNTIME_CUDA_GPUFLOWINFO_H

#include "vflow/Runtime/DType.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace vflow::rt {

/// The grid a flow's GPU kernel is launched over. The compiler's
/// vt-plan-launches decides it for each vt.kernel (vt::LaunchGrid has the
/// same cases in the same order: fields, tile, row); the CUDA backend adds
/// the append and commit kernels. A list is one (sequence, KV head).
enum class GpuGrid {
  Append, ///< batch x KV heads: the step's new token, then the cache stage
          ///< on a block it completes
  Fields, ///< pages x KV heads: the cache stage on given pages
  Tile,   ///< ceil(blocks / tile) x lists
  Row,    ///< lists: one CTA over every block of a list
  Commit, ///< lists: this step's stored states become the next step's
  Retain, ///< lists: the retain block's score of every complete block into
          ///< VflowGpuArgs::retainScore (launched only where it is set)
};

/// The grid's name in artifacts and messages: "append", "fields", "tile",
/// "row", "commit", "retain".
const char *gpuGridName(GpuGrid grid);
/// The grid of that name; nullopt for any other string.
std::optional<GpuGrid> parseGpuGrid(const std::string &name);

struct GpuKernelInfo {
  std::string symbol;
  GpuGrid grid = GpuGrid::Row;
  /// Threads per CTA (the kernel's __launch_bounds__): the vt.kernel's
  /// planned launch, or 256 for append (without a cache stage) and commit.
  int64_t threads = 256;
  /// Tile kernels: the planned blocks per tile (the launch's tile_blocks),
  /// and the shared f32 elements
  /// per block of the tile and in all (the tile is cut to fit). Append and
  /// fields kernels: the cache stage's shared f32 elements (fixedShared).
  int64_t planTile = 0;
  std::vector<std::vector<int64_t>> perBlockShared, fixedShared;
  /// The first index kernel, when it has a twin `<symbol>_append` that also
  /// does the append kernel's work (gpuFusedAppend: for which
  /// specializations it is compiled).
  bool appends = false;
};

/// A value one kernel passes to a later one, in the per-list workspace.
struct GpuWorkspaceSlot {
  bool perBlock = false; ///< maxBlocks times the sizes' product
  std::vector<int64_t> sizes;
};

/// PTX compiled ahead of time (vflowc --arch) for one specialization.
struct GpuBinary {
  std::string target; ///< compute_<digits>
  int64_t group = 0, headDim = 0;
  DType kvDType = DType::BF16; ///< a GPU KV dtype (isGpuKVDType)
  std::string ptx;
};

struct GpuFlowInfo {
  std::string source; ///< CUDA C++; includes "vflow/FlowDevice.cuh" only
  std::vector<GpuKernelInfo> kernels; ///< launch order; append/fields first
  std::vector<GpuWorkspaceSlot> workspace;
  std::vector<GpuBinary> binaries;
};

/// Shared memory a tile kernel may use for its values, in f32 elements.
constexpr int64_t kGpuTileSharedFloats = 10240;

/// Shared memory the cache stage (append and fields kernels) may use for
/// its values, in f32 elements: the 48 KB of static shared memory a CUDA
/// thread block has, less 1 KB.
constexpr int64_t kGpuCacheSharedFloats = 12032;

/// Product of `sizes` with G and D resolved.
int64_t resolvedElements(const std::vector<int64_t> &sizes, int64_t group,
                         int64_t headDim);

/// The blocks per tile of a tile kernel for (group, headDim): the plan's
/// tile, cut so its values fit in kGpuTileSharedFloats; 0 if none fits.
int64_t gpuTileBlocks(const GpuKernelInfo &kernel, int64_t group,
                      int64_t headDim);

/// The kernel whose appending twin exists for (group, headDim): the one
/// marked `appends`, when its values and the cache stage's fit in
/// kGpuTileSharedFloats together (the twin holds both); -1 if none, and
/// the append kernel runs on its own. gpuSpecializationMacros then defines
/// VFLOW_FUSED_APPEND, which compiles the twin: its CTA over a row's newest
/// complete block (a row kernel's only CTA) writes the row's token (a.kNew,
/// a.vNew), and the cache stage of the block it completes, before
/// anything else. The runtime launches it instead of the append kernel and
/// the kernel where its grid runs in one wave.
int64_t gpuFusedAppend(const GpuFlowInfo &info, int64_t group, int64_t headDim);

/// f32 elements of one list's workspace: `perBlock` times maxBlocks plus
/// `fixed`.
void gpuWorkspaceShape(const GpuFlowInfo &info, int64_t group, int64_t headDim,
                       int64_t &perBlock, int64_t &fixed);

/// Whether the GPU stores K/V in `type`: bf16, f16, fp8e4m3 or int8 (the
/// 8-bit ones with a scale per stored row).
bool isGpuKVDType(DType type);
/// Those dtypes as messages list them: "bf16, f16, fp8e4m3 or int8".
const char *gpuKVDTypeList();

/// The NVRTC options (-D...) that specialize `info.source` for a group, a
/// head dimension and a KV dtype (isGpuKVDType, else an Error).
std::vector<std::string> gpuSpecializationMacros(const GpuFlowInfo &info,
                                                 int64_t group, int64_t headDim,
                                                 DType kvType);

} // namespace vflow::rt

#endif // VFLOW_RUNTIME_CUDA_GPUFLOWINFO_H
