//===- RetainGpuTest.cpp - Eviction on the GPU session
//----------------------===//
//
// A flow's retain block on the CUDA session against the CPU session: the
// stock eviction programs at small capacities (the kept blocks and the
// selections among them step by step), a step replayed from a CUDA graph
// against the same step run eagerly, and Session::evict itself (the states
// follow the kept blocks, pages return to the pool, bad input changes
// nothing).
//
//===----------------------------------------------------------------------===//

#include "GpuFlowTesting.h"

#include "../../common/Configs.h"
#include "vflow/Runtime/Error.h"

#include <random>

using namespace vflow;
using namespace vflow::rt;
using namespace vflow::gputest;
using vflow::testing::sessionConfig;

namespace {

/// The stock eviction programs with capacities a few hundred tokens hold:
/// every sequence past them evicts at its first step and again each time a
/// block completes (the 333-token one after 3 steps).
TEST(Retain, StockProgramsEvictAsTheCpu) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  const Shape shape{2, 4, 128, {700, 333, 40}, 20};
  compareWithCpu("streaming_llm", shape, DType::BF16, 0.0, 1.0, {},
                 {{"keep_last", 4}});
  compareWithCpu("h2o_evict", shape, DType::BF16, 0.0, 1.0, {},
                 {{"capacity", 10}, {"keep_last", 3}, {"budget", 4}});
  compareWithCpu("snapkv", shape, DType::BF16, 0.0, 1.0, {},
                 {{"capacity", 12}, {"budget", 5}});
  compareWithCpu("rkv_evict", shape, DType::BF16, 0.0, 1.0, {},
                 {{"capacity", 10}, {"keep_last", 2}, {"budget", 4}});
  // Odd shapes and the other KV dtypes.
  compareWithCpu("h2o_evict", {3, 5, 64, {517, 17, 260}, 18}, DType::F16, 0.0,
                 1.0, {}, {{"capacity", 6}, {"keep_last", 2}, {"budget", 3}});
  compareWithCpu("streaming_llm", {2, 4, 128, {600, 250}, 17}, DType::FP8E4M3,
                 0.0, 1.0, {}, {{"keep_last", 2}});
  compareWithCpu("h2o_evict", {2, 4, 128, {600, 250}, 17}, DType::INT8, 0.0,
                 1.0, {}, {{"capacity", 8}, {"keep_last", 2}, {"budget", 4}});
}

/// `first_token` on the GPU (VflowGpuArgs::firstToken, uploaded with the
/// block tables): a retain block and a selection that read it keep and
/// select what the CPU session does as the sequences evict, step by step.
TEST(Retain, FirstTokenAsTheCpu) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  compareWithCpu("age_evict", {2, 4, 128, {700, 333, 40}, 20}, DType::BF16,
                 0.0);
}

/// Steps replayed from a CUDA graph evict what the same steps run eagerly
/// evict (the retain kernel and the fold are in the graph; the cut runs at
/// endStep).
TEST(Retain, GraphReplayEvictsAsEager) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  Artifact artifact = loadArtifact(artifactPath("h2o_evict"));
  std::mt19937 rng(11);
  SessionPair pair(artifact.flows.at(0), {700, 333, 100}, rng);
  for (Session *s : {pair.eager.get(), pair.graphed.get()}) {
    s->setParam("capacity", 9);
    s->setParam("keep_last", 3);
    s->setParam("budget", 4);
  }
  for (int step = 0; step < 24; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    pair.stepBoth(rng, nullptr);
    for (size_t i = 0; i < pair.a.size(); ++i) {
      EXPECT_EQ(pair.eager->length(pair.a[i]), pair.graphed->length(pair.b[i]));
      EXPECT_EQ(pair.eager->position(pair.a[i]),
                pair.graphed->position(pair.b[i]));
      const int64_t blocks = (pair.eager->length(pair.a[i]) + 15) / 16;
      for (int64_t blk = 0; blk < blocks; ++blk)
        EXPECT_EQ(pair.eager->originalBlock(pair.a[i], blk),
                  pair.graphed->originalBlock(pair.b[i], blk));
    }
  }
  const SessionStats e = pair.eager->stats(), g = pair.graphed->stats();
  // 700 tokens: 43 complete blocks down to 9 at the first step, then one
  // more at tokens 704 and 720; 333: 20 down to 9, then at 336 and 352;
  // 100 never passes 9.
  EXPECT_EQ(e.blocksEvicted, (34 + 2) + (11 + 2));
  EXPECT_EQ(e.blocksEvicted, g.blocksEvicted);
  EXPECT_EQ(e.pagesReclaimed, g.pagesReclaimed);
  EXPECT_EQ(pair.eager->length(pair.a[0]), 9 * 16 + (700 + 24) % 16);
  EXPECT_EQ(pair.eager->position(pair.a[0]), 700 + 24);
}

