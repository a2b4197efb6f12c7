//===- AST.h - The .vflow abstract syntax tree ------------------*- C++ -*-===//
//
// Every node carries its source range. Semantic analysis (Sema.h) fills in
// the `info` of each expression: its named-axis shape and what kind of value
// it is; the lowering to vt reads that instead of recomputing it.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_FRONTEND_AST_H
#define VFLOW_FRONTEND_AST_H

#include "vflow/Frontend/Diagnostics.h"
#include "vflow/Frontend/Types.h"

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace vflow::ast {

//===----------------------------------------------------------------------===//
// Expressions
//===----------------------------------------------------------------------===//

enum class ExprKind {
  Number,
  Bool,
  Inf,
  String,
  Name,
  List,
  Unary,
  Binary,
  Call
};

enum class UnaryOp { Neg, Not };
enum class BinaryOp { Add, Sub, Mul, Div, Lt, Le, Gt, Ge, Eq, Ne, And, Or };

const char *spelling(UnaryOp op);
const char *spelling(BinaryOp op);
/// The operator spelled `text` in source ("+", "<=", "and", ...), if any.
std::optional<BinaryOp> binaryOpSpelled(std::string_view text);
bool isComparison(BinaryOp op);

/// What an expression denotes, filled in by Sema.
enum class ValueKind {
  Unknown,   ///< Not analyzed yet, or in error (suppresses follow-on errors).
  Tensor,    ///< A named-axis f32 tensor (a scalar has no axes).
  Selection, ///< The result of topk/threshold/union.
  Axis,      ///< A bare axis name in an axis position.
  String,    ///< A string literal (load's file name).
  List,      ///< A bracketed list (axes, weights, literal values).
};

/// Where the value of an expression comes from, for stage and budget rules.
enum Dependence : unsigned {
  DepNone = 0,
  DepParam = 1u << 0,     ///< A param's value.
  DepHostInput = 1u << 1, ///< num_blocks, context_len, step.
  DepDevice = 1u << 2,    ///< Anything only the device has (q, fields, ...).
};

struct ExprInfo {
  ValueKind kind = ValueKind::Unknown;
  Shape shape;
  /// Bitwise-or of Dependence.
  unsigned deps = DepNone;
  /// True when the host could compute it from params, literals, num_blocks
  /// and context_len with + - * / min max (a budget expression).
  bool hostEvaluable = false;
};

struct Expr {
  ExprKind kind;
  SourceRange range;
  ExprInfo info;
  /// Written inside parentheses (so `(a < b) < c` is not a chained compare).
  bool parenthesized = false;

  Expr(ExprKind kind, SourceRange range) : kind(kind), range(range) {}
  virtual ~Expr() = default;
};
using ExprPtr = std::unique_ptr<Expr>;

/// LLVM-style checked casts over the expression kinds (the front end does
/// not depend on LLVM).
template <typename T> bool isa(const Expr *e) { return e && T::classof(e); }
template <typename T> T *dyn_cast(Expr *e) {
  return isa<T>(e) ? static_cast<T *>(e) : nullptr;
}
template <typename T> const T *dyn_cast(const Expr *e) {
  return isa<T>(e) ? static_cast<const T *>(e) : nullptr;
}
template <typename T> T &cast(Expr &e) { return static_cast<T &>(e); }
template <typename T> const T &cast(const Expr &e) {
  return static_cast<const T &>(e);
}

struct NumberExpr : Expr {
  double value;
  bool isInteger;
  std::string text;
  NumberExpr(SourceRange r, double value, bool isInteger, std::string text)
      : Expr(ExprKind::Number, r), value(value), isInteger(isInteger),
        text(std::move(text)) {}
  static bool classof(const Expr *e) { return e->kind == ExprKind::Number; }
};

struct BoolExpr : Expr {
  bool value;
  BoolExpr(SourceRange r, bool value) : Expr(ExprKind::Bool, r), value(value) {}
  static bool classof(const Expr *e) { return e->kind == ExprKind::Bool; }
};

struct InfExpr : Expr {
  explicit InfExpr(SourceRange r) : Expr(ExprKind::Inf, r) {}
  static bool classof(const Expr *e) { return e->kind == ExprKind::Inf; }
};

struct StringExpr : Expr {
  std::string value;
  StringExpr(SourceRange r, std::string value)
      : Expr(ExprKind::String, r), value(std::move(value)) {}
  static bool classof(const Expr *e) { return e->kind == ExprKind::String; }
};

/// What a name resolved to (filled in by Sema).
enum class NameRef {
  Unresolved,
  Input, ///< K, V, q, mass, position, num_blocks, context_len, step.
  Param,
  Const,
  CacheField,
  State,
  Let,
  Axis,
};

struct NameExpr : Expr {
  std::string name;
  NameRef ref = NameRef::Unresolved;
  /// NameRef::Let: the bound value (owned by its let statement).
  const Expr *binding = nullptr;
  NameExpr(SourceRange r, std::string name)
      : Expr(ExprKind::Name, r), name(std::move(name)) {}
  static bool classof(const Expr *e) { return e->kind == ExprKind::Name; }
};

struct ListExpr : Expr {
  std::vector<ExprPtr> elements;
  ListExpr(SourceRange r, std::vector<ExprPtr> elements)
      : Expr(ExprKind::List, r), elements(std::move(elements)) {}
  static bool classof(const Expr *e) { return e->kind == ExprKind::List; }
};

struct UnaryExpr : Expr {
  UnaryOp op;
  ExprPtr operand;
  UnaryExpr(SourceRange r, UnaryOp op, ExprPtr operand)
      : Expr(ExprKind::Unary, r), op(op), operand(std::move(operand)) {}
  static bool classof(const Expr *e) { return e->kind == ExprKind::Unary; }
};

struct BinaryExpr : Expr {
  BinaryOp op;
  SourceRange opRange;
  ExprPtr lhs, rhs;
  BinaryExpr(SourceRange r, BinaryOp op, SourceRange opRange, ExprPtr lhs,
             ExprPtr rhs)
      : Expr(ExprKind::Binary, r), op(op), opRange(opRange),
        lhs(std::move(lhs)), rhs(std::move(rhs)) {}
  static bool classof(const Expr *e) { return e->kind == ExprKind::Binary; }
};

/// One argument of a call: positional `x`, named `scale = 2`, or a rename
/// pair `m -> n`.
struct CallArg {
  enum class Kind { Positional, Named, Rename } kind = Kind::Positional;
  SourceRange range;
  std::string name; ///< Named: the name; Rename: the source axis.
  SourceRange nameRange;
  std::string to; ///< Rename: the new axis name.
  SourceRange toRange;
  ExprPtr value; ///< Positional and named.
};

/// The builtin a call resolved to (filled in by Sema).
enum class Builtin {
  Unknown,
  // Elementwise.
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Abs,
  Relu,
  Sigmoid,
  Silu,
  Tanh,
  Hash,
  Pow,
  Maximum,
  Minimum,
  Clamp,
  Where,
  // Reductions.
  Sum,
  Mean,
  Max,
  Min,
  L2Norm,
  // Along block.
  Softmax,
  Normalize,
  Conv,
  KthLargest,
  // Shape.
  Split,
  Rename,
  // Const generators.
  Rademacher,
  Gaussian,
  TensorLiteral,
  Load,
  // Selections.
  TopK,
  ApproxTopK,
  Threshold,
  TopP,
  Union,
};

struct CallExpr : Expr {
  std::string callee;
  SourceRange calleeRange;
  std::vector<CallArg> args;
  Builtin builtin = Builtin::Unknown;
  CallExpr(SourceRange r, std::string callee, SourceRange calleeRange,
           std::vector<CallArg> args)
      : Expr(ExprKind::Call, r), callee(std::move(callee)),
        calleeRange(calleeRange), args(std::move(args)) {}
  /// The argument named `name` (`name = value`), or null.
  const CallArg *namedArg(const std::string &name) const;
  static bool classof(const Expr *e) { return e->kind == ExprKind::Call; }
};

//===----------------------------------------------------------------------===//
// Declarations and statements
//===----------------------------------------------------------------------===//

/// A name with its source range.
struct Ident {
  std::string name;
  SourceRange range;
};

enum class StmtKind { Let, Field, Assign, Return };

/// A statement of a `cache { }` or `index { }` block.
struct Stmt {
  StmtKind kind;
  SourceRange range;
  Ident name;                 ///< Let, Field, Assign.
  std::optional<Ident> dtype; ///< Field: optional storage dtype.
  ExprPtr value;
};

enum class DeclKind {
  Param,
  Axis,
  Const,
  CacheField,
  CacheBlock,
  State,
  Index,
  Retain
};

struct Decl {
  DeclKind kind;
  SourceRange range;
  SourceRange keywordRange;
  Ident name;                ///< Param, Axis, Const, CacheField, State.
  std::optional<Ident> type; ///< Param type, field or state dtype.
  std::vector<Ident> axes;   ///< State: its axes.
  bool hasAxisList = false;  ///< State: `[...]` was written.
  ExprPtr value;             ///< Param, Axis, Const, CacheField, State.
  std::vector<Stmt> body;    ///< CacheBlock, Index, Retain.
  SourceRange closeBrace;    ///< CacheBlock, Index, Retain: the `}`.
  /// Retain: its arguments (the capacity, `combine = sum|max`).
  std::vector<CallArg> args;
};

struct Flow {
  Ident name;
  SourceRange range;
  std::vector<Decl> decls;
};

struct Module {
  std::vector<Flow> flows;
};

} // namespace vflow::ast

#endif // VFLOW_FRONTEND_AST_H
