//===- GpuFlowTesting.cpp - What the GPU flow tests share -----------------===//

#include "GpuFlowTesting.h"

#include "../../common/Configs.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/cuda/Driver.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iterator>

using namespace vflow;
using namespace vflow::rt;
using vflow::testing::sessionConfig;

namespace vflow::gputest {

std::string artifactDir() {
  const char *dir = std::getenv("VFLOW_GPU_ARTIFACTS");
  return dir ? dir : "gpu-artifacts";
}

std::string artifactPath(const std::string &name) {
  return artifactDir() + "/" + name + ".vfa";
}

bool haveGpu() {
  std::string why;
  if (cuda::gpuAvailable(&why))
    return true;
  std::printf("no GPU: %s\n", why.c_str());
  return false;
}

/// Values on the `grid` dtype's grid (bf16: what both sides are given).
std::vector<float> randomBF16(std::mt19937 &rng, size_t n, float scale,
                              DType grid) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(n);
  for (float &x : out)
    x = roundToDType(grid, dist(rng));
  return out;
}

std::vector<uint16_t> toBF16(const std::vector<float> &x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = floatToBF16(x[i]);
  return out;
}

double relativeError(const std::vector<float> &got,
                     const std::vector<float> &want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]))
      return INFINITY;
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

/// Whether `seq` of `a` and `other` of `b` hold the same tokens after the
/// retain blocks evicted: the same length and position (else a test
/// failure) and the same blocks by original index.
bool sameKeptBlocks(const Session &a, SeqId seq, const Session &b,
                    SeqId other) {
  EXPECT_EQ(a.length(seq), b.length(other));
  EXPECT_EQ(a.position(seq), b.position(other));
  if (a.length(seq) != b.length(other))
    return false;
  const int64_t P = a.flow().blockSize;
  for (int64_t blk = 0; blk < (a.length(seq) + P - 1) / P; ++blk)
    if (a.originalBlock(seq, blk) != b.originalBlock(other, blk))
      return false;
  return true;
}

