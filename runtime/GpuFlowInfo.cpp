//===- GpuFlowInfo.cpp - Sizes of a flow's CUDA kernels -------------------===//

#include "vflow/Runtime/cuda/GpuFlowInfo.h"
#include "vflow/Runtime/Error.h"

#include <algorithm>
#include <iterator>

using namespace vflow::rt;

namespace {

/// Each grid's name, in the enum's order: the one list that gpuGridName and
/// parseGpuGrid read.
constexpr const char *kGridNames[] = {"append", "fields", "tile",
                                      "row",    "commit", "retain"};
static_assert(std::size(kGridNames) == static_cast<size_t>(GpuGrid::Retain) + 1,
              "one name per grid");

} // namespace

const char *vflow::rt::gpuGridName(GpuGrid grid) {
  size_t i = static_cast<size_t>(grid);
  return i < std::size(kGridNames) ? kGridNames[i] : "?";
}

std::optional<GpuGrid> vflow::rt::parseGpuGrid(const std::string &name) {
  for (size_t i = 0; i < std::size(kGridNames); ++i)
    if (name == kGridNames[i])
      return static_cast<GpuGrid>(i);
  return std::nullopt;
}

int64_t vflow::rt::resolvedElements(const std::vector<int64_t> &sizes,
                                    int64_t group, int64_t headDim) {
  int64_t n = 1;
  for (int64_t s : sizes)
    n *= s == -2 ? group : s == -3 ? headDim : s;
  return n;
}

namespace {

/// f32 elements of `lists` (shared memory sizes) for (group, headDim).
int64_t sharedFloats(const std::vector<std::vector<int64_t>> &lists,
                     int64_t group, int64_t headDim) {
  int64_t n = 0;
  for (const auto &sizes : lists)
    n += resolvedElements(sizes, group, headDim);
  return n;
}

} // namespace

int64_t vflow::rt::gpuTileBlocks(const GpuKernelInfo &kernel, int64_t group,
                                 int64_t headDim) {
  const int64_t perBlock = sharedFloats(kernel.perBlockShared, group, headDim),
                fixed = sharedFloats(kernel.fixedShared, group, headDim);
  int64_t tile = std::max<int64_t>(1, kernel.planTile);
  if (fixed > kGpuTileSharedFloats)
    return 0;
  if (perBlock > 0)
    tile = std::min(tile, (kGpuTileSharedFloats - fixed) / perBlock);
  return tile;
}

int64_t vflow::rt::gpuFusedAppend(const GpuFlowInfo &info, int64_t group,
                                  int64_t headDim) {
  int64_t cache = 1;
  for (const GpuKernelInfo &k : info.kernels)
    if (k.grid == GpuGrid::Append)
      cache += sharedFloats(k.fixedShared, group, headDim);
  for (size_t i = 0; i < info.kernels.size(); ++i) {
    const GpuKernelInfo &k = info.kernels[i];
    if (!k.appends)
      continue;
    int64_t own = 1 + sharedFloats(k.fixedShared, group, headDim);
    if (k.grid == GpuGrid::Tile) {
      int64_t tile = gpuTileBlocks(k, group, headDim);
      if (tile < 1)
        return -1;
      own += tile * sharedFloats(k.perBlockShared, group, headDim);
    }
    return own + cache <= kGpuTileSharedFloats ? int64_t(i) : -1;
  }
  return -1;
}

void vflow::rt::gpuWorkspaceShape(const GpuFlowInfo &info, int64_t group,
                                  int64_t headDim, int64_t &perBlock,
                                  int64_t &fixed) {
  perBlock = fixed = 0;
  for (const GpuWorkspaceSlot &slot : info.workspace)
    (slot.perBlock ? perBlock : fixed) +=
        resolvedElements(slot.sizes, group, headDim);
}

const char *vflow::rt::gpuKVDTypeList() { return "bf16, f16, fp8e4m3 or int8"; }

bool vflow::rt::isGpuKVDType(DType type) {
  return type == DType::BF16 || type == DType::F16 || type == DType::FP8E4M3 ||
         type == DType::INT8;
}

std::vector<std::string>
vflow::rt::gpuSpecializationMacros(const GpuFlowInfo &info, int64_t group,
                                   int64_t headDim, DType kvType) {
  if (!isGpuKVDType(kvType))
    throw Error(std::string("the GPU stores K/V as ") + gpuKVDTypeList() +
                ", not " + dtypeName(kvType));
  const std::string kv = kvType == DType::BF16      ? "vd::BF16"
                         : kvType == DType::F16     ? "vd::F16"
                         : kvType == DType::FP8E4M3 ? "vd::FP8E4M3"
                                                    : "vd::INT8";
  if (group < 1 || headDim < 1)
    throw Error("group and head dimension must be positive");
  std::vector<std::string> out = {"-DVFLOW_G=" + std::to_string(group),
                                  "-DVFLOW_D=" + std::to_string(headDim),
                                  "-DVFLOW_KV=" + kv};
  for (size_t i = 0; i < info.kernels.size(); ++i) {
    const GpuKernelInfo &k = info.kernels[i];
    if (k.grid == GpuGrid::Append || k.grid == GpuGrid::Fields) {
      int64_t floats = 1 + sharedFloats(k.fixedShared, group, headDim);
      if (floats > kGpuCacheSharedFloats)
        throw Error("the cache stage needs " +
                    std::to_string((floats * 4 + 1023) / 1024) +
                    " KB of shared memory per (page, KV head) for group " +
                    std::to_string(group) + " and head dimension " +
                    std::to_string(headDim) + "; the GPU backend has " +
                    std::to_string(kGpuCacheSharedFloats * 4 / 1024) +
                    " KB: make the cache stage's intermediate values "
                    "smaller (reductions that keep large axes of K, V or "
                    "consts)");
    }
    if (k.grid != GpuGrid::Tile)
      continue;
    int64_t tile = gpuTileBlocks(k, group, headDim);
    if (tile < 1)
      throw Error("kernel " + k.symbol +
                  " needs more shared memory than a "
                  "CTA has for group " +
                  std::to_string(group) + " and head dimension " +
                  std::to_string(headDim));
    out.push_back("-DVFLOW_TILE_" + std::to_string(i) + "=" +
                  std::to_string(tile));
  }
  if (gpuFusedAppend(info, group, headDim) >= 0)
    out.push_back("-DVFLOW_FUSED_APPEND=1");
  return out;
}
