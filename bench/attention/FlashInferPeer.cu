//===- FlashInferPeer.cu - FlashInfer's paged decode as a peer --*- C++ -*-===//
//
// The template instantiations: q and out bf16; KV bf16 or fp8 e4m3; head
// dim 64 or 128; group 1, 2, 4 or 8; no positional encoding in the kernel
// (vflow's keys are stored rotated); no sliding window, soft cap or ALiBi.
//
//===----------------------------------------------------------------------===//

#include "FlashInferPeer.h"

#include "vflow/Runtime/Error.h"

#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>
#include <flashinfer/page.cuh>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <functional>
#include <string>

namespace vflow {
namespace bench {
namespace {

using rt::Error;
using Variant = flashinfer::DefaultAttention</*custom mask*/ false,
                                             /*sliding window*/ false,
                                             /*soft cap*/ false,
                                             /*alibi*/ false>;
template <typename KV>
using Params =
    flashinfer::BatchDecodeParams<__nv_bfloat16, KV, __nv_bfloat16, int32_t>;

void check(cudaError_t status, const char *what) {
  if (status != cudaSuccess)
    throw Error(std::string("FlashInfer peer: ") + what + ": " +
                cudaGetErrorString(status));
}

/// Device memory, or page-locked host memory (FlashInfer's plan writes its
/// int workspace there and copies it to the device), freed with its owner.
struct Memory {
  void *data = nullptr;
  bool pinned;
  Memory(size_t bytes, bool pinnedHost) : pinned(pinnedHost) {
    check(pinned ? cudaMallocHost(&data, bytes) : cudaMalloc(&data, bytes),
          pinned ? "cudaMallocHost" : "cudaMalloc");
  }
  ~Memory() { pinned ? cudaFreeHost(data) : cudaFree(data); }
  Memory(const Memory &) = delete;
  Memory &operator=(const Memory &) = delete;
};

// FlashInfer's Python wrapper allocates these sizes (128 MiB of float
// workspace, 8 MiB of int workspace).
constexpr size_t kFloatWorkspace = size_t(128) << 20;
constexpr size_t kIntWorkspace = size_t(8) << 20;

} // namespace

struct FlashInferPeer::Impl {
  FlashInferProblem problem;
  Memory floatWs{kFloatWorkspace, false}, intWs{kIntWorkspace, false};
  Memory pinned{kIntWorkspace, true};
  std::unique_ptr<Memory> indptr, lastPageLen;
  flashinfer::DecodePlanInfo plan;
  std::function<void(const void *, const void *, const int32_t *, const void *,
                     void *, cudaStream_t)>
      launch;

  int requests() const { return static_cast<int>(problem.indptr.size()) - 1; }

  /// Plans with FlashInfer's scheduler and binds the launch of the
  /// instantiation <KV, D, G>.
  template <typename KV, uint32_t D, uint32_t G> void bind() {
    using P = Params<KV>;
    const int heads = problem.perHeadLists ? 1 : problem.shape.numKVHeads;
    const uint32_t qoHeads = static_cast<uint32_t>(heads) * G;
    auto estimate =
        flashinfer::BatchDecodeWithPagedKVCacheWorkEstimationDispatched<
            G, D, flashinfer::PosEncodingMode::kNone, Variant, P>;
    check(flashinfer::DecodePlan<D, flashinfer::PosEncodingMode::kNone, Variant,
                                 P>(
              floatWs.data, kFloatWorkspace, intWs.data, pinned.data,
              kIntWorkspace, plan, problem.indptr.data(),
              static_cast<uint32_t>(requests()), qoHeads,
              static_cast<uint32_t>(problem.shape.pageSize),
              /*enable_cuda_graph=*/false, /*stream=*/nullptr, estimate),
          "DecodePlan");
    check(cudaStreamSynchronize(nullptr), "DecodePlan's copy");
    launch = [this, heads, qoHeads](const void *k, const void *v,
                                    const int32_t *pages, const void *q,
                                    void *out, cudaStream_t stream) {
      const FlashInferProblem &pr = problem;
      const int64_t page = pr.shape.pageSize, H = pr.shape.numKVHeads;
      // HND strides {page, head, token}; sparse: pages of one head.
      const int64_t strides[3] = {pr.perHeadLists ? page * D : H * page * D,
                                  page * D, static_cast<int64_t>(D)};
      flashinfer::paged_kv_t<KV, int32_t> kv(
          static_cast<uint32_t>(heads), static_cast<uint32_t>(page), D,
          static_cast<uint32_t>(requests()), flashinfer::QKVLayout::kHND,
          static_cast<KV *>(const_cast<void *>(k)),
          static_cast<KV *>(const_cast<void *>(v)), strides,
          const_cast<int32_t *>(pages), static_cast<int32_t *>(indptr->data),
          static_cast<int32_t *>(lastPageLen->data));
      P params;
      params.q = static_cast<__nv_bfloat16 *>(const_cast<void *>(q));
      params.paged_kv = kv;
      params.o = static_cast<__nv_bfloat16 *>(out);
      params.num_qo_heads = qoHeads;
      params.q_stride_n = static_cast<int32_t>(qoHeads * D);
      params.q_stride_h = static_cast<int32_t>(D);
      params.window_left = -1;
      params.sm_scale = pr.scale;
      params.rope_rcp_scale = 1.0f;
      params.rope_rcp_theta = 1.0f / 1e4f;
      char *ints = static_cast<char *>(intWs.data);
      params.request_indices =
          reinterpret_cast<int32_t *>(ints + plan.request_indices_offset);
      params.kv_tile_indices =
          reinterpret_cast<int32_t *>(ints + plan.kv_tile_indices_offset);
      params.o_indptr =
          reinterpret_cast<int32_t *>(ints + plan.o_indptr_offset);
      params.kv_chunk_size_ptr =
          reinterpret_cast<int32_t *>(ints + plan.kv_chunk_size_ptr_offset);
      params.padded_batch_size = static_cast<uint32_t>(plan.padded_batch_size);
      __nv_bfloat16 *tmpV = nullptr;
      float *tmpS = nullptr;
      if (plan.split_kv) {
        char *floats = static_cast<char *>(floatWs.data);
        tmpV = reinterpret_cast<__nv_bfloat16 *>(floats + plan.v_offset);
        tmpS = reinterpret_cast<float *>(floats + plan.s_offset);
      }
      check(flashinfer::BatchDecodeWithPagedKVCacheDispatched<
                D, flashinfer::PosEncodingMode::kNone, Variant>(
                params, tmpV, tmpS, /*enable_pdl=*/false, stream),
            "BatchDecodeWithPagedKVCacheDispatched");
    };
  }

