//===- Workload.h - The synthetic workload of vflowc run --------*- C++ -*-===//
//
// What `vflowc run` (and vflow.run in Python) runs flows on: no MLIR types,
// so that the compile API (Compile.h) can take it.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_COMPILER_WORKLOAD_H
#define VFLOW_COMPILER_WORKLOAD_H

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace vflow::eval {

/// The synthetic workload (docs/workload.md describes every number).
/// A param swept over values (`vflowc run -p budget=16,32`, vflow.run's
/// lists).
struct Sweep {
  std::string name;
  std::vector<std::string> values;
};
/// Every point of the sweeps: their cartesian product, the first param
/// varying slowest, each point a list of (name, value) overrides; one empty
/// point without sweeps. (Evaluate.cpp)
std::vector<std::vector<std::pair<std::string, std::string>>>
sweepPoints(const std::vector<Sweep> &sweeps);

struct WorkloadSpec {
  uint64_t seed = 1;
  /// Workloads run: seeds seed .. seed + seeds - 1; metrics are their mean
  /// with a standard error across seeds.
  int seeds = 3;
  /// Prompt lengths in tokens, one sequence each.
  std::vector<int64_t> lengths = {2053, 4105, 6147, 8205};
  int numKVHeads = 4;
  int group = 4;
  int headDim = 128;
  /// Decode steps after the prompt.
  int steps = 4;
  /// Planted needle spans per sequence and KV head (16 tokens each).
  int needles = 8;
  /// How strongly needle keys match the query (logit scale, per sqrt(D)).
  double needleStrength = 0.6;
  /// The share of the 16-token spans between the sinks and the last 384
  /// tokens that are distractors, per sequence and KV head: keys with the
  /// needle direction's channel magnitudes but a random sign per token and
  /// channel, `distractorStrength` times as strong as a needle. They draw
  /// little attention (their logits average out) but spread every channel's
  /// min and max across the block, as rotary channels do in real models,
  /// so a per-channel bound over-rates them.
  double distractors = 0.25;
  /// How far the query heads of a KV group disagree: head j's direction is
  /// the group's plus `headSpread` times its own Gaussian one (rescaled),
  /// and needle n is tuned to head n % group. 0: one direction per group.
  double headSpread = 0.5;
  double distractorStrength = 1.5;
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

} // namespace vflow::eval

#endif // VFLOW_COMPILER_WORKLOAD_H
