//===- Params.h - A flow's params at run time -------------------*- C++ -*-===//
//
// One implementation of what setting a param means, for every backend (the
// CPU flow, the host session, the GPU session): the value must fit the
// param's type (an int an integer within 2^53, a bool 0 or 1, a finite
// number), a compile-time param cannot change (the code was specialized on
// it), keep_first/keep_last stay >= 0, and no budget of the flow may become
// NaN or negative (Budget.h). A refused value leaves the old one.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_PARAMS_H
#define VFLOW_RUNTIME_PARAMS_H

#include "vflow/Runtime/Budget.h"
#include "vflow/Runtime/ParamText.h"

#include <cstdint>
#include <string>
#include <vector>

namespace vflow::rt {

struct ParamSpec {
  std::string name;
  std::string type; ///< One of kParamTypeNames.
  double value = 0;
  bool compileTime = false;
};

class FlowParams {
public:
  FlowParams() = default;
  /// Throws Error when a reserved param is missing or a budget is already
  /// NaN or negative with the default values anywhere in `scope` (the
  /// session's group, and the layers and KV heads its index stage runs for:
  /// the inputs `group`, `layer` and `kv_head` of the budgets).
  FlowParams(std::string flow, std::vector<ParamSpec> params,
             std::vector<BudgetExpr> budgets,
             std::vector<SelectionNode> selection, BudgetScope scope);

  /// Sets a param (see the file comment); throws Error and keeps the old
  /// value when it is refused.
  void set(const std::string &name, double value);
  double get(const std::string &name) const;
  /// Every param's value in declaration order (the ABI's `params`).
  const std::vector<double> &values() const { return current; }
  const std::vector<ParamSpec> &specs() const { return params; }

  int64_t blockSize() const { return reserved(blockSizeIndex); }
  int64_t keepFirst() const { return reserved(keepFirstIndex); }
  int64_t keepLast() const { return reserved(keepLastIndex); }

  /// The scope the budgets are evaluated over, and which of its inputs they
  /// read. setScope checks the budgets at every point of the new scope
  /// (Error: the old one stays).
  const BudgetScope &scope() const { return where; }
  BudgetInputs reads() const { return inputs; }
  void setScope(const BudgetScope &scope);
  /// setScope with the layers and KV heads given and the group kept.
  void setScope(int64_t firstLayer, int64_t numLayers, int64_t firstKVHead,
                int64_t numKVHeads);
  /// Throws Error when the index stage is about to run at a `layer` or
  /// `kvHead` outside the scope while a budget reads it (the lists were
  /// sized for the scope's largest budget). `what` starts the message.
  void checkInScope(const char *what, int64_t layer, int64_t kvHead) const;

  /// The number of blocks the flow's selection takes for a sequence of
  /// `numBlocks` complete blocks and `contextLen` tokens (kept blocks not
  /// counted), as the host planner evaluates it: the most over the scope's
  /// layers and KV heads when a budget reads them.
  int64_t budget(int64_t numBlocks, int64_t contextLen) const;
  /// The same at one point (one layer and KV head).
  int64_t budgetAt(const BudgetPoint &at) const;
  /// Budget `index` alone at `at`, rounded as the kernels round it.
  int64_t budgetValue(int64_t index, const BudgetPoint &at) const;
  /// The most entries one decode step's block list can hold for a sequence
  /// of `contextLen` tokens: the budget, the kept blocks and the partial
  /// last block, at most every block.
  int64_t maxEntries(int64_t contextLen) const;
  /// Whether a step's list for a sequence of `contextLen` tokens holds
  /// every block whatever the scores: the selection takes every complete
  /// block that is not kept (selectionTakesAll), at every layer and KV head
  /// of the scope.
  bool takesEveryBlock(int64_t contextLen) const;
  /// The budget checks of Budget.h with the current values.
  void checkBudgets() const;
  /// The same at one sequence's length (every layer and KV head of the
  /// scope), as the planner of every step does for each row before anything
  /// runs (checkBudgetsAt).
  void checkBudgetsAt(int64_t contextLen) const;

private:
  int64_t indexOf(const std::string &name) const;
  int64_t reserved(int64_t i) const { return static_cast<int64_t>(current[i]); }

  std::string flow;
  std::vector<ParamSpec> params;
  std::vector<double> current;
  std::vector<BudgetExpr> budgets;
  std::vector<SelectionNode> selection;
  /// The params' names and which are compile-time (the checks' messages).
  std::vector<std::string> names;
  std::vector<bool> compileTime;
  int64_t blockSizeIndex = -1, keepFirstIndex = -1, keepLastIndex = -1;
  BudgetScope where;
  BudgetInputs inputs;
};

} // namespace vflow::rt

#endif // VFLOW_RUNTIME_PARAMS_H
