//===- Budget.cpp - Budget expressions the runtime evaluates --------------===//

#include "vflow/Runtime/Budget.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Limits.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

using namespace vflow::rt;

double BudgetExpr::evaluate(const double *params, const BudgetPoint &at) const {
  if (nodes.empty())
    throw Error("budget '" + what + "' has no nodes");
  // Small budgets (the usual few nodes) need no allocation.
  double small[16];
  std::vector<double> large;
  double *v = small;
  if (nodes.size() > 16) {
    large.resize(nodes.size());
    v = large.data();
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    const BudgetNode &n = nodes[i];
    double a = n.a >= 0 ? v[n.a] : 0, b = n.b >= 0 ? v[n.b] : 0;
    switch (n.kind) {
    case BudgetNode::Kind::Const:
      v[i] = n.value;
      break;
    case BudgetNode::Kind::Param:
      v[i] = params[n.param];
      break;
    case BudgetNode::Kind::NumBlocks:
      v[i] = double(at.numBlocks);
      break;
    case BudgetNode::Kind::ContextLen:
      v[i] = double(at.contextLen);
      break;
    case BudgetNode::Kind::Group:
      v[i] = double(at.group);
      break;
    case BudgetNode::Kind::Layer:
      v[i] = double(at.layer);
      break;
    case BudgetNode::Kind::KVHead:
      v[i] = double(at.kvHead);
      break;
    case BudgetNode::Kind::Add:
      v[i] = a + b;
      break;
    case BudgetNode::Kind::Sub:
      v[i] = a - b;
      break;
    case BudgetNode::Kind::Mul:
      v[i] = a * b;
      break;
    case BudgetNode::Kind::Div:
      v[i] = a / b;
      break;
    // std::min/std::max semantics (the first operand when either is NaN
    // and the comparison fails), as the generated code computes them.
    case BudgetNode::Kind::Min:
      v[i] = std::min(a, b);
      break;
    case BudgetNode::Kind::Max:
      v[i] = std::max(a, b);
      break;
    }
  }
  return v[nodes.size() - 1];
}

BudgetInputs vflow::rt::budgetInputs(const std::vector<BudgetExpr> &budgets) {
  BudgetInputs reads;
  for (const BudgetExpr &b : budgets)
    for (const BudgetNode &n : b.nodes) {
      reads.layer |= n.kind == BudgetNode::Kind::Layer;
      reads.kvHead |= n.kind == BudgetNode::Kind::KVHead;
    }
  return reads;
}

int64_t vflow::rt::roundBudget(double value) {
  if (std::isnan(value) || value <= 0)
    return 0;
  if (value > 9.0e15)
    return int64_t(9.0e15);
  return static_cast<int64_t>(std::floor(value));
}

namespace {

/// Blocks budget node `n` allows at this length (its expression, rounded
/// as the kernels round it).
int64_t nodeBudget(const SelectionNode &n,
                   const std::vector<BudgetExpr> &budgets, const double *params,
                   const BudgetPoint &at) {
  return roundBudget(budgets[size_t(n.budget)].evaluate(params, at));
}

} // namespace

int64_t vflow::rt::selectionBudget(const std::vector<SelectionNode> &nodes,
                                   const std::vector<BudgetExpr> &budgets,
                                   const double *params,
                                   const BudgetPoint &at) {
  const int64_t numBlocks = at.numBlocks;
  std::vector<int64_t> v(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const SelectionNode &n = nodes[i];
    switch (n.kind) {
    case SelectionNode::Kind::Budget:
    case SelectionNode::Kind::TopK:
      v[i] = std::min(nodeBudget(n, budgets, params, at), numBlocks);
      break;
    case SelectionNode::Kind::Union:
      v[i] = std::min(v[n.a] + v[n.b], numBlocks);
      break;
    case SelectionNode::Kind::All:
      v[i] = numBlocks;
      break;
    }
  }
  return nodes.empty() ? 0 : std::max<int64_t>(0, v.back());
}

bool vflow::rt::selectionTakesAll(const std::vector<SelectionNode> &nodes,
                                  const std::vector<BudgetExpr> &budgets,
                                  const double *params, const BudgetPoint &at,
                                  int64_t candidates) {
  std::vector<bool> all(nodes.size(), false);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const SelectionNode &n = nodes[i];
    switch (n.kind) {
    case SelectionNode::Kind::TopK:
      // ctaTopK and the CPU's top-k take every candidate when k >= their
      // count (and none when k <= 0).
      all[i] =
          candidates == 0 || nodeBudget(n, budgets, params, at) >= candidates;
      break;
    case SelectionNode::Kind::Union:
      all[i] = all[n.a] || all[n.b];
      break;
    case SelectionNode::Kind::Budget:
    case SelectionNode::Kind::All:
      all[i] = candidates == 0; // the scores decide
      break;
    }
  }
  return !nodes.empty() && all.back();
}