  template <typename KV, uint32_t D> void bindGroup() {
    switch (problem.shape.group) {
    case 1:
      return bind<KV, D, 1>();
    case 2:
      return bind<KV, D, 2>();
    case 4:
      return bind<KV, D, 4>();
    case 8:
      return bind<KV, D, 8>();
    default:
      throw Error("FlashInfer peer: group " +
                  std::to_string(problem.shape.group) +
                  " is not instantiated (1, 2, 4 or 8)");
    }
  }

  template <typename KV> void bindDim() {
    switch (problem.shape.headDim) {
    case 64:
      return bindGroup<KV, 64>();
    case 128:
      return bindGroup<KV, 128>();
    default:
      throw Error("FlashInfer peer: head dim " +
                  std::to_string(problem.shape.headDim) +
                  " is not instantiated (64 or 128)");
    }
  }
};

FlashInferPeer::FlashInferPeer(const FlashInferProblem &problem)
    : impl(new Impl{problem}) {
  Impl &m = *impl;
  if (problem.indptr.size() < 2 ||
      problem.lastPageLen.size() + 1 != problem.indptr.size())
    throw Error("FlashInfer peer: indptr and lastPageLen disagree");
  const size_t n = problem.indptr.size();
  m.indptr = std::make_unique<Memory>(n * sizeof(int32_t), false);
  m.lastPageLen = std::make_unique<Memory>((n - 1) * sizeof(int32_t), false);
  check(cudaMemcpy(m.indptr->data, problem.indptr.data(), n * sizeof(int32_t),
                   cudaMemcpyHostToDevice),
        "indptr");
  check(cudaMemcpy(m.lastPageLen->data, problem.lastPageLen.data(),
                   (n - 1) * sizeof(int32_t), cudaMemcpyHostToDevice),
        "lastPageLen");
  switch (problem.shape.type) {
  case rt::cuda::KVType::BF16:
    m.bindDim<__nv_bfloat16>();
    break;
  case rt::cuda::KVType::FP8E4M3:
    m.bindDim<__nv_fp8_e4m3>();
    break;
  default:
    throw Error("FlashInfer peer: KV type not instantiated (bf16, fp8)");
  }
}

FlashInferPeer::~FlashInferPeer() = default;

void FlashInferPeer::run(const void *kPool, const void *vPool,
                         const int32_t *pages, const void *q, void *out,
                         cudaStream_t stream) const {
  impl->launch(kPool, vPool, pages, q, out, stream);
}

std::vector<int32_t>
FlashInferPeer::perHeadPageIds(const std::vector<int32_t> &indptr,
                               const std::vector<int32_t> &pages,
                               int numKVHeads) {
  std::vector<int32_t> ids(pages.size());
  for (size_t r = 0; r + 1 < indptr.size(); ++r)
    for (int32_t i = indptr[r]; i < indptr[r + 1]; ++i)
      ids[i] = pages[i] * numKVHeads + static_cast<int32_t>(r % numKVHeads);
  return ids;
}

} // namespace bench
} // namespace vflow
