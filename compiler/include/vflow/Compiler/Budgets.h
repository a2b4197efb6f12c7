//===- Budgets.h - A flow's budgets as the runtime evaluates them -*- C++
//-*-===//
//
// Turns the host-evaluable budget definitions of a flow's index stage into
// rt::BudgetExpr DAGs (one per topk/approx_topk k, threshold max and
// kth_largest k, in the order of a pre-order walk of the index stage) and
// the returned selection's size bound into rt::SelectionNode's. The
// artifact carries both; CpuFlow, the GPU session's planner and the
// interpreter evaluate them with the runtime's one evaluator.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_COMPILER_BUDGETS_H
#define VFLOW_COMPILER_BUDGETS_H

#include "vflow/Dialect/VT/VTOps.h"
#include "vflow/Runtime/Budget.h"

#include "llvm/ADT/DenseMap.h"

#include <string>
#include <vector>

namespace vflow {

struct FlowBudgets {
  std::vector<rt::BudgetExpr> budgets;
  std::vector<rt::SelectionNode> selection;
  /// The retain block's capacity (an index into `budgets`), -1 without one.
  int64_t retainBudget = -1;
  /// The budget of each selection op (and kth_largest) by its op.
  llvm::DenseMap<mlir::Operation *, int64_t> budgetOf;
};

/// The budgets of `flow` (planned or just lowered IR). Returns false with a
/// reason when a budget uses something the host cannot evaluate (the
/// verifier and the checker make that an internal error).
bool describeBudgets(vt::FlowOp flow, FlowBudgets &out, std::string &error);

} // namespace vflow

#endif // VFLOW_COMPILER_BUDGETS_H
