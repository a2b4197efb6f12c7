//===- Evaluate.cpp - Run flows on a synthetic long-context workload ------===//
//
// The workload is described in docs/workload.md; keep the two in step.
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/Evaluate.h"
#include "vflow/Compiler/Artifact.h"
#include "vflow/Compiler/StorageDType.h"
#include "vflow/Runtime/Attention.h"
#include "vflow/Runtime/PagedKVCache.h"
#include "vflow/Runtime/Random.h"
#include "vflow/Runtime/Session.h"

#include "mlir/IR/BuiltinTypes.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <set>
#include <stdexcept>
#include <tuple>

using namespace vflow;
using namespace vflow::eval;

std::string WorkloadSpec::validate() const {
  if (lengths.empty())
    return "the workload needs at least one sequence";
  for (int64_t l : lengths)
    if (l < 1 || l > (int64_t(1) << 20))
      return "sequence lengths must be between 1 and 1048576 tokens";
  if (numKVHeads < 1 || numKVHeads > 64)
    return "--kv-heads must be between 1 and 64";
  if (group < 1 || group > 64)
    return "--group must be between 1 and 64";
  if (headDim < 2 || headDim > 512 || headDim % 2 != 0)
    return "--head-dim must be even and between 2 and 512";
  if (seeds < 1 || seeds > 64)
    return "--seeds must be between 1 and 64";
  if (steps < 1 || steps > 1024)
    return "--steps must be between 1 and 1024";
  if (needles < 0 || needles > 64)
    return "--needles must be between 0 and 64";
  if (!(headSpread >= 0 && headSpread <= 10))
    return "--head-spread must be between 0 and 10";
  if (!(distractors >= 0 && distractors <= 0.9))
    return "--distractors must be a share between 0 and 0.9";
  if (!(outlier >= 0 && outlier <= 100))
    return "--outlier must be between 0 and 100";
  if (!(maxMemoryGiB > 0 && maxMemoryGiB <= 1 << 20))
    return "--max-memory must be a positive number of GiB";
  if (!(maxWork > 0 && maxWork <= 1e9))
    return "--max-work must be a positive number (billions of operations)";
  return "";
}

