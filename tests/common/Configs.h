//===- Configs.h - The cache and session configs tests build ----*- C++ -*-===//
//
// Shared by the runtime, compiler and GPU tests: a paged cache's config and
// a quiet session's config from the shape numbers each test picks. Header
// only, on the runtime alone.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_TESTS_COMMON_CONFIGS_H
#define VFLOW_TESTS_COMMON_CONFIGS_H

#include "vflow/Runtime/PagedKVCache.h"
#include "vflow/Runtime/Session.h"

#include <cstdint>
#include <string>

namespace vflow::testing {

/// A paged KV cache of `numLayers` layers of `numKVHeads` heads of
/// `headDim`, `numPages` pages of `pageSize` tokens per layer, K and V
/// stored as `kvDType`; no fields or states.
inline rt::CacheConfig cacheConfig(int numLayers, int numKVHeads, int headDim,
                                   int pageSize, int64_t numPages,
                                   rt::DType kvDType) {
  return {numLayers, numKVHeads, headDim, pageSize, numPages, kvDType, {}, {}};
}

/// A CPU session (set `device` for another) over `numLayers` layers of
/// `numKVHeads` KV heads with `group` query heads each and `headDim`,
/// `numPages` pages per layer; quiet, its JIT cache in `cacheDir`.
inline rt::SessionConfig sessionConfig(int numLayers, int numKVHeads, int group,
                                       int headDim, int64_t numPages,
                                       const std::string &cacheDir) {
  rt::SessionConfig cfg;
  cfg.numLayers = numLayers;
  cfg.numKVHeads = numKVHeads;
  cfg.group = group;
  cfg.headDim = headDim;
  cfg.numPages = numPages;
  cfg.quiet = true;
  cfg.cacheDir = cacheDir;
  return cfg;
}

} // namespace vflow::testing

#endif // VFLOW_TESTS_COMMON_CONFIGS_H
