//===- Random.h - Normal random inputs for tests ----------------*- C++ -*-===//
//
// Tests feed sessions, caches and interpreters K, V and queries drawn from a
// normal distribution. NormalDraws keeps one distribution for all its draws
// (the standard one makes values in pairs), so that filling k and then v
// draws exactly the values one loop over both would.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_TESTS_COMMON_RANDOM_H
#define VFLOW_TESTS_COMMON_RANDOM_H

#include <cstddef>
#include <random>
#include <vector>

namespace vflow::testing {

/// Draws from N(0, sigma^2) with `rng` (a std::mt19937 or another engine).
template <typename Engine> class NormalDraws {
public:
  explicit NormalDraws(Engine &rng, float sigma = 1.0f)
      : rng(rng), normal(0.0f, sigma) {}

  /// Fills each of `values` in turn, element by element.
  template <typename... Vectors> void fill(Vectors &...values) {
    for (std::vector<float> *v : {&values...})
      for (float &x : *v)
        x = normal(rng);
  }

  /// `n` new values.
  std::vector<float> take(size_t n) {
    std::vector<float> out(n);
    fill(out);
    return out;
  }

private:
  Engine &rng;
  std::normal_distribution<float> normal;
};

} // namespace vflow::testing

#endif // VFLOW_TESTS_COMMON_RANDOM_H