/// Session::evict on the GPU: a flow's per-block state (running_avg's avg)
/// follows the kept blocks as on the CPU, so the selections after it agree;
/// the pages return to the pool; a bad list changes nothing.
TEST(Retain, EvictMovesStatesWithTheBlocks) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  Artifact artifact = loadArtifact(artifactPath("running_avg"));
  const FlowArtifact &flow = artifact.flows.at(0);
  const int H = 2, G = 4, D = 128;
  SessionConfig cfg =
      sessionConfig(1, H, G, D, 256, ::testing::TempDir() + "/vflow-gpu-jit");
  std::unique_ptr<Session> cpu = openSession(flow, cfg);
  cfg.device = Device::Cuda;
  cfg.maxSequences = cfg.maxBatch = 4;
  std::unique_ptr<Session> gpu = openSession(flow, cfg);
  for (Session *s : {cpu.get(), gpu.get()})
    s->setParam("budget", 6);
  std::mt19937 rng(5);
  const SeqId c = cpu->addSequence(), g = gpu->addSequence();
  const int64_t n = 300;
  auto k = randomBF16(rng, size_t(n) * H * D, 1.0f);
  auto v = randomBF16(rng, size_t(n) * H * D, 1.0f);
  cpu->append(c, n, k.data(), v.data());
  gpu->append(g, n, k.data(), v.data());
  auto stepOf = [&](const char *when, SeqId c, SeqId g) {
    SCOPED_TRACE(when);
    auto kn = randomBF16(rng, size_t(H) * D, 1.0f);
    auto vn = randomBF16(rng, size_t(H) * D, 1.0f);
    auto q = randomBF16(rng, size_t(H) * G * D, 1.0f);
    std::vector<float> want(q.size()), got(q.size());
    cpu->append(c, 1, kn.data(), vn.data());
    gpu->append(g, 1, kn.data(), vn.data());
    cpu->decode(0, {c}, q.data(), want.data());
    gpu->decode(0, {g}, q.data(), got.data());
    EXPECT_EQ(cpu->selection(0), gpu->selection(0));
    EXPECT_LT(relativeError(got, want), 1.5e-2);
  };
  auto step = [&](const char *when) { stepOf(when, c, g); };
  for (int i = 0; i < 3; ++i)
    step("before");
  const int64_t freeBefore = gpu->freePages();
  for (Session *s : {cpu.get(), gpu.get()}) {
    const SeqId seq = s == cpu.get() ? c : g;
    // Not increasing, past the complete blocks, an unknown sequence: each
    // an Error that changes nothing.
    EXPECT_THROW(s->evict(seq, {4, 2}), Error);
    EXPECT_THROW(s->evict(seq, {1, 18}), Error);
    EXPECT_THROW(s->evict(seq + 100, {1}), Error);
    EXPECT_EQ(s->length(seq), n + 3);
    s->evict(seq, {1, 4, 5, 9, 16});
    EXPECT_EQ(s->length(seq), n + 3 - 5 * 16);
    EXPECT_EQ(s->position(seq), n + 3);
    EXPECT_EQ(s->originalBlock(seq, 4), 7);
  }
  EXPECT_EQ(gpu->freePages(), freeBefore + 5);
  for (int i = 0; i < 20; ++i)
    step("after");
  // Token grain: the same tokens out of both (compaction on the GPU: the
  // moved K/V, the fields of the rewritten blocks, their state rows start
  // over), then the same selections.
  const std::vector<int64_t> tokens = {17, 18, 40, 41, 42, 100, 101, 150};
  const int64_t gpuPages = gpu->freePages(), cpuPages = cpu->freePages();
  for (Session *s : {cpu.get(), gpu.get()}) {
    const SeqId seq = s == cpu.get() ? c : g;
    const int64_t length = s->length(seq);
    EXPECT_THROW(s->evictTokens(seq, {41, 40}), Error);
    EXPECT_EQ(s->length(seq), length);
    s->evictTokens(seq, tokens);
    EXPECT_EQ(s->length(seq), length - int64_t(tokens.size()));
  }
  EXPECT_EQ(gpu->freePages() - gpuPages, cpu->freePages() - cpuPages);
  for (int64_t t : {0, 16, 17, 38, 97, 140})
    EXPECT_EQ(cpu->originalPosition(c, t), gpu->originalPosition(g, t)) << t;
  for (int i = 0; i < 20; ++i)
    step("after compaction");
  // A fork shares every page; compacting the fork copies what it rewrites
  // (copy on write): the parent decodes as before, on both.
  const SeqId cf = cpu->fork(c), gf = gpu->fork(g);
  const int64_t parentLength = gpu->length(g);
  for (Session *s : {cpu.get(), gpu.get()})
    s->evictTokens(s == cpu.get() ? cf : gf, {3, 20, 21, 64});
  EXPECT_EQ(gpu->length(g), parentLength);
  EXPECT_EQ(gpu->length(gf), parentLength - 4);
  for (int i = 0; i < 5; ++i) {
    stepOf("parent after the fork's compaction", c, g);
    stepOf("fork after its compaction", cf, gf);
  }
  // Inside a step, evict and evictTokens are refused.
  gpu->beginStep({g}, 0, nullptr);
  EXPECT_THROW(gpu->evict(g, {2}), Error);
  EXPECT_THROW(gpu->evictTokens(g, {2}), Error);
  gpu->endStep();
}

/// A [block, token] retain score on the GPU (its retain kernel writes P
/// scores a block, folded as the CPU folds them, cut by the same rule):
/// the sequences compact at every step past the capacity and keep what the
/// CPU session keeps, in bf16 and int8.
TEST(Retain, TokenGrainCompactsAsTheCpu) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  // Tokens go and pages come back (the CPU's counts are the same: checked
  // inside), so the comparison ran over compacted sequences.
  SessionStats bf16, int8;
  compareWithCpu("token_evict", {2, 4, 128, {700, 333, 40}, 20}, DType::BF16,
                 0.0, 1.0, {}, {{"capacity", 120}}, &bf16);
  compareWithCpu("token_evict", {2, 4, 128, {600, 250}, 17}, DType::INT8, 0.0,
                 1.0, {}, {{"capacity", 200}, {"keep_last", 2}}, &int8);
  for (const SessionStats &s : {bf16, int8}) {
    EXPECT_GT(s.tokensEvicted, 0);
    EXPECT_GT(s.pagesReclaimed, 0);
  }
}

} // namespace
