//===- SemaShapes.cpp - Shapes, axes and the size model -------------------===//
//
// Named-axis shapes: the size model every value is held to, broadcasting by
// axis name, axis arguments, and the calls that make axes (split, rename).
//
//===----------------------------------------------------------------------===//

#include "SemaImpl.h"
#include "vflow/Runtime/Limits.h"

#include <cstdio>

using namespace vflow;
using namespace vflow::ast;
using namespace vflow::sema;

namespace vflow::sema {

/// "16777216 (2^24)", "2147483647 (2^31 - 1)".
std::string describeLimit(int64_t limit) {
  std::string out = std::to_string(limit);
  for (int p = 1; p < 63; ++p) {
    if (limit == (int64_t(1) << p))
      return out + " (2^" + std::to_string(p) + ")";
    if (limit == (int64_t(1) << p) - 1)
      return out + " (2^" + std::to_string(p) + " - 1)";
  }
  return out;
}

/// "a scalar" or "a tensor with axes [...]" (reads after "this is").
std::string describeValue(const Shape &shape) {
  return shape.isScalar() ? "a scalar" : "a tensor with axes " + shape.str();
}

/// "it is a scalar" or "it has axes [...]".
std::string itHasAxes(const Shape &shape) {
  return shape.isScalar() ? "it is a scalar" : "it has axes " + shape.str();
}

/// A size with its meaning when it is a symbol: "G (query heads per KV
/// head)".
std::string describeSize(int64_t size) {
  const char *meaning = size == kSizeBlocks    ? "the number of blocks"
                        : size == kSizeGroup   ? "query heads per KV head"
                        : size == kSizeHeadDim ? "the head dimension"
                                               : nullptr;
  std::string text = formatAxisSize(size);
  return meaning ? text + " (" + meaning + ")" : text;
}

} // namespace vflow::sema

/// The size model: a value may have at most limits::kMaxElements elements,
/// per block for values with the block axis (and the cache stage's), in all
/// otherwise; G and D (unless head_dim fixes it) count at their largest.
bool FlowChecker::checkSize(const Shape &shape, bool perBlock, SourceRange at,
                            const std::string &what) {
  if (shape.getAxes().size() > kMaxAxesPerValue) {
    diags.error(DiagCode::Limit, at,
                what + " has " + std::to_string(shape.getAxes().size()) +
                    " axes; a value may have at most " +
                    std::to_string(kMaxAxesPerValue));
    return false;
  }
  // Two products, overflow-safe: all axes with G and D at their largest
  // (N not counted), and the fixed-size axes alone.
  int64_t worst = 1, fixed = 1;
  bool usesG = false, usesD = false;
  for (const Axis &a : shape.getAxes()) {
    int64_t n = a.size;
    if (n == kSizeBlocks)
      continue;
    if (n == kSizeGroup) {
      n = limits::kMaxGroup;
      usesG = true;
    } else if (n == kSizeHeadDim) {
      n = limits::kMaxHeadDim;
      usesD = true;
    } else if (fixed >= 0) {
      fixed = limits::boundedProduct(fixed, n, limits::kMaxStaticElements);
    }
    if (worst >= 0)
      worst = limits::boundedProduct(worst, n, limits::kMaxElements);
  }
  if (worst >= 0 && fixed >= 0)
    return true;
  bool staticOnly = worst >= 0;
  // The count for the message: exact when it fits int64, else about.
  int64_t exact = 1;
  bool overflow = false;
  double approx = 1;
  for (const Axis &a : shape.getAxes()) {
    int64_t n = a.size == kSizeGroup     ? limits::kMaxGroup
                : a.size == kSizeHeadDim ? limits::kMaxHeadDim
                                         : a.size;
    if (a.size == kSizeBlocks || (staticOnly && a.size < 0))
      continue;
    approx *= double(n);
    overflow = overflow || __builtin_mul_overflow(exact, n, &exact);
  }
  std::string count;
  if (!overflow) {
    count = std::to_string(exact);
  } else {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "about %.3g", approx);
    count = buf;
  }
  const char *per = perBlock ? " per block" : "";
  if (staticOnly) {
    diags.error(DiagCode::Limit, at,
                what + " is too large: " + shape.str() + " has " + count +
                    " elements in its fixed-size axes" + per +
                    "; the limit is " +
                    describeLimit(limits::kMaxStaticElements) + per);
    return false;
  }
  std::string assumed;
  if (usesG || usesD)
    assumed =
        std::string(" with ") + (usesG ? "G = 64" : "") +
        (usesG && usesD ? " and " : "") + (usesD ? "D = 1024" : "") +
        (usesG && usesD ? " (their largest values)" : " (its largest value)");
  diags.error(DiagCode::Limit, at,
              what + " is too large: " + shape.str() + " is " + count +
                  " elements" + per + assumed + "; the limit is " +
                  describeLimit(limits::kMaxElements) + per);
  if (usesD)
    diags.note(SourceRange(), "'dim' has the head dimension D as its size; "
                              "set 'param head_dim = ...;' to specialize the "
                              "flow to one head dimension");
  return false;
}