namespace {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

/// Standard normal values from the workload's generator.
class Normal {
public:
  explicit Normal(uint64_t seed) : rng(seed) {}
  float next() {
    if (haveSpare) {
      haveSpare = false;
      return spare;
    }
    double u1 = rng.uniform(), u2 = rng.uniform();
    double r = std::sqrt(-2.0 * std::log(1.0 - u1));
    spare = static_cast<float>(r * std::sin(6.283185307179586 * u2));
    haveSpare = true;
    return static_cast<float>(r * std::cos(6.283185307179586 * u2));
  }
  rt::SplitMix64 &raw() { return rng; }

private:
  rt::SplitMix64 rng;
  float spare = 0;
  bool haveSpare = false;
};

/// RoPE: rotates channel pair (2p, 2p+1) by pos * 10000^(-2p/D).
void rotate(float *x, int d, double pos) {
  for (int p = 0; p < d / 2; ++p) {
    double theta = pos * std::pow(10000.0, -2.0 * p / d);
    double c = std::cos(theta), s = std::sin(theta);
    double a = x[2 * p], b = x[2 * p + 1];
    x[2 * p] = static_cast<float>(a * c - b * s);
    x[2 * p + 1] = static_cast<float>(a * s + b * c);
  }
}

/// One sequence of the workload, one layer: post-RoPE keys and queries.
struct SequenceData {
  int64_t promptLength = 0;
  /// [tokens, kvHeads, D] for prompt + decode tokens.
  std::vector<float> keys, values;
  /// Per decode step: [kvHeads * group, D].
  std::vector<std::vector<float>> queries;
  /// The query of the prompt's last token ([kvHeads * group, D]): its
  /// attention is the mass the first decode step reads (what prefill
  /// leaves behind), not the first step's own attention.
  std::vector<float> observation;
  /// Per KV head: the first token of each needle span.
  std::vector<std::vector<int64_t>> needles;
};

constexpr int kNeedleSpan = 16;

/// The directions of one sequence's KV heads.
struct Directions {
  /// [kvHeads][D]: a content direction on the slow half of the RoPE pairs
  /// (norm sqrt(D)), and key outliers on 4 channels.
  std::vector<std::vector<float>> content, outlier;
  /// [kvHeads][group][D]: where each query head looks.
  std::vector<std::vector<std::vector<float>>> head;
};

Directions drawDirections(const WorkloadSpec &spec, Normal &rng) {
  const int d = spec.headDim, h = spec.numKVHeads, g = spec.group;
  Directions dir;
  dir.content.assign(h, std::vector<float>(d, 0.0f));
  dir.outlier.assign(h, std::vector<float>(d, 0.0f));
  for (int kh = 0; kh < h; ++kh) {
    std::vector<float> &content = dir.content[kh];
    double norm = 0;
    for (int c = d / 2; c < d; ++c) {
      content[c] = rng.next();
      norm += double(content[c]) * content[c];
    }
    for (int c = d / 2; c < d; ++c)
      content[c] *= static_cast<float>(std::sqrt(d / norm));
    for (int k = 0; k < 4; ++k)
      dir.outlier[kh][(rng.raw().next() % (d / 2)) * 2] =
          static_cast<float>((rng.raw().next() & 1 ? 1 : -1) * spec.outlier);
  }
  // Query heads that disagree: head j of a group looks along
  // u_j = u + spread * w_j (w_j Gaussian on the slow half), rescaled to
  // norm sqrt(D); needle n is tuned to head n % group.
  dir.head.assign(h, std::vector<std::vector<float>>(g));
  for (int kh = 0; kh < h; ++kh)
    for (int j = 0; j < g; ++j) {
      std::vector<float> &u = dir.head[kh][j];
      u = dir.content[kh];
      if (spec.headSpread <= 0)
        continue; // no draws: the workload of earlier records
      double norm = 0;
      for (int c = d / 2; c < d; ++c) {
        u[c] += static_cast<float>(spec.headSpread) * rng.next();
        norm += double(u[c]) * u[c];
      }
      for (int c = d / 2; c < d; ++c)
        u[c] *= static_cast<float>(std::sqrt(d / norm));
    }
  return dir;
}

/// Places the needle spans (into seq.needles) and the distractor spans of
/// every KV head; returns the distractors' tokens per KV head.
std::vector<std::set<int64_t>> placeSpans(const WorkloadSpec &spec, Normal &rng,
                                          SequenceData &seq) {
  const int h = spec.numKVHeads;
  // Needle spans: 16-aligned, away from the sinks and the last blocks.
  seq.needles.assign(h, {});
  int64_t lo = 64, hi = seq.promptLength - 3 * 128;
  for (int kh = 0; kh < h; ++kh)
    for (int n = 0; n < spec.needles && hi > lo + kNeedleSpan; ++n) {
      int64_t start = lo + int64_t(rng.raw().next() % uint64_t(hi - lo));
      seq.needles[kh].push_back(start / kNeedleSpan * kNeedleSpan);
    }
  // Distractor spans: 16-aligned, in the same range, off the needles.
  std::vector<std::set<int64_t>> distractorTokens(h);
  for (int kh = 0; kh < h; ++kh) {
    std::set<int64_t> taken;
    for (int64_t start : seq.needles[kh])
      taken.insert(start);
    const int64_t spans =
        hi > lo ? int64_t(spec.distractors * double(hi - lo) / kNeedleSpan) : 0;
    for (int64_t n = 0; n < spans && hi > lo + kNeedleSpan; ++n) {
      int64_t start = (lo + int64_t(rng.raw().next() % uint64_t(hi - lo))) /
                      kNeedleSpan * kNeedleSpan;
      if (!taken.insert(start).second)
        continue;
      for (int64_t t = start; t < start + kNeedleSpan; ++t)
        distractorTokens[kh].insert(t);
    }
  }
  return distractorTokens;
}

/// The keys and values of every token (prompt and decode) of `seq`.
void drawKeysAndValues(const WorkloadSpec &spec, Normal &rng,
                       const Directions &dir,
                       const std::vector<std::set<int64_t>> &distractorTokens,
                       SequenceData &seq) {
  const int d = spec.headDim, h = spec.numKVHeads, g = spec.group;
  const int64_t total = seq.promptLength + spec.steps;
  // The query position the needles are tuned to: the first decode step.
  const double m0 = double(seq.promptLength);
  seq.keys.assign(total * h * d, 0.0f);
  seq.values.assign(total * h * d, 0.0f);
  std::vector<float> tmp(d), tuned(d);
  for (int kh = 0; kh < h; ++kh) {
    tuned = dir.content[kh];
    rotate(tuned.data(), d, m0);
    // Each needle token's query head (n % group), rotated to m0.
    std::map<int64_t, int> needleTokens;
    for (size_t n = 0; n < seq.needles[kh].size(); ++n)
      for (int64_t t = seq.needles[kh][n]; t < seq.needles[kh][n] + kNeedleSpan;
           ++t)
        needleTokens[t] = int(n) % g;
    std::vector<std::vector<float>> tunedHead(g);
    for (int j = 0; j < g; ++j) {
      tunedHead[j] = dir.head[kh][j];
      rotate(tunedHead[j].data(), d, m0);
    }
    for (int64_t t = 0; t < total; ++t) {
      for (int c = 0; c < d; ++c)
        tmp[c] = dir.outlier[kh][c] + rng.next();
      if (t < spec.sinkTokens)
        for (int c = 0; c < d; ++c)
          tmp[c] += 0.5f * dir.content[kh][c];
      rotate(tmp.data(), d, double(t));
      if (auto it = needleTokens.find(t); it != needleTokens.end())
        for (int c = 0; c < d; ++c)
          tmp[c] += static_cast<float>(spec.needleStrength) *
                    tunedHead[it->second][c];
      if (distractorTokens[kh].count(t))
        for (int c = 0; c < d; ++c)
          tmp[c] += static_cast<float>(spec.needleStrength *
                                       spec.distractorStrength) *
                    std::fabs(tuned[c]) * (rng.raw().next() & 1 ? 1.0f : -1.0f);
      float *k = &seq.keys[(t * h + kh) * d];
      float *v = &seq.values[(t * h + kh) * d];
      for (int c = 0; c < d; ++c) {
        k[c] = tmp[c];
        v[c] = rng.next();
      }
    }
  }
}

/// A query of `seq` at `position`: each head's direction with noise.
std::vector<float> drawQuery(const WorkloadSpec &spec, Normal &rng,
                             const Directions &dir, int64_t position) {
  const int d = spec.headDim, h = spec.numKVHeads, g = spec.group;
  std::vector<float> q(h * g * d);
  for (int kh = 0; kh < h; ++kh)
    for (int j = 0; j < g; ++j) {
      float *qh = &q[(kh * g + j) * d];
      for (int c = 0; c < d; ++c)
        qh[c] =
            dir.head[kh][j][c] + 0.3f * rng.next() + 0.05f * dir.outlier[kh][c];
      rotate(qh, d, double(position));
    }
  return q;
}

/// The queries of every decode step of `seq`.
void drawQueries(const WorkloadSpec &spec, Normal &rng, const Directions &dir,
                 SequenceData &seq) {
  for (int step = 0; step < spec.steps; ++step)
    seq.queries.push_back(drawQuery(spec, rng, dir, seq.promptLength + step));
}

/// Every sequence of the workload; each draws from its own generator, in
/// the order of the functions above.
std::vector<SequenceData> makeWorkload(const WorkloadSpec &spec) {
  std::vector<SequenceData> out;
  for (size_t s = 0; s < spec.lengths.size(); ++s) {
    Normal rng(spec.seed * 0x9e3779b97f4a7c15ull + s);
    SequenceData seq;
    seq.promptLength = spec.lengths[s];
    Directions dir = drawDirections(spec, rng);
    std::vector<std::set<int64_t>> distractorTokens =
        placeSpans(spec, rng, seq);
    drawKeysAndValues(spec, rng, dir, distractorTokens, seq);
    drawQueries(spec, rng, dir, seq);
    // The prompt's last query from a generator of its own, so that the
    // rest of the workload is drawn as before it existed.
    Normal observe((spec.seed * 0x9e3779b97f4a7c15ull + s) ^
                   0x0b5e7a7e0b5e7a7eull);
    seq.observation = drawQuery(spec, observe, dir, seq.promptLength - 1);
    out.push_back(std::move(seq));
  }
  return out;
}

int64_t resolved(int64_t size, int64_t headDim, int64_t group) {
  return size == vt::kSizeHeadDim ? headDim
         : size == vt::kSizeGroup ? group
                                  : size;
}

/// Accumulates metrics over (sequence, KV head, query head, step).
struct MetricSum {
  double recall = 0, relError = 0, maxRelError = 0;
  int64_t count = 0, needles = 0, needlesHit = 0;
  Metrics finish() const {
    Metrics m;
    m.recall = count ? recall / count : 0;
    m.relError = count ? relError / count : 0;
    m.maxRelError = maxRelError;
    m.needleHit = needles ? double(needlesHit) / needles : 1.0;
    return m;
  }
};

void score(const rt::BlockLists &blocks, const std::vector<float> &denseMass,
           const std::vector<float> &denseOut,
           const std::vector<float> &sparseOut, const SequenceData &seq,
           int64_t numBlocks, int64_t blockSize, const WorkloadSpec &spec,
           MetricSum &sum) {
  const int g = spec.group, d = spec.headDim;
  for (int kh = 0; kh < spec.numKVHeads; ++kh) {
    std::set<int64_t> attended(blocks[kh].begin(), blocks[kh].end());
    for (int j = 0; j < g; ++j) {
      double recall = 0;
      for (int64_t b : attended)
        recall += denseMass[(kh * numBlocks + b) * g + j];
      int qh = kh * g + j;
      double err = 0, ref = 0;
      for (int c = 0; c < d; ++c) {
        double diff = sparseOut[qh * d + c] - denseOut[qh * d + c];
        err += diff * diff;
        ref += double(denseOut[qh * d + c]) * denseOut[qh * d + c];
      }
      double rel = ref > 0 ? std::sqrt(err / ref) : 0;
      sum.recall += recall;
      sum.relError += rel;
      sum.maxRelError = std::max(sum.maxRelError, rel);
      ++sum.count;
    }
    for (int64_t start : seq.needles[kh]) {
      ++sum.needles;
      sum.needlesHit += attended.count(start / blockSize);
    }
  }
}

/// Elements of a value of `type` with N blocks; 1 for selections and
/// scalars of other types.
double elementsOf(mlir::Type type, double numBlocks, const WorkloadSpec &spec) {
  auto tensor = type.dyn_cast<vt::TensorType>();
  if (!tensor)
    return type.isa<vt::SelectionType>() ? numBlocks : 1;
  double n = 1;
  for (vt::AxisAttr a : tensor.getAxes())
    n *= a.getSize() == vt::kSizeBlocks
             ? numBlocks
             : double(resolved(a.getSize(), spec.headDim, spec.group));
  return n;
}

/// The element operations and the bytes of the values of one run of a
/// stage's ops (nested kernels included) with N blocks.
void stageCost(mlir::Operation *stage, double numBlocks,
               const WorkloadSpec &spec, double &work, double &bytes) {
  if (!stage)
    return;
  stage->walk([&](mlir::Operation *op) {
    if (op == stage || llvm::isa<vt::KernelOp>(op))
      return;
    double largest = 0;
    for (mlir::Value v : op->getOperands())
      largest = std::max(largest, elementsOf(v.getType(), numBlocks, spec));
    for (mlir::Value v : op->getResults()) {
      double n = elementsOf(v.getType(), numBlocks, spec);
      largest = std::max(largest, n);
      bytes += 4 * n;
    }
    // Selections sort their scores: count a few passes.
    bool selects = llvm::isa<vt::TopKOp, vt::ApproxTopKOp, vt::ThresholdOp,
                             vt::TopPOp, vt::KthLargestOp>(op);
    work += (selects ? 8 : 1) * largest;
  });
}

} // namespace

