//===- Sha256.h - SHA-256 (FIPS 180-4) --------------------------*- C++ -*-===//
//
// The runtime's one hash: artifact checksums and the JIT caches' keys and
// entry checks. A self-contained implementation, so the runtime keeps
// depending on nothing but libc.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_SHA256_H
#define VFLOW_RUNTIME_SHA256_H

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace vflow {
namespace rt {

/// Incremental SHA-256. update() any number of times, then digest() or
/// hex(); both may be called more than once and do not change the state.
class Sha256 {
public:
  Sha256();

  void update(const void *data, size_t size);
  void update(const std::string &text) { update(text.data(), text.size()); }

  /// The 32-byte digest of everything passed to update() so far.
  std::array<uint8_t, 32> digest() const;
  /// digest() as 64 lowercase hex digits.
  std::string hex() const;

private:
  void compress(const uint8_t *block);

  uint32_t state[8];
  uint8_t buffer[64];
  size_t buffered = 0;
  uint64_t totalBytes = 0;
};

/// SHA-256 of `bytes` as 64 lowercase hex digits.
std::string sha256Hex(const std::string &bytes);
std::string sha256Hex(const void *data, size_t size);

} // namespace rt
} // namespace vflow

#endif // VFLOW_RUNTIME_SHA256_H
