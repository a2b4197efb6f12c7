//===- SemaParams.cpp - Params: values, types, overrides ------------------===//
//
// Params are checked first: each value is computed at compile time, its type
// declared or inferred from the value, -p overrides applied as soon as the
// param is known (so params computed from it see the new value), and the
// reserved params a flow does not declare are added with their defaults.
//
//===----------------------------------------------------------------------===//

#include "SemaImpl.h"
#include "vflow/Runtime/Limits.h"
#include "vflow/Runtime/ParamText.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>

using namespace vflow;
using namespace vflow::ast;
using namespace vflow::sema;

namespace {

const ReservedParam kReservedParams[] = {
    {"block_size", 16, "tokens per block"},
    {"keep_first", 1, "first blocks always attended"},
    {"keep_last", 1, "last blocks always attended"},
    {"head_dim", 0, "head dimension the flow is specialized to (0: any)"},
};

} // namespace

namespace vflow::sema {

const ReservedParam *findReserved(const std::string &name) {
  for (const ReservedParam &r : kReservedParams)
    if (name == r.name)
      return &r;
  return nullptr;
}

/// Checks the value range of a reserved param; returns an error message or
/// an empty string.
std::string checkReservedValue(const std::string &name, double value) {
  if (name == "block_size") {
    int64_t v = static_cast<int64_t>(value);
    if (value != v || v < 1 || v > 1024 || (v & (v - 1)) != 0)
      return "block_size must be a power of two between 1 and 1024";
  } else if (name == "keep_first" || name == "keep_last") {
    if (value < 0 || value > 1e6 || value != std::floor(value))
      return name + " must be a non-negative integer";
  } else if (name == "head_dim") {
    if (value < 0 || value > 1024 || value != std::floor(value))
      return "head_dim must be 0 (any) or a positive integer up to 1024";
  }
  return "";
}

} // namespace vflow::sema

//===----------------------------------------------------------------------===//
// Params
//===----------------------------------------------------------------------===//

void FlowChecker::checkParams() {
  Scope scope(Stage::ParamValue);
  // Overrides apply as soon as a param is known, so params computed from it
  // see the overridden value.
  auto finish = [&](ParamInfo &param) { applyOverrides(info.addParam(param)); };
  forEachDecl(DeclKind::Param, [&](Decl &decl) {
    ParamInfo param;
    param.name = decl.name.name;
    param.range = decl.name.range;
    param.declared = true;
    const ReservedParam *reserved = findReserved(param.name);
    param.reserved = reserved != nullptr;

    ExprInfo value = analyze(*decl.value, scope);
    paramsDone.insert(param.name);
    if (value.kind == ValueKind::Unknown) {
      finish(param);
      return;
    }
    std::optional<double> v =
        requireConst(*decl.value, "the value of param '" + param.name + "'");
    if (!v) {
      finish(param);
      return;
    }
    param.value = *v;
    // A param computed from others is computed here, at compile time: the
    // params it reads are baked in.
    markCompileTime(*decl.value);
    // The type: declared, or inferred from the value.
    bool isBool = isa<BoolExpr>(decl.value.get());
    bool integral = *v == std::floor(*v);
    bool intLiteralOnly = true;
    std::function<void(const Expr &)> scan = [&](const Expr &e) {
      if (auto *n = dyn_cast<NumberExpr>(&e))
        intLiteralOnly &= n->isInteger;
      else if (auto *u = dyn_cast<UnaryExpr>(&e))
        scan(*u->operand);
      else if (auto *b = dyn_cast<BinaryExpr>(&e)) {
        scan(*b->lhs);
        scan(*b->rhs);
      } else if (auto *nm = dyn_cast<NameExpr>(&e)) {
        if (const ParamInfo *p = info.findParam(nm->name))
          intLiteralOnly &= p->type != ParamType::Float;
      } else if (!isa<BoolExpr>(&e)) {
        intLiteralOnly = false;
      }
    };
    scan(*decl.value);
    param.type = isBool                         ? ParamType::Bool
                 : (intLiteralOnly && integral) ? ParamType::Int
                                                : ParamType::Float;
    if (reserved && !decl.type)
      param.type = ParamType::Int;
    // An int beyond 2^53 is not exact in the f64 params are carried in.
    auto checkIntRange = [&](const char *why) {
      if (isExactInt(*v))
        return;
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.17g", *v);
      diags.error(DiagCode::ParamDeclaration, decl.value->range,
                  "the value of int param '" + param.name + "' is " + buf +
                      ", out of range: " + intRangeRule() + why);
    };
    if (!decl.type && !reserved && param.type == ParamType::Int)
      checkIntRange(" (it is an int because its value is computed from ints; "
                    "declare it ': float' if a float is meant)");
    if (decl.type) {
      const std::string &ty = decl.type->name;
      std::optional<ParamType> declared = paramTypeNamed(ty);
      if (!declared) {
        diags.error(DiagCode::ParamDeclaration, decl.type->range,
                    "unknown param type '" + ty +
                        "'; expected int, float or bool");
      } else if (*declared == ParamType::Int) {
        if (!integral)
          diags.error(DiagCode::ParamDeclaration, decl.value->range,
                      "param '" + param.name +
                          "' is declared int but its value is not an integer");
        else
          checkIntRange("");
      } else if (*declared == ParamType::Bool) {
        if (*v != 0 && *v != 1)
          diags.error(DiagCode::ParamDeclaration, decl.value->range,
                      "param '" + param.name +
                          "' is declared bool but its "
                          "value is not true or false");
      }
      if (declared)
        param.type = *declared;
    }
    if (reserved) {
      if (param.type != ParamType::Int)
        diags.error(DiagCode::ParamDeclaration,
                    decl.type ? decl.type->range : decl.name.range,
                    "reserved param '" + param.name + "' is an int");
      std::string msg = checkReservedValue(param.name, param.value);
      if (!msg.empty())
        diags.error(DiagCode::ParamDeclaration, decl.value->range, msg);
    }
    finish(param);
  });
  addReservedParams();
  for (ParamInfo &p : info.params)
    if (p.name == "block_size" || p.name == "head_dim")
      p.compileTime = true;
}

