//===- FlowGpuTest.cpp - Stock programs on the GPU vs the CPU backend ----===//
//
// Every stock program's artifact runs in the CUDA backend's session and in
// the CPU backend's HostSession on the same random prefill and decode steps
// (three sequences of odd lengths, one shorter than the budget, two
// layers): the attended blocks of every (sequence, KV head) and the
// attention outputs are compared step by step. Then a CUDA graph of a
// decode step is replayed and compared with eager steps.
//
// The artifacts come from $VFLOW_GPU_ARTIFACTS (tools/gpu.sh writes them
// with vflowc, which the GPU machine cannot build).
//
//===----------------------------------------------------------------------===//

#include "GpuFlowTesting.h"

#include "../../common/Configs.h"
#include "../../common/StockPrograms.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/cuda/Driver.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>

using namespace vflow;
using namespace vflow::rt;
using namespace vflow::gputest;
using vflow::testing::sessionConfig;

namespace {

class StockProgram : public ::testing::TestWithParam<const char *> {};

TEST_P(StockProgram, MatchesCpuBackend) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  std::string name = GetParam();
  Shape shape{2, 4, 128, {700, 333, 40}, 3};
  compareWithCpu(name, shape, DType::BF16, 0.0);
}

TEST_P(StockProgram, OddShapes) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  std::string name = GetParam();
  if (name == "double_sparse")
    GTEST_SKIP() << "specialized to head_dim 128";
  compareWithCpu(name, {3, 5, 64, {517, 17, 1000, 64}, 2}, DType::BF16, 0.0);
  compareWithCpu(name, {2, 1, 64, {301, 95}, 2}, DType::F16, 0.0);
  // Groups of 8 and 16 (Llama-70B-like, MQA-like): the transposed shuffle
  // tree of [block, head] reductions at 3 and 4 steps.
  compareWithCpu(name, {1, 8, 128, {450, 70}, 2}, DType::BF16, 0.0);
  compareWithCpu(name, {1, 16, 64, {260}, 2}, DType::BF16, 0.0);
}

/// 8-bit caches: both sessions store each row with its scale by the same
/// rule, so they read the same values.
TEST_P(StockProgram, EightBitCaches) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  std::string name = GetParam();
  compareWithCpu(name, {2, 4, 128, {600, 250, 33}, 2}, DType::FP8E4M3, 0.0);
  compareWithCpu(name, {2, 4, 128, {600, 250, 33}, 2}, DType::INT8, 0.0);
  if (name != "double_sparse")
    compareWithCpu(name, {3, 5, 64, {517, 17}, 2}, DType::INT8, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Gpu, StockProgram,
                         ::testing::ValuesIn(vflow::testing::kStockPrograms),
                         flowName);

/// What a step runs whose first grid is longer than one wave: the append
/// kernel on its own before the plain first index kernel, over whole tiles
/// (forced by the session's launch options: the twin never, tiles whole;
/// the tests above run the appending twin over split tiles at their short
/// lengths), agrees with the CPU backend too: rows complete blocks at steps
/// 1 and 3, whose fields the same step reads.
TEST(FusedAppend, AppendKernelOnItsOwn) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  GpuLaunchOptions launch;
  launch.fusedAppend = GpuLaunchOptions::Fuse::Never;
  launch.tileSplit = 1;
  for (const char *name : {"quest", "block_topk", "h2o", "eps"})
    compareWithCpu(name, {2, 4, 128, {333, 95, 40}, 3}, DType::BF16, 0.0, 1.0,
                   launch);
}

/// Long contexts: one sequence of about 128K tokens (8192 blocks per list
/// for the selection) next to a short one.
class LongContext : public ::testing::TestWithParam<const char *> {};

TEST_P(LongContext, MatchesCpuBackend) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  std::string name = GetParam();
  compareWithCpu(name, {2, 4, 128, {131072 - 3, 2000}, 2}, DType::BF16, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Gpu, LongContext,
                         ::testing::Values("quest", "block_topk", "h2o", "eps"),
                         flowName);

/// approx_topk: the GPU's radix select stops early when the bucket it
/// would take arbitrarily misses at most (1 - recall) * k of the k best;
/// the CPU backend is exact. Every list keeps k blocks and the recall.
/// recall = 1 must equal exact top-k.
TEST(ApproxTopK, KeepsTheRecall) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  compareWithCpu("approx_quest", {2, 4, 128, {131072 - 3, 40000, 700}, 3},
                 DType::BF16, 1.0, 0.9);
  compareWithCpu("approx_quest_exact", {2, 4, 128, {40000, 700}, 2},
                 DType::BF16, 0.0);
}