std::optional<Shape>
FlowChecker::broadcast(const std::vector<const Expr *> &operands,
                       SourceRange at) {
  // The result shares an operand's axes when that operand has them all
  // (the usual case), so typing an expression copies no axes.
  Shape out;
  bool firstOperand = true;
  for (const Expr *e : operands) {
    const Shape &shape = e->info.shape;
    if (firstOperand) {
      out = shape;
      firstOperand = false;
      continue;
    }
    std::vector<const Axis *> missing;
    for (const Axis &a : shape.getAxes()) {
      const Axis *have = out.find(a.name);
      if (!have) {
        missing.push_back(&a);
        continue;
      }
      if (have->size == a.size)
        continue;
      const Expr *owner = nullptr;
      for (const Expr *o : operands) {
        if (o == e)
          break;
        if (o->info.shape.has(a.name)) {
          owner = o;
          break;
        }
      }
      diags.error(DiagCode::Axes, at,
                  "axis '" + a.name + "' has size " + describeSize(have->size) +
                      " on one side but " + describeSize(a.size) +
                      " on the other");
      if (owner)
        diags.note(owner->range,
                   "this operand has axes " + owner->info.shape.str());
      diags.note(e->range, "this operand has axes " + e->info.shape.str());
      return std::nullopt;
    }
    if (missing.empty())
      continue;
    if (out.getAxes().size() + missing.size() == shape.getAxes().size()) {
      out = shape;
      continue;
    }
    // A union made before is shared too (the cache keeps its operands
    // alive, so their identities stay unique).
    auto key = std::make_pair(out.identity(), shape.identity());
    auto cached = unionCache.find(key);
    if (cached != unionCache.end()) {
      out = cached->second.result;
      continue;
    }
    CachedUnion entry{out, shape, out};
    for (const Axis *a : missing)
      entry.result.insert(*a, axisRank);
    out = entry.result;
    unionCache.emplace(key, std::move(entry));
  }
  return out;
}

/// `arg` must be a bare axis name that `value` has.
bool FlowChecker::requireAxisOf(const Expr &arg, const ExprInfo &value,
                                const Expr &valueExpr, std::string &axisName) {
  auto *name = dyn_cast<NameExpr>(const_cast<Expr *>(&arg));
  if (!name) {
    diags.error(DiagCode::Axes, arg.range, "expected an axis name");
    return false;
  }
  axisName = name->name;
  name->ref = NameRef::Axis;
  name->info.kind = ValueKind::Axis;
  if (!info.findAxis(axisName)) {
    diags.error(DiagCode::UnknownName, arg.range,
                "unknown axis '" + shortName(axisName) + "'");
    if (auto close = closestName(axisName, info.axisOrder()))
      diags.hint(SourceRange(), "did you mean '" + *close + "'?");
    return false;
  }
  if (value.kind == ValueKind::Tensor && !value.shape.has(axisName)) {
    diags.error(DiagCode::Axes, arg.range,
                "the value has no axis '" + axisName + "'");
    diags.note(valueExpr.range, "the value has axes " + value.shape.str());
    return false;
  }
  return true;
}

bool FlowChecker::checkAxisCreation(const std::string &name, int64_t size,
                                    SourceRange range) {
  if (const AxisInfo *a = info.findAxis(name)) {
    if (a->size != size) {
      bool declaredAxis = a->origin == AxisOrigin::Declared;
      diags.error(DiagCode::Axes, range,
                  "axis '" + name + "' is " +
                      (declaredAxis ? "declared" : "made elsewhere") +
                      " with size " + formatAxisSize(a->size) +
                      ", but this makes it " + describeSize(size));
      diags.note(a->range, "axis '" + name + "' is " +
                               (declaredAxis ? "declared" : "first made") +
                               " here");
      return false;
    }
    return true;
  }
  if (declared.count(name)) {
    diags.error(DiagCode::Redefinition, range,
                "'" + name + "' is already " +
                    withArticle(declaredKindName(declared[name].kind)) +
                    " and cannot name an axis");
    return false;
  }
  registerAxis(name, size, AxisOrigin::Split, range);
  return true;
}

