//===- AttentionCommon.cpp - Host helpers of the attention kernels --------===//

#include "AttentionCommon.h"

#include <cmath>

namespace vflow {
namespace rt {
namespace cuda {

size_t kvTypeBytes(KVType type) { return type == KVType::FP8E4M3 ? 1 : 2; }

namespace detail {

int currentDeviceSMs() {
  int device = 0;
  checkCuda(cudaGetDevice(&device), "attention: cudaGetDevice");
  int sms = 0;
  checkCuda(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
      "attention: reading the multiprocessor count");
  return sms;
}

void checkKVArgs(const char *op, const void *kPool, const void *vPool,
                 KVType kvType, int batch, int numKVHeads, int group,
                 int headDim, int pageSize, const void *q, void *out,
                 float scale) {
  require(kvType == KVType::BF16 || kvType == KVType::F16 ||
              kvType == KVType::FP8E4M3,
          op, "unknown kvType " + std::to_string(static_cast<int>(kvType)));
  require(batch > 0, op,
          "batch must be positive, got " + std::to_string(batch));
  require(numKVHeads > 0, op,
          "numKVHeads must be positive, got " + std::to_string(numKVHeads));
  require(group > 0, op,
          "group (query heads per kv head) must be positive, got " +
              std::to_string(group));
  require(headDim == 64 || headDim == 128 || headDim == 256, op,
          "headDim must be 64, 128 or 256, got " + std::to_string(headDim));
  require(pageSize > 0, op,
          "pageSize must be positive, got " + std::to_string(pageSize));
  require(kPool && vPool && q && out, op,
          "kPool, vPool, q and out must not be null");
  require(aligned(kPool, 16) && aligned(vPool, 16), op,
          "kPool and vPool must be 16-byte aligned");
  require(aligned(q, 4) && aligned(out, 4), op,
          "q and out must be 4-byte aligned");
  require(std::isfinite(scale), op, "the softmax scale must be finite");
}

} // namespace detail
} // namespace cuda
} // namespace rt
} // namespace vflow