/// Programs nobody wrote by hand: the random generator's flows (written
/// and compiled by tools/gpu-prepare.sh into artifacts/random/, listed in
/// its manifest.txt as "name group head_dim approx") against the CPU
/// backend. Element functions (exp, log, ...) may differ by an ulp between
/// CUDA and the host's libm, so a near-tie may resolve differently: one list
/// in 30 may differ, and the test prints how many. A program with
/// approx_topk (any recall) must keep the CPU lists' lengths.
TEST(RandomPrograms, MatchCpuBackend) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  std::string dir = artifactDir() + "/random";
  std::ifstream manifest(dir + "/manifest.txt");
  if (!manifest)
    GTEST_SKIP() << "no " << dir << "/manifest.txt (tools/gpu-prepare.sh)";
  std::string name;
  int group = 0, headDim = 0, approx = 0, programs = 0;
  while (manifest >> name >> group >> headDim >> approx) {
    ++programs;
    compareWithCpu(dir + "/" + name + ".vfa",
                   {2, group, headDim, {301, 77, 6}, 3}, DType::BF16,
                   approx ? 1.0 : 1.0 / 30, approx ? 1e-9 : 1.0);
  }
  EXPECT_GT(programs, 0);
}

/// The CUDA graph tests, for a flow that scores with fields (quest) and one
/// whose index stage stores states (h2o).
class GpuGraph : public GpuTest,
                 public ::testing::WithParamInterface<const char *> {};

INSTANTIATE_TEST_SUITE_P(Gpu, GpuGraph, ::testing::Values("quest", "h2o"),
                         flowName);

/// A decode step captured once in a CUDA graph and replayed over later
/// steps equals the same steps run eagerly.
TEST_P(GpuGraph, ReplayEqualsEager) {
  Artifact artifact = loadArtifact(artifactPath(GetParam()));
  std::mt19937 rng(99);
  SessionPair s(artifact.flows.at(0), {900, 450, 31}, rng);
  for (int step = 0; step < 20; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    s.stepBoth(rng, nullptr);
    if (::testing::Test::HasFatalFailure())
      return;
  }
}

/// Short contexts (shorter than the flow's budget) replay too: with
/// graphSafe the step's key changes only as the longest list passes a power
/// of two, so 100 steps from 40 tokens capture a few graphs, not one per
/// block.
TEST_P(GpuGraph, ShortContextsReplay) {
  Artifact artifact = loadArtifact(artifactPath(GetParam()));
  std::mt19937 rng(5);
  SessionPair s(artifact.flows.at(0), {40, 20}, rng);
  for (int step = 0; step < 100; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    s.stepBoth(rng, nullptr);
    if (::testing::Test::HasFatalFailure())
      return;
  }
  std::printf("%s: 100 steps from 40 tokens, %d captures\n", GetParam(),
              s.graph.captures);
  EXPECT_LE(s.graph.captures, 4);
}

/// A step whose selection takes every block whatever the scores (Quest's
/// 64 of at most 21 blocks here) writes its lists without scoring: every
/// block of every row, the same outputs replayed from a graph, and the
/// step's key says so (the CPU backend's lists at such lengths:
/// MatchesCpuBackend, OddShapes). A longer sequence, and H2O (whose index
/// stage stores states), score as always.
TEST(CudaSession, EveryBlockStepsSkipTheScoring) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  auto run = [](const char *name, std::initializer_list<int64_t> lengths,
                bool every) {
    SCOPED_TRACE(std::string(name) + " " + std::to_string(*lengths.begin()));
    Artifact artifact = loadArtifact(artifactPath(name));
    std::mt19937 rng(7);
    SessionPair s(artifact.flows.at(0), lengths, rng);
    const size_t B = lengths.size();
    for (int step = 0; step < 6; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      s.stepBoth(rng, [&](const StepKey &key) {
        EXPECT_EQ(key.everyBlock, every);
        if (!every)
          return;
        const std::vector<BlockLists> lists = s.eager->selection(0);
        ASSERT_EQ(lists.size(), B);
        for (size_t b = 0; b < B; ++b) {
          const int64_t n = (s.eager->length(s.a[b]) + 15) / 16;
          std::vector<int64_t> all(static_cast<size_t>(n));
          for (int64_t j = 0; j < n; ++j)
            all[size_t(j)] = j;
          for (const std::vector<int64_t> &list : lists[b])
            EXPECT_EQ(list, all) << "row " << b;
        }
      });
      if (::testing::Test::HasFatalFailure())
        return;
    }
  };
  run("quest", {330, 120, 31}, true);
  run("quest", {1500, 120, 31}, false);
  run("h2o", {330, 120, 31}, false);
}