/// split(x, axis, outer = n): `axis` becomes axis / n and a new axis
/// `outer` of size n.
ExprInfo FlowChecker::analyzeSplit(CallExpr &call, Scope &scope) {
  if (!checkArgs(call, 2, 2, {""}))
    return error();
  const CallArg *outer = nullptr;
  for (const CallArg &a : call.args) {
    if (a.kind != CallArg::Kind::Named)
      continue;
    if (outer) {
      diags.error(DiagCode::Reshape, a.nameRange,
                  "split makes one new axis; '" + outer->name +
                      "' is already it");
      return error();
    }
    outer = &a;
  }
  if (!outer) {
    diags.error(DiagCode::Reshape, call.range,
                "split needs the new axis and its size, e.g. "
                "split(x, token, sub = 4)");
    return error();
  }
  Expr &value = *call.args[0].value;
  if (!analyzeTensor(value, scope, "the value of split"))
    return error();
  std::string axis;
  if (!requireAxisOf(*call.args[1].value, value.info, value, axis))
    return error();
  if (axis == "block") {
    diags.error(DiagCode::Reshape, call.args[1].range,
                "the 'block' axis cannot be split");
    diags.hint(SourceRange(),
               "a flow's blocks are its block_size param: a smaller "
               "'param block_size = ...;' gives finer blocks; split the "
               "tokens of a block instead: split(x, token, sub = 4)");
    return error();
  }
  int64_t size = value.info.shape.find(axis)->size;
  analyze(*outer->value, scope);
  std::optional<int64_t> factor = requirePositiveInt(
      *outer->value, "the size of split axis '" + outer->name + "'",
      limits::kMaxAxisSize);
  if (!factor)
    return error();
  markCompileTime(*outer->value);
  if (size < 0) {
    diags.error(
        DiagCode::Reshape, call.args[1].range,
        "axis '" + axis + "' has size " + describeSize(size) +
            ", known only when the flow is attached to a cache, so "
            "it cannot be split" +
            (axis == "dim" ? "; fix it with 'param head_dim = ...;'" : ""));
    return error();
  }
  if (size % *factor != 0) {
    diags.error(DiagCode::Reshape, outer->value->range,
                "cannot split axis '" + axis + "' of size " +
                    std::to_string(size) + " into " + std::to_string(*factor) +
                    " parts");
    return error();
  }
  if (isBuiltinAxis(outer->name) || value.info.shape.has(outer->name)) {
    diags.error(DiagCode::Reshape, outer->nameRange,
                "the new axis '" + outer->name +
                    "' already exists on the value");
    return error();
  }
  if (!checkAxisCreation(outer->name, *factor, outer->nameRange))
    return error();
  Shape shape = value.info.shape;
  shape.remove(axis);
  shape.insert({axis, size / *factor}, axisRank);
  shape.insert({outer->name, *factor}, axisRank);
  return tensor(shape, value.info.deps, false);
}

/// rename(x, a -> b, ...)
ExprInfo FlowChecker::analyzeRename(CallExpr &call, Scope &scope) {
  if (call.args.empty() || call.args[0].kind != CallArg::Kind::Positional) {
    diags.error(DiagCode::Reshape, call.range,
                "rename needs a value and pairs like 'm -> n'");
    return error();
  }
  Expr &value = *call.args[0].value;
  if (!analyzeTensor(value, scope, "the value of rename"))
    return error();
  if (call.args.size() < 2) {
    diags.error(DiagCode::Reshape, call.range,
                "rename needs at least one pair like 'm -> n'");
    return error();
  }
  Shape shape = value.info.shape;
  for (size_t i = 1; i < call.args.size(); ++i) {
    CallArg &arg = call.args[i];
    if (arg.kind != CallArg::Kind::Rename) {
      diags.error(DiagCode::Reshape, arg.range,
                  "expected a pair like 'm -> n'");
      return error();
    }
    if (!info.findAxis(arg.name)) {
      diags.error(DiagCode::UnknownName, arg.nameRange,
                  "unknown axis '" + arg.name + "'");
      return error();
    }
    const Axis *from = shape.find(arg.name);
    if (!from) {
      diags.error(DiagCode::Axes, arg.nameRange,
                  "the value has no axis '" + arg.name + "'");
      diags.note(value.range, "the value has axes " + shape.str());
      return error();
    }
    if (arg.name == "block" || arg.to == "block") {
      diags.error(DiagCode::Reshape, arg.range,
                  "the 'block' axis cannot be renamed");
      diags.hint(SourceRange(),
                 "'block' is the axis selections rank and the runtime pages "
                 "by, so every per-block value keeps it; to mix neighbouring "
                 "blocks use conv(x, block, [w0, w1, w2]), to compare a block "
                 "with all of them reduce over block (max(x, block), "
                 "softmax(x, block))");
      return error();
    }
    if (shape.has(arg.to)) {
      diags.error(DiagCode::Reshape, arg.toRange,
                  "the value already has an axis '" + arg.to + "'");
      return error();
    }
    int64_t size = from->size;
    if (isBuiltinAxis(arg.to) && axisSize(arg.to) != size) {
      diags.error(DiagCode::Axes, arg.toRange,
                  "axis '" + arg.to + "' has size " +
                      describeSize(axisSize(arg.to)) + ", but '" + arg.name +
                      "' has size " + describeSize(size));
      return error();
    }
    if (!isBuiltinAxis(arg.to) && !checkAxisCreation(arg.to, size, arg.toRange))
      return error();
    shape.remove(arg.name);
    shape.insert({arg.to, size}, axisRank);
  }
  return tensor(shape, value.info.deps, false);
}
