//===- SemaExpressions.cpp - The analysis of one expression ---------------===//
//
// Expressions are analyzed bottom-up into ExprInfo (kind, shape, what they
// depend on, whether the host can evaluate them): literals, names (lets,
// inputs, params, axes, consts, fields and states, each with its stage
// rules), unary and binary operators. Calls are in SemaCalls.cpp.
//
//===----------------------------------------------------------------------===//

#include "SemaImpl.h"
#include "vflow/Runtime/Names.h"

#include <map>

using namespace vflow;
using namespace vflow::ast;
using namespace vflow::sema;

namespace {

/// Each stage as messages name it ("... in <stage>").
const char *const kStageNames[] = {
    "a param's value", "an axis size",    "a state's initial value",
    "a const",         "the cache stage", "the index stage"};
static_assert(rt::coversEnum(kStageNames, Stage::Index), "one name per Stage");

const char *stageName(Stage stage) {
  return rt::nameOf(kStageNames, stage, "");
}

} // namespace

//===----------------------------------------------------------------------===//
// Expressions
//===----------------------------------------------------------------------===//

bool FlowChecker::analyzeTensor(Expr &expr, Scope &scope,
                                const std::string &role) {
  analyze(expr, scope);
  return requireTensor(expr, role);
}

bool FlowChecker::requireTensor(Expr &expr, const std::string &role) {
  switch (expr.info.kind) {
  case ValueKind::Tensor:
    return true;
  case ValueKind::Unknown:
    return false;
  case ValueKind::Axis:
    diags.error(DiagCode::ValueKind, expr.range,
                "'" + cast<NameExpr>(expr).name +
                    "' is an axis, not a value; " +
                    "axes appear only as arguments of reductions and shape "
                    "functions");
    diags.hint(expr.range, "reduce over it, e.g. sum(x, " +
                               cast<NameExpr>(expr).name + ") or mean(x, " +
                               cast<NameExpr>(expr).name +
                               "); its size is not a value (num_blocks is "
                               "the block count)");
    return false;
  case ValueKind::Selection:
    diags.error(DiagCode::ValueKind, expr.range,
                role + " must be a tensor, but this is a "
                       "selection; selections can only be "
                       "returned or combined with union");
    diags.hint(expr.range,
               "compute with the score the selection ranks instead, e.g. "
               "its kth_largest as a threshold value");
    return false;
  case ValueKind::String:
    diags.error(DiagCode::ValueKind, expr.range,
                "a string is only allowed as the file name of load(...)");
    return false;
  case ValueKind::List:
    diags.error(DiagCode::ValueKind, expr.range,
                "a list is only allowed as an argument of "
                "rademacher, gaussian, tensor, load or conv");
    return false;
  }
  return false;
}

std::vector<std::string> FlowChecker::visibleNames(const Scope &scope) {
  // The declared names are fixed once registered: listed once, not walked
  // again for every unknown name.
  if (declaredNames.size() != declared.size()) {
    declaredNames.clear();
    for (const auto &entry : declared)
      declaredNames.push_back(entry.first);
  }
  std::vector<std::string> names = declaredNames;
  for (const auto &let : scope.lets)
    names.push_back(let.first);
  for (const char *n : kInputNames)
    names.push_back(n);
  for (const AxisInfo &a : info.axes)
    names.push_back(a.name);
  return names;
}

void FlowChecker::unknownName(const std::string &name, SourceRange range,
                              const Scope &scope) {
  auto it = declared.find(name);
  if (it != declared.end() && currentDecl >= 0 && declIndex.count(name) &&
      declIndex.at(name) == currentDecl) {
    diags.error(DiagCode::UseBeforeDeclaration, range,
                "'" + name + "' is used in its own declaration");
    return;
  }
  if (it != declared.end()) {
    diags.error(DiagCode::UseBeforeDeclaration, range,
                "'" + name + "' is used before its declaration");
    diags.note(it->second.range,
               std::string(declaredKindName(it->second.kind)) + " '" + name +
                   "' is declared here");
    return;
  }
  diags.error(DiagCode::UnknownName, range,
              "unknown name '" + shortName(name) + "'");
  // The letters the messages use for axis sizes are not values.
  static const std::map<std::string, const char *> sizes = {
      {"G", "the query heads of a KV head (the 'head' axis): its count is "
            "the input 'group'; mean(x, head) averages over them"},
      {"D", "the head dimension (the 'dim' axis): mean(x, dim) averages "
            "over it; 'param head_dim = 128;' fixes it at compile time"},
      {"N", "the blocks (the 'block' axis): the count is num_blocks"},
      {"P", "the block size: the param block_size"},
      {"H", "the KV heads: a flow runs per KV head and never sees their "
            "count; the input 'kv_head' is the one it runs for"}};
  if (auto it = sizes.find(name); it != sizes.end()) {
    diags.note(range, "'" + name + "' is a size in messages, not a value: " +
                          it->second);
    return;
  }
  // Inputs agents ask for that the language spells another way
  // (docs/design/language-round2.md): what to write instead.
  static const std::map<std::string, const char *> spelled = {
      {"selected",
       "the blocks the previous step attended are 'max(mass, head) > 0' "
       "(examples/sticky_quest.vflow)"}};
  if (auto it = spelled.find(name); it != spelled.end()) {
    diags.note(range, "'" + name + "' is not an input: " + it->second);
    return;
  }
  if (auto close = closestName(name, visibleNames(scope))) {
    SourceRange at;
    auto d = declared.find(*close);
    if (d != declared.end())
      at = d->second.range;
    else if (const LetBinding *let = scope.findLet(*close))
      at = let->range;
    diags.hint(at, "did you mean '" + *close + "'?");
  }
}

