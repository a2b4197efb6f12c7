//===- vflow_ops.cpp - torch.ops.vflow: vflow's GPU kernels as torch ops --===//
//
// Built by CMake with the package against the installed torch
// (libvflow_torch_ops.so, python/CMakeLists.txt; vflow.torch_ops.load()
// loads it), so a torch-based serving engine calls vflow's kernels on its
// own tensors, on the current stream:
//
//   vflow::write_kv       K/V of new tokens into paged caches at (page, slot)
//   vflow::paged_decode   paged decode attention over block lists (sparse:
//                         the selection; dense: every block), with the
//                         optional per-block attention mass
//   vflow::paged_decode_workspace_bytes   what paged_decode's workspace needs
//   vflow::carry_mass     a step's per-block attention mass into the rows'
//                         state slots (for flows that read `mass`)
//   vflow::flow_cache_update   K/V of new tokens, then the flow's cache
//                         stage (fields) on the blocks they complete
//   vflow::flow_index     the flow's index stage of one layer: selection
//                         into preallocated block lists (optionally with
//                         the fused append of this step's token)
//   vflow::flow_workspace_bytes   what flow_index's workspace needs
//   vflow::flow_decode_layer   one decode layer (DecodeLayer.h, the routine
//                         vflow's own session runs): flow_index,
//                         paged_decode and carry_mass in one op
//
// The flow ops take a flow handle: the address of a VflowFlowOps
// (FlowOpsAbi.h) that vflow._vflow.CudaFlow owns (the flow's kernels,
// compiled for this device and shape, its consts and params); the engine
// owns every tensor.
//
// Every op checks its tensors (device, dtype, shape, contiguity) with
// TORCH_CHECK messages that name the argument. The fake (meta) kernels are
// registered in Python (vflow/torch_ops.py).
//
//===----------------------------------------------------------------------===//

#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/cuda/Attention.h"
#include "vflow/Runtime/cuda/DecodeLayer.h"
#include "vflow/Runtime/cuda/FlowOpsAbi.h"

#include "vflow/Runtime/cuda/SessionKernels.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_set>

using vflow::rt::cuda::KVType;
using vflow::rt::cuda::kvTypeName;

namespace {

/// Check messages are built here, without std::ostream: on the GPU machine's
/// torch 2.11 build, formatting an integer through c10::str (TORCH_CHECK
/// with several arguments) crashes in any extension, so every message is
/// one std::string (which c10::str passes through as it is).
std::string piece(const char *s) { return s; }
std::string piece(const std::string &s) { return s; }
template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
std::string piece(T v) {
  return std::to_string(v);
}
std::string piece(at::ScalarType t) { return c10::toString(t); }
std::string piece(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i)
    out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}
template <typename... Args> std::string message(const Args &...args) {
  std::string out;
  ((out += piece(args)), ...);
  return out;
}

#define VFLOW_CHECK(cond, ...) TORCH_CHECK(cond, message(__VA_ARGS__))

