//===- SemaCalls.cpp - Builtin calls --------------------------------------===//
//
// The builtins by name, the shape of an argument list, and the analysis of
// a call: the stage rules of each family, elementwise math, reductions and
// the along-block ops (softmax, normalize, conv, kth_largest). Split and
// rename are in SemaShapes.cpp, literal data in SemaLiterals.cpp, selections
// in SemaSelections.cpp.
//
//===----------------------------------------------------------------------===//

#include "SemaImpl.h"

#include <algorithm>
#include <cstdint>

using namespace vflow;
using namespace vflow::ast;
using namespace vflow::sema;

namespace {

struct BuiltinEntry {
  const char *name;
  Builtin builtin;
};

const BuiltinEntry kBuiltins[] = {
    {"exp", Builtin::Exp},
    {"log", Builtin::Log},
    {"sqrt", Builtin::Sqrt},
    {"rsqrt", Builtin::Rsqrt},
    {"abs", Builtin::Abs},
    {"relu", Builtin::Relu},
    {"sigmoid", Builtin::Sigmoid},
    {"silu", Builtin::Silu},
    {"tanh", Builtin::Tanh},
    {"hash", Builtin::Hash},
    {"pow", Builtin::Pow},
    {"maximum", Builtin::Maximum},
    {"minimum", Builtin::Minimum},
    {"clamp", Builtin::Clamp},
    {"where", Builtin::Where},
    {"sum", Builtin::Sum},
    {"mean", Builtin::Mean},
    {"max", Builtin::Max},
    {"min", Builtin::Min},
    {"l2norm", Builtin::L2Norm},
    {"softmax", Builtin::Softmax},
    {"normalize", Builtin::Normalize},
    {"conv", Builtin::Conv},
    {"kth_largest", Builtin::KthLargest},
    {"split", Builtin::Split},
    {"rename", Builtin::Rename},
    {"rademacher", Builtin::Rademacher},
    {"gaussian", Builtin::Gaussian},
    {"tensor", Builtin::TensorLiteral},
    {"load", Builtin::Load},
    {"topk", Builtin::TopK},
    {"approx_topk", Builtin::ApproxTopK},
    {"threshold", Builtin::Threshold},
    {"topp", Builtin::TopP},
    {"union", Builtin::Union},
};

bool isUnaryMath(Builtin b) {
  switch (b) {
  case Builtin::Exp:
  case Builtin::Log:
  case Builtin::Sqrt:
  case Builtin::Rsqrt:
  case Builtin::Abs:
  case Builtin::Relu:
  case Builtin::Sigmoid:
  case Builtin::Silu:
  case Builtin::Tanh:
  case Builtin::Hash:
    return true;
  default:
    return false;
  }
}

bool isReduction(Builtin b) {
  return b == Builtin::Sum || b == Builtin::Mean || b == Builtin::Max ||
         b == Builtin::Min || b == Builtin::L2Norm;
}

bool isSelectionBuiltin(Builtin b) {
  return b == Builtin::TopK || b == Builtin::ApproxTopK ||
         b == Builtin::Threshold || b == Builtin::TopP || b == Builtin::Union;
}

bool isGenerator(Builtin b) {
  return b == Builtin::Rademacher || b == Builtin::Gaussian ||
         b == Builtin::TensorLiteral || b == Builtin::Load;
}

} // namespace

const std::vector<std::string> &vflow::builtinFunctionNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const BuiltinEntry &e : kBuiltins)
      out.push_back(e.name);
    return out;
  }();
  return names;
}

/// Checks the argument list shape: counts of positional arguments, allowed
/// named arguments (an empty name in `named` allows any one name: split's new
/// axis), no rename pairs unless the call is rename, positional before named.
bool FlowChecker::checkArgs(CallExpr &call, size_t minPositional,
                            size_t maxPositional,
                            const std::vector<std::string> &named) {
  size_t positional = 0;
  bool seenNamed = false, ok = true;
  std::set<std::string> seen;
  for (CallArg &arg : call.args) {
    if (arg.kind == CallArg::Kind::Rename) {
      if (call.builtin != Builtin::Rename) {
        diags.error(DiagCode::Arguments, arg.range,
                    "'a -> b' is only allowed in rename(...)");
        ok = false;
      }
      continue;
    }
    if (arg.kind == CallArg::Kind::Positional) {
      if (seenNamed) {
        diags.error(DiagCode::Arguments, arg.range,
                    "positional argument after a named argument in " +
                        call.callee + "(...)");
        ok = false;
      }
      ++positional;
      continue;
    }
    seenNamed = true;
    if (!seen.insert(arg.name).second) {
      diags.error(DiagCode::Arguments, arg.nameRange,
                  "argument '" + arg.name + "' is given twice");
      ok = false;
      continue;
    }
    bool allowed =
        std::find(named.begin(), named.end(), arg.name) != named.end() ||
        std::find(named.begin(), named.end(), "") != named.end();
    if (!allowed) {
      std::string expected;
      for (const std::string &n : named)
        expected += (expected.empty() ? "'" : ", '") + n + "'";
      diags.error(DiagCode::Arguments, arg.nameRange,
                  "unknown argument '" + arg.name + "' for " + call.callee +
                      (expected.empty() ? "; it takes no named arguments"
                                        : "; expected " + expected));
      ok = false;
    }
  }
  if (positional < minPositional || positional > maxPositional) {
    std::string want = minPositional == maxPositional
                           ? std::to_string(minPositional)
                       : maxPositional == SIZE_MAX
                           ? "at least " + std::to_string(minPositional)
                           : std::to_string(minPositional) + " to " +
                                 std::to_string(maxPositional);
    diags.error(DiagCode::Arguments, call.range,
                call.callee + " takes " + want + " positional argument" +
                    (want == "1" ? "" : "s") + ", but " +
                    std::to_string(positional) +
                    (positional == 1 ? " was" : " were") + " given");
    ok = false;
  }
  return ok;
}