void vflow::rt::checkBudgetsAt(const std::vector<BudgetExpr> &budgets,
                               const double *params,
                               const std::vector<std::string> &paramNames,
                               const std::vector<bool> &compileTime,
                               const BudgetPoint &at, const std::string &flow) {
  auto number = [](double x) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.10g", x);
    return std::string(text);
  };
  for (const BudgetExpr &budget : budgets) {
    double v = budget.evaluate(params, at);
    if (v >= 0)
      continue;
    auto reads = [&](BudgetNode::Kind kind) {
      return std::any_of(budget.nodes.begin(), budget.nodes.end(),
                         [&](const BudgetNode &n) { return n.kind == kind; });
    };
    std::string where = "num_blocks = " + std::to_string(at.numBlocks) +
                        ", context_len = " + std::to_string(at.contextLen);
    if (reads(BudgetNode::Kind::Group))
      where += ", group = " + std::to_string(at.group);
    if (reads(BudgetNode::Kind::Layer))
      where += ", layer = " + std::to_string(at.layer);
    if (reads(BudgetNode::Kind::KVHead))
      where += ", kv_head = " + std::to_string(at.kvHead);
    std::string values;
    for (size_t j = 0; j < paramNames.size(); ++j)
      if (!compileTime[j])
        values += (values.empty() ? "" : ", ") + paramNames[j] + " = " +
                  number(params[j]);
    throw Error("flow '" + flow + "': the budget of " + budget.what + " is " +
                (std::isnan(v) ? std::string("NaN") : number(v)) + " at " +
                where + " with " + values + "; a budget must be a number >= 0");
  }
}

void vflow::rt::checkBudgets(const std::vector<BudgetExpr> &budgets,
                             const double *params,
                             const std::vector<std::string> &paramNames,
                             const std::vector<bool> &compileTime,
                             int64_t blockSize, const BudgetScope &scope,
                             const std::string &flow) {
  const BudgetInputs reads = budgetInputs(budgets);
  for (int64_t n : limits::budgetSampleBlocks())
    for (int64_t length : {n * blockSize, n * blockSize + blockSize - 1})
      forEachScopePoint(scope, reads, n, length, [&](const BudgetPoint &at) {
        checkBudgetsAt(budgets, params, paramNames, compileTime, at, flow);
      });
}

void vflow::rt::validateBudget(const BudgetExpr &budget, size_t numParams,
                               const std::string &what) {
  if (budget.nodes.empty() ||
      budget.nodes.size() > size_t(limits::kMaxOpsPerStage) * 4)
    throw Error(what + ": a budget has no nodes or too many");
  for (size_t i = 0; i < budget.nodes.size(); ++i) {
    const BudgetNode &n = budget.nodes[i];
    bool binary = n.kind >= BudgetNode::Kind::Add;
    if (binary &&
        !(n.a >= 0 && n.b >= 0 && n.a < int64_t(i) && n.b < int64_t(i)))
      throw Error(what + ": budget node " + std::to_string(i) +
                  " reads a node that is not before it");
    if (n.kind == BudgetNode::Kind::Param &&
        (n.param < 0 || n.param >= int64_t(numParams)))
      throw Error(what + ": budget node " + std::to_string(i) +
                  " reads a param that does not exist");
  }
}

void vflow::rt::validateSelection(const std::vector<SelectionNode> &nodes,
                                  size_t numBudgets, const std::string &what) {
  if (nodes.empty())
    throw Error(what + ": the selection has no budget nodes");
  for (size_t i = 0; i < nodes.size(); ++i) {
    const SelectionNode &n = nodes[i];
    if ((n.kind == SelectionNode::Kind::Budget ||
         n.kind == SelectionNode::Kind::TopK) &&
        (n.budget < 0 || n.budget >= int64_t(numBudgets)))
      throw Error(what + ": selection node " + std::to_string(i) +
                  " reads a budget that does not exist");
    if (n.kind == SelectionNode::Kind::Union &&
        !(n.a >= 0 && n.b >= 0 && n.a < int64_t(i) && n.b < int64_t(i)))
      throw Error(what + ": selection node " + std::to_string(i) +
                  " reads a node that is not before it");
  }
}
