//===- SemaEvaluation.cpp - Compile-time values and budgets ---------------===//
//
// The one scalar evaluator: compile-time values (literals and params) for
// the checker and the lowering, and budgets as the host evaluates them (with
// num_blocks, context_len and the lets they are read through).
//
//===----------------------------------------------------------------------===//

#include "SemaImpl.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

using namespace vflow;
using namespace vflow::ast;
using namespace vflow::sema;

namespace vflow::sema {

/// Calls `fn` on `root` and every node below it, and with `followLets` on
/// the values of the lets they read (each once). Iterative: a chain of lets
/// can be as long as the file.
void forEachNode(const Expr &root, bool followLets,
                 const std::function<void(const Expr &)> &fn) {
  std::vector<const Expr *> stack = {&root};
  std::unordered_set<const Expr *> seenLets;
  while (!stack.empty()) {
    const Expr *e = stack.back();
    stack.pop_back();
    fn(*e);
    if (auto *n = dyn_cast<NameExpr>(e)) {
      if (followLets && n->ref == NameRef::Let && n->binding &&
          seenLets.insert(n->binding).second)
        stack.push_back(n->binding);
    } else if (auto *u = dyn_cast<UnaryExpr>(e)) {
      stack.push_back(u->operand.get());
    } else if (auto *b = dyn_cast<BinaryExpr>(e)) {
      stack.push_back(b->rhs.get());
      stack.push_back(b->lhs.get());
    } else if (auto *c = dyn_cast<CallExpr>(e)) {
      for (auto it = c->args.rbegin(); it != c->args.rend(); ++it)
        if (it->value)
          stack.push_back(it->value.get());
    } else if (auto *l = dyn_cast<ListExpr>(e)) {
      for (auto it = l->elements.rbegin(); it != l->elements.rend(); ++it)
        stack.push_back(it->get());
    }
  }
}

/// The let-bound values `expr` reads, directly or through other lets, in
/// source order: each reads only lets before it.
std::vector<const Expr *> letsReadBy(const Expr &expr) {
  std::vector<const Expr *> lets;
  forEachNode(expr, true, [&](const Expr &e) {
    if (auto *n = dyn_cast<NameExpr>(&e))
      if (n->ref == NameRef::Let && n->binding)
        lets.push_back(n->binding);
  });
  std::sort(lets.begin(), lets.end(), [](const Expr *a, const Expr *b) {
    return a->range.begin < b->range.begin;
  });
  lets.erase(std::unique(lets.begin(), lets.end()), lets.end());
  return lets;
}

std::optional<double> ScalarEvaluator::eval(const Expr &expr) {
  switch (expr.kind) {
  case ExprKind::Number:
    return cast<NumberExpr>(expr).value;
  case ExprKind::Bool:
    return cast<BoolExpr>(expr).value ? 1.0 : 0.0;
  case ExprKind::Inf:
    return INFINITY;
  case ExprKind::Name: {
    auto &name = cast<NameExpr>(expr);
    if (name.ref == NameRef::Param)
      if (const ParamInfo *p = flow.findParam(name.name))
        return p->value;
    if (host && name.ref == NameRef::Input) {
      if (name.name == "num_blocks")
        return host->numBlocks;
      if (name.name == "context_len")
        return host->contextLen;
      if (name.name == "group")
        return host->group;
      if (name.name == "layer")
        return host->layer;
      if (name.name == "kv_head")
        return host->kvHead;
    }
    if (host && name.ref == NameRef::Let && name.binding) {
      auto it = letValues.find(name.binding);
      if (it != letValues.end())
        return it->second;
      std::optional<double> v = eval(*name.binding);
      letValues[name.binding] = v;
      return v;
    }
    return fail(expr);
  }
  case ExprKind::Unary: {
    auto &u = cast<UnaryExpr>(expr);
    auto v = eval(*u.operand);
    if (!v)
      return v;
    return u.op == UnaryOp::Neg ? -*v : (*v == 0 ? 1.0 : 0.0);
  }
  case ExprKind::Binary: {
    auto &b = cast<BinaryExpr>(expr);
    auto l = eval(*b.lhs);
    auto r = eval(*b.rhs);
    if (!l || !r)
      return std::nullopt;
    switch (b.op) {
    case BinaryOp::Add:
      return *l + *r;
    case BinaryOp::Sub:
      return *l - *r;
    case BinaryOp::Mul:
      return *l * *r;
    case BinaryOp::Div:
      return *l / *r;
    case BinaryOp::Lt:
      return double(*l < *r);
    case BinaryOp::Le:
      return double(*l <= *r);
    case BinaryOp::Gt:
      return double(*l > *r);
    case BinaryOp::Ge:
      return double(*l >= *r);
    case BinaryOp::Eq:
      return double(*l == *r);
    case BinaryOp::Ne:
      return double(*l != *r);
    case BinaryOp::And:
      return double(*l != 0 && *r != 0);
    case BinaryOp::Or:
      return double(*l != 0 || *r != 0);
    }
    return fail(expr);
  }
  case ExprKind::Call: {
    auto &call = cast<CallExpr>(expr);
    std::vector<double> args;
    for (const CallArg &a : call.args) {
      if (a.kind != CallArg::Kind::Positional)
        return fail(expr);
      auto v = eval(*a.value);
      if (!v)
        return std::nullopt;
      args.push_back(*v);
    }
    size_t want = call.builtin == Builtin::Maximum ||
                          call.builtin == Builtin::Minimum ||
                          call.builtin == Builtin::Pow
                      ? 2
                      : 1;
    if (args.size() != want)
      return fail(expr);
    switch (call.builtin) {
    case Builtin::Maximum:
      return std::max(args[0], args[1]);
    case Builtin::Minimum:
      return std::min(args[0], args[1]);
    case Builtin::Pow:
      return std::pow(args[0], args[1]);
    case Builtin::Sqrt:
      return std::sqrt(args[0]);
    case Builtin::Exp:
      return std::exp(args[0]);
    case Builtin::Log:
      return std::log(args[0]);
    case Builtin::Abs:
      return std::abs(args[0]);
    default:
      return fail(expr);
    }
  }
  default:
    return fail(expr);
  }
}

std::optional<double> evalScalar(const Expr &expr, const FlowInfo &flow,
                                 const HostValues *host,
                                 const Expr **offender) {
  ScalarEvaluator evaluator(flow, host, offender);
  if (!host)
    return evaluator.eval(expr);
  return evaluator.evalAfterLets(expr, letsReadBy(expr));
}

} // namespace vflow::sema