ExprInfo FlowChecker::analyzeCall(CallExpr &call, Scope &scope) {
  call.builtin = Builtin::Unknown;
  for (const BuiltinEntry &entry : kBuiltins)
    if (call.callee == entry.name)
      call.builtin = entry.builtin;
  if (call.builtin == Builtin::Unknown) {
    diags.error(DiagCode::UnknownName, call.calleeRange,
                "unknown function '" + shortName(call.callee) + "'");
    if (auto close = closestName(call.callee, builtinFunctionNames()))
      diags.hint(SourceRange(), "did you mean '" + *close + "'?");
    return error();
  }
  Builtin b = call.builtin;

  // Stage rules for whole families of builtins.
  if (isGenerator(b) && scope.stage != Stage::Const) {
    diags.error(DiagCode::WrongStage, call.calleeRange,
                call.callee + "(...) makes a constant tensor and is "
                              "only allowed in a const declaration");
    return error();
  }
  bool blockOp = b == Builtin::Softmax || b == Builtin::Normalize ||
                 b == Builtin::Conv || b == Builtin::KthLargest;
  if (isSelectionBuiltin(b) && scope.retain) {
    diags.error(DiagCode::Retain, call.calleeRange,
                call.callee + "(...) makes a selection; a retain block "
                              "returns a [block] score and the runtime "
                              "keeps the capacity's best blocks");
    return error();
  }
  if ((blockOp || isSelectionBuiltin(b)) && scope.stage != Stage::Index) {
    diags.error(DiagCode::WrongStage, call.calleeRange,
                call.callee + "(...) works across blocks "
                              "and is only allowed in the "
                              "index stage");
    return error();
  }

  if (isSelectionBuiltin(b))
    return analyzeSelection(call, scope);
  if (isGenerator(b))
    return analyzeGenerator(call, scope);
  if (isReduction(b))
    return analyzeReduction(call, scope);
  if (blockOp)
    return analyzeBlockOp(call, scope);
  if (b == Builtin::Split)
    return analyzeSplit(call, scope);
  if (b == Builtin::Rename)
    return analyzeRename(call, scope);

  // Elementwise.
  size_t arity = isUnaryMath(b)                                 ? 1
                 : (b == Builtin::Clamp || b == Builtin::Where) ? 3
                                                                : 2;
  // maximum and minimum take two or more values.
  const bool nary = b == Builtin::Maximum || b == Builtin::Minimum;
  bool argsOk = checkArgs(call, arity, nary ? SIZE_MAX : arity, {});
  std::vector<const Expr *> operands;
  bool ok = argsOk;
  for (CallArg &arg : call.args) {
    if (!arg.value)
      continue;
    analyze(*arg.value, scope);
    if (!requireTensor(*arg.value, "an argument of " + call.callee))
      ok = false;
    operands.push_back(arg.value.get());
  }
  if (!ok)
    return error();
  std::optional<Shape> shape = broadcast(operands, call.range);
  if (!shape)
    return error();
  unsigned deps = 0;
  bool host = b == Builtin::Maximum || b == Builtin::Minimum;
  for (const Expr *e : operands) {
    deps |= e->info.deps;
    host &= e->info.hostEvaluable;
  }
  return tensor(*shape, deps, host);
}

