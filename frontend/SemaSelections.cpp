//===- SemaSelections.cpp - Selections and their budgets ------------------===//
//
// topk, approx_topk, threshold, topp and union, and the budgets they take: a
// budget must be a scalar the host can compute, and not NaN or negative at
// any of a sample of sequence lengths for the params given.
//
//===----------------------------------------------------------------------===//

#include "SemaImpl.h"
#include "vflow/Runtime/Limits.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

using namespace vflow;
using namespace vflow::ast;
using namespace vflow::sema;

bool FlowChecker::requireBudget(Expr &expr, const std::string &role) {
  if (!requireTensor(expr, role))
    return false;
  if (!expr.info.shape.isScalar()) {
    diags.error(DiagCode::Axes, expr.range,
                role + " must be a scalar, but it has axes " +
                    expr.info.shape.str());
    return false;
  }
  if (expr.info.hostEvaluable)
    return checkBudgetValues(expr);
  diags.error(DiagCode::BudgetOnDevice, expr.range,
              role + " must be computable on the host, from literals, params, "
                     "num_blocks, context_len, group, layer and kv_head with "
                     "+ - * / min max");
  // Point at the first part that only the device knows, through lets: the
  // value behind an alias, not the alias (which `through` lists).
  std::vector<std::string> through;
  std::function<const Expr *(const Expr &)> culprit =
      [&](const Expr &e) -> const Expr * {
    if (e.info.hostEvaluable)
      return nullptr;
    if (auto *n = dyn_cast<NameExpr>(&e);
        n && n->ref == NameRef::Let && n->binding && through.size() < 16) {
      through.push_back(n->name);
      if (const Expr *c = culprit(*n->binding))
        return c;
      through.pop_back();
    }
    if (auto *b = dyn_cast<BinaryExpr>(&e)) {
      if (const Expr *c = culprit(*b->lhs))
        return c;
      if (const Expr *c = culprit(*b->rhs))
        return c;
    } else if (auto *u = dyn_cast<UnaryExpr>(&e)) {
      if (const Expr *c = culprit(*u->operand))
        return c;
    } else if (auto *call = dyn_cast<CallExpr>(&e)) {
      if (call->builtin == Builtin::Maximum ||
          call->builtin == Builtin::Minimum)
        for (const CallArg &a : call->args)
          if (a.value)
            if (const Expr *c = culprit(*a.value))
              return c;
    }
    return &e;
  };
  if (const Expr *c = culprit(expr)) {
    std::string what = "this";
    if (auto *n = dyn_cast<NameExpr>(c))
      what = "'" + n->name + "'";
    else if (auto *call = dyn_cast<CallExpr>(c))
      what = "'" + call->callee + "(...)'";
    std::string via;
    for (const std::string &name : through)
      via += (via.empty() ? " (through '" : "', '") + name;
    if (!via.empty())
      via += "')";
    diags.note(c->range, what +
                             (c->info.deps & DepDevice
                                  ? " is only known on the device"
                                  : " cannot be evaluated by the host") +
                             via);
    // A cut that depends on the scores is what threshold is for.
    if (c->info.deps & DepDevice)
      diags.hint(SourceRange(),
                 "for a cut that depends on device values use "
                 "threshold(score, t, max = k): t may be one, e.g. "
                 "threshold(s, mean(s, block), max = 64)");
  }
  return false;
}

namespace {

/// The params and host inputs a budget reads (through lets).
struct BudgetReads {
  bool numBlocks = false, contextLen = false, group = false, layer = false,
       kvHead = false;
  std::vector<const ParamInfo *> params;
};

BudgetReads collectBudgetReads(const Expr &expr, const FlowInfo &flow) {
  BudgetReads reads;
  forEachNode(expr, true, [&](const Expr &e) {
    auto *n = dyn_cast<NameExpr>(&e);
    if (!n)
      return;
    if (n->ref == NameRef::Input) {
      reads.numBlocks |= n->name == "num_blocks";
      reads.contextLen |= n->name == "context_len";
      reads.group |= n->name == "group";
      reads.layer |= n->name == "layer";
      reads.kvHead |= n->name == "kv_head";
    } else if (n->ref == NameRef::Param) {
      const ParamInfo *p = flow.findParam(n->name);
      if (p &&
          std::find(reads.params.begin(), reads.params.end(), p) ==
              reads.params.end() &&
          reads.params.size() < 8)
        reads.params.push_back(p);
    }
  });
  return reads;
}

std::string formatNumber(double v) {
  char buf[32];
  if (v == std::floor(v) && std::abs(v) < 1e17)
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  else
    std::snprintf(buf, sizeof(buf), "%.10g", v);
  return buf;
}

/// Source text on one line, shortened for a message.
std::string oneLine(const std::string &text) {
  std::string out = collapseWhitespace(text);
  return out.size() > 60 ? out.substr(0, 57) + "..." : out;
}

} // namespace