RunCost vflow::eval::estimateRunCost(vt::FlowOp flow,
                                     const WorkloadSpec &spec) {
  RunCost cost;
  const double h = spec.numKVHeads, g = spec.group, d = spec.headDim;
  double blockSize = 16;
  for (auto param : flow.getBody()->getOps<vt::ParamOp>())
    if (param.getSymName() == "block_size")
      if (auto i = param.getValue().dyn_cast<mlir::IntegerAttr>())
        blockSize = double(std::max<int64_t>(1, i.getInt()));
  double fieldElements = 0, perBlockState = 0, fixedState = 0;
  for (auto field : flow.getBody()->getOps<vt::CacheFieldOp>())
    fieldElements += elementsOf(field.getTensorType(), 1, spec);
  for (auto state : flow.getBody()->getOps<vt::StateOp>()) {
    bool perBlock = state.getTensorType().hasAxis("block");
    (perBlock ? perBlockState : fixedState) +=
        elementsOf(state.getTensorType(), 1, spec);
  }
  double cacheWork = 0, cacheBytes = 0;
  stageCost(flow.getCacheStage(), 1, spec, cacheWork, cacheBytes);
  for (int64_t prompt : spec.lengths) {
    double tokens = double(prompt) + spec.steps;
    double blocks = std::ceil(tokens / blockSize);
    // Keys, values and queries in f32; the paged cache in bf16 with f32
    // fields; states in both executors' copies.
    cost.workloadBytes +=
        tokens * h * d * 4 * 2 + double(spec.steps) * h * g * d * 4;
    // The session's cache and the reference's, K and V in bf16.
    cost.cacheBytes +=
        2 * blocks * blockSize * h * d * 2 * 2 + blocks * h * fieldElements * 4;
    cost.stateBytes += 2 * h * (blocks * perBlockState + fixedState) * 4;
    // Generating keys and values: a rotation of every pair per token.
    cost.work += tokens * h * d * 16;
    cost.work += blocks * h * cacheWork;
    for (int step = 0; step < spec.steps; ++step) {
      double context = double(prompt) + step + 1;
      double complete = std::floor(context / blockSize);
      double indexWork = 0, indexBytes = 0;
      stageCost(flow.getIndexStage(), complete, spec, indexWork, indexBytes);
      cost.work += h * indexWork;
      // Dense, sparse and random attention, scores and outputs.
      cost.work += 3 * context * h * g * d * 2;
      // One (sequence, KV head) at a time: its values, its gathered fields,
      // K and V when the index stage reads them, the mass.
      double gathered = complete * (fieldElements + blockSize * d * 2 + g);
      cost.stepBytes =
          std::max(cost.stepBytes, indexBytes + cacheBytes + 4 * gathered +
                                       h * complete * g * 8);
    }
  }
  return cost;
}

