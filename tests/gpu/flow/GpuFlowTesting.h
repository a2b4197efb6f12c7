//===- GpuFlowTesting.h - What the GPU flow tests share ---------*- C++ -*-===//
//
// The GPU flow tests' helpers: artifacts from $VFLOW_GPU_ARTIFACTS
// (tools/gpu.sh writes them with vflowc, which the GPU machine cannot
// build), random data on the bf16 grid, compareWithCpu (a flow on the CUDA
// session against the CPU session, step by step), and SessionPair (eager
// steps against steps replayed from a CUDA graph).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_TESTS_GPU_FLOW_GPUFLOWTESTING_H
#define VFLOW_TESTS_GPU_FLOW_GPUFLOWTESTING_H

#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Session.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace vflow::gputest {

using namespace vflow::rt;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

std::string artifactDir();
std::string artifactPath(const std::string &name);
/// Whether a GPU is there (else says why).
bool haveGpu();

/// Values on the bf16 grid (what both sides store and read), or on the
/// fp8 e4m3 grid (which bf16 holds exactly).
std::vector<float> randomBF16(std::mt19937 &rng, size_t n, float scale,
                              DType grid = DType::BF16);
std::vector<uint16_t> toBF16(const std::vector<float> &x);
double relativeError(const std::vector<float> &got,
                     const std::vector<float> &want);
/// A device bf16 tensor.
Tensor device(void *p);

