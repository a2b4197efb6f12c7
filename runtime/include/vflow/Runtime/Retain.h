//===- Retain.h - A flow's retain block at run time -------------*- C++ -*-===//
//
// What every session does with a flow's retain block (docs/language.md,
// "retain"), one implementation for the CPU and the GPU: how many complete
// blocks a sequence keeps, and which it evicts once the step's scores are
// folded over KV heads and flow layers (NumericRules.h retainFold): the
// kept first and last blocks always stay and count in the capacity; of the
// other blocks the best by score (ties to the lower index, NaN last) fill
// what is left of it.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_RETAIN_H
#define VFLOW_RUNTIME_RETAIN_H

#include <cstdint>
#include <string>
#include <vector>

namespace vflow::rt {

class FlowParams;

struct RetainRule {
  int64_t capacity = 0;                ///< complete blocks kept
  int64_t keepFirst = 0, keepLast = 0; ///< always kept, counted in it
  bool max = false;                    ///< combine = max (else sum)

  /// The rule of a flow's retain block with the current params: its
  /// capacity is budget `retainBudget` (an index into the flow's budgets)
  /// at `group`; `combine` is "sum" or "max".
  static RetainRule of(const FlowParams &params, int64_t retainBudget,
                       int64_t group, const std::string &combine);

  /// The complete blocks a sequence keeps: the capacity, or the kept blocks
  /// when they are more (a cut under them would evict nothing). A sequence
  /// with more is scored and cut.
  int64_t retainedBlocks() const;
  /// The blocks (increasing, logical ids) that a sequence of `n` complete
  /// blocks with the folded `score` [n] evicts; empty when it is within
  /// the rule.
  std::vector<int64_t> evictions(const float *score, int64_t n) const;
};

} // namespace vflow::rt

#endif // VFLOW_RUNTIME_RETAIN_H
