//===- Budget.h - Budget expressions the runtime evaluates ------*- C++ -*-===//
//
// A selection's budget (topk's k, threshold's max, kth_largest's k) is a
// host-evaluable expression of literals, params, num_blocks, context_len
// and group (the session's query heads per KV head). The compiler writes each
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

/// One budget: its nodes (the root is the last) and what it belongs to, for
/// messages ("vt.topk at line 7, column 12").
struct BudgetExpr {
  std::vector<BudgetNode> nodes;
  std::string what;

  /// The unrounded f64 value; `params` in the flow's declaration order.
  double evaluate(const double *params, double numBlocks, double contextLen,
                  double group) const;
};

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
/// most, kept blocks not counted, clamped to numBlocks.
int64_t selectionBudget(const std::vector<SelectionNode> &nodes,
                        const std::vector<BudgetExpr> &budgets,
                        const double *params, int64_t numBlocks,
                        int64_t contextLen, int64_t group);

/// Whether the selection of `nodes` takes every one of the `candidates`
/// complete blocks that are not kept (rules::KeptBlocks) at this length: a
/// top-k whose budget reaches their count, or a union with one. Then the
/// step's lists hold every block, whatever the scores.
bool selectionTakesAll(const std::vector<SelectionNode> &nodes,
                       const std::vector<BudgetExpr> &budgets,
                       const double *params, int64_t numBlocks,
                       int64_t contextLen, int64_t group, int64_t candidates);

/// Throws Error when a budget is NaN or negative at one of
/// limits::budgetSampleBlocks() (with context lengths N * blockSize and
/// N * blockSize + blockSize - 1) for `params` at `group` query heads per KV
/// head; `flow` and `paramNames`
/// (declaration order) name things in the message.
void checkBudgets(const std::vector<BudgetExpr> &budgets, const double *params,
                  const std::vector<std::string> &paramNames,
                  const std::vector<bool> &compileTime, int64_t blockSize,
                  int64_t group, const std::string &flow);

/// Throws the same Error when a budget is NaN or negative at `numBlocks`
/// complete blocks and `contextLen` tokens: the planner's check at run time,
/// per row and step (a budget may be NaN only between the sampled lengths).
void checkBudgetsAt(const std::vector<BudgetExpr> &budgets,
                    const double *params,
                    const std::vector<std::string> &paramNames,
                    const std::vector<bool> &compileTime, int64_t numBlocks,
                    int64_t contextLen, int64_t group, const std::string &flow);

/// Checks a budget's structure: operands refer to earlier nodes, params
/// exist (`numParams`), the root exists. Throws Error naming `what`.
void validateBudget(const BudgetExpr &budget, size_t numParams,
                    const std::string &what);
void validateSelection(const std::vector<SelectionNode> &nodes,
                       size_t numBudgets, const std::string &what);

} // namespace vflow::rt

#endif // VFLOW_RUNTIME_BUDGET_H
