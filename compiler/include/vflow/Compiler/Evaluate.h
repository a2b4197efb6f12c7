//===- Evaluate.h - Run flows on a synthetic workload -----------*- C++ -*-===//
//
// `vflowc run`: builds a seeded synthetic workload with the structure of real
// models' keys (docs/workload.md), attaches a flow to a paged KV cache, runs
// its cache stage as blocks complete and its index stage every decode step,
// runs sparse attention over the selection and dense attention over
// everything, and reports how good the selection is: attention-mass recall,
// needle hit rate and output error against dense, next to a random selection
// and the oracle selection of the same size, as means with standard errors
// over several seeds.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_COMPILER_EVALUATE_H
#define VFLOW_COMPILER_EVALUATE_H

#include "vflow/Compiler/Driver.h"
#include "vflow/Compiler/Workload.h"
#include "vflow/Dialect/VT/VTOps.h"
#include "vflow/Runtime/Artifact.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace vflow::eval {

struct Metrics {
  double recall = 0;    ///< Mean share of dense attention probability kept.
  double needleHit = 0; ///< Share of needle spans whose block was attended.
  double relError = 0;  ///< Mean ||o - o_dense|| / ||o_dense||.
  double maxRelError = 0;
};

struct FlowReport {
  std::string flow;
  /// The source file and the param overrides the flow ran with (a sweep
  /// point of `vflowc run -p budget=16,32`): name -> value as given.
  std::string file;
  std::vector<std::pair<std::string, std::string>> params;
  /// The index stage reads `mass`: this workload's needles stay put, so the
  /// last attention predicts the next better than on a model (flagged).
  bool readsMass = false;
  /// The index stage reads `layer` (this workload has one layer: 0).
  bool readsLayer = false;
  /// The flow has a retain block: sequences past its capacity lose blocks
  /// (the metrics compare with attention over every token).
  bool evicts = false;
  int64_t blockSize = 0;
  /// Mean blocks attended per (sequence, KV head, step), kept and partial
  /// blocks included, and the mean number of blocks of a sequence.
  double blocksAttended = 0, blocksTotal = 0;
  /// The flow's selection, a random one and the oracle (the blocks with
  /// the most dense attention mass, summed over the KV head's query heads)
  /// of the same size: means over the seeds, and their standard errors
  /// (0 with one seed).
  Metrics flowMetrics, randomMetrics, oracleMetrics;
  Metrics flowSE, randomSE, oracleSE;
  int seeds = 1;
  /// The flow's metrics of each seed (spec.seed, spec.seed + 1, ...): the
  /// paired differences against a baseline flow are taken seed by seed.
  std::vector<Metrics> perSeed;
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

/// Runs every flow of a compiled program (CompileStage::VT) on `spec`
/// from its artifact, as a user's would: a report per flow that ran, a
/// failure (also an error in the diagnostics, at the flow) per flow that
/// could not.
/// `overrides` (-p name=value or flow.name=value, as compiled) label each
/// report with those that set one of its flow's params.
void runFlows(
    Compilation &compilation, const WorkloadSpec &spec,
    std::vector<FlowReport> &reports, std::vector<FlowFailure> &failures,
    const std::vector<std::pair<std::string, std::string>> &overrides = {});

/// A run report's error for a file that does not compile: its first error
/// ("LINE:COL: message [CODE]") and how many there are, so that the JSON
/// report alone says why (every diagnostic: --diagnostics=json).
std::string errorsInBrief(const DiagnosticEngine &diags);

/// A flow's metrics minus its baseline's, seed by seed: the mean of the
/// differences and its standard error (the paired SE: 0 with one seed).
struct PairedDifference {
  std::string baseline; ///< The baseline row's label (flow[params]).
  Metrics mean, se;
};

/// The row of `reports` that `reports[row]` is compared with: the one of
/// flow `baseline` run with the same params, else the only row of that
/// flow; -1 with the reason in `why` when there is none or several.
int baselineRow(const std::vector<FlowReport> &reports, size_t row,
                const std::string &baseline, std::string &why);
PairedDifference pairedDifference(const FlowReport &flow,
                                  const FlowReport &baseline);
/// flow, or flow[name=value,...] for a row with params.
std::string rowLabel(const FlowReport &r);

/// The text table; with a `baseline` flow, a column of each row's paired
/// difference in mass recall against it.
std::string formatReportText(const std::vector<FlowReport> &reports,
                             const WorkloadSpec &spec,
                             const std::string &baseline = "");
/// The JSON report: {"workload": {...}, "flows": [...], "errors": [...]},
/// with every failure in "errors" ({"file", "flow", "message"}); with a
/// `baseline` flow, each row's "vs_baseline" (paired differences).
std::string formatReportJSON(const std::vector<FlowReport> &reports,
                             const std::vector<FlowFailure> &failures,
                             const WorkloadSpec &spec,
                             const std::string &baseline = "");

} // namespace vflow::eval

#endif // VFLOW_COMPILER_EVALUATE_H
