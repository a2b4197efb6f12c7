//===- MoeGpuTest.cpp - The GPU's mixture of experts against float64 ------===//
//
// moeForward (runtime/model/CudaMoe.cu) on fresh random routers, inputs and
// experts against a float64 host reference written from transformers'
// routers (Qwen3-MoE and Mixtral: softmax, top k, renormalized or not;
// DeepSeek-V2: groups by their best; DeepSeek-V3: sigmoid scores, a choice
// bias, groups by their two best, renormalized and scaled). The kernel and
// the reference route from the same f32 logits, so their choices agree
// (random logits have no ties); the outputs then differ by the bf16
// rounding of the result alone. The output aliases the input, as the
// engine calls it.
//
//===----------------------------------------------------------------------===//

#include "CudaBlas.h"
#include "CudaMoe.h"

#include "vflow/Runtime/DType.h"

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace vflow;
using namespace vflow::model;

namespace {

bool haveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/// A device copy of a host vector, freed with it.
template <typename T> struct Device {
  T *ptr = nullptr;
  explicit Device(const std::vector<T> &h) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void **>(&ptr),
                         std::max<size_t>(1, h.size()) * sizeof(T)),
              cudaSuccess);
    EXPECT_EQ(
        cudaMemcpy(ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice),
        cudaSuccess);
  }
  Device(const Device &) = delete;
  ~Device() { cudaFree(ptr); }
  std::vector<T> download(size_t n) const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return h;
  }
};

struct Case {
  std::string name;
  int rows, hidden, inner, experts, perToken;
  int groups = 0, keptGroups = 0;
  bool sigmoid = false, normalize = false, bias = false;
  float scaling = 1.0f;
  int nanRow = -1; ///< a row whose logits are all NaN (broken input)
};

std::ostream &operator<<(std::ostream &os, const Case &c) {
  return os << c.name;
}

/// Row r's chosen experts and weights by the transformers routers' rule.
void routeRow(const Case &c, const float *z, const float *bias,
              std::vector<int> &chosen, std::vector<double> &weight) {
  const int X = c.experts;
  std::vector<double> p(X), choice(X);
  if (c.sigmoid) {
    for (int e = 0; e < X; ++e)
      p[e] = 1.0 / (1.0 + std::exp(-double(z[e])));
  } else {
    double top = -INFINITY, sum = 0;
    for (int e = 0; e < X; ++e)
      top = std::max(top, double(z[e]));
    for (int e = 0; e < X; ++e)
      sum += p[e] = std::exp(double(z[e]) - top);
    for (double &v : p)
      v /= sum;
  }
  for (int e = 0; e < X; ++e)
    choice[e] = p[e] + (bias ? bias[e] : 0.0);
  auto byValue = [&](const std::vector<double> &v) {
    std::vector<int> order(v.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return v[a] > v[b]; });
    return order;
  };
  std::vector<bool> allowed(X, true);
  if (c.groups > 0) {
    const int per = X / c.groups;
    std::vector<double> score(c.groups);
    for (int g = 0; g < c.groups; ++g) {
      std::vector<double> in(choice.begin() + g * per,
                             choice.begin() + (g + 1) * per);
      std::sort(in.rbegin(), in.rend());
      score[g] = c.sigmoid && per >= 2 ? in[0] + in[1] : in[0];
    }
    std::vector<int> order = byValue(score);
    std::vector<bool> keep(c.groups, false);
    for (int k = 0; k < c.keptGroups; ++k)
      keep[order[k]] = true;
    for (int e = 0; e < X; ++e)
      allowed[e] = keep[e / per];
  }
  std::vector<double> ranked(X);
  for (int e = 0; e < X; ++e)
    ranked[e] = allowed[e] ? choice[e] : -INFINITY;
  std::vector<int> order = byValue(ranked);
  chosen.assign(order.begin(), order.begin() + c.perToken);
  double kept = 0;
  for (int e : chosen)
    kept += p[e];
  weight.clear();
  for (int e : chosen)
    weight.push_back(p[e] / (c.normalize ? kept + (c.sigmoid ? 1e-20 : 0) : 1) *
                     c.scaling);
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

/// Each case through the kernels (no cuBLAS handle: what a captured decode
/// step runs) and, given a handle, through the per-expert GEMMs where it
/// has kMoeGemmRows rows or more (prefill).
class MoeGpu : public ::testing::TestWithParam<std::tuple<Case, bool>> {};