/// A budget must not be NaN or negative for the params given, at any of a
/// sample of sequence lengths: num_blocks in limits::budgetSampleBlocks()
/// ({0, 1, 2, 3, 4, 8, ..., 2^20}), context_len at both ends of each (the
/// host rounds the f64 value down), group in limits::budgetSampleGroups(),
/// layer and kv_head in limits::budgetSampleIndices() when the budget reads
/// them.
bool FlowChecker::checkBudgetValues(const Expr &expr) {
  BudgetReads reads = collectBudgetReads(expr, info);
  std::vector<const Expr *> lets = letsReadBy(expr);
  int64_t blockSize = info.blockSize();
  // The runtime checks the same samples when a param is set; a budget that
  // reads neither input has one value.
  std::vector<int64_t> blocks = {0};
  if (reads.numBlocks || reads.contextLen)
    blocks = limits::budgetSampleBlocks();
  std::vector<HostValues> samples;
  std::vector<int64_t> groups = {1}, layers = {0}, heads = {0};
  if (reads.group)
    groups = limits::budgetSampleGroups();
  if (reads.layer)
    layers = limits::budgetSampleIndices();
  if (reads.kvHead)
    heads = limits::budgetSampleIndices();
  for (int64_t l : layers)
    for (int64_t h : heads)
      for (int64_t g : groups)
        for (int64_t n : blocks) {
          samples.push_back({double(n), double(n * blockSize), double(g),
                             double(l), double(h)});
          if (reads.contextLen)
            samples.push_back({double(n), double(n * blockSize + blockSize - 1),
                               double(g), double(l), double(h)});
        }
  for (const HostValues &host : samples) {
    std::optional<double> v =
        ScalarEvaluator(info, &host, nullptr).evalAfterLets(expr, lets);
    if (!v || (!std::isnan(*v) && *v >= 0))
      continue;
    std::string at;
    auto add = [&](bool read, const char *name, double value) {
      if (read)
        at += (at.empty() ? "" : ", ") + std::string(name) + " = " +
              formatNumber(value);
    };
    add(reads.numBlocks, "num_blocks", host.numBlocks);
    add(reads.contextLen, "context_len", host.contextLen);
    add(reads.group, "group", host.group);
    add(reads.layer, "layer", host.layer);
    add(reads.kvHead, "kv_head", host.kvHead);
    std::string with;
    for (const ParamInfo *p : reads.params)
      with += (with.empty() ? "" : ", ") + p->name + " = " +
              formatNumber(p->value) + (p->overridden ? " (from -p)" : "");
    std::string text =
        diags.getBuffer() ? oneLine(diags.getBuffer()->getRangeText(expr.range))
                          : std::string("k");
    std::string message = "budget '" + text + "' is " +
                          (std::isnan(*v) ? std::string("NaN (not a number)")
                                          : formatNumber(*v)) +
                          (at.empty() ? "" : " at " + at) +
                          (with.empty() ? "" : " with " + with);
    diags.error(DiagCode::BudgetNegative, expr.range,
                message + (std::isnan(*v)
                               ? "; a budget must be a number >= 0"
                               : "; a budget must be >= 0: write max(0, "
                                 "...)"));
    return false;
  }
  return true;
}

/// topk(score, k, per = head): the union of each query head's own top k
/// (lowered as threshold(max(score - kth_largest(score, k), head), 0,
/// max = group * k)). The score is [block, head]; k a budget.
bool FlowChecker::analyzePerHeadTopK(CallExpr &call, const CallArg &per,
                                     Scope &scope) {
  ExprInfo axis = analyze(*per.value, scope);
  auto *name = dyn_cast<NameExpr>(per.value.get());
  if (axis.kind != ValueKind::Axis || !name || name->name != "head") {
    diags.error(DiagCode::SelectionScore, per.value->range,
                "per must be the axis head: topk(score, k, per = head) keeps "
                "each query head's own top k blocks");
    return false;
  }
  Expr &score = *call.args[0].value;
  const Shape &s = score.info.shape;
  if (s.getAxes().size() != 2 || !s.has("block") || !s.has("head")) {
    diags.error(DiagCode::SelectionScore, score.range,
                "the score of topk(..., per = head) must have exactly the "
                "axes [block, head], but " +
                    itHasAxes(s));
    return false;
  }
  Expr &k = *call.args[1].value;
  analyze(k, scope);
  return requireBudget(k, "the budget k of topk");
}

