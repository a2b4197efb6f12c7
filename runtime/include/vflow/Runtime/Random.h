//===- Random.h - The generators behind rademacher() and gaussian() -*- C++
//-*-===//
//
// Consts made by rademacher([axes], seed) and gaussian([axes], seed) must be
// bit-identical wherever they are materialized (the reference interpreter,
// the CPU backend, the GPU runtime at attach time), so the generator is
// specified here once:
//
//   state = seed; next() = SplitMix64(state)
//   rademacher: value i (row-major over the const's canonical axis order) is
//               +1 if the low bit of next() is 1, else -1
//   gaussian:   values are produced in pairs by Box-Muller from two uniforms
//               u = (next() >> 11) * 2^-53 in [0, 1), using 1 - u1 for the
//               radius so that log() never sees 0; an odd count drops the
//               last value of the final pair.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_RANDOM_H
#define VFLOW_RUNTIME_RANDOM_H

#include <cmath>
#include <cstdint>
#include <vector>

namespace vflow::rt {

/// SplitMix64 (Steele, Lea, Flood 2014): small, fast and fully specified.
class SplitMix64 {
public:
  explicit SplitMix64(uint64_t seed) : state(seed) {}
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// A double in [0, 1) with 53 random bits.
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }

private:
  uint64_t state;
};

/// `count` values of rademacher(seed).
inline std::vector<float> rademacherValues(uint64_t seed, size_t count) {
  SplitMix64 rng(seed);
  std::vector<float> out(count);
  for (float &v : out)
    v = (rng.next() & 1) ? 1.0f : -1.0f;
  return out;
}

/// `count` values of gaussian(seed): standard normal.
inline std::vector<float> gaussianValues(uint64_t seed, size_t count) {
  SplitMix64 rng(seed);
  std::vector<float> out(count);
  const double twoPi = 6.283185307179586476925286766559;
  for (size_t i = 0; i < count; i += 2) {
    double u1 = rng.uniform(), u2 = rng.uniform();
    double radius = std::sqrt(-2.0 * std::log(1.0 - u1));
    out[i] = static_cast<float>(radius * std::cos(twoPi * u2));
    if (i + 1 < count)
      out[i + 1] = static_cast<float>(radius * std::sin(twoPi * u2));
  }
  return out;
}

} // namespace vflow::rt

#endif // VFLOW_RUNTIME_RANDOM_H