namespace {

/// One seed's run of a flow (report.seeds = 1, no standard errors). The
/// flow runs in a session of the chosen backend, through the one session
/// API; the reference (dense attention, the random and oracle baselines)
/// runs on a host cache of the same K/V in the same storage dtype.
class SeedRun {
public:
  SeedRun(const rt::FlowArtifact &artifact, const WorkloadSpec &spec)
      : spec(spec), p(artifact.blockSize), d(spec.headDim), h(spec.numKVHeads),
        g(spec.group), scale(1.0f / std::sqrt(float(d))),
        rowQ(size_t(h) * g * d), data(makeWorkload(spec)) {
    report.flow = artifact.name;
    report.blockSize = p;
    int64_t pages = 0, longest = 0;
    for (const SequenceData &sd : data) {
      int64_t blocks = (sd.promptLength + spec.steps + p - 1) / p;
      pages += blocks;
      longest = std::max(longest, blocks);
    }
    session = rt::openSession(artifact, sessionConfig(pages, longest));
    cache = std::make_unique<rt::PagedKVCache>(referenceConfig(pages));
    for (const SequenceData &sd : data) {
      seqs.push_back(session->addSequence());
      session->append(seqs.back(), sd.promptLength, sd.keys.data(),
                      sd.values.data());
      refs.push_back(cache->addSequence());
      cache->appendTokens(refs.back(), sd.promptLength, sd.keys.data(),
                          sd.values.data());
    }
    report.cacheStageMs = session->stats().cacheStageMs;
  }