/// Steps padded to 4 rows (Session::beginStep's `rows`): one graph,
/// captured with 3 sequences, replays the steps of 3 and then of 2
/// sequences, and each sequence's output equals the unpadded eager step's.
/// (The longest sequence has more blocks than a list's most entries, so
/// growing does not change the step's key.)
TEST_P(GpuGraph, PaddedStepServesSmallerBatches) {
  Artifact artifact = loadArtifact(artifactPath(GetParam()));
  std::mt19937 rng(7);
  SessionPair s(artifact.flows.at(0), {2100, 1500, 31}, rng);
  const int H = SessionPair::H, G = SessionPair::G, D = SessionPair::D;
  const int Rows = 4;
  const size_t qRow = size_t(H) * G * D, kvRow = size_t(H) * D;
  DeviceBuffer dq(Rows * qRow * 2), dk(Rows * kvRow * 2), dv(Rows * kvRow * 2),
      out1(Rows * qRow * 2), out2(Rows * qRow * 2);
  for (int step = 0; step < 16; ++step) {
    // Sequence 1 stops after 8 steps; the others go on.
    std::vector<size_t> live =
        step < 8 ? std::vector<size_t>{0, 1, 2} : std::vector<size_t>{0, 2};
    std::vector<SeqId> ea, gb;
    for (size_t i : live) {
      ea.push_back(s.a[i]);
      gb.push_back(s.b[i]);
    }
    // Padding rows hold random values: nothing may read them.
    auto q = toBF16(randomBF16(rng, Rows * qRow, 1.0f));
    auto k = toBF16(randomBF16(rng, Rows * kvRow, 1.0f));
    auto v = toBF16(randomBF16(rng, Rows * kvRow, 1.0f));
    CUDA_OK(cudaMemcpy(dq.ptr, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dk.ptr, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv.ptr, v.data(), v.size() * 2, cudaMemcpyHostToDevice));
    s.eager->beginStep(ea, 0, s.stream);
    s.eager->stepLayer(0, device(dq.ptr), device(dk.ptr), device(dv.ptr),
                       device(out1.ptr), s.stream);
    s.eager->endStep();
    const StepKey key = s.graphed->beginStep(gb, Rows, s.stream);
    ASSERT_EQ(key.rows, Rows);
    s.graph.replay(*s.graphed, key, s.stream, dq.ptr, dk.ptr, dv.ptr, out2.ptr);
    s.graphed->endStep();
    CUDA_OK(cudaStreamSynchronize(s.stream));
    const size_t n = live.size() * qRow;
    std::vector<uint16_t> x(n), y(n);
    CUDA_OK(cudaMemcpy(x.data(), out1.ptr, n * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(y.data(), out2.ptr, n * 2, cudaMemcpyDeviceToHost));
    ASSERT_EQ(x, y) << "step " << step;
  }
  EXPECT_EQ(s.graph.captures, 1);
  // A padded step over maxBatch is refused.
  EXPECT_THROW(s.graphed->beginStep(s.b, 5), Error);
}

/// The SessionApi tests' sessions: for quest, h2o and eps, the flow of its
/// artifact opened through openSession on the CPU with `base`, then on CUDA
/// with `base` on Device::Cuda (and `cudaMaxBlocksPerSeq` blocks per
/// sequence when it is not 0). Runs `test(flow, cfg, cpu, gpu)` with the
/// FlowArtifact, the CUDA session's SessionConfig and the two Session
/// pointers.
template <typename Test>
void onBothDevices(const SessionConfig &base, int64_t cudaMaxBlocksPerSeq,
                   Test test) {
  for (const char *name : {"quest", "h2o", "eps"}) {
    SCOPED_TRACE(name);
    Artifact artifact = loadArtifact(artifactPath(name));
    const FlowArtifact &flow = artifact.flows.at(0);
    SessionConfig cfg = base;
    std::unique_ptr<Session> cpu = openSession(flow, cfg);
    cfg.device = Device::Cuda;
    if (cudaMaxBlocksPerSeq)
      cfg.maxBlocksPerSeq = cudaMaxBlocksPerSeq;
    std::unique_ptr<Session> gpu = openSession(flow, cfg);
    test(flow, cfg, cpu.get(), gpu.get());
  }
}

/// The SessionApi tests: skipped without a GPU; their sessions are 2
/// layers of 2 KV heads of 4 query heads of 128.
class SessionApi : public GpuTest {
protected:
  static SessionConfig baseConfig(int64_t numPages = 512) {
    return sessionConfig(2, 2, 4, 128, numPages,
                         ::testing::TempDir() + "/vflow-session-api");
  }
};

/// `steps` decode steps through both sessions, layer by layer: one random
/// token of K and V appended to each of the sequences (`cs` on the CPU, `gs`
/// the same ones on the GPU) and random queries decoded; the GPU selects
/// what the CPU selects and its outputs are close.
/// Queries `q` decoded at layer `l` (of step `step`) through both sessions:
/// the GPU selects what the CPU selects and its outputs are close.
void expectSameDecode(Session *cpu, Session *gpu, const std::vector<SeqId> &cs,
                      const std::vector<SeqId> &gs, int l,
                      const std::vector<float> &q, int step) {
  std::vector<float> o1(q.size()), o2(q.size());
  cpu->decode(l, cs, q.data(), o1.data());
  gpu->decode(l, gs, q.data(), o2.data());
  EXPECT_EQ(cpu->selection(l), gpu->selection(l))
      << "step " << step << " layer " << l;
  EXPECT_LT(relativeError(o2, o1), 0.02) << "step " << step;
}

void decodeStepsAgree(Session *cpu, Session *gpu, const std::vector<SeqId> &cs,
                      const std::vector<SeqId> &gs, int numLayers, size_t row,
                      size_t qrow, std::mt19937 &rng, int steps = 3) {
  const std::vector<int64_t> ones(cs.size(), 1);
  for (int step = 0; step < steps; ++step)
    for (int l = 0; l < numLayers; ++l) {
      auto kn = randomBF16(rng, cs.size() * row, 1.0f),
           vn = randomBF16(rng, cs.size() * row, 1.0f);
      auto q = randomBF16(rng, cs.size() * qrow, 1.0f);
      cpu->append(l, cs, ones, Tensor::host(kn.data()),
                  Tensor::host(vn.data()));
      gpu->append(l, gs, ones, Tensor::host(kn.data()),
                  Tensor::host(vn.data()));
      expectSameDecode(cpu, gpu, cs, gs, l, q, step);
    }
}

/// The one session API (openSession) on both devices: the same prefill,
/// a fork with its own tokens, release and decode steps through
/// rt::Session give the same selections on the CPU and the GPU.
TEST_F(SessionApi, CpuAndCudaAgree) {
  SessionConfig base = baseConfig();
  base.massRecall = true;
  onBothDevices(base, 0, [](auto &flow, auto &cfg, auto *cpu, auto *gpu) {
    const size_t token = size_t(cfg.numLayers) * cfg.numKVHeads * 128;
    std::mt19937 rng(99);
    int64_t n = 40 * flow.blockSize + 5;
    auto k = randomBF16(rng, size_t(n) * token, 1.0f);
    auto v = randomBF16(rng, size_t(n) * token, 1.0f);
    SeqId a = cpu->addSequence(), ga = gpu->addSequence();
    cpu->append(a, n, k.data(), v.data());
    gpu->append(ga, n, k.data(), v.data());
    SeqId b = cpu->fork(a), gb = gpu->fork(ga);
    // A prefix hit: the first 32 blocks shared, fresh states.
    SeqId c = cpu->sharePrefix(a, 32 * flow.blockSize),
          gc = gpu->sharePrefix(ga, 32 * flow.blockSize);
    SeqId gone = cpu->addSequence(), ggone = gpu->addSequence();
    cpu->release(gone);
    gpu->release(ggone);
    std::vector<SeqId> cs = {a, b, c}, gs = {ga, gb, gc};
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < cs.size(); ++i) {
        auto kn = randomBF16(rng, token, 1.0f),
             vn = randomBF16(rng, token, 1.0f);
        cpu->append(cs[i], 1, kn.data(), vn.data());
        gpu->append(gs[i], 1, kn.data(), vn.data());
      }
      for (int l = 0; l < cfg.numLayers; ++l) {
        auto q = randomBF16(rng, cs.size() * cfg.numKVHeads * 4 * 128, 1.0f);
        expectSameDecode(cpu, gpu, cs, gs, l, q, step);
      }
    }
    EXPECT_EQ(cpu->length(a), gpu->length(ga));
    EXPECT_EQ(cpu->length(c), gpu->length(gc));
    EXPECT_EQ(cpu->length(c), 32 * flow.blockSize + 3);
    EXPECT_EQ(cpu->stats().blocksAttended, gpu->stats().blocksAttended);
    // The mass recall: the same lists, dense attention on both devices.
    SessionStats cs_ = cpu->stats(), gs_ = gpu->stats();
    EXPECT_EQ(cs_.massRecallCount, gs_.massRecallCount);
    EXPECT_EQ(cs_.massRecallCount, (std::vector<int64_t>{9, 9}));
    ASSERT_EQ(cs_.massRecallSum.size(), gs_.massRecallSum.size());
    for (size_t i = 0; i < cs_.massRecallSum.size(); ++i) {
      EXPECT_NEAR(cs_.massRecallSum[i], gs_.massRecallSum[i], 5e-3) << i;
      EXPECT_GT(cs_.massRecallSum[i], 0.0);
      EXPECT_LE(cs_.massRecallSum[i], 9.0 + 1e-4);
    }
  });
}

