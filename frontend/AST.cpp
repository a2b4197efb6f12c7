//===- AST.cpp - The .vflow abstract syntax tree --------------------------===//

#include "vflow/Frontend/AST.h"

namespace vflow::ast {

const char *spelling(UnaryOp op) { return op == UnaryOp::Neg ? "-" : "not"; }

const CallArg *CallExpr::namedArg(const std::string &name) const {
  for (const CallArg &a : args)
    if (a.kind == CallArg::Kind::Named && a.name == name)
      return &a;
  return nullptr;
}

const char *spelling(BinaryOp op) {
  switch (op) {
  case BinaryOp::Add:
    return "+";
  case BinaryOp::Sub:
    return "-";
  case BinaryOp::Mul:
    return "*";
  case BinaryOp::Div:
    return "/";
  case BinaryOp::Lt:
    return "<";
  case BinaryOp::Le:
    return "<=";
  case BinaryOp::Gt:
    return ">";
  case BinaryOp::Ge:
    return ">=";
  case BinaryOp::Eq:
    return "==";
  case BinaryOp::Ne:
    return "!=";
  case BinaryOp::And:
    return "and";
  case BinaryOp::Or:
    return "or";
  }
  return "?";
}

bool isComparison(BinaryOp op) {
  return op == BinaryOp::Lt || op == BinaryOp::Le || op == BinaryOp::Gt ||
         op == BinaryOp::Ge || op == BinaryOp::Eq || op == BinaryOp::Ne;
}

} // namespace vflow::ast