ExprInfo FlowChecker::analyze(Expr &expr, Scope &scope) {
  ExprInfo result = analyzeKind(expr, scope);
  // The size model: every value the checker types, intermediates included.
  if (result.kind == ValueKind::Tensor &&
      !checkSize(result.shape,
                 scope.stage == Stage::Cache || result.shape.has("block"),
                 expr.range, "this value"))
    result = error();
  // A rejected expression must come with an error somewhere (its own, or the
  // one of the declaration it refers to); never fail silently.
  if (result.kind == ValueKind::Unknown && !diags.hasErrors())
    diags.error(DiagCode::Internal, expr.range,
                "internal error: this expression could not be "
                "analyzed (please report it)");
  expr.info = result;
  return result;
}

ExprInfo FlowChecker::analyzeKind(Expr &expr, Scope &scope) {
  ExprInfo result;
  switch (expr.kind) {
  case ExprKind::Number:
  case ExprKind::Bool:
  case ExprKind::Inf:
    result = tensor(Shape(), DepNone, true);
    break;
  case ExprKind::String:
    result.kind = ValueKind::String;
    break;
  case ExprKind::List:
    result.kind = ValueKind::List;
    for (ExprPtr &e : cast<ListExpr>(expr).elements)
      analyze(*e, scope);
    break;
  case ExprKind::Name:
    result = analyzeName(cast<NameExpr>(expr), scope);
    break;
  case ExprKind::Unary:
    result = analyzeUnary(cast<UnaryExpr>(expr), scope);
    break;
  case ExprKind::Binary:
    result = analyzeBinary(cast<BinaryExpr>(expr), scope);
    break;
  case ExprKind::Call:
    result = analyzeCall(cast<CallExpr>(expr), scope);
    break;
  }
  return result;
}

/// K, V, q, mass, position, num_blocks, context_len, step and group: only the
/// stages see them, and the cache stage only K and V.
ExprInfo FlowChecker::analyzeInput(NameExpr &expr, Stage stage) {
  const std::string &name = expr.name;
  bool inStage = stage == Stage::Cache || stage == Stage::Index;
  expr.ref = NameRef::Input;
  if (!inStage) {
    diags.error(DiagCode::WrongStage, expr.range,
                "input '" + name + "' cannot be used in " + stageName(stage) +
                    ", which is computed before any sequence "
                    "exists");
    return error();
  }
  auto axis = [&](const char *n) { return Axis{n, axisSize(n)}; };
  if (name == "K" || name == "V") {
    Shape shape;
    if (stage == Stage::Index)
      shape.insert(axis("block"), axisRank);
    shape.insert(axis("token"), axisRank);
    shape.insert(axis("dim"), axisRank);
    return tensor(shape, DepDevice, false);
  }
  if (stage == Stage::Cache) {
    diags.error(DiagCode::WrongStage, expr.range,
                "'" + name +
                    "' is an index-stage input and cannot be "
                    "used in the cache stage");
    diags.note(expr.range, "the cache stage sees only one block's K and V, "
                           "consts and params");
    return error();
  }
  if (name == "q")
    return tensor(Shape({axis("head"), axis("dim")}), DepDevice, false);
  if (name == "mass")
    return tensor(Shape({axis("block"), axis("head")}), DepDevice, false);
  if (name == "position" || name == "first_token")
    return tensor(Shape({axis("block")}), DepDevice, false);
  // num_blocks, context_len, step: per-sequence scalars the host knows;
  // group: the session's query heads per KV head; layer and kv_head: the
  // model's indices of the layer and KV head the stage runs for.
  bool budgetInput = name == "num_blocks" || name == "context_len" ||
                     name == "group" || name == "layer" || name == "kv_head";
  return tensor(Shape(), DepHostInput, budgetInput);
}