/// Wide sums follow NumericRules' f32 lane order bit for bit on both
/// devices (programs/wide_sum_order.vflow says how the data tells the
/// orders apart): block 0 is selected only when both of its sums (a warp
/// per output and a warp per block on the GPU) followed the lanes.
TEST(NumericRules, WideSumOrder) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  Artifact artifact = loadArtifact(artifactPath("wide_sum_order"));
  const FlowArtifact &flow = artifact.flows.at(0);
  const int D = 64;
  const int64_t P = flow.blockSize;
  SessionConfig cfg =
      sessionConfig(1, 1, 1, D, 16, ::testing::TempDir() + "/vflow-lanes");
  std::unique_ptr<Session> cpu = openSession(flow, cfg);
  cfg.device = Device::Cuda;
  std::unique_ptr<Session> gpu = openSession(flow, cfg);
  // Block 0: keys of ones. Block 1: 1 in dim 0, 62 in dim 1, zeros.
  std::vector<float> k(size_t(2 * P) * D, 0.0f), v(k.size(), 0.5f);
  for (int64_t t = 0; t < P; ++t)
    for (int d = 0; d < D; ++d)
      k[size_t(t) * D + d] = 1.0f;
  for (int64_t t = P; t < 2 * P; ++t) {
    k[size_t(t) * D] = 1.0f;
    k[size_t(t) * D + 1] = 62.0f;
  }
  std::vector<float> q(D, 1.0f), out(D), token(D, 0.0f);
  q[0] = 16777216.0f;
  for (Session *s : {cpu.get(), gpu.get()}) {
    SeqId seq = s->addSequence();
    s->append(seq, 2 * P, k.data(), v.data());
    s->append(seq, 1, token.data(), token.data());
    s->decode(0, {seq}, q.data(), out.data());
    const std::vector<BlockLists> lists = s->selection(0);
    const std::vector<int64_t> &blocks = lists.at(0).at(0);
    EXPECT_NE(std::find(blocks.begin(), blocks.end(), 0), blocks.end())
        << (s == cpu.get() ? "cpu" : "cuda");
    EXPECT_EQ(std::find(blocks.begin(), blocks.end(), 1), blocks.end())
        << (s == cpu.get() ? "cpu" : "cuda");
  }
}