  FlowReport run() {
    for (int step = 0; step < spec.steps; ++step)
      runStep(step);
    report.blocksAttended = attendedCount ? attendedBlocks / attendedCount : 0;
    report.blocksTotal = attendedCount ? totalBlocks / attendedCount : 0;
    report.flowMetrics = flowSum.finish();
    report.randomMetrics = randomSum.finish();
    report.oracleMetrics = oracleSum.finish();
    return report;
  }

private:
  rt::SessionConfig sessionConfig(int64_t pages, int64_t longest) const {
    rt::SessionConfig cfg;
    cfg.device = spec.backend == WorkloadSpec::Backend::Cuda ? rt::Device::Cuda
                                                             : rt::Device::Cpu;
    cfg.numLayers = 1;
    cfg.numKVHeads = h;
    cfg.group = g;
    cfg.headDim = d;
    cfg.numPages = pages + 1;
    cfg.kvDType = rt::DType::BF16;
    cfg.scale = scale;
    cfg.maxSequences = cfg.maxBatch = int(data.size());
    cfg.maxBlocksPerSeq = longest + 1;
    cfg.quiet = true;
    return cfg;
  }

  rt::CacheConfig referenceConfig(int64_t pages) const {
    rt::CacheConfig reference;
    reference.numLayers = 1;
    reference.numKVHeads = h;
    reference.headDim = d;
    reference.pageSize = static_cast<int>(p);
    reference.numPages = pages + 1;
    reference.kvDType = rt::DType::BF16;
    return reference;
  }