void checkCuda(const at::Tensor &t, const char *name) {
  VFLOW_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  VFLOW_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void checkIndex(const at::Tensor &t, const char *name) {
  checkCuda(t, name);
  VFLOW_CHECK(t.scalar_type() == at::kInt, name, " must be int32, got ",
              t.scalar_type());
  VFLOW_CHECK(t.dim() == 1, name, " must be 1-D, got ", t.dim(), " dims");
}

KVType kvTypeOf(const at::Tensor &cache, const char *name) {
  switch (cache.scalar_type()) {
  case at::kBFloat16:
    return KVType::BF16;
  case at::kHalf:
    return KVType::F16;
  case at::kFloat8_e4m3fn:
    return KVType::FP8E4M3;
  default:
    VFLOW_CHECK(false, name,
                " must be bfloat16, float16 or float8_e4m3fn, got ",
                cache.scalar_type());
  }
}

/// The paged cache's shape [pages, kv_heads, page_size, head_dim].
void checkCache(const at::Tensor &c, const char *name) {
  checkCuda(c, name);
  VFLOW_CHECK(c.dim() == 4, name,
              " must be [pages, kv_heads, page_size, head_dim], got ", c.dim(),
              " dims");
}

/// The K and V caches: each [pages, kv_heads, page_size, head_dim], alike.
void checkCaches(const at::Tensor &kCache, const at::Tensor &vCache) {
  checkCache(kCache, "k_cache");
  checkCache(vCache, "v_cache");
  VFLOW_CHECK(kCache.sizes() == vCache.sizes() &&
                  kCache.scalar_type() == vCache.scalar_type(),
              "v_cache must match k_cache (shape and dtype)");
}

/// Every tensor of an op on the caches' device (a kernel reads one GPU's
/// memory only).
void checkDevice(
    const at::Tensor &cache,
    std::initializer_list<std::pair<const at::Tensor *, const char *>>
        tensors) {
  for (auto [t, name] : tensors)
    VFLOW_CHECK(t->device() == cache.device(), name, " is on ",
                t->device().str(), ", the caches on ", cache.device().str());
}

template <typename Body> void rethrow(Body body) {
  try {
    body();
  } catch (const vflow::rt::Error &e) {
    VFLOW_CHECK(false, e.what());
  }
}

/// Checks k, v ([tokens, kv_heads, head_dim] bf16) and the slots against
/// the caches, then stores the tokens (on the current stream).
void storeTokens(const at::Tensor &k, const at::Tensor &v,
                 const at::Tensor &slotPages, const at::Tensor &slotPositions,
                 at::Tensor &kCache, at::Tensor &vCache) {
  checkCaches(kCache, vCache);
  const int64_t H = kCache.size(1), P = kCache.size(2), D = kCache.size(3);
  for (const at::Tensor *t : {&k, &v}) {
    const char *name = t == &k ? "k" : "v";
    checkCuda(*t, name);
    VFLOW_CHECK(t->scalar_type() == at::kBFloat16, name,
                " must be bfloat16, got ", t->scalar_type());
    VFLOW_CHECK(t->dim() == 3 && t->size(1) == H && t->size(2) == D, name,
                " must be [tokens, ", H, ", ", D, "], got ", t->sizes());
  }
  const int64_t n = k.size(0);
  VFLOW_CHECK(v.size(0) == n, "v must have as many tokens as k");
  checkIndex(slotPages, "slot_pages");
  checkIndex(slotPositions, "slot_positions");
  VFLOW_CHECK(slotPages.size(0) == n && slotPositions.size(0) == n,
              "slot_pages and slot_positions need one entry per token (", n,
              ")");
  checkDevice(kCache, {{&vCache, "v_cache"},
                       {&k, "k"},
                       {&v, "v"},
                       {&slotPages, "slot_pages"},
                       {&slotPositions, "slot_positions"}});
  const at::cuda::CUDAGuard guard(k.device());
  vflow::rt::cuda::WriteTokensArgs w;
  w.k = static_cast<const unsigned short *>(k.data_ptr());
  w.v = static_cast<const unsigned short *>(v.data_ptr());
  w.layer = 0;
  w.numLayers = 1;
  w.pages = slotPages.data_ptr<int32_t>();
  w.positions = slotPositions.data_ptr<int32_t>();
  w.n = int(n);
  w.numKVHeads = int(H);
  w.pageSize = int(P);
  w.numPages = int(kCache.size(0));
  w.headDim = int(D);
  w.kPool = kCache.data_ptr();
  w.vPool = vCache.data_ptr();
  w.kvType = kvTypeOf(kCache, "k_cache");
  rethrow([&] {
    vflow::rt::cuda::writeTokens(w, at::cuda::getCurrentCUDAStream());
  });
}

void writeKV(const at::Tensor &k, const at::Tensor &v,
             const at::Tensor &slotPages, const at::Tensor &slotPositions,
             at::Tensor &kCache, at::Tensor &vCache) {
  storeTokens(k, v, slotPages, slotPositions, kCache, vCache);
}

int64_t workspaceBytes(int64_t batch, int64_t kvHeads, int64_t group,
                       int64_t headDim, int64_t maxEntries) {
  int64_t bytes = 0;
  rethrow([&] {
    bytes = int64_t(vflow::rt::cuda::pagedDecodeWorkspaceBytes(
        int(batch), int(kvHeads), int(group), int(headDim), int(maxEntries)));
  });
  return bytes;
}

/// paged_decode's checks and arguments (the lists: indptr, count, pages,
/// blocks; one per sequence with listsPerSequence, else per sequence and
/// KV head).
vflow::rt::cuda::PagedAttentionArgs
attentionArgs(const at::Tensor &q, const at::Tensor &kCache,
              const at::Tensor &vCache, const at::Tensor &indptr,
              const at::Tensor &pages, const at::Tensor &blocks,
              const at::Tensor &seqLens, double scale, int64_t maxEntries,
              bool listsPerSequence, at::Tensor &out,
              const std::optional<at::Tensor> &mass, at::Tensor &workspace,
              const std::optional<at::Tensor> &count) {
  checkCaches(kCache, vCache);
  const int64_t H = kCache.size(1), P = kCache.size(2), D = kCache.size(3);
  checkCuda(q, "q");
  VFLOW_CHECK(q.scalar_type() == at::kBFloat16, "q must be bfloat16, got ",
              q.scalar_type());
  VFLOW_CHECK(q.dim() == 3 && q.size(2) == D && q.size(1) % H == 0,
              "q must be [batch, kv_heads * group, ", D, "], got ", q.sizes());
  const int64_t B = q.size(0), G = q.size(1) / H;
  checkCuda(out, "out");
  VFLOW_CHECK(out.sizes() == q.sizes() && out.scalar_type() == q.scalar_type(),
              "out must be like q");
  for (auto [t, name] : {std::pair{&indptr, "indptr"},
                         {&pages, "pages"},
                         {&blocks, "blocks"},
                         {&seqLens, "seq_lens"}})
    checkIndex(*t, name);
  const int64_t lists = listsPerSequence ? B : B * H;
  VFLOW_CHECK(indptr.size(0) == lists + 1, "indptr must have ", lists + 1,
              " entries (one list per ",
              listsPerSequence ? "sequence" : "sequence and KV head",
              ", plus one), got ", indptr.size(0));
  VFLOW_CHECK(blocks.size(0) == pages.size(0),
              "blocks must have an entry per page entry");
  VFLOW_CHECK(seqLens.size(0) == B, "seq_lens must have ", B, " entries");
  if (count) {
    checkIndex(*count, "count");
    VFLOW_CHECK(count->size(0) == lists, "count must have ", lists,
                " entries (one per list), got ", count->size(0));
  }
  checkCuda(workspace, "workspace");
  VFLOW_CHECK(workspace.scalar_type() == at::kByte, "workspace must be uint8");
  checkDevice(kCache, {{&vCache, "v_cache"},
                       {&q, "q"},
                       {&out, "out"},
                       {&indptr, "indptr"},
                       {&pages, "pages"},
                       {&blocks, "blocks"},
                       {&seqLens, "seq_lens"},
                       {&workspace, "workspace"}});
  if (count)
    checkDevice(kCache, {{&*count, "count"}});
  if (mass)
    checkDevice(kCache, {{&*mass, "mass"}});
  int64_t massStride = 0;
  if (mass) {
    checkCuda(*mass, "mass");
    VFLOW_CHECK(mass->scalar_type() == at::kFloat, "mass must be float32");
    VFLOW_CHECK(mass->dim() == 4 && mass->size(0) == B && mass->size(1) == H &&
                    mass->size(3) == G,
                "mass must be [batch, kv_heads, max_blocks, group], got ",
                mass->sizes());
    massStride = mass->size(2);
  }
  vflow::rt::cuda::PagedAttentionArgs a;
  a.kPool = kCache.data_ptr();
  a.vPool = vCache.data_ptr();
  a.kvType = kvTypeOf(kCache, "k_cache");
  a.batch = int(B);
  a.numKVHeads = int(H);
  a.group = int(G);
  a.headDim = int(D);
  a.pageSize = int(P);
  a.numPages = int(kCache.size(0));
  a.q = q.data_ptr();
  a.out = out.data_ptr();
  a.scale = float(scale);
  a.indptr = indptr.data_ptr<int32_t>();
  a.count = count ? count->data_ptr<int32_t>() : nullptr;
  a.pages = pages.data_ptr<int32_t>();
  a.blocks = blocks.data_ptr<int32_t>();
  a.seqLen = seqLens.data_ptr<int32_t>();
  a.listsPerSequence = listsPerSequence;
  a.maxEntries = int(maxEntries);
  a.mass = mass ? mass->data_ptr<float>() : nullptr;
  a.massStride = int(massStride);
  a.workspace = workspace.numel() ? workspace.data_ptr() : nullptr;
  a.workspaceBytes = size_t(workspace.numel());
  return a;
}

void pagedDecode(const at::Tensor &q, const at::Tensor &kCache,
                 const at::Tensor &vCache, const at::Tensor &indptr,
                 const at::Tensor &pages, const at::Tensor &blocks,
                 const at::Tensor &seqLens, double scale, int64_t maxEntries,
                 bool listsPerSequence, at::Tensor &out,
                 const std::optional<at::Tensor> &mass, at::Tensor &workspace,
                 const std::optional<at::Tensor> &count) {
  vflow::rt::cuda::PagedAttentionArgs a =
      attentionArgs(q, kCache, vCache, indptr, pages, blocks, seqLens, scale,
                    maxEntries, listsPerSequence, out, mass, workspace, count);
  const at::cuda::CUDAGuard guard(q.device());
  rethrow([&] {
    vflow::rt::cuda::pagedDecodeAttention(a, at::cuda::getCurrentCUDAStream());
  });
}

//===----------------------------------------------------------------------===//
// The flow's kernels
//===----------------------------------------------------------------------===//

/// Handles of the live flows (torch_ops.Flow registers its own and
/// unregisters it when freed), so that an op never reads through an
/// integer that is not one.
std::mutex registryMutex;
std::unordered_set<int64_t> &registry() {
  static std::unordered_set<int64_t> handles;
  return handles;
}

void registerFlow(int64_t handle, bool add) {
  VFLOW_CHECK(handle != 0, "flow: a null handle");
  if (add) {
    const auto *ops = reinterpret_cast<const VflowFlowOps *>(handle);
    VFLOW_CHECK(ops->magic == kVflowFlowOpsMagic &&
                    ops->version == kVflowFlowOpsVersion,
                "flow: not a handle of this vflow (CudaFlow.handle)");
  }
  std::lock_guard<std::mutex> lock(registryMutex);
  if (add)
    registry().insert(handle);
  else
    registry().erase(handle);
}

/// The VflowFlowOps behind a registered handle.
const VflowFlowOps &flowOf(int64_t handle) {
  {
    std::lock_guard<std::mutex> lock(registryMutex);
    VFLOW_CHECK(registry().count(handle), "flow: ", handle,
                " is not the handle of a live torch_ops.Flow");
  }
  return *reinterpret_cast<const VflowFlowOps *>(handle);
}

void throwIf(const char *error) { VFLOW_CHECK(error == nullptr, error); }

at::ScalarType fieldType(const char *name) {
  const std::string n = name;
  if (n == "f32")
    return at::kFloat;
  if (n == "bf16")
    return at::kBFloat16;
  if (n == "f16")
    return at::kHalf;
  if (n == "fp8e4m3")
    return at::kFloat8_e4m3fn;
  VFLOW_CHECK(n == "fp8e5m2", "flow: unknown field dtype ", n);
  return at::kFloat8_e5m2;
}

/// The caches against the flow's specialization: [pages, kv_heads,
/// block_size, head_dim] of its KV dtype, on its device.
void checkFlowCaches(const VflowFlowOps &f, const at::Tensor &kCache,
                     const at::Tensor &vCache) {
  checkCaches(kCache, vCache);
  VFLOW_CHECK(kCache.get_device() == f.device,
              "k_cache is on cuda:", kCache.get_device(),
              ", the flow's kernels on cuda:", f.device);
  VFLOW_CHECK(std::string(kvTypeName(kvTypeOf(kCache, "k_cache"))) == f.kvDType,
              "k_cache is ", kCache.scalar_type(),
              ", the flow was opened for kv_dtype ", f.kvDType);
  VFLOW_CHECK(kCache.size(2) == f.pageSize, "k_cache has ", kCache.size(2),
              " tokens per page, the flow's block size is ", f.pageSize);
  VFLOW_CHECK(kCache.size(3) == f.headDim, "k_cache has head_dim ",
              kCache.size(3), ", the flow was opened for ", f.headDim);
}

/// fields: the flow's, each [pages, kv_heads, elements] of its dtype.
void checkFields(const VflowFlowOps &f, at::TensorList fields, int64_t pages,
                 int64_t kvHeads) {
  VFLOW_CHECK(int64_t(fields.size()) == f.numFields, "fields: the flow has ",
              f.numFields, " fields, got ", fields.size(), " tensors");
  for (int i = 0; i < f.numFields; ++i) {
    const at::Tensor &t = fields[i];
    const std::string name = "fields[" + std::to_string(i) + "]";
    checkCuda(t, name.c_str());
    VFLOW_CHECK(t.scalar_type() == fieldType(f.fieldDTypes[i]), name,
                " must be ", fieldType(f.fieldDTypes[i]), ", got ",
                t.scalar_type());
    VFLOW_CHECK(t.dim() == 3 && t.size(0) == pages && t.size(1) == kvHeads &&
                    t.size(2) == f.fieldElements[i],
                name, " must be [", pages, ", ", kvHeads, ", ",
                f.fieldElements[i], "], got ", t.sizes());
  }
}

/// Device pointers the generated kernels read through arrays (fields,
/// then old states, then new states), stored at the head of `workspace`.
constexpr int64_t kPointerBytes =
    int64_t(vflow::rt::cuda::kMaxStoredPointers) * int64_t(sizeof(void *));

void **storeFlowPointers(at::Tensor &workspace, at::TensorList fields,
                         at::TensorList statesOld, at::TensorList statesNew) {
  std::vector<void *> ptrs;
  for (at::TensorList list : {fields, statesOld, statesNew})
    for (const at::Tensor &t : list)
      ptrs.push_back(t.data_ptr());
  auto **dst = static_cast<void **>(workspace.data_ptr());
  rethrow([&] {
    vflow::rt::cuda::storePointers(dst, ptrs.data(), int(ptrs.size()),
                                   at::cuda::getCurrentCUDAStream());
  });
  return dst;
}

int64_t flowWorkspaceBytes(int64_t handle, int64_t batch, int64_t kvHeads,
                           int64_t maxBlocks) {
  const VflowFlowOps &f = flowOf(handle);
  VFLOW_CHECK(batch >= 0 && kvHeads >= 1 && maxBlocks >= 1,
              "flow_workspace_bytes: batch >= 0, kv_heads >= 1 and "
              "max_blocks >= 1");
  return kPointerBytes + batch * kvHeads *
                             f.workspaceFloats(f.self, maxBlocks) *
                             int64_t(sizeof(float));
}

void checkWorkspace(const at::Tensor &workspace, int64_t needed) {
  checkCuda(workspace, "workspace");
  VFLOW_CHECK(workspace.scalar_type() == at::kByte, "workspace must be uint8");
  VFLOW_CHECK(workspace.numel() >= needed, "workspace has ", workspace.numel(),
              " bytes, the flow needs ", needed, " (flow_workspace_bytes)");
  VFLOW_CHECK(reinterpret_cast<uintptr_t>(workspace.data_ptr()) % 16 == 0,
              "workspace must be 16-byte aligned");
}

void flowCacheUpdate(int64_t handle, const at::Tensor &k, const at::Tensor &v,
                     const at::Tensor &slotPages,
                     const at::Tensor &slotPositions,
                     const at::Tensor &completedPages, at::Tensor &kCache,
                     at::Tensor &vCache, at::TensorList fields,
                     at::Tensor &workspace) {
  const VflowFlowOps &f = flowOf(handle);
  checkFlowCaches(f, kCache, vCache);
  const int64_t pages = kCache.size(0), H = kCache.size(1);
  checkFields(f, fields, pages, H);
  checkIndex(completedPages, "completed_pages");
  checkWorkspace(workspace, kPointerBytes);
  storeTokens(k, v, slotPages, slotPositions, kCache, vCache);
  const int64_t n = completedPages.size(0);
  if (!f.hasFields || n == 0)
    return;
  const at::cuda::CUDAGuard guard(kCache.device());
  VflowGpuArgs a{};
  a.numKVHeads = int(H);
  a.pageSize = f.pageSize;
  a.kPool = kCache.data_ptr();
  a.vPool = vCache.data_ptr();
  a.fields = storeFlowPointers(workspace, fields, {}, {});
  a.pages = completedPages.data_ptr<int32_t>();
  a.numPages = int(n);
  throwIf(f.launchFields(f.self, &a, int(n),
                         at::cuda::getCurrentCUDAStream().stream()));
}

/// flow_index's checks and arguments (the flow's kernels' VflowGpuArgs,
/// pointing into `workspace`).
VflowGpuArgs
indexArgs(const VflowFlowOps &f, int64_t handle, const at::Tensor &q,
          at::Tensor &kCache, at::Tensor &vCache, at::TensorList fields,
          at::TensorList statesOld, at::TensorList statesNew,
          const std::optional<at::Tensor> &mass, const at::Tensor &seqLens,
          const at::Tensor &blockTable, const at::Tensor &slots,
          const at::Tensor &steps, const at::Tensor &indptr, at::Tensor &count,
          at::Tensor &pages, at::Tensor &blocks, at::Tensor &workspace,
          const std::optional<at::Tensor> &kNew,
          const std::optional<at::Tensor> &vNew, int64_t layer,
          int64_t kvHeadBase) {
  checkFlowCaches(f, kCache, vCache);
  VFLOW_CHECK(layer >= 0 && layer <= INT32_MAX && kvHeadBase >= 0 &&
                  kvHeadBase <= INT32_MAX,
              "layer and kv_head_base must be model indices >= 0, got ", layer,
              " and ", kvHeadBase);
  const int64_t numPages = kCache.size(0), H = kCache.size(1);
  const int64_t D = f.headDim, G = f.group;
  checkFields(f, fields, numPages, H);
  checkCuda(q, "q");
  VFLOW_CHECK(q.scalar_type() == at::kBFloat16, "q must be bfloat16, got ",
              q.scalar_type());
  VFLOW_CHECK(q.dim() == 3 && q.size(1) == H * G && q.size(2) == D,
              "q must be [batch, ", H * G, ", ", D,
              "] (kv_heads * group, head_dim of the flow), got ", q.sizes());
  const int64_t B = q.size(0);
  checkIndex(seqLens, "seq_lens");
  checkIndex(slots, "slots");
  checkIndex(steps, "steps");
  for (auto [t, name] :
       {std::pair{&seqLens, "seq_lens"}, {&slots, "slots"}, {&steps, "steps"}})
    VFLOW_CHECK(t->size(0) == B, name, " must have ", B,
                " entries (one per row of q), got ", t->size(0));
  checkCuda(blockTable, "block_table");
  VFLOW_CHECK(blockTable.scalar_type() == at::kInt && blockTable.dim() == 2 &&
                  blockTable.size(0) == B && blockTable.size(1) >= 1,
              "block_table must be int32 [", B, ", max_blocks], got ",
              blockTable.scalar_type(), " ", blockTable.sizes());
  const int64_t maxBlocks = blockTable.size(1);
  // States: [slots, kv_heads, elements (x max_blocks)], f32, old and new
  // alike.
  VFLOW_CHECK(int64_t(statesOld.size()) == f.numStates &&
                  int64_t(statesNew.size()) == f.numStates,
              "states: the flow has ", f.numStates, " states, got ",
              statesOld.size(), " old and ", statesNew.size(), " new tensors");
  int64_t numSlots = -1;
  for (int i = 0; i < f.numStates; ++i)
    for (const at::Tensor *t : {&statesOld[i], &statesNew[i]}) {
      const std::string name =
          std::string(t == &statesOld[i] ? "states_old" : "states_new") + "[" +
          std::to_string(i) + "]";
      checkCuda(*t, name.c_str());
      const int64_t n =
          f.stateElements[i] * (f.statePerBlock[i] ? maxBlocks : 1);
      VFLOW_CHECK(
          t->scalar_type() == at::kFloat && t->dim() == 3 && t->size(1) == H &&
              t->size(2) == n && (numSlots < 0 || t->size(0) == numSlots),
          name, " must be float32 [slots, ", H, ", ", n,
          "] like the other states, got ", t->scalar_type(), " ", t->sizes());
      numSlots = t->size(0);
    }
  if (f.readsMass) {
    VFLOW_CHECK(mass.has_value(),
                "mass: the flow reads the last step's attention mass; pass "
                "the [slots, kv_heads, max_blocks, group] float32 tensor "
                "that carry_mass fills");
    checkCuda(*mass, "mass");
    VFLOW_CHECK(mass->scalar_type() == at::kFloat && mass->dim() == 4 &&
                    mass->size(1) == H && mass->size(2) == maxBlocks &&
                    mass->size(3) == G,
                "mass must be float32 [slots, ", H, ", ", maxBlocks, ", ", G,
                "], got ", mass->scalar_type(), " ", mass->sizes());
  }
  const int64_t lists = B * H;
  checkIndex(indptr, "indptr");
  VFLOW_CHECK(indptr.size(0) == lists + 1, "indptr must have ", lists + 1,
              " entries (one list per sequence and KV head, plus one), got ",
              indptr.size(0));
  checkIndex(count, "count");
  VFLOW_CHECK(count.size(0) == lists, "count must have ", lists,
              " entries, got ", count.size(0));
  checkIndex(pages, "pages");
  checkIndex(blocks, "blocks");
  VFLOW_CHECK(blocks.size(0) == pages.size(0),
              "blocks must have an entry per page entry");
  checkWorkspace(workspace, flowWorkspaceBytes(handle, B, H, maxBlocks));
  VFLOW_CHECK(kNew.has_value() == vNew.has_value(),
              "k_new and v_new: pass both or neither");
  if (kNew)
    for (const at::Tensor *t : {&*kNew, &*vNew}) {
      const char *name = t == &*kNew ? "k_new" : "v_new";
      checkCuda(*t, name);
      VFLOW_CHECK(t->scalar_type() == at::kBFloat16 && t->dim() == 3 &&
                      t->size(0) == B && t->size(1) == H && t->size(2) == D,
                  name, " must be bfloat16 [", B, ", ", H, ", ", D, "], got ",
                  t->scalar_type(), " ", t->sizes());
    }
  VflowGpuArgs a{};
  a.layer = int(layer);
  a.kvHeadBase = int(kvHeadBase);
  a.batch = int(B);
  a.numKVHeads = int(H);
  a.maxBlocks = int(maxBlocks);
  a.pageSize = f.pageSize;
  a.seqLen = seqLens.data_ptr<int32_t>();
  a.blockTable = blockTable.data_ptr<int32_t>();
  a.slot = slots.data_ptr<int32_t>();
  a.step = steps.data_ptr<int32_t>();
  a.kPool = kCache.data_ptr();
  a.vPool = vCache.data_ptr();
  void **ptrs = storeFlowPointers(workspace, fields, statesOld, statesNew);
  a.fields = ptrs;
  a.statesOld = reinterpret_cast<float *const *>(ptrs + f.numFields);
  a.statesNew =
      reinterpret_cast<float *const *>(ptrs + f.numFields + f.numStates);
  a.q = static_cast<const unsigned short *>(q.data_ptr());
  a.mass = f.readsMass ? mass->data_ptr<float>() : nullptr;
  a.workspace = reinterpret_cast<float *>(
      static_cast<char *>(workspace.data_ptr()) + kPointerBytes);
  a.tableIndptr = indptr.data_ptr<int32_t>();
  a.tableCount = count.data_ptr<int32_t>();
  a.tablePages = pages.data_ptr<int32_t>();
  a.tableBlocks = blocks.data_ptr<int32_t>();
  if (kNew) {
    a.kNew = static_cast<const unsigned short *>(kNew->data_ptr());
    a.vNew = static_cast<const unsigned short *>(vNew->data_ptr());
  }
  return a;
}

void flowIndex(int64_t handle, const at::Tensor &q, at::Tensor &kCache,
               at::Tensor &vCache, at::TensorList fields,
               at::TensorList statesOld, at::TensorList statesNew,
               const std::optional<at::Tensor> &mass, const at::Tensor &seqLens,
               const at::Tensor &blockTable, const at::Tensor &slots,
               const at::Tensor &steps, const at::Tensor &indptr,
               at::Tensor &count, at::Tensor &pages, at::Tensor &blocks,
               at::Tensor &workspace, const std::optional<at::Tensor> &kNew,
               const std::optional<at::Tensor> &vNew, int64_t layer,
               int64_t kvHeadBase) {
  const VflowFlowOps &f = flowOf(handle);
  VflowGpuArgs a =
      indexArgs(f, handle, q, kCache, vCache, fields, statesOld, statesNew,
                mass, seqLens, blockTable, slots, steps, indptr, count, pages,
                blocks, workspace, kNew, vNew, layer, kvHeadBase);
  if (a.batch == 0)
    return;
  const at::cuda::CUDAGuard guard(q.device());
  throwIf(f.launchIndex(f.self, &a, a.maxBlocks, kNew ? 1 : 0,
                        at::cuda::getCurrentCUDAStream().stream(), nullptr,
                        nullptr));
}

/// One decode layer (DecodeLayer.h): the token appended (k_new, v_new),
/// the flow's selection, attention over it, the mass carried to the
/// slots: flow_index, paged_decode and carry_mass in one op.
void flowDecodeLayer(
    int64_t handle, const at::Tensor &q, at::Tensor &kCache, at::Tensor &vCache,
    at::TensorList fields, at::TensorList statesOld, at::TensorList statesNew,
    const std::optional<at::Tensor> &mass, const at::Tensor &seqLens,
    const at::Tensor &blockTable, const at::Tensor &slots,
    const at::Tensor &steps, const at::Tensor &indptr, at::Tensor &count,
    at::Tensor &pages, at::Tensor &blocks, at::Tensor &workspace, double scale,
    int64_t maxEntries, at::Tensor &out,
    const std::optional<at::Tensor> &massRows, at::Tensor &attnWorkspace,
    const std::optional<at::Tensor> &kNew,
    const std::optional<at::Tensor> &vNew, int64_t layer, int64_t kvHeadBase) {
  const VflowFlowOps &f = flowOf(handle);
  VflowGpuArgs a =
      indexArgs(f, handle, q, kCache, vCache, fields, statesOld, statesNew,
                mass, seqLens, blockTable, slots, steps, indptr, count, pages,
                blocks, workspace, kNew, vNew, layer, kvHeadBase);
  VFLOW_CHECK(massRows.has_value() == f.readsMass,
              f.readsMass ? "mass_rows: the flow reads the attention mass; "
                            "pass the [batch, kv_heads, max_blocks, group] "
                            "float32 rows attention writes"
                          : "mass_rows: the flow does not read the attention "
                            "mass; pass None");
  if (massRows)
    VFLOW_CHECK(massRows->size(2) == a.maxBlocks,
                "mass_rows must have max_blocks (", a.maxBlocks,
                ") blocks per list, got ", massRows->sizes());
  vflow::rt::cuda::DecodeLayerArgs l;
  l.attention =
      attentionArgs(q, kCache, vCache, indptr, pages, blocks, seqLens, scale,
                    maxEntries, false, out, massRows, attnWorkspace, count);
  if (a.batch == 0)
    return;
  l.flow = &f;
  l.index = &a;
  l.gridBlocks = a.maxBlocks;
  l.kNew = kNew ? kNew->data_ptr() : nullptr;
  l.vNew = vNew ? vNew->data_ptr() : nullptr;
  const at::cuda::CUDAGuard guard(q.device());
  rethrow([&] {
    vflow::rt::cuda::decodeLayer(l, at::cuda::getCurrentCUDAStream());
  });
}

void carryMassOp(at::Tensor &massRows, at::Tensor &massSlots,
                 const at::Tensor &slots, const at::Tensor &seqLens,
                 int64_t pageSize) {
  checkCuda(massRows, "mass_rows");
  checkCuda(massSlots, "mass");
  VFLOW_CHECK(massRows.scalar_type() == at::kFloat && massRows.dim() == 4,
              "mass_rows must be float32 [batch, kv_heads, max_blocks, "
              "group], got ",
              massRows.scalar_type(), " ", massRows.sizes());
  const int64_t B = massRows.size(0), H = massRows.size(1),
                M = massRows.size(2), G = massRows.size(3);
  VFLOW_CHECK(massSlots.scalar_type() == at::kFloat && massSlots.dim() == 4 &&
                  massSlots.size(1) == H && massSlots.size(2) == M &&
                  massSlots.size(3) == G,
              "mass must be float32 [slots, ", H, ", ", M, ", ", G, "], got ",
              massSlots.scalar_type(), " ", massSlots.sizes());
  checkIndex(slots, "slots");
  checkIndex(seqLens, "seq_lens");
  VFLOW_CHECK(slots.size(0) == B && seqLens.size(0) == B,
              "slots and seq_lens must have ", B, " entries");
  VFLOW_CHECK(pageSize >= 1, "page_size must be >= 1");
  const at::cuda::CUDAGuard guard(massRows.device());
  rethrow([&] {
    vflow::rt::cuda::carryMass(
        massRows.data_ptr<float>(), massSlots.data_ptr<float>(),
        slots.data_ptr<int32_t>(), seqLens.data_ptr<int32_t>(), int(B), int(H),
        int(M), int(G), int(pageSize), at::cuda::getCurrentCUDAStream());
  });
}

} // namespace

