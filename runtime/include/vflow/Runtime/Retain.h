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
  int64_t capacity = 0;                ///< complete blocks (tokens) kept
  int64_t keepFirst = 0, keepLast = 0; ///< always kept, counted in it
  bool max = false;                    ///< combine = max (else sum)
  /// A [block, token] score: the capacity counts the tokens of complete
  /// blocks, and single tokens are evicted (the rest compacted).
  bool tokens = false;
  int64_t pageSize = 1;

  /// The rule of a flow's retain block with the current params: its
  /// capacity is budget `retainBudget` (an index into the flow's budgets)
  /// at `group`; `combine` is "sum" or "max"; `tokens`: it scores tokens of
  /// `pageSize`-token blocks.
  static RetainRule of(const FlowParams &params, int64_t retainBudget,
                       int64_t group, const std::string &combine,
                       bool tokens = false, int64_t pageSize = 1);

  /// The blocks a sequence keeps: the capacity (in blocks, rounded up from
  /// tokens), or the kept blocks when they are more (a cut under them would
  /// evict nothing).
  int64_t retainedBlocks() const;
  /// Whether a sequence of `complete` complete blocks is past the rule
  /// (then it is scored and cut).
  bool over(int64_t complete) const;
  /// The scores one sequence folds per complete block: 1, or pageSize.
  int64_t scoresPerBlock() const { return tokens ? pageSize : 1; }
  /// Block grain: the blocks (increasing, logical ids) that a sequence of
  /// `n` complete blocks with the folded `score` [n] evicts. Token grain:
  /// the tokens (increasing, logical indices) it evicts, `score` holding
  /// [n, pageSize]. Empty when it is within the rule.
  std::vector<int64_t> evictions(const float *score, int64_t n) const;
};

} // namespace vflow::rt

#endif // VFLOW_RUNTIME_RETAIN_H