struct DeviceBuffer {
  void *ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { cudaMalloc(&ptr, bytes); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
};

struct Shape {
  int kvHeads, group, headDim;
  std::vector<int64_t> lengths;
  int steps;
};

/// Runs `name` (a stock program, or an artifact's path) on both backends
/// and checks that at most `maxListMismatch` of the attended block lists
/// differ. Flows that read the attention mass see the GPU's own mass (float
/// sums in another order), so near-ties may resolve differently: 5% of
/// lists, 25% among thousands of candidates. With `minRecall` < 1
/// (approximate top-k on the GPU, exact on the CPU) a list may differ but
/// must have the CPU list's length and hold at least minRecall of its
/// blocks. `params` are set on both sessions first. A flow with a retain
/// block evicts on both after each step's last layer: every sequence keeps
/// the same length and position, and a sequence whose kept blocks (by
/// original index) differ counts as a list that differs.
/// `gpuStats`, if given, receives the GPU session's stats at the end.
void compareWithCpu(const std::string &name, const Shape &shape, DType kvDType,
                    double maxListMismatch, double minRecall = 1.0,
                    const GpuLaunchOptions &launch = GpuLaunchOptions(),
                    const std::map<std::string, double> &params = {},
                    SessionStats *gpuStats = nullptr);

/// A parameterized test's name: its flow's (the parameter).
std::string flowName(const ::testing::TestParamInfo<const char *> &info);

/// The config of SessionPair's sessions: one layer, H = 2 KV heads, G = 4,
/// D = 128, up to 4 rows of up to 256 blocks, graph-safe, no telemetry
/// (the selection read is the last decode's).
SessionConfig pairConfig();

/// A CUDA graph of one decode layer (Session::stepLayer) captured on a
/// stream, captured again whenever the step's key changes (as a model's
/// graph cache does).
struct StepGraph {
  cudaGraphExec_t exec = nullptr;
  StepKey captured;
  int captures = 0;
  StepGraph() = default;
  StepGraph(const StepGraph &) = delete;
  StepGraph &operator=(const StepGraph &) = delete;
  ~StepGraph() {
    if (exec)
      cudaGraphExecDestroy(exec);
  }
  /// Replays the step layer 0 of `s` (begun with key `key`) on `stream`,
  /// capturing it first when no graph of that key is held.
  void replay(Session &s, const StepKey &key, cudaStream_t stream, void *q,
              void *k, void *v, void *out) {
    if (!exec || key != captured) {
      if (exec)
        cudaGraphExecDestroy(exec);
      exec = nullptr;
      cudaGraph_t graph;
      CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      s.stepLayer(0, device(q), device(k), device(v), device(out), stream);
      CUDA_OK(cudaStreamEndCapture(stream, &graph));
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      cudaGraphDestroy(graph);
      captured = key;
      ++captures;
    }
    CUDA_OK(cudaGraphLaunch(exec, stream));
  }
};

/// Two sessions of one flow (pairConfig) holding the same random sequences
/// of `lengths`: one for eager steps, one for captured ones, on a stream of
/// the test's own.
struct SessionPair {
  static constexpr int H = 2, G = 4, D = 128;
  std::unique_ptr<Session> eager, graphed;
  std::vector<SeqId> a, b;
  cudaStream_t stream = nullptr;
  StepGraph graph;
  SessionPair(const FlowArtifact &flow, std::initializer_list<int64_t> lengths,
              std::mt19937 &rng) {
    eager = openSession(flow, pairConfig());
    graphed = openSession(flow, pairConfig());
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    for (int64_t len : lengths) {
      auto k = randomBF16(rng, size_t(len) * H * D, 1.0f);
      auto v = randomBF16(rng, size_t(len) * H * D, 1.0f);
      a.push_back(eager->addSequence());
      b.push_back(graphed->addSequence());
      eager->append(a.back(), len, k.data(), v.data());
      graphed->append(b.back(), len, k.data(), v.data());
    }
  }
  ~SessionPair() { cudaStreamDestroy(stream); }
  /// One decode step of fresh random data for every row of `a` and `b`:
  /// layer 0 run eagerly (then `afterEager` with the step's key, the
  /// stream done and the step still open), and from a graph (captured
  /// again where the step's key changed); the outputs must be the same
  /// bits.
  void stepBoth(std::mt19937 &rng,
                const std::function<void(const StepKey &)> &afterEager) {
    const int B = int(a.size());
    const size_t qSize = size_t(B) * H * G * D, kvSize = size_t(B) * H * D;
    if (!dq) {
      dq = std::make_unique<DeviceBuffer>(qSize * 2);
      dk = std::make_unique<DeviceBuffer>(kvSize * 2);
      dv = std::make_unique<DeviceBuffer>(kvSize * 2);
      out1 = std::make_unique<DeviceBuffer>(qSize * 2);
      out2 = std::make_unique<DeviceBuffer>(qSize * 2);
    }
    auto q = toBF16(randomBF16(rng, qSize, 1.0f));
    auto k = toBF16(randomBF16(rng, kvSize, 1.0f));
    auto v = toBF16(randomBF16(rng, kvSize, 1.0f));
    CUDA_OK(cudaMemcpy(dq->ptr, q.data(), qSize * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dk->ptr, k.data(), kvSize * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv->ptr, v.data(), kvSize * 2, cudaMemcpyHostToDevice));
    const StepKey ek = eager->beginStep(a, 0, stream);
    eager->stepLayer(0, device(dq->ptr), device(dk->ptr), device(dv->ptr),
                     device(out1->ptr), stream);
    CUDA_OK(cudaStreamSynchronize(stream));
    if (afterEager)
      afterEager(ek);
    eager->endStep();
    const StepKey gk = graphed->beginStep(b, 0, stream);
    EXPECT_EQ(ek, gk);
    graph.replay(*graphed, gk, stream, dq->ptr, dk->ptr, dv->ptr, out2->ptr);
    graphed->endStep();
    CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<uint16_t> x(qSize), y(qSize);
    CUDA_OK(cudaMemcpy(x.data(), out1->ptr, qSize * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(y.data(), out2->ptr, qSize * 2, cudaMemcpyDeviceToHost));
    ASSERT_EQ(x, y);
  }

private:
  std::unique_ptr<DeviceBuffer> dq, dk, dv, out1, out2;
};

/// Tests skipped without a GPU.
class GpuTest : public ::testing::Test {
protected:
  void SetUp() override {
    if (!haveGpu())
      GTEST_SKIP() << "no GPU";
  }
};

} // namespace vflow::gputest

#endif // VFLOW_TESTS_GPU_FLOW_GPUFLOWTESTING_H
