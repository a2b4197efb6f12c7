//===- vflow_ops.cpp - torch.ops.vflow: vflow's GPU kernels as torch ops --===//
//
// Built against the installed torch (vflow.torch_ops.load() compiles it
// with torch.utils.cpp_extension), so a torch-based serving engine calls
// vflow's kernels on its own tensors, on the current stream:
//
//   vflow::write_kv       K/V of new tokens into paged caches at (page, slot)
//   vflow::paged_decode   paged decode attention over block lists (sparse:
//                         the selection; dense: every block), with the
//                         optional per-block attention mass
//   vflow::paged_decode_workspace_bytes   what paged_decode's workspace needs
//
// Every op checks its tensors (device, dtype, shape, contiguity) with
// TORCH_CHECK messages that name the argument. The fake (meta) kernels are
// registered in Python (vflow/torch_ops.py).
//
//===----------------------------------------------------------------------===//

#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/cuda/Attention.h"

#include "../../runtime/cuda/flow/SessionKernels.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

using vflow::rt::cuda::KVType;

namespace {

void checkCuda(const at::Tensor &t, const char *name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void checkIndex(const at::Tensor &t, const char *name) {
  checkCuda(t, name);
  TORCH_CHECK(t.scalar_type() == at::kInt, name, " must be int32, got ",
              t.scalar_type());
  TORCH_CHECK(t.dim() == 1, name, " must be 1-D, got ", t.dim(), " dims");
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
    TORCH_CHECK(false, name,
                " must be bfloat16, float16 or float8_e4m3fn, got ",
                cache.scalar_type());
  }
}

const char *kvDTypeName(KVType t) {
  return t == KVType::BF16 ? "bf16" : t == KVType::F16 ? "f16" : "fp8_e4m3";
}

/// The paged cache's shape [pages, kv_heads, page_size, head_dim].
void checkCache(const at::Tensor &c, const char *name) {
  checkCuda(c, name);
  TORCH_CHECK(c.dim() == 4, name,
              " must be [pages, kv_heads, page_size, head_dim], got ", c.dim(),
              " dims");
}

/// The K and V caches: each [pages, kv_heads, page_size, head_dim], alike.
void checkCaches(const at::Tensor &kCache, const at::Tensor &vCache) {
  checkCache(kCache, "k_cache");
  checkCache(vCache, "v_cache");
  TORCH_CHECK(kCache.sizes() == vCache.sizes() &&
                  kCache.scalar_type() == vCache.scalar_type(),
              "v_cache must match k_cache (shape and dtype)");
}

template <typename Body> void rethrow(Body body) {
  try {
    body();
  } catch (const vflow::rt::Error &e) {
    TORCH_CHECK(false, e.what());
  }
}

void writeKV(const at::Tensor &k, const at::Tensor &v,
             const at::Tensor &slotPages, const at::Tensor &slotPositions,
             at::Tensor &kCache, at::Tensor &vCache) {
  checkCaches(kCache, vCache);
  const int64_t H = kCache.size(1), P = kCache.size(2), D = kCache.size(3);
  for (const at::Tensor *t : {&k, &v}) {
    const char *name = t == &k ? "k" : "v";
    checkCuda(*t, name);
    TORCH_CHECK(t->scalar_type() == at::kBFloat16, name,
                " must be bfloat16, got ", t->scalar_type());
    TORCH_CHECK(t->dim() == 3 && t->size(1) == H && t->size(2) == D, name,
                " must be [tokens, ", H, ", ", D, "], got ", t->sizes());
  }
  const int64_t n = k.size(0);
  TORCH_CHECK(v.size(0) == n, "v must have as many tokens as k");
  checkIndex(slotPages, "slot_pages");
  checkIndex(slotPositions, "slot_positions");
  TORCH_CHECK(slotPages.size(0) == n && slotPositions.size(0) == n,
              "slot_pages and slot_positions need one entry per token (", n,
              ")");
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
  w.headDim = int(D);
  w.kPool = kCache.data_ptr();
  w.vPool = vCache.data_ptr();
  w.kvDType = kvDTypeName(kvTypeOf(kCache, "k_cache"));
  rethrow([&] {
    vflow::rt::cuda::writeTokens(w, at::cuda::getCurrentCUDAStream());
  });
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

void pagedDecode(const at::Tensor &q, const at::Tensor &kCache,
                 const at::Tensor &vCache, const at::Tensor &indptr,
                 const at::Tensor &pages, const at::Tensor &blocks,
                 const at::Tensor &seqLens, double scale, int64_t maxEntries,
                 bool listsPerSequence, at::Tensor &out,
                 const std::optional<at::Tensor> &mass, at::Tensor &workspace) {
  checkCaches(kCache, vCache);
  const int64_t H = kCache.size(1), P = kCache.size(2), D = kCache.size(3);
  checkCuda(q, "q");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16, "q must be bfloat16, got ",
              q.scalar_type());
  TORCH_CHECK(q.dim() == 3 && q.size(2) == D && q.size(1) % H == 0,
              "q must be [batch, kv_heads * group, ", D, "], got ", q.sizes());
  const int64_t B = q.size(0), G = q.size(1) / H;
  checkCuda(out, "out");
  TORCH_CHECK(out.sizes() == q.sizes() && out.scalar_type() == q.scalar_type(),
              "out must be like q");
  for (auto [t, name] : {std::pair{&indptr, "indptr"},
                         {&pages, "pages"},
                         {&blocks, "blocks"},
                         {&seqLens, "seq_lens"}})
    checkIndex(*t, name);
  const int64_t lists = listsPerSequence ? B : B * H;
  TORCH_CHECK(indptr.size(0) == lists + 1, "indptr must have ", lists + 1,
              " entries (one list per ",
              listsPerSequence ? "sequence" : "sequence and KV head",
              ", plus one), got ", indptr.size(0));
  TORCH_CHECK(blocks.size(0) == pages.size(0),
              "blocks must have an entry per page entry");
  TORCH_CHECK(seqLens.size(0) == B, "seq_lens must have ", B, " entries");
  checkCuda(workspace, "workspace");
  TORCH_CHECK(workspace.scalar_type() == at::kByte, "workspace must be uint8");
  int64_t massStride = 0;
  if (mass) {
    checkCuda(*mass, "mass");
    TORCH_CHECK(mass->scalar_type() == at::kFloat, "mass must be float32");
    TORCH_CHECK(mass->dim() == 4 && mass->size(0) == B && mass->size(1) == H &&
                    mass->size(3) == G,
                "mass must be [batch, kv_heads, max_blocks, group], got ",
                mass->sizes());
    massStride = mass->size(2);
  }
  const at::cuda::CUDAGuard guard(q.device());
  vflow::rt::cuda::PagedAttentionArgs a;
  a.kPool = kCache.data_ptr();
  a.vPool = vCache.data_ptr();
  a.kvType = kvTypeOf(kCache, "k_cache");
  a.batch = int(B);
  a.numKVHeads = int(H);
  a.group = int(G);
  a.headDim = int(D);
  a.pageSize = int(P);
  a.q = q.data_ptr();
  a.out = out.data_ptr();
  a.scale = float(scale);
  a.indptr = indptr.data_ptr<int32_t>();
  a.pages = pages.data_ptr<int32_t>();
  a.blocks = blocks.data_ptr<int32_t>();
  a.seqLen = seqLens.data_ptr<int32_t>();
  a.listsPerSequence = listsPerSequence;
  a.maxEntries = int(maxEntries);
  a.mass = mass ? mass->data_ptr<float>() : nullptr;
  a.massStride = int(massStride);
  a.workspace = workspace.numel() ? workspace.data_ptr() : nullptr;
  a.workspaceBytes = size_t(workspace.numel());
  rethrow([&] {
    vflow::rt::cuda::pagedDecodeAttention(a, at::cuda::getCurrentCUDAStream());
  });
}

} // namespace

TORCH_LIBRARY(vflow, m) {
  m.def("write_kv(Tensor k, Tensor v, Tensor slot_pages, Tensor "
        "slot_positions, Tensor(a!) k_cache, Tensor(b!) v_cache) -> ()");
  m.def("paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor "
        "indptr, Tensor pages, Tensor blocks, Tensor seq_lens, float scale, "
        "int max_entries, bool lists_per_sequence, Tensor(a!) out, "
        "Tensor(b!)? mass, Tensor(c!) workspace) -> ()");
  m.def("paged_decode_workspace_bytes(int batch, int kv_heads, int group, int "
        "head_dim, int max_entries) -> int");
  m.impl("paged_decode_workspace_bytes", &workspaceBytes);
}

TORCH_LIBRARY_IMPL(vflow, CUDA, m) {
  m.impl("write_kv", &writeKV);
  m.impl("paged_decode", &pagedDecode);
}
