//===- AST.cpp - The .vflow abstract syntax tree --------------------------===//

#include "vflow/Frontend/AST.h"
#include "vflow/Runtime/Names.h"

namespace vflow::ast {

namespace {

/// The source spelling of each operator, in the enum's order.
const char *const kUnaryOpSpellings[] = {"-", "not"};
static_assert(rt::coversEnum(kUnaryOpSpellings, UnaryOp::Not),
              "one spelling per UnaryOp");
const char *const kBinaryOpSpellings[] = {
    "+", "-", "*", "/", "<", "<=", ">", ">=", "==", "!=", "and", "or"};
static_assert(rt::coversEnum(kBinaryOpSpellings, BinaryOp::Or),
              "one spelling per BinaryOp");

} // namespace

const char *spelling(UnaryOp op) { return rt::nameOf(kUnaryOpSpellings, op); }

const char *spelling(BinaryOp op) { return rt::nameOf(kBinaryOpSpellings, op); }

std::optional<BinaryOp> binaryOpSpelled(std::string_view text) {
  return rt::enumNamed<BinaryOp>(kBinaryOpSpellings, text);
}

const CallArg *CallExpr::namedArg(const std::string &name) const {
  for (const CallArg &a : args)
    if (a.kind == CallArg::Kind::Named && a.name == name)
      return &a;
  return nullptr;
}

bool isComparison(BinaryOp op) {
  return op == BinaryOp::Lt || op == BinaryOp::Le || op == BinaryOp::Gt ||
         op == BinaryOp::Ge || op == BinaryOp::Eq || op == BinaryOp::Ne;
}

} // namespace vflow::ast
