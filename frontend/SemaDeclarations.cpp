//===- SemaDeclarations.cpp - Declared names, axes, consts, states --------===//
//
// The declarations of a flow other than params and the stages: the names
// the language reserves, registration of every declared name (duplicates,
// reserved names), then axes, consts and states in order of declaration.
//
//===----------------------------------------------------------------------===//

#include "SemaImpl.h"
#include "vflow/Runtime/Limits.h"
#include "vflow/Runtime/Names.h"

using namespace vflow;
using namespace vflow::ast;
using namespace vflow::sema;

namespace vflow::sema {

const char *const kInputNames[] = {
    "K",           "V",    "q",     "mass",  "position", "num_blocks",
    "context_len", "step", "group", "layer", "kv_head",  "first_token"};
const char *const kBuiltinAxes[] = {"block", "head", "token", "dim"};

bool isInputName(const std::string &name) {
  for (const char *n : kInputNames)
    if (name == n)
      return true;
  return false;
}

bool isBuiltinAxis(const std::string &name) {
  for (const char *n : kBuiltinAxes)
    if (name == n)
      return true;
  return false;
}

const char *const kDeclaredKindNames[] = {"param", "axis", "const",
                                          "cache field", "state"};
static_assert(rt::coversEnum(kDeclaredKindNames, DeclaredKind::State),
              "one name per DeclaredKind");

const char *declaredKindName(DeclaredKind kind) {
  return rt::nameOf(kDeclaredKindNames, kind, "");
}

} // namespace vflow::sema

//===----------------------------------------------------------------------===//
// Registration
//===----------------------------------------------------------------------===//

/// The kind of the name a declaration declares; none for a cache block
/// (its fields declare theirs) and the index stage.
static std::optional<DeclaredKind> declaredKindOf(DeclKind kind) {
  static const std::pair<DeclKind, DeclaredKind> kinds[] = {
      {DeclKind::Param, DeclaredKind::Param},
      {DeclKind::Axis, DeclaredKind::Axis},
      {DeclKind::Const, DeclaredKind::Const},
      {DeclKind::CacheField, DeclaredKind::Field},
      {DeclKind::State, DeclaredKind::State}};
  for (auto [declKind, declared] : kinds)
    if (declKind == kind)
      return declared;
  return std::nullopt;
}

void FlowChecker::registerNames() {
  int index = 0;
  auto add = [&](const Ident &name, DeclaredKind kind) {
    if (name.name.empty())
      return;
    // What the language reserves the name for, if anything.
    const char *reservedAs =
        isInputName(name.name)     ? "a reserved input name"
        : isBuiltinAxis(name.name) ? "a builtin axis"
        : kind != DeclaredKind::Param && findReserved(name.name)
            ? "a reserved param"
            : nullptr;
    if (reservedAs) {
      diags.error(DiagCode::Redefinition, name.range,
                  "'" + name.name + "' is " + reservedAs +
                      " and cannot be declared as " +
                      withArticle(declaredKindName(kind)));
      return;
    }
    auto it = declared.find(name.name);
    if (it != declared.end()) {
      diags.error(DiagCode::Redefinition, name.range,
                  "redefinition of '" + name.name + "' as " +
                      withArticle(declaredKindName(kind)));
      diags.note(it->second.range,
                 "previous definition as " +
                     withArticle(declaredKindName(it->second.kind)) +
                     " is here");
      return;
    }
    declared[name.name] = {kind, name.range};
    declIndex[name.name] = index;
  };
  for (Decl &decl : flow.decls) {
    ++index;
    if (decl.kind == DeclKind::CacheBlock) {
      for (Stmt &stmt : decl.body)
        if (stmt.kind == StmtKind::Field)
          add(stmt.name, DeclaredKind::Field);
    } else if (std::optional<DeclaredKind> kind = declaredKindOf(decl.kind)) {
      add(decl.name, *kind);
    }
  }
}

//===----------------------------------------------------------------------===//
// Axes, consts, states
//===----------------------------------------------------------------------===//

void FlowChecker::checkAxes() {
  Scope scope(Stage::AxisSize);
  forEachDecl(DeclKind::Axis, [&](Decl &decl) {
    axesDone.insert(decl.name.name);
    ExprInfo value = analyze(*decl.value, scope);
    if (value.kind == ValueKind::Unknown)
      return;
    std::optional<int64_t> size = requirePositiveInt(
        *decl.value, "the size of axis '" + decl.name.name + "'",
        limits::kMaxAxisSize);
    if (!size)
      return;
    markCompileTime(*decl.value);
    if (!info.findAxis(decl.name.name))
      registerAxis(decl.name.name, *size, AxisOrigin::Declared,
                   decl.name.range);
  });
}

void FlowChecker::registerAxis(const std::string &name, int64_t size,
                               AxisOrigin origin, SourceRange range) {
  info.addAxis({name, size, origin, range});
}

int64_t FlowChecker::axisSize(const std::string &name) const {
  const AxisInfo *a = info.findAxis(name);
  return a ? a->size : 0;
}