void FlowChecker::addReservedParams() {
  for (const ReservedParam &r : kReservedParams) {
    if (info.findParam(r.name))
      continue;
    ParamInfo param;
    param.name = r.name;
    param.type = ParamType::Int;
    param.value = r.defaultValue;
    param.reserved = true;
    applyOverrides(info.addParam(param));
  }
}

void FlowChecker::applyOverrides(ParamInfo &target) {
  for (const ParamOverride &ov : options.overrides) {
    std::string name = ov.name;
    size_t dot = name.find('.');
    if (dot != std::string::npos) {
      if (name.substr(0, dot) != info.name)
        continue;
      name = name.substr(dot + 1);
    }
    if (name != target.name)
      continue;
    ParamInfo *param = &target;
    usedOverrides.insert(ov.name);
    std::string where = "-p " + ov.name + "=" + ov.value;
    const std::string &text = ov.value;
    // The one syntax of a param value (rt::parseParamValue, as vflowc's and
    // the vflow CLI's -p read it), then what the param's type accepts: a
    // bool true, false, 1 or 0; an int an integer within 2^53 (1e3 too);
    // a float any number.
    rt::ParamValue parsed;
    std::string why;
    bool ok = rt::parseParamValue(text, parsed, why);
    const double value = parsed.value;
    if (ok && param->type == ParamType::Bool)
      ok = parsed.kind == rt::ParamValue::Kind::Bool ||
           (parsed.kind == rt::ParamValue::Kind::Int &&
            (value == 0 || value == 1));
    else if (ok && param->type == ParamType::Int) {
      ok = parsed.kind != rt::ParamValue::Kind::Bool &&
           value == std::floor(value);
      // Digits past 2^53 come back as a (rounded) float: out of range.
      const bool rounded = parsed.kind == rt::ParamValue::Kind::Float &&
                           std::fabs(value) >= double(limits::kMaxExactInt);
      if (ok && (rounded || !isExactInt(value))) {
        diags.error(DiagCode::ParamOverride, SourceRange(),
                    where + ": '" + shortName(text) +
                        "' is out of range for int param '" + name +
                        "' of flow '" + info.name + "': " + intRangeRule());
        if (param->declared)
          diags.note(param->range, "param '" + name + "' is declared here");
        continue;
      }
    } else if (ok)
      ok = parsed.kind != rt::ParamValue::Kind::Bool;
    if (!ok) {
      diags.error(DiagCode::ParamOverride, SourceRange(),
                  where + ": '" + text + "' is not a valid " +
                      paramTypeName(param->type) + " for param '" + name +
                      "' of flow '" + info.name + "'");
      if (param->declared)
        diags.note(param->range, "param '" + name + "' is declared here");
      continue;
    }
    if (param->reserved) {
      std::string msg = checkReservedValue(name, value);
      if (!msg.empty()) {
        diags.error(DiagCode::ParamOverride, SourceRange(), where + ": " + msg);
        continue;
      }
    }
    param->value = value;
    param->overridden = true;
  }
}

void FlowChecker::markCompileTime(const Expr &expr) {
  if (auto *n = dyn_cast<NameExpr>(&expr)) {
    if (n->ref == NameRef::Param)
      if (const ParamInfo *p = info.findParam(n->name))
        const_cast<ParamInfo *>(p)->compileTime = true;
    // A const's value is walked once, however many consts read it (a chain
    // of consts would otherwise be walked again from every link).
    if (n->ref == NameRef::Const)
      if (const ConstInfo *c = info.findConst(n->name))
        if (c->init && markedConsts.insert(c->init).second)
          markCompileTime(*c->init);
    return;
  }
  if (auto *u = dyn_cast<UnaryExpr>(&expr))
    return markCompileTime(*u->operand);
  if (auto *b = dyn_cast<BinaryExpr>(&expr)) {
    markCompileTime(*b->lhs);
    markCompileTime(*b->rhs);
    return;
  }
  if (auto *l = dyn_cast<ListExpr>(&expr)) {
    for (const ExprPtr &e : l->elements)
      markCompileTime(*e);
    return;
  }
  if (auto *c = dyn_cast<CallExpr>(&expr))
    for (const CallArg &a : c->args)
      if (a.value)
        markCompileTime(*a.value);
}
