//===- SemaStages.cpp - The cache and index stages ------------------------===//
//
// The statements of the stages: cache fields (per block, no token axis left)
// and the lets of cache blocks; the index block's lets, state stores and the
// returned selection; and the warning for cache fields the index never reads.
//
//===----------------------------------------------------------------------===//

#include "SemaImpl.h"

using namespace vflow;
using namespace vflow::ast;
using namespace vflow::sema;

namespace {

SourceRange declRangeOrNone(const std::map<std::string, Declared> &declared,
                            const std::string &name) {
  auto it = declared.find(name);
  return it == declared.end() ? SourceRange() : it->second.range;
}

} // namespace

//===----------------------------------------------------------------------===//
// The cache stage
//===----------------------------------------------------------------------===//

void FlowChecker::checkCache() {
  auto defineField = [&](const Ident &name, const std::optional<Ident> &dtype,
                         Expr &value, Scope &scope) {
    ExprInfo v = analyze(value, scope);
    FieldInfo field;
    field.name = name.name;
    field.range = name.range;
    field.value = &value;
    if (auto d = checkDType(dtype, DType::BF16))
      field.dtype = *d;
    if (v.kind == ValueKind::Tensor) {
      if (v.shape.has("token")) {
        diags.error(DiagCode::FieldShape, value.range,
                    "cache field '" + name.name +
                        "' still has axis 'token'; a field holds one value "
                        "per block, so reduce it (e.g. max(..., token))");
        diags.note(value.range, "the value has axes " + v.shape.str());
      }
      field.shape = v.shape;
      field.shape.remove("token");
    } else if (v.kind != ValueKind::Unknown) {
      requireTensor(value, "the value of cache field '" + name.name + "'");
    }
    if (v.kind != ValueKind::Tensor)
      inError.insert(name.name);
    scope.definedFields.insert(name.name);
    info.addField(field);
  };

  Scope scope(Stage::Cache);
  for (Decl &decl : flow.decls) {
    if (diags.shouldStop())
      return;
    if (decl.kind == DeclKind::CacheField) {
      collectUnusedLets(scope);
      scope.lets.clear();
      defineField(decl.name, decl.type, *decl.value, scope);
    } else if (decl.kind == DeclKind::CacheBlock) {
      // Lets are local to their cache block.
      collectUnusedLets(scope);
      scope.lets.clear();
      if (decl.body.empty())
        diags.warning(DiagCode::EmptyCache, decl.keywordRange,
                      "empty cache block");
      for (Stmt &stmt : decl.body) {
        if (diags.shouldStop())
          return;
        if (stmt.kind == StmtKind::Let) {
          defineLet(stmt, scope);
        } else {
          defineField(stmt.name, stmt.dtype, *stmt.value, scope);
        }
      }
    }
  }
  collectUnusedLets(scope);
}

void FlowChecker::collectUnusedLets(const Scope &scope) {
  // An unused tensor let may feed nothing and costs little once lowered;
  // an unused selection is a ranking computed for nothing.
  for (const auto &[name, let] : scope.lets)
    if (!let.used && let.value->info.kind == ValueKind::Selection)
      unusedLets.push_back({name, let.range});
}

/// `let NAME = VALUE;` in a cache or index block. A rejected name is still
/// bound, so later uses mean what the user meant instead of producing more
/// errors.
void FlowChecker::defineLet(Stmt &stmt, Scope &scope) {
  const std::string &name = stmt.name.name;
  ExprInfo v = analyze(*stmt.value, scope);
  bool selectionOk = scope.stage == Stage::Index;
  if (v.kind != ValueKind::Unknown && v.kind != ValueKind::Tensor &&
      !(selectionOk && v.kind == ValueKind::Selection))
    requireTensor(*stmt.value, "the value of '" + name + "'");
  if (isInputName(name)) {
    diags.error(DiagCode::Redefinition, stmt.name.range,
                "'" + name + "' is an input and cannot be redefined");
  } else if (isBuiltinAxis(name)) {
    diags.error(DiagCode::Redefinition, stmt.name.range,
                "'" + name + "' is a builtin axis and cannot name a value");
  } else if (findReserved(name) && !declared.count(name)) {
    diags.error(DiagCode::ParamDeclaration, stmt.name.range,
                "'" + name + "' is a reserved param and cannot be redefined");
  } else if (const LetBinding *prev = scope.findLet(name)) {
    diags.error(DiagCode::Redefinition, stmt.name.range,
                "redefinition of '" + name + "'");
    diags.note(prev->range, "previous definition is here");
  } else if (declared.count(name)) {
    diags.error(DiagCode::Redefinition, stmt.name.range,
                "'" + name + "' is already declared as " +
                    withArticle(declaredKindName(declared[name].kind)));
    diags.note(declared[name].range, "declared here");
  } else if (info.findAxis(name)) {
    diags.error(DiagCode::Redefinition, stmt.name.range,
                "'" + name + "' is an axis and cannot name a value");
  }
  scope.lets[name] = {name, stmt.name.range, stmt.value.get()};
}

//===----------------------------------------------------------------------===//
// The index stage
//===----------------------------------------------------------------------===//

