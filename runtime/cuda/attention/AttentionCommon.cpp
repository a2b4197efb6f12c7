//===- AttentionCommon.cpp - Host helpers of the attention kernels --------===//

#include "AttentionCommon.h"

#include <cmath>

namespace vflow::rt::cuda {

size_t kvTypeBytes(KVType type) {
  return type == KVType::FP8E4M3 || type == KVType::INT8 ? 1 : 2;
}

const char *kvTypeName(KVType type) {
  return type == KVType::BF16      ? "bf16"
         : type == KVType::F16     ? "f16"
         : type == KVType::FP8E4M3 ? "fp8e4m3"
                                   : "int8";
}

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

void checkKVArgs(const char *op, const PagedKVArgs &args) {
  const KVType kvType = args.kvType;
  require(kvType == KVType::BF16 || kvType == KVType::F16 ||
              kvType == KVType::FP8E4M3 || kvType == KVType::INT8,
          op, "unknown kvType " + std::to_string(static_cast<int>(kvType)));
  require(kvType != KVType::INT8 || (args.kTokenScale && args.vTokenScale), op,
          "int8 pools need their token scales (kTokenScale, vTokenScale)");
  require(kvTypeBytes(kvType) == 1 || (!args.kTokenScale && !args.vTokenScale),
          op,
          "token scales are for 8-bit pools (fp8e4m3, int8), not " +
              std::string(kvTypeName(kvType)));
  require(!args.kTokenScale == !args.vTokenScale, op,
          "kTokenScale and vTokenScale come together");
  require(!args.kTokenScale ||
              (aligned(args.kTokenScale, 16) && aligned(args.vTokenScale, 16)),
          op, "kTokenScale and vTokenScale must be 16-byte aligned");
  require(args.batch > 0, op,
          "batch must be positive, got " + std::to_string(args.batch));
  require(args.numKVHeads > 0, op,
          "numKVHeads must be positive, got " +
              std::to_string(args.numKVHeads));
  require(args.group > 0, op,
          "group (query heads per kv head) must be positive, got " +
              std::to_string(args.group));
  require(args.headDim == 64 || args.headDim == 128 || args.headDim == 256, op,
          "headDim must be 64, 128 or 256, got " +
              std::to_string(args.headDim));
  require(args.pageSize > 0, op,
          "pageSize must be positive, got " + std::to_string(args.pageSize));
  require(args.numPages > 0, op,
          "numPages (pages in each pool) must be positive, got " +
              std::to_string(args.numPages));
  require(args.kPool && args.vPool && args.q && args.out, op,
          "kPool, vPool, q and out must not be null");
  require(aligned(args.kPool, 16) && aligned(args.vPool, 16), op,
          "kPool and vPool must be 16-byte aligned");
  require(aligned(args.q, 4) && aligned(args.out, 4), op,
          "q and out must be 4-byte aligned");
  require(std::isfinite(args.scale), op, "the softmax scale must be finite");
}

} // namespace detail
} // namespace vflow::rt::cuda
