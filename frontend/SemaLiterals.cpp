//===- SemaLiterals.cpp - Constant tensors: random and literal data -------===//
//
// The generators allowed in const declarations: rademacher and gaussian
// over listed axes, tensor(...) of nested lists and load("file.npy", ...).
// Literal data is read here, checked against the listed axes and stored in
// FlowInfo::literals in the canonical axis order.
//
//===----------------------------------------------------------------------===//

#include "SemaImpl.h"
#include "vflow/Frontend/Npy.h"
#include "vflow/Runtime/Limits.h"

#include <algorithm>
#include <cmath>
#include <functional>

using namespace vflow;
using namespace vflow::ast;
using namespace vflow::sema;

Shape FlowChecker::axesFromList(const Expr &listExpr, bool &ok,
                                std::vector<std::string> *listed) {
  ok = false;
  auto *list = dyn_cast<ListExpr>(&listExpr);
  if (!list) {
    diags.error(DiagCode::Axes, listExpr.range,
                "expected a list of axes, e.g. [dim, m]");
    return Shape();
  }
  if (list->elements.size() > kMaxAxesPerValue) {
    diags.error(DiagCode::Limit, listExpr.range,
                "this list has " + std::to_string(list->elements.size()) +
                    " axes; a value may have at most " +
                    std::to_string(kMaxAxesPerValue));
    return Shape();
  }
  Shape shape;
  for (const ExprPtr &e : list->elements) {
    auto *name = dyn_cast<NameExpr>(e.get());
    if (!name || !info.findAxis(name->name)) {
      diags.error(DiagCode::UnknownName, e->range,
                  name ? "unknown axis '" + name->name + "'"
                       : std::string("expected an axis name"));
      if (name)
        if (auto close = closestName(name->name, info.axisOrder()))
          diags.hint(SourceRange(), "did you mean '" + *close + "'?");
      return Shape();
    }
    const AxisInfo *axis = info.findAxis(name->name);
    if (axis->origin == AxisOrigin::Declared && declaredLater(name->name)) {
      diags.error(DiagCode::UseBeforeDeclaration, e->range,
                  "axis '" + name->name + "' is used before its declaration");
      diags.note(axis->range, "axis '" + name->name + "' is declared here");
      return Shape();
    }
    if (name->name == "block" || name->name == "head") {
      diags.error(DiagCode::Axes, e->range,
                  "a const cannot have axis '" + name->name +
                      "': consts are the same for every sequence "
                      "and head");
      return Shape();
    }
    if (shape.has(name->name)) {
      diags.error(DiagCode::Axes, e->range,
                  "axis '" + name->name + "' is listed twice");
      return Shape();
    }
    name->ref = NameRef::Axis;
    name->info.kind = ValueKind::Axis;
    shape.insert({name->name, axisSize(name->name)}, axisRank);
    if (listed)
      listed->push_back(name->name);
  }
  ok = true;
  return shape;
}

ExprInfo FlowChecker::analyzeGenerator(CallExpr &call, Scope &scope) {
  if (call.builtin == Builtin::Rademacher || call.builtin == Builtin::Gaussian)
    return analyzeRandomTensor(call, scope);
  return analyzeLiteralData(call, scope);
}

/// rademacher([axes], seed = s) and gaussian([axes], seed = s).
ExprInfo FlowChecker::analyzeRandomTensor(CallExpr &call, Scope &scope) {
  if (!checkArgs(call, 1, 1, {"seed"}))
    return error();
  bool ok;
  Shape shape = axesFromList(*call.args[0].value, ok);
  if (!ok)
    return error();
  if (const CallArg *seed = call.namedArg("seed"))
    if (!requireConstArg(
            *seed, scope, "the seed",
            [](double s) {
              return s >= 0 && s == std::floor(s) && s <= 4294967295.0;
            },
            "the seed must be an integer between 0 and 2^32-1"))
      return error();
  return tensor(shape, DepNone, false);
}

namespace {

/// `rowMajor` (row-major in the `listed` order of axes with `sizes`) in the
/// canonical order `canon` of the same axes: walks the canonical index like
/// an odometer, moving the source offset by the listed stride of the axis
/// that steps (linear time).
std::vector<float> toCanonicalOrder(const std::vector<float> &rowMajor,
                                    const std::vector<std::string> &listed,
                                    const std::vector<int64_t> &sizes,
                                    const std::vector<std::string> &canon,
                                    int64_t count) {
  std::vector<int64_t> strides(listed.size(), 1);
  for (size_t i = listed.size(); i-- > 1;)
    strides[i - 1] = strides[i] * sizes[i];
  std::vector<int64_t> canonStride(canon.size()), canonSize(canon.size());
  for (size_t c = 0; c < canon.size(); ++c) {
    size_t l =
        std::find(listed.begin(), listed.end(), canon[c]) - listed.begin();
    canonStride[c] = strides[l];
    canonSize[c] = sizes[l];
  }
  std::vector<float> values(count);
  std::vector<int64_t> idx(canon.size(), 0);
  int64_t src = 0;
  for (int64_t linear = 0; linear < count; ++linear) {
    values[linear] = rowMajor[src];
    for (size_t c = canon.size(); c-- > 0;) {
      src += canonStride[c];
      if (++idx[c] < canonSize[c])
        break;
      src -= canonStride[c] * canonSize[c];
      idx[c] = 0;
    }
  }
  return values;
}

} // namespace