/// Prefill (causal, dense) and decode steps through the session API of
/// sessions opened with `base` (and its first layer dense): the CUDA
/// backend equals the CPU backend, for quest, h2o and eps and for the
/// dense flow (no flow compiled).
void prefillAndDecodeAgree(const SessionConfig &base) {
  auto check = [](const FlowArtifact &flow, const SessionConfig &cfg,
                  Session *cpu, Session *gpu) {
    const size_t row = size_t(cfg.numKVHeads) * size_t(cfg.headDim),
                 qrow = row * size_t(cfg.group);
    std::mt19937 rng(7);
    const std::vector<int64_t> prompt = {3 * flow.blockSize + 5, 70};
    const int64_t total = prompt[0] + prompt[1];
    std::vector<SeqId> cs = {cpu->addSequence(), cpu->addSequence()};
    std::vector<SeqId> gs = {gpu->addSequence(), gpu->addSequence()};
    for (int l = 0; l < cfg.numLayers; ++l) {
      auto k = randomBF16(rng, size_t(total) * row, 1.0f);
      // (With valuesAreKeys the values are the keys' rows: v is not read.)
      auto v = randomBF16(rng, size_t(total) * row, 1.0f);
      auto q = randomBF16(rng, size_t(total) * qrow, 1.0f);
      for (Session *s : {cpu, gpu})
        s->append(l, s == cpu ? cs : gs, prompt, Tensor::host(k.data()),
                  Tensor::host(v.data()));
      std::vector<float> o1(q.size()), o2(q.size());
      cpu->prefill(l, cs, prompt, Tensor::host(q.data()),
                   Tensor::host(o1.data()));
      gpu->prefill(l, gs, prompt, Tensor::host(q.data()),
                   Tensor::host(o2.data()));
      EXPECT_LT(relativeError(o2, o1), 0.02) << "prefill at layer " << l;
    }
    decodeStepsAgree(cpu, gpu, cs, gs, cfg.numLayers, row, qrow, rng);
    EXPECT_EQ(cpu->stats().blocksAttended, gpu->stats().blocksAttended);
  };
  onBothDevices(base, 0, check);
  SessionConfig dense = base;
  dense.denseLayers = dense.numLayers;
  FlowArtifact flow = denseFlow(16);
  std::unique_ptr<Session> cpu = openSession(flow, dense);
  dense.device = Device::Cuda;
  std::unique_ptr<Session> gpu = openSession(flow, dense);
  check(flow, dense, cpu.get(), gpu.get());
}