  /// One decode step of every sequence: the flow's, and dense attention's
  /// on the reference; then each sequence is scored.
  void runStep(int step) {
    std::vector<float> q(data.size() * rowQ), out(q.size());
    std::vector<std::vector<float>> denseMass(data.size()),
        denseOut(data.size());
    double denseMs = 0;
    if (step == 0)
      observePrompts();
    for (size_t s = 0; s < data.size(); ++s) {
      const SequenceData &sd = data[s];
      int64_t pos = sd.promptLength + step;
      session->append(seqs[s], 1, &sd.keys[pos * h * d],
                      &sd.values[pos * h * d]);
      cache->append(refs[s], &sd.keys[pos * h * d], &sd.values[pos * h * d]);
      std::copy(sd.queries[step].begin(), sd.queries[step].end(),
                q.begin() + s * rowQ);
      // Dense attention: the reference.
      int64_t numBlocks = cache->numBlocks(refs[s]);
      denseOut[s].resize(rowQ);
      denseMass[s].resize(size_t(h) * numBlocks * g);
      auto t0 = Clock::now();
      rt::denseDecodeAttention(*cache, refs[s], 0, sd.queries[step].data(), g,
                               scale, denseOut[s].data(), denseMass[s].data());
      denseMs += msSince(t0);
    }
    // A retain block evicts at the end of the decode: its lists name the
    // blocks as they were before it, which the reference (every token)
    // numbers by their original index.
    std::vector<std::vector<int64_t>> original(data.size());
    for (size_t s = 0; s < data.size(); ++s)
      for (int64_t b = 0, n = session->length(seqs[s]); b * p < n; ++b)
        original[s].push_back(session->originalBlock(seqs[s], b));
    rt::SessionStats before = session->stats();
    session->decode(0, seqs, q.data(), out.data());
    rt::SessionStats after = session->stats();
    std::vector<rt::BlockLists> selected = session->selection(0);
    for (size_t s = 0; s < data.size(); ++s)
      for (std::vector<int64_t> &list : selected[s])
        for (int64_t &b : list)
          b = original[s][size_t(b)];
    for (size_t s = 0; s < data.size(); ++s) {
      std::vector<float> sparseOut(out.begin() + s * rowQ,
                                   out.begin() + (s + 1) * rowQ);
      scoreSequence(s, step, selected[s], denseMass[s], denseOut[s], sparseOut);
    }
    report.indexMs += (after.indexMs - before.indexMs) / spec.steps;
    report.sparseMs += (after.attendMs - before.attendMs) / spec.steps;
    report.denseMs += denseMs / spec.steps;
  }

  /// The mass the first decode step's index stage reads: the attention the
  /// prompt's last query pays to each block (what prefill leaves behind),
  /// not the first step's own, which would hand a flow that reads `mass`
  /// the oracle's answer.
  void observePrompts() {
    for (size_t s = 0; s < data.size(); ++s) {
      int64_t numBlocks = cache->numBlocks(refs[s]);
      std::vector<float> out(rowQ), mass(size_t(h) * numBlocks * g);
      rt::denseDecodeAttention(*cache, refs[s], 0, data[s].observation.data(),
                               g, scale, out.data(), mass.data());
      session->setAttentionMass(seqs[s], 0, mass);
    }
  }

  /// Scores the flow's selection of sequence `s` and the baselines'.
  void scoreSequence(size_t s, int step, const rt::BlockLists &blocks,
                     const std::vector<float> &denseMass,
                     const std::vector<float> &denseOut,
                     const std::vector<float> &sparseOut) {
    const SequenceData &sd = data[s];
    rt::SeqId ref = refs[s];
    int64_t numBlocks = cache->numBlocks(ref);
    int64_t complete = cache->numCompleteBlocks(ref);
    score(blocks, denseMass, denseOut, sparseOut, sd, numBlocks, p, spec,
          flowSum);
    rt::BlockLists randomBlocks(h), oracleBlocks(h);
    chooseBaselines(blocks, denseMass, numBlocks, complete, randomBlocks,
                    oracleBlocks);
    for (auto &[lists, sum] :
         {std::pair<rt::BlockLists *, MetricSum *>{&randomBlocks, &randomSum},
          {&oracleBlocks, &oracleSum}}) {
      std::vector<float> baselineOut(rowQ);
      rt::sparseDecodeAttention(*cache, ref, 0, sd.queries[step].data(), g,
                                scale, *lists, baselineOut.data());
      score(*lists, denseMass, denseOut, baselineOut, sd, numBlocks, p, spec,
            *sum);
    }
  }