//===----------------------------------------------------------------------===//
// Compile-time evaluation
//===----------------------------------------------------------------------===//

std::optional<double> FlowChecker::constEval(const Expr &expr,
                                             const Expr **offender) {
  return evalScalar(expr, info, nullptr, offender);
}

std::optional<double> FlowChecker::requireConst(const Expr &expr,
                                                const std::string &role) {
  if (expr.info.kind == ValueKind::Unknown)
    return std::nullopt;
  if (expr.info.kind == ValueKind::List ||
      expr.info.kind == ValueKind::String ||
      expr.info.kind == ValueKind::Selection ||
      expr.info.kind == ValueKind::Axis) {
    diags.error(DiagCode::ValueKind, expr.range, role + " must be a number");
    return std::nullopt;
  }
  if (expr.info.kind == ValueKind::Tensor && !expr.info.shape.isScalar()) {
    diags.error(DiagCode::ValueKind, expr.range,
                role + " must be a number, but it has axes " +
                    expr.info.shape.str());
    return std::nullopt;
  }
  const Expr *offender = nullptr;
  std::optional<double> v = constEval(expr, &offender);
  if (!v) {
    diags.error(DiagCode::NotConstant, expr.range,
                role + " must be known at compile time (numbers "
                       "and params only)");
    if (offender && offender != &expr)
      diags.note(offender->range, "this is not a compile-time value");
    return std::nullopt;
  }
  if (std::isnan(*v)) {
    diags.error(DiagCode::NotConstant, expr.range,
                role + " is not a number (NaN)");
    return std::nullopt;
  }
  return v;
}

bool FlowChecker::requireConstArg(const CallArg &arg, Scope &scope,
                                  const std::string &role,
                                  bool (*valid)(double),
                                  const std::string &invalid) {
  analyze(*arg.value, scope);
  std::optional<double> v = requireConst(*arg.value, role);
  if (!v)
    return false;
  if (!valid(*v)) {
    diags.error(DiagCode::InvalidConstant, arg.value->range, invalid);
    return false;
  }
  return true;
}

std::optional<int64_t> FlowChecker::requirePositiveInt(const Expr &expr,
                                                       const std::string &role,
                                                       int64_t max) {
  std::optional<double> v = requireConst(expr, role);
  if (!v)
    return std::nullopt;
  if (*v != std::floor(*v) || *v < 1 || *v > double(max)) {
    diags.error(
        DiagCode::InvalidConstant, expr.range,
        role + " must be an integer between 1 and " + std::to_string(max) +
            ", but it is " + [&] {
              char buf[32];
              std::snprintf(buf, sizeof(buf), "%g", *v);
              return std::string(buf);
            }());
    return std::nullopt;
  }
  return static_cast<int64_t>(*v);
}

std::optional<double> vflow::evaluateConstant(const Expr &expr,
                                              const FlowInfo &flow) {
  return evalScalar(expr, flow, nullptr, nullptr);
}

std::optional<double>
vflow::evaluateBudgetValue(const Expr &expr, const FlowInfo &flow,
                           int64_t numBlocks, int64_t contextLen, int64_t group,
                           int64_t layer, int64_t kvHead) {
  HostValues host{double(numBlocks), double(contextLen), double(group),
                  double(layer), double(kvHead)};
  return evalScalar(expr, flow, &host, nullptr);
}

int64_t vflow::roundBudget(double value) {
  if (std::isnan(value) || value <= 0)
    return 0;
  if (value > 9.0e15)
    return int64_t(9.0e15);
  return static_cast<int64_t>(std::floor(value));
}

std::optional<int64_t> vflow::evaluateBudget(const Expr &expr,
                                             const FlowInfo &flow,
                                             int64_t numBlocks,
                                             int64_t contextLen, int64_t group,
                                             int64_t layer, int64_t kvHead) {
  std::optional<double> v = evaluateBudgetValue(
      expr, flow, numBlocks, contextLen, group, layer, kvHead);
  if (!v || std::isnan(*v))
    return std::nullopt;
  return roundBudget(*v);
}
