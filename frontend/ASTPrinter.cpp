//===- ASTPrinter.cpp - Printing the AST ----------------------------------===//

#include "vflow/Frontend/ASTPrinter.h"
#include "vflow/Runtime/Names.h"

using namespace vflow;
using namespace vflow::ast;

namespace {

/// Each DeclKind as the dump names it.
const char *const kDeclKindNames[] = {"Param",      "Axis",       "Const",
                                      "CacheField", "CacheBlock", "State",
                                      "Index",      "Retain"};
static_assert(rt::coversEnum(kDeclKindNames, DeclKind::Retain),
              "one name per DeclKind");

class Printer {
public:
  Printer(const SourceBuffer &buffer) : buffer(buffer) {}

  std::string print(const Module &module) {
    for (const Flow &flow : module.flows) {
      line(0, "Flow " + flow.name.name, flow.name.range);
      for (const Decl &decl : flow.decls)
        printDecl(decl);
    }
    return out;
  }

private:
  std::string loc(SourceRange range) {
    if (!range.isValid())
      return "";
    LineCol lc = buffer.getLineCol(range.begin);
    return " <" + std::to_string(lc.line) + ":" + std::to_string(lc.column) +
           ">";
  }

  void line(unsigned depth, const std::string &text, SourceRange range) {
    out += std::string(depth * 2, ' ') + text + loc(range) + "\n";
  }

  static std::string typeSuffix(const std::optional<Ident> &type) {
    return type ? " : " + type->name : "";
  }

  void printDecl(const Decl &decl) {
    const char *kind = rt::nameOf(kDeclKindNames, decl.kind);
    if (decl.kind == DeclKind::CacheBlock || decl.kind == DeclKind::Index ||
        decl.kind == DeclKind::Retain) {
      line(1, kind, decl.keywordRange);
      printArgs(decl.args, 2);
      for (const Stmt &stmt : decl.body)
        printStmt(stmt);
      return;
    }
    // A named declaration: its name, a state's axes and the type where they
    // were written, then its value.
    std::string text = std::string(kind) + " " + decl.name.name;
    if (decl.hasAxisList) {
      std::string axes;
      for (const Ident &a : decl.axes)
        axes += (axes.empty() ? "" : ", ") + a.name;
      text += "[" + axes + "]";
    }
    line(1, text + typeSuffix(decl.type), decl.name.range);
    printExpr(*decl.value, 2);
  }

  void printStmt(const Stmt &stmt) {
    switch (stmt.kind) {
    case StmtKind::Let:
      line(2, "Let " + stmt.name.name, stmt.name.range);
      break;
    case StmtKind::Field:
      line(2, "Field " + stmt.name.name + typeSuffix(stmt.dtype),
           stmt.name.range);
      break;
    case StmtKind::Assign:
      line(2, "Store " + stmt.name.name, stmt.name.range);
      break;
    case StmtKind::Return:
      line(2, "Return", stmt.range);
      break;
    }
    printExpr(*stmt.value, 3);
  }

  static std::string info(const Expr &e) {
    switch (e.info.kind) {
    case ValueKind::Tensor:
      return " " + e.info.shape.str() + (e.info.hostEvaluable ? " host" : "");
    case ValueKind::Selection:
      return " selection";
    case ValueKind::Axis:
      return " axis";
    default:
      return "";
    }
  }

  void printExpr(const Expr &e, unsigned depth) {
    switch (e.kind) {
    case ExprKind::Number:
      line(depth, "Number " + cast<NumberExpr>(e).text + info(e), e.range);
      break;
    case ExprKind::Bool:
      line(depth,
           std::string("Bool ") + (cast<BoolExpr>(e).value ? "true" : "false") +
               info(e),
           e.range);
      break;
    case ExprKind::Inf:
      line(depth, "Inf" + info(e), e.range);
      break;
    case ExprKind::String:
      line(depth, "String \"" + cast<StringExpr>(e).value + "\"", e.range);
      break;
    case ExprKind::Name:
      line(depth, "Name " + cast<NameExpr>(e).name + info(e), e.range);
      break;
    case ExprKind::List:
      line(depth, "List", e.range);
      for (const ExprPtr &el : cast<ListExpr>(e).elements)
        printExpr(*el, depth + 1);
      break;
    case ExprKind::Unary: {
      auto &u = cast<UnaryExpr>(e);
      line(depth, std::string("Unary ") + spelling(u.op) + info(e), e.range);
      printExpr(*u.operand, depth + 1);
      break;
    }
    case ExprKind::Binary: {
      auto &b = cast<BinaryExpr>(e);
      line(depth, std::string("Binary ") + spelling(b.op) + info(e), e.range);
      printExpr(*b.lhs, depth + 1);
      printExpr(*b.rhs, depth + 1);
      break;
    }
    case ExprKind::Call: {
      auto &c = cast<CallExpr>(e);
      line(depth, "Call " + c.callee + info(e), e.range);
      printArgs(c.args, depth + 1);
      break;
    }
    }
  }

  void printArgs(const std::vector<CallArg> &args, unsigned depth) {
    for (const CallArg &a : args) {
      if (a.kind == CallArg::Kind::Rename) {
        line(depth, "Rename " + a.name + " -> " + a.to, a.range);
      } else if (a.kind == CallArg::Kind::Named) {
        line(depth, "Named " + a.name, a.nameRange);
        printExpr(*a.value, depth + 1);
      } else {
        printExpr(*a.value, depth);
      }
    }
  }

  const SourceBuffer &buffer;
  std::string out;
};

} // namespace

std::string vflow::printAST(const Module &module, const SourceBuffer &buffer) {
  return Printer(buffer).print(module);
}