  /// The baselines: per KV head, the kept and partial blocks and as many
  /// other blocks as the flow selected, drawn uniformly (random) or those
  /// with the most dense mass over the head's query heads (oracle; ties to
  /// the lower block).
  void chooseBaselines(const rt::BlockLists &blocks,
                       const std::vector<float> &denseMass, int64_t numBlocks,
                       int64_t complete, rt::BlockLists &randomBlocks,
                       rt::BlockLists &oracleBlocks) {
    int64_t keepFirst =
        std::min<int64_t>(int64_t(session->param("keep_first")), complete);
    int64_t keepLast =
        std::min<int64_t>(int64_t(session->param("keep_last")), complete);
    for (int kh = 0; kh < h; ++kh) {
      std::set<int64_t> kept;
      for (int64_t b = 0; b < keepFirst; ++b)
        kept.insert(b);
      for (int64_t b = complete - keepLast; b < complete; ++b)
        kept.insert(b);
      std::vector<int64_t> candidates;
      for (int64_t b = 0; b < complete; ++b)
        if (!kept.count(b))
          candidates.push_back(b);
      int64_t partial = numBlocks > complete ? 1 : 0;
      size_t chosen =
          blocks[kh].size() -
          std::min<size_t>(blocks[kh].size(), kept.size() + size_t(partial));
      chosen = std::min(chosen, candidates.size());
      auto listOf = [&](const std::vector<int64_t> &order) {
        std::set<int64_t> all(kept.begin(), kept.end());
        all.insert(order.begin(), order.begin() + chosen);
        if (partial)
          all.insert(complete);
        return std::vector<int64_t>(all.begin(), all.end());
      };
      std::vector<int64_t> shuffled = candidates;
      for (size_t i = 0; i < chosen; ++i) {
        size_t j = i + pick.next() % (shuffled.size() - i);
        std::swap(shuffled[i], shuffled[j]);
      }
      randomBlocks[kh] = listOf(shuffled);
      auto massOf = [&](int64_t b) {
        double m = 0;
        for (int j = 0; j < g; ++j)
          m += denseMass[(kh * numBlocks + b) * g + j];
        return m;
      };
      std::vector<int64_t> ranked = candidates;
      std::stable_sort(ranked.begin(), ranked.end(), [&](int64_t a, int64_t b) {
        return massOf(a) > massOf(b);
      });
      oracleBlocks[kh] = listOf(ranked);
      attendedBlocks += double(blocks[kh].size());
      totalBlocks += double(numBlocks);
      ++attendedCount;
    }
  }

  const WorkloadSpec &spec;
  const int64_t p;
  const int d, h, g;
  const float scale;
  const size_t rowQ;
  std::vector<SequenceData> data;
  std::unique_ptr<rt::Session> session;
  std::unique_ptr<rt::PagedKVCache> cache;
  std::vector<rt::SeqId> seqs, refs;
  FlowReport report;
  MetricSum flowSum, randomSum, oracleSum;
  double attendedBlocks = 0, totalBlocks = 0;
  int64_t attendedCount = 0;
  rt::SplitMix64 pick{spec.seed ^ 0x5eed5eedull};
};

/// The mean of each metric over the seeds' runs and its standard error.
FlowReport combineSeeds(const std::vector<FlowReport> &runs) {
  FlowReport out = runs.front();
  const size_t n = runs.size();
  out.seeds = int(n);
  out.perSeed.clear();
  for (const FlowReport &r : runs)
    out.perSeed.push_back(r.flowMetrics);
  auto field = [&](Metrics FlowReport::*which, double Metrics::*what,
                   Metrics &mean, Metrics &se) {
    double sum = 0, sq = 0;
    for (const FlowReport &r : runs)
      sum += (r.*which).*what;
    const double m = sum / double(n);
    for (const FlowReport &r : runs)
      sq += ((r.*which).*what - m) * ((r.*which).*what - m);
    mean.*what = m;
    se.*what = n > 1 ? std::sqrt(sq / double(n - 1) / double(n)) : 0;
  };
  for (auto [which, mean, se] :
       {std::tuple<Metrics FlowReport::*, Metrics *, Metrics *>{
            &FlowReport::flowMetrics, &out.flowMetrics, &out.flowSE},
        {&FlowReport::randomMetrics, &out.randomMetrics, &out.randomSE},
        {&FlowReport::oracleMetrics, &out.oracleMetrics, &out.oracleSE}}) {
    for (double Metrics::*what :
         {&Metrics::recall, &Metrics::needleHit, &Metrics::relError})
      field(which, what, *mean, *se);
    // The worst output error over every seed.
    mean->maxRelError = 0;
    for (const FlowReport &r : runs)
      mean->maxRelError = std::max(mean->maxRelError, (r.*which).maxRelError);
  }
  auto average = [&](double FlowReport::*what) {
    double sum = 0;
    for (const FlowReport &r : runs)
      sum += r.*what;
    out.*what = sum / double(n);
  };
  for (double FlowReport::*what :
       {&FlowReport::blocksAttended, &FlowReport::blocksTotal,
        &FlowReport::indexMs, &FlowReport::sparseMs, &FlowReport::denseMs,
        &FlowReport::cacheStageMs})
    average(what);
  return out;
}

} // namespace

