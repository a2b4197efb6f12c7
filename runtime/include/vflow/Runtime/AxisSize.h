//===- AxisSize.h - Symbolic axis sizes and how they print ------*- C++ -*-===//
//
// An axis size is a positive integer or a symbol fixed later: N (the blocks
// of the sequence), G (query heads per KV head) or D (the head dimension),
// encoded as -1, -2 and -3. The frontend's shapes, the vt dialect and the
// CPU flow's tensor specs share the encoding, and print sizes alike with
// formatAxisSize. Header-only and dependency-free (no MLIR or LLVM types):
// the frontend, the dialect and the runtime can all include it.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_AXISSIZE_H
#define VFLOW_RUNTIME_AXISSIZE_H

#include <cstdint>
#include <string>

namespace vflow::rt {

constexpr int64_t kAxisSizeBlocks = -1;  ///< N: blocks of the sequence.
constexpr int64_t kAxisSizeGroup = -2;   ///< G: query heads per KV head.
constexpr int64_t kAxisSizeHeadDim = -3; ///< D: the head dimension.

/// "N", "G", "D" or the decimal number, for messages and printing.
inline std::string formatAxisSize(int64_t size) {
  switch (size) {
  case kAxisSizeBlocks:
    return "N";
  case kAxisSizeGroup:
    return "G";
  case kAxisSizeHeadDim:
    return "D";
  default:
    return std::to_string(size);
  }
}

} // namespace vflow::rt

#endif // VFLOW_RUNTIME_AXISSIZE_H