TEST_P(MoeGpu, MatchesFloat64) {
  if (!haveGpu())
    GTEST_SKIP() << "no CUDA device";
  const Case c = std::get<0>(GetParam());
  const bool gemms = std::get<1>(GetParam());
  cublasHandle_t blas = nullptr;
  if (gemms) {
    ASSERT_EQ(detail::Blas::get().create(&blas), CUBLAS_STATUS_SUCCESS);
  }
  const int T = c.rows, E = c.hidden, I = c.inner, X = c.experts;
  std::mt19937 rng(std::hash<std::string>()(c.name) ^ 20261128u);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto bf16Vector = [&](size_t n, float scale) {
    std::vector<uint16_t> v(n);
    for (auto &x : v)
      x = rt::floatToBF16(normal(rng) * scale);
    return v;
  };
  std::vector<float> logits(size_t(T) * X);
  for (float &z : logits)
    z = 2.0f * normal(rng);
  if (c.nanRow >= 0)
    std::fill_n(logits.begin() + size_t(c.nanRow) * X, X,
                std::numeric_limits<float>::quiet_NaN());
  std::vector<float> bias(X);
  for (float &b : bias)
    b = 0.1f * normal(rng);
  const std::vector<uint16_t> x = bf16Vector(size_t(T) * E, 1.0f);
  const std::vector<uint16_t> gateUp =
      bf16Vector(size_t(X) * 2 * I * E, 1.0f / std::sqrt(float(E)));
  const std::vector<uint16_t> down =
      bf16Vector(size_t(X) * E * I, 1.0f / std::sqrt(float(I)));

  Device<float> dLogits(logits), dBias(bias);
  Device<uint16_t> dX(x), dGateUp(gateUp), dDown(down);
  Device<uint8_t> work(std::vector<uint8_t>(
      moeWorkspaceBytes(T, E, I, X, c.perToken), 0xFF)); // poisoned
  MoeArgs a;
  a.rows = T;
  a.hidden = E;
  a.inner = I;
  a.experts = X;
  a.perToken = c.perToken;
  a.groups = c.groups;
  a.keptGroups = c.keptGroups;
  a.sigmoid = c.sigmoid;
  a.normalize = c.normalize;
  a.scaling = c.scaling;
  a.logits = dLogits.ptr;
  a.bias = c.bias ? dBias.ptr : nullptr;
  a.x = reinterpret_cast<const __nv_bfloat16 *>(dX.ptr);
  a.gateUp = reinterpret_cast<const __nv_bfloat16 *>(dGateUp.ptr);
  a.down = reinterpret_cast<const __nv_bfloat16 *>(dDown.ptr);
  a.out = reinterpret_cast<__nv_bfloat16 *>(dX.ptr); // in place
  a.workspace = work.ptr;
  a.blas = blas;
  moeForward(a, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (blas)
    detail::Blas::get().destroy(blas);
  const std::vector<uint16_t> got = dX.download(size_t(T) * E);

  auto at = [](const std::vector<uint16_t> &v, size_t i) {
    return double(rt::bf16ToFloat(v[i]));
  };
  double worst = 0, scale = 0;
  std::vector<int> chosen;
  std::vector<double> weight;
  for (int r = 0; r < T; ++r) {
    if (r == c.nanRow)
      continue; // its output is NaN; the other rows must not suffer
    routeRow(c, logits.data() + size_t(r) * X, c.bias ? bias.data() : nullptr,
             chosen, weight);
    // Per row: each chosen expert's hidden vector, then every output.
    std::vector<std::vector<double>> hid(c.perToken, std::vector<double>(I));
    for (int j = 0; j < c.perToken; ++j)
      for (int i = 0; i < I; ++i) {
        double g = 0, u = 0;
        const size_t gr = (size_t(chosen[j]) * 2 * I + i) * E,
                     ur = (size_t(chosen[j]) * 2 * I + I + i) * E;
        for (int k = 0; k < E; ++k) {
          g += at(x, size_t(r) * E + k) * at(gateUp, gr + k);
          u += at(x, size_t(r) * E + k) * at(gateUp, ur + k);
        }
        hid[j][i] = silu(g) * u;
      }
    for (int col = 0; col < E; ++col) {
      double want = 0;
      for (int j = 0; j < c.perToken; ++j) {
        double d = 0;
        const size_t dr = (size_t(chosen[j]) * E + col) * I;
        for (int i = 0; i < I; ++i)
          d += hid[j][i] * at(down, dr + i);
        want += weight[j] * d;
      }
      const double g = at(got, size_t(r) * E + col);
      ASSERT_TRUE(std::isfinite(g)) << "row " << r << " col " << col;
      worst = std::max(worst, std::abs(g - want));
      scale = std::max(scale, std::abs(want));
    }
  }
  // bf16's rounding of the output (2^-9 relative) and the f32 sums; the
  // GEMMs also round the gathered products and activations to bf16.
  const bool gemmPath = gemms && c.rows >= kMoeGemmRows;
  EXPECT_LE(worst, (gemmPath ? 1.2e-2 : 8e-3) * scale) << "scale " << scale;
  std::printf("  %-28s %-7s max err %.2e of %.3f\n", c.name.c_str(),
              gemmPath ? "gemms" : "kernels", worst, scale);
}

INSTANTIATE_TEST_SUITE_P(
    Routers, MoeGpu,
    ::testing::Combine(
        ::testing::Values(
            // Qwen3-MoE (norm_topk_prob) and Mixtral: one decode row, a prompt.
            Case{"softmax_norm_decode", 1, 128, 96, 8, 2, 0, 0, false, true},
            Case{"softmax_norm_prompt", 37, 128, 96, 8, 2, 0, 0, false, true},
            // Qwen3-30B-A3B's 128 experts choose 8, not renormalized; a batch
            // of rows sharing experts.
            Case{"softmax_128x8_rows64", 64, 256, 64, 128, 8},
            // DeepSeek-V2: 4 groups, 2 kept, scaled, never renormalized.
            Case{"groups_softmax_scaled", 19, 64, 32, 16, 3, 4, 2, false, false,
                 false, 2.5f},
            // DeepSeek-V3: sigmoid, a choice bias, groups by their two best.
            Case{"sigmoid_bias_groups", 23, 64, 48, 32, 4, 8, 3, true, true,
                 true, 2.5f},
            // A row of NaN logits keeps its K experts distinct (each expert's
            // list holds at most a row's one entry); the other rows are right.
            Case{"nan_row", 9, 64, 32, 8, 2, 0, 0, false, true, false, 1.0f, 4},
            // A prompt's worth of rows: experts with many rows each.
            Case{"prompt_rows200", 200, 128, 64, 16, 4, 0, 0, false, true}),
        ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<Case, bool>> &i) {
      return std::get<0>(i.param).name +
             (std::get<1>(i.param) ? "_cublas" : "_kernels");
    });

} // namespace