/// `NAME = VALUE;` in the index block: NAME must be a state, stored once
/// per step, with a value of the state's axes.
void FlowChecker::checkStateStore(Stmt &stmt, Scope &scope) {
  const std::string &name = stmt.name.name;
  ExprInfo v = analyze(*stmt.value, scope);
  StateInfo *state = const_cast<StateInfo *>(info.findState(name));
  if (!state) {
    if (scope.findLet(name) || declared.count(name) || isInputName(name)) {
      std::string what =
          scope.findLet(name) ? "a let binding"
          : isInputName(name)
              ? "an input"
              : std::string("a ") + declaredKindName(declared[name].kind);
      diags.error(DiagCode::StateStore, stmt.name.range,
                  "cannot assign to '" + name + "', " + what +
                      "; only states can be stored (use 'let' for a new "
                      "value)");
    } else {
      diags.error(DiagCode::UnknownName, stmt.name.range,
                  "unknown state '" + name + "'");
      std::vector<std::string> names;
      for (const StateInfo &s : info.states)
        names.push_back(s.name);
      if (auto close = closestName(name, names))
        diags.hint(declRangeOrNone(declared, *close),
                   "did you mean '" + *close + "'?");
      else
        diags.hint(SourceRange(), "declare it with 'state " + name +
                                      "[block] = 0;' before assigning");
    }
    return;
  }
  auto prev = scope.storedStates.find(name);
  if (prev != scope.storedStates.end()) {
    diags.error(DiagCode::StateStore, stmt.name.range,
                "state '" + name + "' is stored twice in one step");
    diags.note(prev->second, "first stored here");
    return;
  }
  scope.storedStates[name] = stmt.range;
  state->stored = true;
  if (inError.count(name))
    return;
  if (v.kind == ValueKind::Tensor && v.shape != state->shape) {
    diags.error(DiagCode::StateStore, stmt.value->range,
                "the value stored to state '" + name + "' has axes " +
                    v.shape.str() + ", but the state has " +
                    state->shape.str());
    diags.note(state->range, "state '" + name + "' is declared here");
  } else if (v.kind != ValueKind::Unknown) {
    requireTensor(*stmt.value, "the value stored to state '" + name + "'");
  }
}

Decl *FlowChecker::onlyBlock(DeclKind kind, DiagCode code,
                             const std::string &what) {
  Decl *first = nullptr;
  for (Decl &decl : flow.decls) {
    if (decl.kind != kind)
      continue;
    if (first) {
      diags.error(code, decl.keywordRange,
                  "flow '" + info.name + "' has more than one " + what +
                      " block");
      diags.note(first->keywordRange, "the first " + what + " block is here");
      continue;
    }
    first = &decl;
  }
  return first;
}

void FlowChecker::checkIndex() {
  Decl *index = onlyBlock(DeclKind::Index, DiagCode::IndexReturn, "index");
  if (!index) {
    diags.error(DiagCode::IndexReturn, flow.name.range,
                "flow '" + info.name +
                    "' has no index block; add 'index { ... "
                    "return topk(score, k); }'");
    return;
  }
  info.index = index;

  Scope scope(Stage::Index);
  const Stmt *returned = nullptr;
  for (Stmt &stmt : index->body) {
    if (returned) {
      diags.error(DiagCode::IndexReturn, stmt.range,
                  "statement after 'return' is never executed");
      diags.note(returned->range, "the index block returns here");
      break;
    }
    switch (stmt.kind) {
    case StmtKind::Let:
      defineLet(stmt, scope);
      break;
    case StmtKind::Assign:
      checkStateStore(stmt, scope);
      break;
    case StmtKind::Return: {
      returned = &stmt;
      ExprInfo v = analyze(*stmt.value, scope);
      info.selection = stmt.value.get();
      if (v.kind == ValueKind::Tensor) {
        diags.error(DiagCode::IndexReturn, stmt.value->range,
                    "'return' needs a selection such as topk(score, k), "
                    "threshold(score, t) or union(...); this is " +
                        describeValue(v.shape));
      } else if (v.kind != ValueKind::Unknown &&
                 v.kind != ValueKind::Selection) {
        diags.error(DiagCode::IndexReturn, stmt.value->range,
                    "'return' needs a selection such as topk(score, k)");
      }
      break;
    }
    case StmtKind::Field:
      break;
    }
    if (diags.shouldStop())
      return;
  }
  if (!returned) {
    diags.error(DiagCode::IndexReturn, index->closeBrace,
                "index block of flow '" + info.name +
                    "' does not return a selection; end it with 'return "
                    "topk(score, k);'");
  }
  collectUnusedLets(scope);
  // Unused cache fields cost memory and bandwidth, unused selections
  // compute time (said only when the flow is otherwise fine: a misspelled read
  // would make it a false alarm).
  if (diags.hasErrors())
    return;
  std::sort(unusedLets.begin(), unusedLets.end(),
            [](const auto &a, const auto &b) {
              return a.second.begin < b.second.begin;
            });
  for (const auto &[name, range] : unusedLets)
    diags.warning(DiagCode::UnusedLet, range,
                  "selection '" + name +
                      "' is never used; remove it (it is still computed "
                      "every step) or combine it with union(...)");
  for (FieldInfo &field : info.fields)
    if (!field.readInIndex && declared.count(field.name) &&
        declared[field.name].range.begin == field.range.begin)
      diags.warning(DiagCode::UnreadField, field.range,
                    "cache field '" + field.name +
                        "' is never read in the index stage");
}