TEST_F(SessionApi, PrefillAndDenseLayersAgree) {
  SessionConfig base = baseConfig();
  base.denseLayers = 1;
  // H2O's first selection reads the observation window's mass.
  base.observeTokens = 4;
  prefillAndDecodeAgree(base);
}

/// A latent cache (valuesAreKeys: DeepSeek's MLA rows, one KV head of 576
/// read by 16 query heads, the whole row as the value) on the GPU's latent
/// kernels.
TEST_F(SessionApi, LatentCacheAgrees) {
  SessionConfig base =
      sessionConfig(2, 1, 16, 576, 512, ::testing::TempDir() + "/vflow-latent");
  base.valuesAreKeys = true;
  base.denseLayers = 1;
  base.observeTokens = 4;
  prefillAndDecodeAgree(base);
}

/// Flows with fields and states, dense at every layer, opened from an
/// artifact that is gone before the session is used: the session keeps
/// what it needs of the flow (the GPU session referenced the caller's
/// artifact, and allocated pools for fields nothing computes), and decodes
/// as the dense flow does on the CPU.
TEST_F(SessionApi, DenseEverywhereFlowOutlivesItsArtifact) {
  SessionConfig cfg = baseConfig();
  cfg.denseLayers = cfg.numLayers;
  for (const char *name : {"quest", "h2o", "eps"}) {
    SCOPED_TRACE(name);
    std::unique_ptr<Session> gpu;
    int64_t blockSize = 0;
    {
      SessionConfig g = cfg;
      g.device = Device::Cuda;
      std::unique_ptr<Artifact> artifact =
          std::make_unique<Artifact>(loadArtifact(artifactPath(name)));
      ASSERT_FALSE(artifact->flows.at(0).fields.empty() &&
                   artifact->flows.at(0).states.empty());
      blockSize = artifact->flows.at(0).blockSize;
      gpu = openSession(artifact->flows.at(0), g);
      // Overwritten, then freed: nothing of it may be read again.
      artifact->flows.at(0) = FlowArtifact();
    }
    EXPECT_TRUE(gpu->flow().fields.empty());
    EXPECT_TRUE(gpu->flow().states.empty());
    std::unique_ptr<Session> cpu = openSession(denseFlow(blockSize), cfg);
    std::mt19937 rng(3);
    const size_t row = size_t(cfg.numKVHeads) * 128, qrow = row * 4;
    const int64_t n = 5 * blockSize + 3;
    SeqId c = cpu->addSequence(), g = gpu->addSequence();
    for (int l = 0; l < cfg.numLayers; ++l) {
      auto k = randomBF16(rng, size_t(n) * row, 1.0f);
      auto v = randomBF16(rng, size_t(n) * row, 1.0f);
      cpu->append(l, {c}, {n}, Tensor::host(k.data()), Tensor::host(v.data()));
      gpu->append(l, {g}, {n}, Tensor::host(k.data()), Tensor::host(v.data()));
    }
    decodeStepsAgree(cpu.get(), gpu.get(), {c}, {g}, cfg.numLayers, row, qrow,
                     rng);
  }
}

