//===- Budget.h - Budget expressions the runtime evaluates ------*- C++ -*-===//
//
// A selection's budget (topk's k, threshold's max, kth_largest's k) is a
// host-evaluable expression of literals, params, num_blocks, context_len,
// group (the session's query heads per KV head), layer and kv_head (which
// decode layer and KV head the index stage runs for). The compiler writes each
// one into the artifact as a BudgetExpr, a DAG in dependency order (a value a
// definition reads twice is one node, so the size is linear in the program),
// and the runtime evaluates it: the host planner of every backend, the budget
// checks and the reference interpreter use this one evaluator.
//
// Evaluation is in f64 (constants are the f32 values of the IR); a budget
// is then rounded down (roundBudget) and clamped to the blocks there are.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_BUDGET_H
#define VFLOW_RUNTIME_BUDGET_H

#include <cstdint>
#include <string>
#include <vector>

namespace vflow::rt {

struct BudgetNode {
  enum class Kind {
    Const,
    Param,
    NumBlocks,
    ContextLen,
    Group,
    Layer,
    KVHead,
    Add,
    Sub,
    Mul,
    Div,
    Min,
    Max
  };
  Kind kind = Kind::Const;
  double value = 0;       ///< Const
  int64_t param = 0;      ///< Param: index into the flow's params
  int64_t a = -1, b = -1; ///< operands: earlier nodes
};

/// The values a budget reads besides params: the sequence's complete blocks
/// and tokens, the session's query heads per KV head, and the layer and KV
/// head (the model's indices) the index stage runs for.
struct BudgetPoint {
  int64_t numBlocks = 0, contextLen = 0, group = 1, layer = 0, kvHead = 0;
};

/// Where a session's index stage runs: its group, its sparse layers
/// [firstLayer, firstLayer + numLayers) and its KV heads [firstKVHead,
/// firstKVHead + numKVHeads) (a tensor-parallel rank holds a slice of the
/// model's). A budget that reads `layer` or `kv_head` is bounded by its
/// largest value over them (the step's list capacity) and checked at each.
struct BudgetScope {
  int64_t group = 1;
  int64_t firstLayer = 0, numLayers = 1;
  int64_t firstKVHead = 0, numKVHeads = 1;

  bool containsLayer(int64_t layer) const {
    return layer >= firstLayer && layer < firstLayer + numLayers;
  }
  bool containsKVHead(int64_t kvHead) const {
    return kvHead >= firstKVHead && kvHead < firstKVHead + numKVHeads;
  }
};

/// One budget: its nodes (the root is the last) and what it belongs to, for
/// messages ("vt.topk at line 7, column 12").
struct BudgetExpr {
  std::vector<BudgetNode> nodes;
  std::string what;

  /// The unrounded f64 value; `params` in the flow's declaration order.
  double evaluate(const double *params, const BudgetPoint &at) const;
};

/// Which of the scope's inputs any of `budgets` reads.
struct BudgetInputs {
  bool layer = false, kvHead = false;
};
BudgetInputs budgetInputs(const std::vector<BudgetExpr> &budgets);

/// How the returned selection's size bound is made from the budgets: a
/// node is a budget (`budget` indexes BudgetExpr: threshold's or top-p's
/// max, at most that many blocks), a top-k's budget (exactly min(budget,
/// candidates) blocks, so all of them once it reaches their count), the
/// union of two earlier nodes (their sum), or every block (threshold
/// without max).
struct SelectionNode {
  enum class Kind { Budget, Union, All, TopK };
  Kind kind = Kind::All;
  int64_t budget = -1;
  int64_t a = -1, b = -1;
};

/// A budget value as blocks: floor, NaN and negative as 0, capped at 9e15.
int64_t roundBudget(double value);

/// The number of blocks the selection of `nodes` (root last) selects at
/// most at `at`, kept blocks not counted, clamped to at.numBlocks.
int64_t selectionBudget(const std::vector<SelectionNode> &nodes,
                        const std::vector<BudgetExpr> &budgets,
                        const double *params, const BudgetPoint &at);

/// Whether the selection of `nodes` takes every one of the `candidates`
/// complete blocks that are not kept (rules::KeptBlocks) at this length: a
/// top-k whose budget reaches their count, or a union with one. Then the
/// step's lists hold every block, whatever the scores.
bool selectionTakesAll(const std::vector<SelectionNode> &nodes,
                       const std::vector<BudgetExpr> &budgets,
                       const double *params, const BudgetPoint &at,
                       int64_t candidates);

/// Calls fn(point) for `numBlocks` and `contextLen` at every layer and KV
/// head of `scope` that `reads` says matters (the first of each otherwise).
template <typename Fn>
void forEachScopePoint(const BudgetScope &scope, BudgetInputs reads,
                       int64_t numBlocks, int64_t contextLen, Fn &&fn) {
  const int64_t layers = reads.layer ? scope.numLayers : 1;
  const int64_t heads = reads.kvHead ? scope.numKVHeads : 1;
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t h = 0; h < heads; ++h)
      fn(BudgetPoint{numBlocks, contextLen, scope.group, scope.firstLayer + l,
                     scope.firstKVHead + h});
}

/// Throws Error when a budget is NaN or negative at one of
/// limits::budgetSampleBlocks() (with context lengths N * blockSize and
/// N * blockSize + blockSize - 1) for `params` at every point of `scope`
/// (forEachScopePoint); `flow` and `paramNames` (declaration order) name
/// things in the message.
void checkBudgets(const std::vector<BudgetExpr> &budgets, const double *params,
                  const std::vector<std::string> &paramNames,
                  const std::vector<bool> &compileTime, int64_t blockSize,
                  const BudgetScope &scope, const std::string &flow);

/// Throws the same Error when a budget is NaN or negative at `at`: the
/// planner's check at run time, per row and step (a budget may be NaN only
/// between the sampled lengths).
void checkBudgetsAt(const std::vector<BudgetExpr> &budgets,
                    const double *params,
                    const std::vector<std::string> &paramNames,
                    const std::vector<bool> &compileTime, const BudgetPoint &at,
                    const std::string &flow);

/// Checks a budget's structure: operands refer to earlier nodes, params
/// exist (`numParams`), the root exists. Throws Error naming `what`.
void validateBudget(const BudgetExpr &budget, size_t numParams,
                    const std::string &what);
void validateSelection(const std::vector<SelectionNode> &nodes,
                       size_t numBudgets, const std::string &what);

} // namespace vflow::rt

#endif // VFLOW_RUNTIME_BUDGET_H
