//===- Retain.cpp - A flow's retain block at run time ---------------------===//

#include "vflow/Runtime/Retain.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/NumericRules.h"
#include "vflow/Runtime/Params.h"

#include <algorithm>

using namespace vflow;
using namespace vflow::rt;

RetainRule RetainRule::of(const FlowParams &params, int64_t retainBudget,
                          int64_t group, const std::string &combine,
                          bool tokens, int64_t pageSize) {
  if (combine != "sum" && combine != "max")
    throw Error("retain block: combine \"" + combine + "\" is not sum or max");
  RetainRule rule;
  BudgetPoint at;
  at.group = group;
  rule.capacity = params.budgetValue(retainBudget, at);
  rule.keepFirst = params.keepFirst();
  rule.keepLast = params.keepLast();
  rule.max = combine == "max";
  rule.tokens = tokens;
  rule.pageSize = std::max<int64_t>(1, pageSize);
  return rule;
}

int64_t RetainRule::retainedBlocks() const {
  const int64_t blocks =
      tokens ? (capacity + pageSize - 1) / pageSize : capacity;
  return std::max(blocks, keepFirst + keepLast);
}

bool RetainRule::over(int64_t complete) const {
  if (!tokens)
    return complete > retainedBlocks();
  return complete * pageSize >
         std::max(capacity, (keepFirst + keepLast) * pageSize);
}

std::vector<int64_t> RetainRule::evictions(const float *score,
                                           int64_t n) const {
  // The candidates: every block (token grain: every token of a block) that
  // is not kept first or last; the kept ones count in the capacity.
  const rules::KeptBlocks kept{n, keepFirst, keepLast};
  const int64_t unit = scoresPerBlock();
  std::vector<int64_t> candidates;
  for (int64_t b = 0; b < n; ++b)
    if (!kept.contains(b))
      for (int64_t i = 0; i < unit; ++i)
        candidates.push_back(b * unit + i);
  const int64_t room =
      std::max<int64_t>(0, capacity - (n * unit - int64_t(candidates.size())));
  if (int64_t(candidates.size()) <= room)
    return {};
  std::nth_element(candidates.begin(), candidates.begin() + room,
                   candidates.end(), [&](int64_t a, int64_t b) {
                     return rules::ranksBefore(score[a], a, score[b], b);
                   });
  std::vector<int64_t> out(candidates.begin() + room, candidates.end());
  std::sort(out.begin(), out.end());
  return out;
}