/// The session API as a model drives it on the GPU: device bf16 tensors on
/// the caller's stream, K/V appended layer by layer (prompts of several
/// sequences in one call, then one token per step, held for the fused
/// append of the decode), sequences joining, forking and leaving between
/// steps, and one step's decode captured in a CUDA graph. Selections and
/// outputs equal the CPU backend's, fed the same values as host f32.
TEST_F(SessionApi, LayerByLayerOnDeviceTensors) {
  SessionConfig base = baseConfig(1024);
  base.graphSafe = true;
  onBothDevices(base, 128, [](auto &flow, auto &cfg, auto *cpu, auto *gpu) {
    const int L = cfg.numLayers;
    const size_t row = size_t(cfg.numKVHeads) * 128, qrow = row * 4;
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
              cudaSuccess);
    DeviceBuffer dk(16384 * row * 2), dv(16384 * row * 2), dq(8 * qrow * 2),
        dout(8 * qrow * 2);
    auto upload = [&](void *dst, const std::vector<float> &x) {
      std::vector<uint16_t> h = toBF16(x);
      ASSERT_EQ(cudaMemcpyAsync(dst, h.data(), h.size() * 2,
                                cudaMemcpyHostToDevice, stream),
                cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    };
    auto device = [](void *p) { return Tensor{p, DType::BF16, Device::Cuda}; };
    std::mt19937 rng(31);
    // Both sessions, one layer's K/V of `counts` tokens of `seqs`.
    std::vector<SeqId> cs, gs;
    auto appendBoth = [&](int l, const std::vector<size_t> &rows,
                          const std::vector<int64_t> &counts) {
      int64_t total = 0;
      for (int64_t n : counts)
        total += n;
      auto k = randomBF16(rng, size_t(total) * row, 1.0f),
           v = randomBF16(rng, size_t(total) * row, 1.0f);
      std::vector<SeqId> c, g;
      for (size_t r : rows)
        c.push_back(cs[r]), g.push_back(gs[r]);
      cpu->append(l, c, counts, Tensor::host(k.data()), Tensor::host(v.data()));
      upload(dk.ptr, k);
      upload(dv.ptr, v);
      gpu->append(l, g, counts, device(dk.ptr), device(dv.ptr), stream);
    };
    auto join = [&](int64_t prompt) {
      cs.push_back(cpu->addSequence());
      gs.push_back(gpu->addSequence());
      for (int l = 0; l < L; ++l)
        appendBoth(l, {cs.size() - 1}, {prompt});
    };
    join(40 * flow.blockSize + 3);
    join(25 * flow.blockSize + 9);
    for (int step = 0; step < 6; ++step) {
      if (step == 2)
        join(31 * flow.blockSize);
      if (step == 3) { // a fork joins, the second sequence leaves
        cs.push_back(cpu->fork(cs[0]));
        gs.push_back(gpu->fork(gs[0]));
        cpu->release(cs[1]);
        gpu->release(gs[1]);
        cs.erase(cs.begin() + 1);
        gs.erase(gs.begin() + 1);
      }
      std::vector<size_t> rows;
      for (size_t r = 0; r < cs.size(); ++r)
        rows.push_back(r);
      const size_t B = rows.size();
      for (int l = 0; l < L; ++l) {
        appendBoth(l, rows, std::vector<int64_t>(B, 1));
        auto q = randomBF16(rng, B * qrow, 1.0f);
        std::vector<float> want(B * qrow);
        cpu->decode(l, cs, q.data(), want.data());
        upload(dq.ptr, q);
        // The first layer plans the step (an upload: not capturable, a
        // clear error that leaves the capture to end cleanly); a later
        // layer of the same rows launches kernels only.
        if (step == 5 && l == 0) {
          cudaGraph_t graph;
          ASSERT_EQ(
              cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
              cudaSuccess);
          EXPECT_THROW(
              gpu->decode(l, gs, device(dq.ptr), device(dout.ptr), stream),
              Error);
          ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
          cudaGraphDestroy(graph);
        }
        const bool capture = step == 5 && l == L - 1;
        if (capture) { // the decode as a CUDA graph, launched once
          cudaGraph_t graph;
          cudaGraphExec_t exec;
          ASSERT_EQ(
              cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
              cudaSuccess);
          gpu->decode(l, gs, device(dq.ptr), device(dout.ptr), stream);
          ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
          ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
          ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
          ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          cudaGraphExecDestroy(exec);
          cudaGraphDestroy(graph);
        } else {
          gpu->decode(l, gs, device(dq.ptr), device(dout.ptr), stream);
        }
        std::vector<uint16_t> hb(B * qrow);
        ASSERT_EQ(cudaMemcpyAsync(hb.data(), dout.ptr, hb.size() * 2,
                                  cudaMemcpyDeviceToHost, stream),
                  cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        std::vector<float> got(hb.size());
        for (size_t i = 0; i < hb.size(); ++i)
          got[i] = bf16ToFloat(hb[i]);
        EXPECT_EQ(cpu->selection(l), gpu->selection(l))
            << "step " << step << " layer " << l << (capture ? " (graph)" : "");
        EXPECT_LT(relativeError(got, want), 0.02)
            << "step " << step << " layer " << l;
      }
    }
    EXPECT_EQ(cpu->stats().blocksAttended, gpu->stats().blocksAttended);
    EXPECT_EQ(cpu->stats().listsAttended, gpu->stats().listsAttended);
    // Each sequence's counts (the GPU's sparse ones per state slot).
    for (size_t i = 0; i < cs.size(); ++i) {
      const SequenceStats c = cpu->sequenceStats(cs[i]),
                          g = gpu->sequenceStats(gs[i]);
      EXPECT_EQ(c.blocksAttended, g.blocksAttended) << "sequence " << i;
      EXPECT_EQ(c.listsAttended, g.listsAttended) << "sequence " << i;
      EXPECT_EQ(c.blocksAvailable, g.blocksAvailable) << "sequence " << i;
    }
    // A decode before its layer holds the step's token is an error.
    gpu->append(0, {gs[0]}, {1}, device(dk.ptr), device(dv.ptr), stream);
    EXPECT_THROW(
        gpu->decode(1, {gs[0]}, device(dq.ptr), device(dout.ptr), stream),
        Error);
    // Host f16 is not a CUDA input; device f32 neither.
    EXPECT_THROW(gpu->decode(0, {gs[0]}, {dq.ptr, DType::F32, Device::Cuda},
                             device(dout.ptr), stream),
                 Error);
    cudaStreamDestroy(stream);
  });
}

/// Everything a GPU session needs comes from the artifact: with no host
/// C++ compiler to be found (CXX and PATH point nowhere), sessions of flows
/// with consts (eps, double_sparse) and without (quest, h2o) run decode
/// steps and select blocks.
TEST(CudaSession, RunsWithoutAHostCompiler) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  /// PATH and CXX point nowhere until the end of the test, however it ends.
  struct NoCompiler {
    std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
    std::string cxx = std::getenv("CXX") ? std::getenv("CXX") : "";
    NoCompiler() {
      ::setenv("PATH", "/nonexistent", 1);
      ::setenv("CXX", "/nonexistent/c++", 1);
    }
    ~NoCompiler() {
      ::setenv("PATH", path.c_str(), 1);
      if (cxx.empty())
        ::unsetenv("CXX");
      else
        ::setenv("CXX", cxx.c_str(), 1);
    }
  } noCompiler;
  for (const char *name : {"eps", "double_sparse", "quest", "h2o"}) {
    SCOPED_TRACE(name);
    Artifact artifact = loadArtifact(artifactPath(name));
    SessionConfig cfg = sessionConfig(
        1, 2, 4, 128, 256, ::testing::TempDir() + "/vflow-gpu-nocxx-" + name);
    cfg.device = Device::Cuda;
    std::unique_ptr<Session> s = openSession(artifact.flows.at(0), cfg);
    SeqId seq = s->addSequence();
    std::mt19937 rng(7);
    int64_t n = 16 * artifact.flows.at(0).blockSize + 3;
    std::vector<float> k = randomBF16(rng, size_t(n) * 2 * 128, 1.0f);
    std::vector<float> v = randomBF16(rng, k.size(), 1.0f);
    s->append(seq, n, k.data(), v.data());
    std::vector<float> kn = randomBF16(rng, 2 * 128, 1.0f);
    s->append(seq, 1, kn.data(), kn.data());
    std::vector<float> q = randomBF16(rng, 8 * 128, 1.0f), out(q.size());
    s->decode(0, {seq}, q.data(), out.data());
    std::vector<BlockLists> attended = s->selection(0);
    ASSERT_EQ(attended.size(), 1u);
    for (const auto &blocks : attended[0])
      EXPECT_FALSE(blocks.empty());
  }
}

