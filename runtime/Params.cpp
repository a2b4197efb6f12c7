//===- Params.cpp - A flow's params at run time ---------------------------===//

#include "vflow/Runtime/Params.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Limits.h"
#include "vflow/Runtime/NumericRules.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

using namespace vflow::rt;

FlowParams::FlowParams(std::string flowName, std::vector<ParamSpec> specs,
                       std::vector<BudgetExpr> budgetExprs,
                       std::vector<SelectionNode> selectionNodes)
    : flow(std::move(flowName)), params(std::move(specs)),
      budgets(std::move(budgetExprs)), selection(std::move(selectionNodes)) {
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
                         contextLen);
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
                           contextLen, kept.candidates());
}

void FlowParams::checkBudgets() const {
  vflow::rt::checkBudgets(budgets, current.data(), names, compileTime,
                          blockSize(), flow);
}

void FlowParams::checkBudgetsAt(int64_t contextLen) const {
  vflow::rt::checkBudgetsAt(budgets, current.data(), names, compileTime,
                            contextLen / std::max<int64_t>(1, blockSize()),
                            contextLen, flow);
}

namespace {

bool isBlank(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' ||
         c == '\r';
}

std::string trimBlanks(const std::string &text) {
  size_t begin = 0, end = text.size();
  while (begin < end && isBlank(text[begin]))
    ++begin;
  while (end > begin && isBlank(text[end - 1]))
    --end;
  return text.substr(begin, end - begin);
}

} // namespace

bool vflow::rt::splitParamSpec(const std::string &text, std::string &name,
                               std::string &value, std::string &why) {
  size_t eq = text.find('=');
  if (eq == std::string::npos) {
    why = "expected NAME=VALUE or FLOW.NAME=VALUE, e.g. budget=32 or "
          "quest.budget=32";
    return false;
  }
  name = trimBlanks(text.substr(0, eq));
  value = trimBlanks(text.substr(eq + 1));
  return true;
}

bool vflow::rt::parseParamValue(const std::string &text, ParamValue &out,
                                std::string &why) {
  const std::string t = trimBlanks(text);
  if (t == "true" || t == "false") {
    out = {ParamValue::Kind::Bool, t == "true" ? 1.0 : 0.0};
    return true;
  }
  size_t i = t.empty() || (t[0] != '+' && t[0] != '-') ? 0 : 1;
  bool digits =
      i < t.size() && t.find_first_not_of("0123456789", i) == std::string::npos;
  if (digits) {
    // Exactly, while it fits: a double would round 2^53 + 1.
    int64_t magnitude = 0;
    bool exact = true;
    for (size_t j = i; j < t.size() && exact; ++j) {
      magnitude = magnitude * 10 + (t[j] - '0');
      exact = magnitude <= limits::kMaxExactInt;
    }
    if (exact) {
      out = {ParamValue::Kind::Int,
             double(t[0] == '-' ? -magnitude : magnitude)};
      return true;
    }
  }
  if (!t.empty() && t.find_first_of("xXpPiInN") == std::string::npos) {
    char *end = nullptr;
    errno = 0;
    double v = std::strtod(t.c_str(), &end);
    if (end == t.c_str() + t.size() && std::isfinite(v) && !isBlank(t[0])) {
      out = {ParamValue::Kind::Float, v};
      return true;
    }
    if (end == t.c_str() + t.size() && !std::isfinite(v)) {
      why = "'" + t + "' is out of range for a number";
      return false;
    }
  }
  why = "'" + t + "' is not a number, true or false";
  return false;
}