void compareWithCpu(const std::string &name, const Shape &shape, DType kvDType,
                    double maxListMismatch, double minRecall,
                    const GpuLaunchOptions &launch,
                    const std::map<std::string, double> &params,
                    SessionStats *gpuStats) {
  SCOPED_TRACE(name + " G=" + std::to_string(shape.group) + " D=" +
               std::to_string(shape.headDim) + " " + dtypeName(kvDType));
  Artifact artifact = loadArtifact(
      name.find('/') == std::string::npos ? artifactPath(name) : name);
  const FlowArtifact &flow = artifact.flows.at(0);
  const int layers = 2, H = shape.kvHeads, G = shape.group, D = shape.headDim;
  const int B = int(shape.lengths.size());
  std::string cache = ::testing::TempDir() + "/vflow-gpu-flow-jit";
  // Pools for every sequence's prefill and decode steps.
  const int64_t P = flow.blockSize;
  int64_t pages = 64, longest = 0;
  for (int64_t len : shape.lengths) {
    int64_t blocks = (len + shape.steps + P - 1) / P;
    pages += blocks;
    longest = std::max(longest, blocks);
  }
  if (std::count(flow.indexInputs.begin(), flow.indexInputs.end(), "mass"))
    maxListMismatch = std::max(maxListMismatch, longest > 4096 ? 0.25 : 0.05);

  SessionConfig ccfg = sessionConfig(layers, H, G, D, pages, cache);
  // A tensor-parallel slice: the inputs kv_head (and layer) are the
  // model's indices, the same on both backends.
  ccfg.firstKVHead = 3;
  // Both store the same dtype: 8-bit rows by NumericRules' scaled rule
  // from the same bf16 values, so they hold the same codes and scales.
  const DType kvGrid = DType::BF16;
  ccfg.kvDType = kvDType;
  std::unique_ptr<Session> cpu = openSession(flow, ccfg);
  SessionConfig gcfg = ccfg;
  gcfg.device = Device::Cuda;
  gcfg.kvDType = kvDType;
  gcfg.launch = launch;
  gcfg.maxSequences = gcfg.maxBatch = 8;
  gcfg.maxBlocksPerSeq = longest + 1;
  std::unique_ptr<Session> gpu = openSession(flow, gcfg);
  for (const auto &[param, value] : params) {
    cpu->setParam(param, value);
    gpu->setParam(param, value);
  }
  auto device = [](void *p) { return Tensor{p, DType::BF16, Device::Cuda}; };

  std::mt19937 rng(1234 + G * 7 + D);
  std::vector<SeqId> cpuSeqs, gpuSeqs;
  for (int64_t len : shape.lengths) {
    cpuSeqs.push_back(cpu->addSequence());
    gpuSeqs.push_back(gpu->addSequence());
    auto k = randomBF16(rng, size_t(len) * layers * H * D, 1.0f, kvGrid);
    auto v = randomBF16(rng, size_t(len) * layers * H * D, 1.0f, kvGrid);
    cpu->append(cpuSeqs.back(), len, k.data(), v.data());
    gpu->append(gpuSeqs.back(), len, k.data(), v.data());
  }
  const size_t qSize = size_t(B) * H * G * D, kvSize = size_t(B) * H * D;
  DeviceBuffer dq(qSize * 2), dout(qSize * 2), dk(kvSize * 2), dv(kvSize * 2);
  int lists = 0, mismatched = 0;
  double worstRecall = 1.0;
  for (int step = 0; step < shape.steps; ++step) {
    // The new token of every sequence, all layers: [layers, H, D] each.
    std::vector<std::vector<float>> kNew(B), vNew(B);
    for (int b = 0; b < B; ++b) {
      kNew[b] = randomBF16(rng, size_t(layers) * H * D, 1.0f, kvGrid);
      vNew[b] = randomBF16(rng, size_t(layers) * H * D, 1.0f, kvGrid);
      cpu->append(cpuSeqs[b], 1, kNew[b].data(), vNew[b].data());
    }
    // The GPU: device tensors, layer by layer (the token held by append is
    // written by the decode's fused append).
    for (int l = 0; l < layers; ++l) {
      auto q = randomBF16(rng, qSize, 1.0f);
      std::vector<float> kl(kvSize), vl(kvSize);
      for (int b = 0; b < B; ++b)
        for (int e = 0; e < H * D; ++e) {
          kl[b * H * D + e] = kNew[b][l * H * D + e];
          vl[b * H * D + e] = vNew[b][l * H * D + e];
        }
      auto qb = toBF16(q), kb = toBF16(kl), vb = toBF16(vl);
      CUDA_OK(cudaMemcpy(dq.ptr, qb.data(), qSize * 2, cudaMemcpyHostToDevice));
      CUDA_OK(
          cudaMemcpy(dk.ptr, kb.data(), kvSize * 2, cudaMemcpyHostToDevice));
      CUDA_OK(
          cudaMemcpy(dv.ptr, vb.data(), kvSize * 2, cudaMemcpyHostToDevice));
      // Poison the output: every element must be written.
      CUDA_OK(cudaMemset(dout.ptr, 0xFF, qSize * 2));
      CUDA_OK(cudaDeviceSynchronize());
      gpu->append(l, gpuSeqs, std::vector<int64_t>(size_t(B), 1),
                  device(dk.ptr), device(dv.ptr));
      gpu->decode(l, gpuSeqs, device(dq.ptr), device(dout.ptr));
      std::vector<BlockLists> gotBlocks = gpu->selection(l); // waits

      std::vector<float> want(qSize);
      cpu->decode(l, cpuSeqs, q.data(), want.data());
      std::vector<BlockLists> wantBlocks = cpu->selection(l);
      std::vector<uint16_t> gotBits(qSize);
      CUDA_OK(cudaMemcpy(gotBits.data(), dout.ptr, qSize * 2,
                         cudaMemcpyDeviceToHost));
      std::vector<float> got(qSize);
      for (size_t i = 0; i < qSize; ++i)
        got[i] = bf16ToFloat(gotBits[i]);

      bool allSame = true;
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h) {
          ++lists;
          const std::vector<int64_t> &g = gotBlocks[b][h],
                                     &w = wantBlocks[b][h];
          if (g == w)
            continue;
          ++mismatched;
          allSame = false;
          if (minRecall < 1.0) {
            EXPECT_EQ(g.size(), w.size()) << "step " << step << " layer " << l
                                          << " seq " << b << " head " << h;
            std::vector<int64_t> common;
            std::set_intersection(g.begin(), g.end(), w.begin(), w.end(),
                                  std::back_inserter(common));
            double recall =
                double(common.size()) / std::max<size_t>(1, w.size());
            worstRecall = std::min(worstRecall, recall);
            EXPECT_GE(recall, minRecall) << "step " << step << " layer " << l
                                         << " seq " << b << " head " << h;
          }
        }
      // Outputs agree within bf16 rounding where the selections agree.
      if (allSame) {
        double err = relativeError(got, want);
        EXPECT_LT(err, 1.5e-2) << "step " << step << " layer " << l;
      }
    }
    if (flow.retains())
      for (int b = 0; b < B; ++b) {
        ++lists;
        if (!sameKeptBlocks(*cpu, cpuSeqs[b], *gpu, gpuSeqs[b]))
          ++mismatched;
      }
  }
  if (flow.retains()) {
    const SessionStats cs = cpu->stats(), gs = gpu->stats();
    std::printf("%-15s evicted %lld blocks and %lld tokens on the CPU, %lld "
                "and %lld on the GPU; %lld pages reclaimed on the GPU\n",
                name.c_str(), (long long)cs.blocksEvicted,
                (long long)cs.tokensEvicted, (long long)gs.blocksEvicted,
                (long long)gs.tokensEvicted, (long long)gs.pagesReclaimed);
    EXPECT_EQ(cs.blocksEvicted, gs.blocksEvicted);
    EXPECT_EQ(cs.tokensEvicted, gs.tokensEvicted);
    EXPECT_EQ(cs.pagesReclaimed, gs.pagesReclaimed);
  }
  double share = double(mismatched) / std::max(1, lists);
  std::printf("%-15s G=%d D=%d %s longest %lld: %d of %d block lists "
              "differ",
              name.c_str(), G, D, dtypeName(kvDType), (long long)longest * P,
              mismatched, lists);
  if (minRecall < 1.0)
    std::printf(" (worst recall %.3f)", worstRecall);
  std::printf("\n");
  EXPECT_LE(share, maxListMismatch);
  if (gpuStats)
    *gpuStats = gpu->stats();
}

/// A parameterized test's name: its flow's (the parameter).
std::string flowName(const ::testing::TestParamInfo<const char *> &info) {
  return info.param;
}

/// A device bf16 tensor.
Tensor device(void *p) { return Tensor{p, DType::BF16, Device::Cuda}; }

/// The config of SessionPair's sessions: one layer, H = 2 KV heads, G = 4,
/// D = 128, up to 4 rows of up to 256 blocks, graph-safe, no telemetry
/// (the selection read is the last decode's).
SessionConfig pairConfig() {
  SessionConfig cfg = sessionConfig(
      1, 2, 4, 128, 2048, ::testing::TempDir() + "/vflow-gpu-flow-jit");
  cfg.device = Device::Cuda;
  cfg.maxSequences = cfg.maxBatch = 4;
  cfg.maxBlocksPerSeq = 256;
  cfg.graphSafe = true;
  cfg.telemetry = false;
  return cfg;
}

} // namespace vflow::gputest
