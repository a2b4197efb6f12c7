//===- Params.cpp - A flow's params at run time ---------------------------===//

#include "vflow/Runtime/Params.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Limits.h"
#include "vflow/Runtime/NumericRules.h"

#include <algorithm>
#include <cmath>

using namespace vflow::rt;

FlowParams::FlowParams(std::string flowName, std::vector<ParamSpec> specs,
                       std::vector<BudgetExpr> budgetExprs,
                       std::vector<SelectionNode> selectionNodes,
                       int64_t groupSize)
    : flow(std::move(flowName)), params(std::move(specs)),
      budgets(std::move(budgetExprs)), selection(std::move(selectionNodes)),
      group(groupSize) {
  for (const ParamSpec &p : params) {
    current.push_back(p.value);
    names.push_back(p.name);
    compileTime.push_back(p.compileTime);
  }
  blockSizeIndex = indexOf("block_size");
  keepFirstIndex = indexOf("keep_first");
  keepLastIndex = indexOf("keep_last");
  if (blockSize() < 1)
    throw Error("flow '" + flow + "': block_size must be positive");
  checkBudgets();
}

int64_t FlowParams::indexOf(const std::string &name) const {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].name == name)
      return int64_t(i);
  throw Error("flow '" + flow + "' has no param '" + name + "'");
}

double FlowParams::get(const std::string &name) const {
  return current[size_t(indexOf(name))];
}

void FlowParams::set(const std::string &name, double value) {
  size_t i = size_t(indexOf(name));
  const ParamSpec &p = params[i];
  std::string where = "param '" + name + "' of flow '" + flow + "'";
  if (p.compileTime && value != current[i])
    throw Error(where +
                " is compile-time: the flow was specialized on it; "
                "recompile with -p " +
                name + "=...");
  if (!std::isfinite(value))
    throw Error(where + " must be a finite number");
  if (p.type == "int" && (value != std::floor(value) ||
                          std::fabs(value) > double(limits::kMaxExactInt)))
    throw Error(where + " is an int; " + std::to_string(value) +
                " is not an integer within 2^53");
  if (p.type == "bool" && value != 0 && value != 1)
    throw Error(where + " is a bool: use 0 or 1");
  if ((name == "keep_first" || name == "keep_last") && value < 0)
    throw Error(where + " must be a non-negative integer");
  double old = current[i];
  current[i] = value;
  try {
    checkBudgets();
  } catch (...) {
    current[i] = old;
    throw;
  }
}

int64_t FlowParams::budget(int64_t numBlocks, int64_t contextLen) const {
  return selectionBudget(selection, budgets, current.data(), numBlocks,
                         contextLen, group);
}

int64_t FlowParams::maxEntries(int64_t contextLen) const {
  const int64_t size = std::max<int64_t>(1, blockSize());
  const int64_t numBlocks = (contextLen + size - 1) / size;
  return std::min(numBlocks, budget(contextLen / size, contextLen) +
                                 keepFirst() + keepLast() + 1);
}

bool FlowParams::takesEveryBlock(int64_t contextLen) const {
  const int64_t complete = contextLen / std::max<int64_t>(1, blockSize());
  const vflow::rules::KeptBlocks kept{complete, keepFirst(), keepLast()};
  return selectionTakesAll(selection, budgets, current.data(), complete,
                           contextLen, group, kept.candidates());
}

void FlowParams::checkBudgets() const {
  vflow::rt::checkBudgets(budgets, current.data(), names, compileTime,
                          blockSize(), group, flow);
}

void FlowParams::checkBudgetsAt(int64_t contextLen) const {
  vflow::rt::checkBudgetsAt(budgets, current.data(), names, compileTime,
                            contextLen / std::max<int64_t>(1, blockSize()),
                            contextLen, group, flow);
}