TEST(CudaSession, BadInputIsAClearError) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  Artifact artifact = loadArtifact(artifactPath("quest"));
  const FlowArtifact &flow = artifact.flows.at(0);
  SessionConfig cfg = sessionConfig(
      1, 2, 4, 128, 8, ::testing::TempDir() + "/vflow-gpu-flow-jit");
  cfg.device = Device::Cuda;
  cfg.maxSequences = cfg.maxBatch = 1;
  cfg.maxBlocksPerSeq = 4;
  std::unique_ptr<Session> s = openSession(flow, cfg);
  SeqId a = s->addSequence();
  EXPECT_THROW(s->addSequence(), Error);
  std::vector<float> k(size_t(80) * 2 * 128, 0.5f);
  EXPECT_THROW(s->append(a, 80, k.data(), k.data()), Error); // > 4 blocks
  EXPECT_EQ(s->length(a), 0);
  EXPECT_THROW(s->beginStep({a, a}), Error);
  DeviceBuffer buf(4096);
  EXPECT_THROW(s->stepLayer(0, device(buf.ptr), device(buf.ptr),
                            device(buf.ptr), device(buf.ptr)),
               Error); // before beginStep
  // K/V the GPU does not store.
  for (DType bad : {DType::F32, DType::FP8E5M2}) {
    SessionConfig c = cfg;
    c.kvDType = bad;
    EXPECT_THROW(openSession(flow, c), Error) << dtypeName(bad);
  }
  // Shapes the attention kernels do not support are refused up front.
  FlowArtifact pages8 = flow;
  pages8.blockSize = 8;
  EXPECT_THROW(openSession(pages8, cfg), Error);
  SessionConfig c = cfg;
  c.headDim = 96;
  EXPECT_THROW(openSession(flow, c), Error);
  c.headDim = 128;
  c.group = 17;
  EXPECT_THROW(openSession(flow, c), Error);
  // A latent cache of a width the artifact has no consts' values for (EPS's
  // Phi is [dim, 8]): the error says how to compile them.
  Artifact eps = loadArtifact(artifactPath("eps"));
  SessionConfig latent = cfg;
  latent.valuesAreKeys = true;
  latent.numKVHeads = 1;
  latent.headDim = 288;
  try {
    openSession(eps.flows.at(0), latent);
    ADD_FAILURE() << "EPS opened on a 288-wide latent cache";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("param head_dim = 288;"),
              std::string::npos)
        << e.what();
  }
}

} // namespace