void FlowChecker::checkConsts() {
  Scope scope(Stage::Const);
  forEachDecl(DeclKind::Const, [&](Decl &decl) {
    ExprInfo value = analyze(*decl.value, scope);
    constsDone.insert(decl.name.name);
    ConstInfo c;
    c.name = decl.name.name;
    c.range = decl.name.range;
    c.init = decl.value.get();
    if (value.kind == ValueKind::Tensor) {
      c.shape = value.shape;
      if (c.shape.has("block") || c.shape.has("head")) {
        diags.error(DiagCode::Axes, decl.value->range,
                    "const '" + c.name + "' cannot have axis '" +
                        (c.shape.has("block") ? "block" : "head") +
                        "': consts are the same for every sequence and head");
      }
      markCompileTime(*decl.value);
    } else if (value.kind != ValueKind::Unknown) {
      requireTensor(*decl.value, "the value of const '" + c.name + "'");
    }
    if (value.kind != ValueKind::Tensor)
      inError.insert(c.name);
    else
      countConstElements(c);
    info.addConst(c);
  });
}

void FlowChecker::countConstElements(const ConstInfo &c) {
  // D at the largest head dimension the artifact carries values for.
  const int64_t dim = std::end(limits::kConstValueHeadDims)[-1];
  int64_t n = 1;
  for (const Axis &a : c.shape.getAxes())
    n = limits::boundedProduct(n, a.size == kSizeHeadDim ? dim : a.size,
                               limits::kMaxConstElements);
  if (constElements < 0)
    return; // already reported
  constElements = n < 0 || constElements + n > limits::kMaxConstElements
                      ? -1
                      : constElements + n;
  if (constElements >= 0)
    return;
  const bool symbolic = c.shape.has("dim") && info.axes[3].size == kSizeHeadDim;
  diags.error(DiagCode::Limit, c.range,
              "const '" + c.name + "' (" + c.shape.str() +
                  ") takes the flow's consts past " +
                  describeLimit(limits::kMaxConstElements) +
                  " elements together" +
                  (symbolic ? " (D = " + std::to_string(dim) + ")" : "") +
                  "; the artifact carries every const's values (for each "
                  "head dimension a GPU session may use)");
}

std::optional<DType> FlowChecker::checkDType(const std::optional<Ident> &dtype,
                                             DType fallback) {
  if (!dtype)
    return fallback;
  std::optional<DType> parsed = parseDType(dtype->name);
  if (!parsed) {
    diags.error(DiagCode::StorageType, dtype->range,
                "unknown storage dtype '" + dtype->name +
                    "'; expected f32, bf16, f16, fp8e4m3 or "
                    "fp8e5m2");
    return std::nullopt;
  }
  if (*parsed == DType::INT8) {
    diags.error(DiagCode::StorageType, dtype->range,
                "int8 is a KV cache dtype (stored with a scale per token), "
                "not a storage dtype of fields and states; expected f32, "
                "bf16, f16, fp8e4m3 or fp8e5m2");
    return std::nullopt;
  }
  return parsed;
}

void FlowChecker::checkStates() {
  Scope scope(Stage::StateInit);
  for (Decl &decl : flow.decls) {
    if (decl.kind != DeclKind::State)
      continue;
    if (diags.shouldStop())
      return;
    unsigned errorsAtStart = diags.getNumErrors();
    StateInfo state;
    state.name = decl.name.name;
    state.range = decl.name.range;
    if (auto dtype = checkDType(decl.type, DType::F32))
      state.dtype = *dtype;
    if (decl.axes.size() > kMaxAxesPerValue) {
      diags.error(
          DiagCode::Limit, decl.name.range.merge(decl.axes.back().range),
          "state '" + state.name + "' has " + std::to_string(decl.axes.size()) +
              " axes; a value may have at most " +
              std::to_string(kMaxAxesPerValue));
      oversizedStates.insert(state.name);
    }
    for (size_t i = 0; i < decl.axes.size() && i < kMaxAxesPerValue; ++i) {
      const Ident &axis = decl.axes[i];
      const AxisInfo *a = info.findAxis(axis.name);
      if (!a) {
        diags.error(DiagCode::UnknownName, axis.range,
                    "unknown axis '" + axis.name + "'");
        if (auto close = closestName(axis.name, info.axisOrder()))
          diags.hint(SourceRange(), "did you mean '" + *close + "'?");
        continue;
      }
      if (axis.name == "token") {
        diags.error(DiagCode::Axes, axis.range,
                    "a state cannot have axis 'token': states "
                    "live per sequence or per block");
        continue;
      }
      if (state.shape.has(axis.name)) {
        diags.error(DiagCode::Axes, axis.range,
                    "axis '" + axis.name + "' appears twice in state '" +
                        state.name + "'");
        continue;
      }
      state.shape.insert({a->name, a->size}, axisRank);
    }
    SourceRange declared = decl.name.range;
    if (!decl.axes.empty())
      declared = declared.merge(decl.axes.back().range);
    if (!oversizedStates.count(state.name) &&
        !checkSize(state.shape, state.shape.has("block"), declared,
                   "state '" + state.name + "'"))
      oversizedStates.insert(state.name);
    ExprInfo value = analyze(*decl.value, scope);
    if (value.kind != ValueKind::Unknown) {
      if (std::optional<double> init = requireConst(
              *decl.value, "the initial value of state '" + state.name + "'"))
        state.init = *init;
      markCompileTime(*decl.value);
    }
    if (diags.getNumErrors() != errorsAtStart)
      inError.insert(state.name);
    info.addState(state);
  }
}