ExprInfo FlowChecker::analyzeName(NameExpr &expr, Scope &scope) {
  const std::string &name = expr.name;
  Stage stage = scope.stage;

  if (const LetBinding *let = scope.findLet(name)) {
    expr.ref = NameRef::Let;
    expr.binding = let->value;
    let->used = true;
    return let->value->info;
  }

  if (isInputName(name))
    return analyzeInput(expr, stage);

  if (const ParamInfo *param = info.findParam(name)) {
    if (param->declared && !paramsDone.count(name) &&
        stage == Stage::ParamValue) {
      unknownName(name, expr.range, scope);
      return error();
    }
    expr.ref = NameRef::Param;
    return tensor(Shape(), DepParam, true);
  }

  auto decl = declared.find(name);
  DeclaredKind kind =
      decl != declared.end() ? decl->second.kind : DeclaredKind::Param;
  if (inError.count(name) &&
      (kind == DeclaredKind::Field || kind == DeclaredKind::Const))
    return error();

  if (const AxisInfo *axis = info.findAxis(name)) {
    if (axis->origin == AxisOrigin::Declared && declaredLater(name)) {
      unknownName(name, expr.range, scope);
      return error();
    }
    if (axis->origin != AxisOrigin::Declared || axesDone.count(name)) {
      expr.ref = NameRef::Axis;
      ExprInfo out;
      out.kind = ValueKind::Axis;
      return out;
    }
  }
  if (decl != declared.end() && kind == DeclaredKind::Axis) {
    unknownName(name, expr.range, scope);
    return error();
  }

  if (decl != declared.end() && kind == DeclaredKind::Const) {
    const ConstInfo *c = info.findConst(name);
    if (!c || !constsDone.count(name)) {
      unknownName(name, expr.range, scope);
      return error();
    }
    expr.ref = NameRef::Const;
    return tensor(c->shape, DepNone, false);
  }

  if (decl != declared.end() && kind == DeclaredKind::Field) {
    if (stage == Stage::Index) {
      if (auto *f = const_cast<FieldInfo *>(info.findField(name))) {
        f->readInIndex = true;
        expr.ref = NameRef::CacheField;
        // One shape per field, shared by all its reads.
        auto cached = fieldReadShapes.find(name);
        if (cached == fieldReadShapes.end()) {
          Shape shape = f->shape;
          shape.insert({"block", kSizeBlocks}, axisRank);
          cached = fieldReadShapes.emplace(name, shape).first;
        }
        return tensor(cached->second, DepDevice, false);
      }
      return error(); // The field itself was in error.
    }
    if (stage == Stage::Cache) {
      if (!scope.definedFields.count(name)) {
        unknownName(name, expr.range, scope);
        return error();
      }
      expr.ref = NameRef::CacheField;
      const FieldInfo *f = info.findField(name);
      return tensor(f ? f->shape : Shape(), DepDevice, false);
    }
    diags.error(DiagCode::WrongStage, expr.range,
                "cache field '" + name + "' cannot be used in " +
                    stageName(stage));
    return error();
  }

  if (decl != declared.end() && kind == DeclaredKind::State) {
    if (stage != Stage::Index) {
      diags.error(DiagCode::WrongStage, expr.range,
                  "state '" + name + "' can only be used in the index stage");
      diags.note(decl->second.range, "state '" + name + "' is declared here");
      return error();
    }
    const StateInfo *s = info.findState(name);
    if (!s || oversizedStates.count(name))
      return error();
    expr.ref = NameRef::State;
    return tensor(s->shape, DepDevice, false);
  }

  unknownName(name, expr.range, scope);
  return error();
}

ExprInfo FlowChecker::analyzeUnary(UnaryExpr &expr, Scope &scope) {
  analyze(*expr.operand, scope);
  if (!requireTensor(*expr.operand,
                     std::string("the operand of '") + spelling(expr.op) + "'"))
    return error();
  const ExprInfo &in = expr.operand->info;
  return tensor(in.shape, in.deps, expr.op == UnaryOp::Neg && in.hostEvaluable);
}

ExprInfo FlowChecker::analyzeBinary(BinaryExpr &expr, Scope &scope) {
  analyze(*expr.lhs, scope);
  analyze(*expr.rhs, scope);
  std::string role = std::string("operand of '") + spelling(expr.op) + "'";
  bool ok = requireTensor(*expr.lhs, "the left " + role);
  ok &= requireTensor(*expr.rhs, "the right " + role);
  if (!ok)
    return error();
  if (isComparison(expr.op)) {
    auto *l = dyn_cast<BinaryExpr>(expr.lhs.get());
    if (l && isComparison(l->op) && !l->parenthesized) {
      diags.error(DiagCode::Syntax, expr.opRange,
                  "comparisons cannot be chained; write 'a < b and b < c'");
      return error();
    }
  }
  std::optional<Shape> shape =
      broadcast({expr.lhs.get(), expr.rhs.get()}, expr.opRange);
  if (!shape)
    return error();
  bool arith = expr.op == BinaryOp::Add || expr.op == BinaryOp::Sub ||
               expr.op == BinaryOp::Mul || expr.op == BinaryOp::Div;
  bool host =
      arith && expr.lhs->info.hostEvaluable && expr.rhs->info.hostEvaluable;
  return tensor(*shape, expr.lhs->info.deps | expr.rhs->info.deps, host);
}
