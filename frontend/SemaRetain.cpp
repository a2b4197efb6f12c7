//===- SemaRetain.cpp - The retain block
//-----------------------------------===//
//
// `retain(capacity [, combine = sum|max]) { lets; return score; }`: once a
// sequence holds more than `capacity` complete blocks, the runtime keeps
// the best of them by the score (combined over KV heads and flow layers)
// and evicts the rest (docs/language.md, docs/design/kv-memory.md). The
// block sees what the index stage sees, with the states as the index
// stage stored them; it makes no selection and stores nothing.
//
//===----------------------------------------------------------------------===//

#include "SemaImpl.h"

using namespace vflow;
using namespace vflow::ast;
using namespace vflow::sema;

void FlowChecker::checkRetain() {
  Decl *retain = onlyBlock(DeclKind::Retain, DiagCode::Retain, "retain");
  if (!retain || !info.index)
    return;
  info.retain = retain;
  if (retain->range.begin < info.index->range.begin) {
    diags.error(DiagCode::Retain, retain->keywordRange,
                "the retain block must come after the index block (it "
                "reads the states as the index stage stored them)");
    diags.note(info.index->keywordRange, "the index block is here");
    return;
  }
  Scope scope(Stage::Index);
  scope.retain = true;
  if (!checkRetainArgs(*retain, scope))
    return;
  const Stmt *returned = nullptr;
  for (Stmt &stmt : retain->body) {
    if (returned) {
      diags.error(DiagCode::Retain, stmt.range,
                  "statement after 'return' is never executed");
      diags.note(returned->range, "the retain block returns here");
      break;
    }
    if (stmt.kind == StmtKind::Let) {
      defineLet(stmt, scope);
    } else if (stmt.kind == StmtKind::Assign) {
      diags.error(DiagCode::Retain, stmt.range,
                  "a retain block cannot store states; store '" +
                      stmt.name.name + "' in the index block");
    } else if (stmt.kind == StmtKind::Return) {
      returned = &stmt;
      ExprInfo v = analyze(*stmt.value, scope);
      const size_t rank = v.shape.getAxes().size();
      const bool perBlock = rank == 1 && v.shape.has("block");
      const bool perToken =
          rank == 2 && v.shape.has("block") && v.shape.has("token");
      if (v.kind == ValueKind::Tensor && !perBlock && !perToken) {
        diags.error(DiagCode::Retain, stmt.value->range,
                    "a retain block returns a score with one value per "
                    "block, or per token ([block, token]); this is " +
                        describeValue(v.shape) +
                        (v.shape.has("block")
                             ? " (reduce the other axes, e.g. max(s, head))"
                             : ""));
      } else if (v.kind != ValueKind::Unknown) {
        requireTensor(*stmt.value, "the score of the retain block");
      }
      info.retainScore = stmt.value.get();
      info.retainTokens = perToken;
    }
    if (diags.shouldStop())
      return;
  }
  if (!returned)
    diags.error(DiagCode::Retain, retain->closeBrace,
                "the retain block does not return a score; end it with "
                "'return score;' (one value per block)");
}

/// `retain(capacity [, combine = sum|max])`: the capacity is a budget in
/// blocks, the same for every layer and KV head of a sequence.
bool FlowChecker::checkRetainArgs(Decl &retain, Scope &scope) {
  CallArg *capacity = nullptr;
  bool ok = true;
  for (CallArg &arg : retain.args) {
    if (arg.kind == CallArg::Kind::Positional && !capacity) {
      capacity = &arg;
    } else if (arg.kind == CallArg::Kind::Named && arg.name == "combine") {
      std::string how;
      if (auto *n = dyn_cast<NameExpr>(arg.value.get()))
        how = n->name;
      else if (auto *s = dyn_cast<StringExpr>(arg.value.get()))
        how = s->value;
      if (how != "sum" && how != "max") {
        diags.error(DiagCode::Retain, arg.value->range,
                    "combine must be sum or max (how the scores of KV heads "
                    "and layers add up)");
        ok = false;
      }
      info.retainCombine = how;
    } else {
      diags.error(DiagCode::Retain, arg.range,
                  "retain takes a capacity (blocks) and optionally "
                  "'combine = sum' or 'combine = max'");
      ok = false;
    }
  }
  if (!capacity) {
    diags.error(DiagCode::Retain, retain.keywordRange,
                "retain needs a capacity: retain(capacity) { ... }");
    return false;
  }
  ExprInfo v = analyze(*capacity->value, scope);
  if (v.kind == ValueKind::Unknown ||
      !requireBudget(*capacity->value, "the capacity of retain"))
    return false;
  // One capacity per sequence, fixed while it grows: not per layer or KV
  // head, and not a function of the length that eviction itself shrinks.
  const NameExpr *bad = nullptr;
  forEachNode(*capacity->value, true, [&](const Expr &e) {
    auto *n = dyn_cast<NameExpr>(&e);
    if (!bad && n && n->ref == NameRef::Input && n->name != "group")
      bad = n;
  });
  if (bad) {
    const std::string &name = bad->name;
    diags.error(DiagCode::Retain, bad->range,
                "the capacity of retain cannot read '" + name + "'");
    diags.note(capacity->value->range,
               name == "layer" || name == "kv_head"
                   ? "a sequence keeps the same blocks in every layer and KV "
                     "head: one capacity for all"
                   : "eviction shortens the sequence, so a capacity that "
                     "follows its length would shrink at every eviction; use "
                     "params, literals and group");
    return false;
  }
  info.retainCapacity = capacity->value.get();
  return ok;
}