/// tensor([axes], values) and load("file.npy", [axes]).
ExprInfo FlowChecker::analyzeLiteralData(CallExpr &call, Scope &scope) {
  bool isLoad = call.builtin == Builtin::Load;
  if (!checkArgs(call, 2, 2, {}))
    return error();
  Expr &axesArg = isLoad ? *call.args[1].value : *call.args[0].value;
  Expr &dataArg = isLoad ? *call.args[0].value : *call.args[1].value;
  bool ok;
  std::vector<std::string> listed;
  Shape shape = axesFromList(axesArg, ok, &listed);
  if (!ok)
    return error();
  std::vector<int64_t> sizes;
  for (const std::string &name : listed) {
    int64_t size = axisSize(name);
    if (size < 0) {
      diags.error(DiagCode::ConstData, axesArg.range,
                  "axis '" + name + "' has size " + describeSize(size) +
                      ", known only when the flow is attached to a cache; "
                      "literal data needs fixed sizes" +
                      (name == "dim" ? " (fix it with 'param head_dim = "
                                       "...;')"
                                     : ""));
      return error();
    }
    sizes.push_back(size);
  }
  // The size model before anything is read or allocated.
  if (!checkSize(shape, false, call.range, "this value"))
    return error();
  int64_t count = 1;
  for (int64_t s : sizes)
    count *= s;
  if (count > limits::kMaxLiteralElements) {
    diags.error(DiagCode::Limit, call.range,
                "literal data of " + std::to_string(count) +
                    " elements is over the limit of " +
                    std::to_string(limits::kMaxLiteralElements) +
                    " (2^20): it is compiled into the flow's code as a "
                    "table");
    return error();
  }

  std::vector<float> rowMajor; // In listed axis order.
  LiteralData data;
  bool read = isLoad
                  ? readLoadedData(call, dataArg, sizes, rowMajor, data)
                  : flattenNestedLists(dataArg, scope, sizes, listed, rowMajor);
  if (!read)
    return error();
  std::vector<std::string> canon = shape.names();
  if (canon == listed || int64_t(rowMajor.size()) != count)
    data.values = std::move(rowMajor);
  else
    data.values = toCanonicalOrder(rowMajor, listed, sizes, canon, count);
  info.literals[&call] = std::move(data);
  return tensor(shape, DepNone, false);
}

/// load's file: its values (row-major in the listed order) must have the
/// listed axes' sizes.
bool FlowChecker::readLoadedData(CallExpr &call, const Expr &dataArg,
                                 const std::vector<int64_t> &sizes,
                                 std::vector<float> &rowMajor,
                                 LiteralData &data) {
  auto *file = dyn_cast<StringExpr>(&dataArg);
  if (!file) {
    diags.error(DiagCode::ConstData, dataArg.range,
                "load needs a file name string, e.g. "
                "load(\"mask.npy\", [dim])");
    return false;
  }
  std::string path = file->value;
  if (!path.empty() && path[0] != '/')
    path = options.baseDir + "/" + path;
  NpyArray array;
  std::string why;
  if (!readNpy(path, array, why)) {
    diags.error(DiagCode::ConstData, call.range,
                "cannot load const data: " + why);
    return false;
  }
  if (array.shape != sizes) {
    std::string have = "(", want = "(";
    for (size_t i = 0; i < array.shape.size(); ++i)
      have += (i ? ", " : "") + std::to_string(array.shape[i]);
    for (size_t i = 0; i < sizes.size(); ++i)
      want += (i ? ", " : "") + std::to_string(sizes[i]);
    diags.error(DiagCode::ConstData, call.range,
                "'" + file->value + "' has shape " + have +
                    ") but the axes need " + want + ")");
    return false;
  }
  rowMajor = std::move(array.values);
  data.source = file->value;
  return true;
}

/// tensor's values: nested lists, one level per listed axis, of
/// compile-time numbers.
bool FlowChecker::flattenNestedLists(Expr &dataArg, Scope &scope,
                                     const std::vector<int64_t> &sizes,
                                     const std::vector<std::string> &listed,
                                     std::vector<float> &rowMajor) {
  std::function<bool(const Expr &, size_t)> flatten = [&](const Expr &e,
                                                          size_t depth) {
    if (depth == sizes.size()) {
      std::optional<double> v = requireConst(e, "a tensor literal value");
      if (!v)
        return false;
      markCompileTime(e);
      rowMajor.push_back(static_cast<float>(*v));
      return true;
    }
    auto *list = dyn_cast<ListExpr>(&e);
    if (!list || list->elements.size() != size_t(sizes[depth])) {
      diags.error(DiagCode::ConstData, e.range,
                  "expected a list of " + std::to_string(sizes[depth]) +
                      " entries for axis '" + listed[depth] + "'");
      return false;
    }
    for (const ExprPtr &child : list->elements)
      if (!flatten(*child, depth + 1))
        return false;
    return true;
  };
  analyze(dataArg, scope);
  return flatten(dataArg, 0);
}
