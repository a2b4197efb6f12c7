//===- Evaluate.h - Run flows on a synthetic long-context workload -*- C++
//-*-===//
//
// `vflowc run`: builds a seeded synthetic workload with the structure of real
// models' keys (docs/workload.md), attaches a flow to a paged KV cache, runs
// its cache stage as blocks complete and its index stage every decode step,
// runs sparse attention over the selection and dense attention over
// everything, and reports how good the selection is: attention-mass recall,
// needle hit rate and output error against dense, next to a random selection
// of the same size.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_COMPILER_EVALUATE_H
#define VFLOW_COMPILER_EVALUATE_H

#include "vflow/Dialect/VT/VTOps.h"
#include "vflow/Runtime/Artifact.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace vflow::eval {

/// The synthetic workload (docs/workload.md describes every number).
struct WorkloadSpec {
  uint64_t seed = 1;
  /// Prompt lengths in tokens, one sequence each.
  std::vector<int64_t> lengths = {2053, 4105, 6147, 8205};
  int numKVHeads = 4;
  int group = 4;
  int headDim = 128;
  /// Decode steps after the prompt.
  int steps = 4;
  /// Planted needle spans per sequence and KV head (16 tokens each).
  int needles = 4;
  /// How strongly needle keys match the query (logit scale, per sqrt(D)).
  double needleStrength = 0.6;
  /// Leading tokens that every query attends strongly (attention sinks).
  int sinkTokens = 4;
  /// The session backend that runs the flow (Session.h): the CPU backend
  /// (its generated C++, compiled by the host compiler and cached) or the
  /// GPU.
  enum class Backend { Cpu, Cuda } backend = Backend::Cpu;
  /// Magnitude of the 4 outlier channels of the keys (real models have a
  /// few channels far larger than the rest).
  double outlier = 6.0;
  /// Limits checked per flow before anything is allocated: the memory the
  /// run would hold at its peak (GiB) and the element operations it would
  /// do (billions). A flow over either is refused with the estimate.
  double maxMemoryGiB = 4.0;
  double maxWork = 20.0;

  /// An error message, or empty when the spec is usable.
  std::string validate() const;
};

struct Metrics {
  double recall = 0;    ///< Mean share of dense attention probability kept.
  double needleHit = 0; ///< Share of needle spans whose block was attended.
  double relError = 0;  ///< Mean ||o - o_dense|| / ||o_dense||.
  double maxRelError = 0;
};

struct FlowReport {
  std::string flow;
  int64_t blockSize = 0;
  /// Mean blocks attended per (sequence, KV head, step), kept and partial
  /// blocks included, and the mean number of blocks of a sequence.
  double blocksAttended = 0, blocksTotal = 0;
  Metrics flowMetrics, randomMetrics;
  /// Milliseconds per decode step for the whole batch (index stage on the
  /// chosen backend; host reference attention), and the cache stage over the
  /// prompt.
  double indexMs = 0, sparseMs = 0, denseMs = 0, cacheStageMs = 0;
};

/// A flow (or a file) that could not run; `flow` is empty for a file.
struct FlowFailure {
  std::string file, flow, message;
};

/// What one flow's run on `spec` would cost, estimated from its vt IR
/// before anything is allocated.
struct RunCost {
  /// Peak bytes: the workload's keys, values and queries; the paged caches
  /// (the session's with the flow's fields, and the reference's); its
  /// states; the values of one index step.
  double workloadBytes = 0, cacheBytes = 0, stateBytes = 0, stepBytes = 0;
  /// Element operations: generating the workload, the cache stage, the
  /// index stage and the reference attention, over every step.
  double work = 0;
  double totalBytes() const {
    return workloadBytes + cacheBytes + stateBytes + stepBytes;
  }
};
RunCost estimateRunCost(vt::FlowOp flow, const WorkloadSpec &spec);

/// Runs the flow of `artifact` on the workload through the session API
/// (openSession on spec.backend); `flow` is its vt IR, for the cost
/// estimate. Throws std::runtime_error when it cannot (a bad spec, a flow
/// over the spec's limits, a head dimension the flow is not specialized to,
/// a backend failure).
FlowReport evaluateFlow(vt::FlowOp flow, const rt::FlowArtifact &artifact,
                        const WorkloadSpec &spec);

std::string formatReportText(const std::vector<FlowReport> &reports,
                             const WorkloadSpec &spec);
/// The JSON report: {"workload": {...}, "flows": [...], "errors": [...]},
/// with every failure in "errors" ({"file", "flow", "message"}).
std::string formatReportJSON(const std::vector<FlowReport> &reports,
                             const std::vector<FlowFailure> &failures,
                             const WorkloadSpec &spec);

} // namespace vflow::eval

#endif // VFLOW_COMPILER_EVALUATE_H