FlowReport vflow::eval::evaluateFlow(vt::FlowOp flow,
                                     const rt::FlowArtifact &artifact,
                                     const WorkloadSpec &spec) {
  std::string problem = spec.validate();
  if (!problem.empty())
    throw std::runtime_error(problem);
  RunCost cost = estimateRunCost(flow, spec);
  const double gib = double(int64_t(1) << 30);
  if (cost.totalBytes() > spec.maxMemoryGiB * gib) {
    char why[512];
    std::snprintf(why, sizeof(why),
                  "it would need about %.1f GiB (keys and values %.1f, cache "
                  "and fields %.1f, states %.1f, one index step %.1f), over "
                  "the limit of %g GiB (--max-memory); use shorter --lengths, "
                  "fewer --kv-heads or a smaller --head-dim",
                  cost.totalBytes() / gib, cost.workloadBytes / gib,
                  cost.cacheBytes / gib, cost.stateBytes / gib,
                  cost.stepBytes / gib, spec.maxMemoryGiB);
    throw std::runtime_error(why);
  }
  cost.work *= spec.seeds;
  if (cost.work > spec.maxWork * 1e9) {
    char why[384];
    std::snprintf(why, sizeof(why),
                  "it would do about %.3g billion element operations, over "
                  "the limit of %g billion (--max-work); use fewer --steps, "
                  "--seeds, shorter --lengths or fewer heads",
                  cost.work / 1e9, spec.maxWork);
    throw std::runtime_error(why);
  }
  std::vector<FlowReport> runs;
  for (int i = 0; i < spec.seeds; ++i) {
    WorkloadSpec one = spec;
    one.seed = spec.seed + uint64_t(i);
    runs.push_back(SeedRun(artifact, one).run());
  }
  return combineSeeds(runs);
}

void vflow::eval::runFlows(
    Compilation &c, const WorkloadSpec &spec, std::vector<FlowReport> &reports,
    std::vector<FlowFailure> &failures,
    const std::vector<std::pair<std::string, std::string>> &overrides) {
  // The flows run from their artifact, as a user's would.
  rt::Artifact artifact;
  if (!buildArtifact(c, artifact))
    return;
  for (auto flow : c.vt->getBody()->getOps<vt::FlowOp>()) {
    std::string name = flow.getSymName().str();
    try {
      const rt::FlowArtifact *f = artifact.findFlow(name);
      if (!f)
        throw std::runtime_error("internal error: no artifact");
      if (f->retainTokens)
        throw std::runtime_error(
            "its retain block scores tokens ([block, token]); the workload "
            "scores selections by their original blocks, which compaction "
            "rewrites (run it with vflow eval, or score blocks)");
      reports.push_back(evaluateFlow(flow, *f, spec));
      FlowReport &r = reports.back();
      r.file = c.buffer->getName();
      r.readsMass = f->readsInput("mass");
      r.readsLayer = f->readsInput("layer");
      r.evicts = f->retains();
      for (const auto &[key, value] : overrides)
        for (const rt::ParamSpec &p : f->params)
          if (key == p.name || key == name + "." + p.name)
            r.params.push_back({p.name, value});
    } catch (const std::exception &e) {
      c.diags.error(DiagCode::CannotRun, flowNameRange(c, name),
                    "flow '" + name +
                        "' cannot run on this workload: " + e.what());
      failures.push_back({c.buffer->getName(), name, e.what()});
    }
  }
}