ExprInfo FlowChecker::analyzeSelection(CallExpr &call, Scope &scope) {
  ExprInfo out;
  out.kind = ValueKind::Selection;
  out.deps = DepDevice;
  Builtin b = call.builtin;
  if (b == Builtin::Union) {
    if (!checkArgs(call, 2, SIZE_MAX, {}))
      return error();
    bool ok = true;
    for (CallArg &arg : call.args) {
      ExprInfo v = analyze(*arg.value, scope);
      if (v.kind != ValueKind::Selection && v.kind != ValueKind::Unknown) {
        diags.error(DiagCode::ValueKind, arg.value->range,
                    "union combines selections such as topk(...), but this "
                    "is " +
                        std::string(v.kind == ValueKind::Tensor
                                        ? describeValue(v.shape)
                                        : "not a selection"));
        ok = false;
      }
      ok &= v.kind == ValueKind::Selection;
    }
    return ok ? out : error();
  }

  std::vector<std::string> named;
  if (b == Builtin::TopK)
    named = {"per"};
  if (b == Builtin::ApproxTopK)
    named = {"recall"};
  if (b == Builtin::Threshold || b == Builtin::TopP)
    named = {"max"};
  if (!checkArgs(call, 2, 2, named))
    return error();
  Expr &score = *call.args[0].value;
  if (!analyzeTensor(score, scope, "the score of " + call.callee))
    return error();
  const Shape &s = score.info.shape;
  if (const CallArg *per = call.namedArg("per"))
    return analyzePerHeadTopK(call, *per, scope) ? out : error();
  if (s.getAxes().size() != 1 || !s.has("block")) {
    diags.error(DiagCode::SelectionScore, score.range,
                "the score of " + call.callee +
                    " must have exactly the axes [block], but " + itHasAxes(s));
    std::string extra;
    for (const Axis &a : s.getAxes())
      if (a.name != "block")
        extra += (extra.empty() ? "" : ", ") + a.name;
    if (!extra.empty())
      diags.hint(score.range, "reduce " + extra + " first, e.g. max(score, " +
                                  s.getAxes().back().name + ")");
    // Selecting per query head is a different algorithm: say how to write
    // it (the union of each head's own top-k).
    if (s.getAxes().size() == 2 && s.has("block") && s.has("head") &&
        (call.callee == "topk" || call.callee == "approx_topk"))
      diags.hint(score.range,
                 "or keep each query head's own top k (their union, up to "
                 "k blocks per head): topk(score, k, per = head)");
    return error();
  }
  Expr &second = *call.args[1].value;
  analyze(second, scope);
  if (b == Builtin::Threshold || b == Builtin::TopP) {
    const std::string role =
        b == Builtin::TopP ? "the mass p of topp" : "the threshold";
    if (!requireTensor(second, role))
      return error();
    if (!second.info.shape.isScalar()) {
      diags.error(DiagCode::SelectionScore, second.range,
                  role +
                      " must be a scalar (one value per "
                      "sequence), but it has axes " +
                      second.info.shape.str());
      return error();
    }
    // A p known on the host must be a share of the mass; one computed on
    // the device follows the run-time rule (<= 0: none, >= 1: all).
    if (b == Builtin::TopP) {
      std::optional<double> p = constEval(second, nullptr);
      if (p && !(*p > 0 && *p <= 1)) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%g", *p);
        diags.error(DiagCode::InvalidConstant, second.range,
                    "the mass p of topp must be in (0, 1], "
                    "but it is " +
                        std::string(buf));
        diags.hint(second.range, "p is a share of the softmax mass over "
                                 "blocks, e.g. topp(s, 0.9, max = 64)");
        return error();
      }
    }
    if (const CallArg *max = call.namedArg("max")) {
      analyze(*max->value, scope);
      if (!requireBudget(*max->value, "the max of " + call.callee))
        return error();
    }
    return out;
  }
  if (!requireBudget(second, "the budget k of " + call.callee))
    return error();
  if (const CallArg *recall = call.namedArg("recall")) {
    if (!requireConstArg(
            *recall, scope, "the recall",
            [](double r) { return r > 0 && r <= 1; },
            "the recall of approx_topk must be in (0, 1]"))
      return error();
    markCompileTime(*recall->value);
  }
  return out;
}