TORCH_LIBRARY(vflow, m) {
  m.def("write_kv(Tensor k, Tensor v, Tensor slot_pages, Tensor "
        "slot_positions, Tensor(a!) k_cache, Tensor(b!) v_cache) -> ()");
  m.def("paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor "
        "indptr, Tensor pages, Tensor blocks, Tensor seq_lens, float scale, "
        "int max_entries, bool lists_per_sequence, Tensor(a!) out, "
        "Tensor(b!)? mass, Tensor(c!) workspace, Tensor? count=None) -> ()");
  m.def("paged_decode_workspace_bytes(int batch, int kv_heads, int group, int "
        "head_dim, int max_entries) -> int");
  m.impl("paged_decode_workspace_bytes", &workspaceBytes);
  m.def("carry_mass(Tensor(a!) mass_rows, Tensor(b!) mass, Tensor slots, "
        "Tensor seq_lens, int page_size) -> ()");
  // torch_ops.Flow's own: makes a handle usable by the flow ops (or not).
  m.def("_register_flow(int flow, bool add) -> ()");
  m.impl("_register_flow", &registerFlow);
  m.def("flow_workspace_bytes(int flow, int batch, int kv_heads, int "
        "max_blocks) -> int");
  m.impl("flow_workspace_bytes", &flowWorkspaceBytes);
  m.def("flow_cache_update(int flow, Tensor k, Tensor v, Tensor slot_pages, "
        "Tensor slot_positions, Tensor completed_pages, Tensor(a!) k_cache, "
        "Tensor(b!) v_cache, Tensor(c!)[] fields, Tensor(d!) workspace) -> "
        "()");
  m.def("flow_index(int flow, Tensor q, Tensor(a!) k_cache, Tensor(b!) "
        "v_cache, Tensor(c!)[] fields, Tensor(d!)[] states_old, Tensor(e!)[] "
        "states_new, Tensor? mass, Tensor seq_lens, Tensor block_table, "
        "Tensor slots, Tensor steps, Tensor indptr, Tensor(f!) count, "
        "Tensor(g!) pages, Tensor(h!) blocks, Tensor(i!) workspace, Tensor? "
        "k_new=None, Tensor? v_new=None, int layer=0, int kv_head_base=0) -> "
        "()");
  m.def("flow_decode_layer(int flow, Tensor q, Tensor(a!) k_cache, Tensor(b!) "
        "v_cache, Tensor(c!)[] fields, Tensor(d!)[] states_old, Tensor(e!)[] "
        "states_new, Tensor(f!)? mass, Tensor seq_lens, Tensor block_table, "
        "Tensor slots, Tensor steps, Tensor indptr, Tensor(g!) count, "
        "Tensor(h!) pages, Tensor(i!) blocks, Tensor(j!) workspace, float "
        "scale, int max_entries, Tensor(k!) out, Tensor(l!)? mass_rows, "
        "Tensor(m!) attn_workspace, Tensor? k_new=None, Tensor? v_new=None, "
        "int layer=0, int kv_head_base=0) -> ()");
}

TORCH_LIBRARY_IMPL(vflow, CUDA, m) {
  m.impl("write_kv", &writeKV);
  m.impl("paged_decode", &pagedDecode);
  m.impl("carry_mass", &carryMassOp);
  m.impl("flow_cache_update", &flowCacheUpdate);
  m.impl("flow_index", &flowIndex);
  m.impl("flow_decode_layer", &flowDecodeLayer);
}