ExprInfo FlowChecker::analyzeReduction(CallExpr &call, Scope &scope) {
  if (!checkArgs(call, 1, SIZE_MAX, {}))
    return error();
  // The value first: it may create axes (rename, split) that later
  // arguments name.
  Expr &value = *call.args[0].value;
  analyze(value, scope);

  // max(a, b) and min(a, b) of two values are the elementwise maximum and
  // minimum (how budgets write min(budget, num_blocks / 2)).
  if ((call.builtin == Builtin::Max || call.builtin == Builtin::Min) &&
      call.args.size() == 2) {
    auto *second = dyn_cast<NameExpr>(call.args[1].value.get());
    bool secondIsAxis =
        second && info.findAxis(second->name) && !scope.findLet(second->name);
    if (!secondIsAxis) {
      call.builtin =
          call.builtin == Builtin::Max ? Builtin::Maximum : Builtin::Minimum;
      Expr &other = *call.args[1].value;
      analyze(other, scope);
      bool ok = requireTensor(value, "an argument of " + call.callee);
      ok &= requireTensor(other, "an argument of " + call.callee);
      if (!ok)
        return error();
      std::optional<Shape> shape = broadcast({&value, &other}, call.range);
      if (!shape)
        return error();
      return tensor(*shape, value.info.deps | other.info.deps,
                    value.info.hostEvaluable && other.info.hostEvaluable);
    }
  }
  if (!requireTensor(value, "the value reduced by " + call.callee))
    return error();
  if (call.args.size() < 2) {
    diags.error(DiagCode::Reduction, call.range,
                call.callee +
                    "(x, axis, ...) needs the axes to reduce, "
                    "e.g. " +
                    call.callee + "(x, dim)");
    if (!value.info.shape.isScalar())
      diags.note(value.range, "the value has axes " + value.info.shape.str());
    return error();
  }
  Shape shape = value.info.shape;
  std::set<std::string> seen;
  for (size_t i = 1; i < call.args.size(); ++i) {
    std::string axis;
    if (!requireAxisOf(*call.args[i].value, value.info, value, axis)) {
      // max(a, b, c) of values: the elementwise form takes any number.
      auto *name = dyn_cast<NameExpr>(call.args[i].value.get());
      if ((call.builtin == Builtin::Max || call.builtin == Builtin::Min) &&
          !(name && info.findAxis(name->name)))
        diags.hint(call.calleeRange,
                   call.callee +
                       "(x, axis, ...) reduces over axes; for the "
                       "elementwise " +
                       (call.builtin == Builtin::Max ? "maximum" : "minimum") +
                       " of several values write " +
                       (call.builtin == Builtin::Max ? "maximum" : "minimum") +
                       "(a, b, c, ...)");
      return error();
    }
    if (!seen.insert(axis).second) {
      diags.error(DiagCode::Reduction, call.args[i].range,
                  "axis '" + axis + "' is reduced twice");
      return error();
    }
    shape.remove(axis);
  }
  return tensor(shape, value.info.deps, false);
}

ExprInfo FlowChecker::analyzeBlockOp(CallExpr &call, Scope &scope) {
  Builtin b = call.builtin;
  size_t positional = b == Builtin::Conv ? 3 : 2;
  std::vector<std::string> named;
  if (b == Builtin::Softmax)
    named.push_back("scale");
  if (!checkArgs(call, positional, positional, named))
    return error();
  Expr &value = *call.args[0].value;
  if (!analyzeTensor(value, scope, "the value of " + call.callee))
    return error();
  if (!value.info.shape.has("block")) {
    diags.error(DiagCode::Axes, value.range,
                call.callee +
                    "(...) works along 'block', but the value "
                    "has axes " +
                    value.info.shape.str());
    return error();
  }
  if (b == Builtin::KthLargest) {
    Expr &k = *call.args[1].value;
    analyze(k, scope);
    if (!requireBudget(k, "k of kth_largest"))
      return error();
    Shape shape = value.info.shape;
    shape.remove("block");
    return tensor(shape, value.info.deps, false);
  }
  auto *axis = dyn_cast<NameExpr>(call.args[1].value.get());
  if (!axis || axis->name != "block") {
    diags.error(
        DiagCode::Axes, call.args[1].range,
        call.callee + "(...) runs along 'block'; write " + call.callee +
            (b == Builtin::Conv ? "(x, block, [w0, w1, w2])" : "(x, block)"));
    return error();
  }
  axis->ref = NameRef::Axis;
  axis->info.kind = ValueKind::Axis;
  unsigned deps = value.info.deps;
  if (b == Builtin::Softmax) {
    if (const CallArg *scale = call.namedArg("scale")) {
      analyze(*scale->value, scope);
      if (!requireTensor(*scale->value, "the scale of softmax"))
        return error();
      if (!scale->value->info.shape.isScalar()) {
        diags.error(DiagCode::Axes, scale->value->range,
                    "the scale of softmax must be a scalar, but it has axes " +
                        scale->value->info.shape.str());
        return error();
      }
      deps |= scale->value->info.deps;
    }
  }
  if (b == Builtin::Conv) {
    Expr &weights = *call.args[2].value;
    analyze(weights, scope);
    auto *list = dyn_cast<ListExpr>(&weights);
    if (!list) {
      diags.error(DiagCode::InvalidConstant, weights.range,
                  "conv weights must be a list of numbers, e.g. [0.25, 0.5, "
                  "0.25]");
      return error();
    }
    if (list->elements.empty() || list->elements.size() % 2 == 0 ||
        list->elements.size() > 15) {
      diags.error(DiagCode::InvalidConstant, weights.range,
                  "conv needs an odd number of weights (1 to 15) so that it "
                  "is centered; got " +
                      std::to_string(list->elements.size()));
      return error();
    }
    for (const ExprPtr &w : list->elements) {
      if (!requireConst(*w, "a conv weight"))
        return error();
      markCompileTime(*w);
    }
  }
  return tensor(value.info.shape, deps, false);
}
