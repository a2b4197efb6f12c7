//===- SemaImpl.h - The checker's private declarations ----------*- C++ -*-===//
//
// What the checker's files share: the FlowChecker class, its scopes and
// declared-name records, the tables of names the language reserves and the
// scalar evaluator. One FlowChecker per flow. It registers every declared
// name first (so that duplicates and uses before declaration get precise
// messages), then checks params, axes, consts, the cache stage, states and
// the index stage in that order. Expressions are analyzed bottom-up into
// ExprInfo; an expression in error gets ValueKind::Unknown, which silences
// follow-on errors about it.
//
// The checker's files, by phase:
//   Sema.cpp             -p overrides, FlowInfo's tables, the module driver
//   SemaDeclarations.cpp reserved names, registration, axes, consts, states
//   SemaParams.cpp       params: values, types, reserved params, overrides
//   SemaStages.cpp       the cache and index stages, lets
//   SemaExpressions.cpp  names, operators, the analysis of one expression
//   SemaCalls.cpp        builtins: arguments, reductions, along-block ops
//   SemaShapes.cpp       the size model, broadcasting, split and rename
//   SemaLiterals.cpp     rademacher, gaussian, tensor and load
//   SemaSelections.cpp   selections and their budgets
//   SemaEvaluation.cpp   compile-time values and host budget evaluation
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_FRONTEND_SEMAIMPL_H
#define VFLOW_FRONTEND_SEMAIMPL_H

#include "vflow/Frontend/Sema.h"

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace vflow::sema {

using ast::BinaryExpr;
using ast::CallArg;
using ast::CallExpr;
using ast::Decl;
using ast::Expr;
using ast::ExprInfo;
using ast::Flow;
using ast::Ident;
using ast::NameExpr;
using ast::Stmt;
using ast::UnaryExpr;

//===----------------------------------------------------------------------===//
// Names the language reserves (SemaDeclarations.cpp)
//===----------------------------------------------------------------------===//

extern const char *const kInputNames[12];
bool isInputName(const std::string &name);
bool isBuiltinAxis(const std::string &name);

/// block_size, keep_first, keep_last and head_dim: params every flow has.
struct ReservedParam {
  const char *name;
  double defaultValue;
  const char *meaning;
};

const ReservedParam *findReserved(const std::string &name);
/// Checks the value range of a reserved param; returns an error message or
/// an empty string.
std::string checkReservedValue(const std::string &name, double value);

//===----------------------------------------------------------------------===//
// Scopes and declared names
//===----------------------------------------------------------------------===//

/// Where an expression is being analyzed.
enum class Stage { ParamValue, AxisSize, StateInit, Const, Cache, Index };

/// What a declared name is, for duplicate and use-before-declaration checks.
enum class DeclaredKind { Param, Axis, Const, Field, State };

const char *declaredKindName(DeclaredKind kind);

struct Declared {
  DeclaredKind kind;
  SourceRange range;
};

struct LetBinding {
  std::string name;
  SourceRange range;
  const Expr *value;
  /// Read by a later expression (W902 otherwise, for a selection).
  mutable bool used = false;
};

struct Scope {
  Stage stage;
  std::map<std::string, LetBinding> lets;
  /// Cache stage: fields defined so far (readable by later statements).
  std::set<std::string> definedFields;
  /// Index stage: states stored so far, with the store's range.
  std::map<std::string, SourceRange> storedStates;
  /// Index stage: the retain block (no selections, no stores).
  bool retain = false;
  explicit Scope(Stage stage) : stage(stage) {}
  const LetBinding *findLet(const std::string &name) const {
    auto it = lets.find(name);
    return it == lets.end() ? nullptr : &it->second;
  }
};

//===----------------------------------------------------------------------===//
// Scalar evaluation (SemaEvaluation.cpp)
//===----------------------------------------------------------------------===//

/// The per-sequence values the host knows when it evaluates a budget.
struct HostValues {
  double numBlocks;
  double contextLen;
  double group;  ///< The query heads of a KV head.
  double layer;  ///< The model's layer index.
  double kvHead; ///< The model's KV head index.
};

/// Calls `fn` on `root` and every node below it, and with `followLets` on
/// the values of the lets they read (each once). Iterative: a chain of lets
/// can be as long as the file.
void forEachNode(const Expr &root, bool followLets,
                 const std::function<void(const Expr &)> &fn);

/// The let-bound values `expr` reads, directly or through other lets, in
/// source order: each reads only lets before it.
std::vector<const Expr *> letsReadBy(const Expr &expr);

/// Evaluates a scalar expression of literals and params (and, with `host`,
/// num_blocks, context_len and the lets a budget reads them through). On
/// failure `offender` (if given) points at the first part that has no value
/// here. The one evaluator of compile-time values and budgets: the summary,
/// the checker's budget samples and the lowering all use it.
class ScalarEvaluator {
public:
  ScalarEvaluator(const FlowInfo &flow, const HostValues *host,
                  const Expr **offender)
      : flow(flow), host(host), offender(offender) {}

  std::optional<double> eval(const Expr &expr);

  /// With `host`: evaluates `lets` (letsReadBy(expr)) in order first, so
  /// that the recursion never follows a chain of lets.
  std::optional<double> evalAfterLets(const Expr &expr,
                                      const std::vector<const Expr *> &lets) {
    for (const Expr *let : lets)
      if (!letValues.count(let))
        letValues[let] = eval(*let);
    return eval(expr);
  }

private:
  std::optional<double> fail(const Expr &e) {
    if (offender && !*offender)
      *offender = &e;
    return std::nullopt;
  }

  const FlowInfo &flow;
  const HostValues *host;
  const Expr **offender;
  /// Values of let-bound expressions already computed: lets may share
  /// subexpressions (`let b = a + a;`), so the work stays linear.
  std::unordered_map<const Expr *, std::optional<double>> letValues;
};

std::optional<double> evalScalar(const Expr &expr, const FlowInfo &flow,
                                 const HostValues *host, const Expr **offender);

//===----------------------------------------------------------------------===//
// Wording of sizes and shapes in messages (SemaShapes.cpp)
//===----------------------------------------------------------------------===//

/// "16777216 (2^24)", "2147483647 (2^31 - 1)".
std::string describeLimit(int64_t limit);
/// "a scalar" or "a tensor with axes [...]" (reads after "this is").
std::string describeValue(const Shape &shape);
/// "it is a scalar" or "it has axes [...]".
std::string itHasAxes(const Shape &shape);
/// A size with its meaning when it is a symbol: "G (query heads per KV
/// head)".
std::string describeSize(int64_t size);

//===----------------------------------------------------------------------===//
// FlowChecker
//===----------------------------------------------------------------------===//

class FlowChecker {
public:
  FlowChecker(Flow &flow, FlowInfo &info, const SemaOptions &options,
              DiagnosticEngine &diags, std::set<std::string> &usedOverrides)
      : flow(flow), info(info), options(options), diags(diags),
        usedOverrides(usedOverrides), axisRank([this](const std::string &name) {
          return this->info.axisRank(name);
        }) {}

  void run();

private:
  // Declarations (SemaDeclarations.cpp, SemaParams.cpp).
  void registerNames();
  void checkParams();
  void addReservedParams();
  void applyOverrides(ParamInfo &param);
  /// Runs `check` on each declaration of `kind` in order, with currentDecl
  /// its position, until the diagnostics say stop; then currentDecl is -1.
  template <typename Check> void forEachDecl(ast::DeclKind kind, Check check) {
    for (Decl &decl : flow.decls) {
      if (decl.kind != kind)
        continue;
      if (diags.shouldStop())
        break;
      auto it = declIndex.find(decl.name.name);
      currentDecl = it == declIndex.end() ? -1 : it->second;
      check(decl);
    }
    currentDecl = -1;
  }
  void checkAxes();
  void checkConsts();
  /// Adds a const's elements to the flow's total (limits::kMaxConstElements,
  /// reported at the const that passes it).
  void countConstElements(const ConstInfo &c);
  void checkStates();
  std::optional<DType> checkDType(const std::optional<Ident> &dtype,
                                  DType fallback);
  void markCompileTime(const Expr &expr);
  void registerAxis(const std::string &name, int64_t size, AxisOrigin origin,
                    SourceRange range);
  int64_t axisSize(const std::string &name) const;

  // The stages (SemaStages.cpp).
  void checkCache();
  void checkIndex();
  /// The flow's one block of `kind` (null without one); each further one
  /// is an error `code` saying there is more than one `what` block.
  Decl *onlyBlock(ast::DeclKind kind, DiagCode code, const std::string &what);
  void checkStateStore(Stmt &stmt, Scope &scope);
  // The retain block (SemaRetain.cpp).
  void checkRetain();
  bool checkRetainArgs(Decl &retain, Scope &scope);
  void defineLet(Stmt &stmt, Scope &scope);
  /// Remembers the selections bound by lets of `scope` that nothing read
  /// (W902, said at the end of the flow when it has no errors).
  void collectUnusedLets(const Scope &scope);
  std::vector<std::pair<std::string, SourceRange>> unusedLets;

  // Expressions (SemaExpressions.cpp).
  ExprInfo analyze(Expr &expr, Scope &scope);
  ExprInfo analyzeKind(Expr &expr, Scope &scope);
  ExprInfo analyzeName(NameExpr &expr, Scope &scope);
  ExprInfo analyzeInput(NameExpr &expr, Stage stage);
  ExprInfo analyzeUnary(UnaryExpr &expr, Scope &scope);
  ExprInfo analyzeBinary(BinaryExpr &expr, Scope &scope);
  bool requireTensor(Expr &expr, const std::string &role);
  /// analyze(expr, scope), then requireTensor(expr, role).
  bool analyzeTensor(Expr &expr, Scope &scope, const std::string &role);
  std::vector<std::string> visibleNames(const Scope &scope);
  void unknownName(const std::string &name, SourceRange range,
                   const Scope &scope);

  // Builtin calls (SemaCalls.cpp).
  ExprInfo analyzeCall(CallExpr &expr, Scope &scope);
  ExprInfo analyzeReduction(CallExpr &call, Scope &scope);
  ExprInfo analyzeBlockOp(CallExpr &call, Scope &scope);
  bool checkArgs(CallExpr &call, size_t minPositional, size_t maxPositional,
                 const std::vector<std::string> &named);

  // Shapes and the size model (SemaShapes.cpp).
  bool checkSize(const Shape &shape, bool perBlock, SourceRange at,
                 const std::string &what);
  std::optional<Shape> broadcast(const std::vector<const Expr *> &operands,
                                 SourceRange at);
  bool requireAxisOf(const Expr &arg, const ExprInfo &value,
                     const Expr &valueExpr, std::string &axisName);
  bool checkAxisCreation(const std::string &name, int64_t size,
                         SourceRange range);
  ExprInfo analyzeSplit(CallExpr &call, Scope &scope);
  ExprInfo analyzeRename(CallExpr &call, Scope &scope);

  // Literal data (SemaLiterals.cpp).
  ExprInfo analyzeGenerator(CallExpr &call, Scope &scope);
  ExprInfo analyzeRandomTensor(CallExpr &call, Scope &scope);
  ExprInfo analyzeLiteralData(CallExpr &call, Scope &scope);
  bool readLoadedData(CallExpr &call, const Expr &dataArg,
                      const std::vector<int64_t> &sizes,
                      std::vector<float> &rowMajor, LiteralData &data);
  bool flattenNestedLists(Expr &dataArg, Scope &scope,
                          const std::vector<int64_t> &sizes,
                          const std::vector<std::string> &listed,
                          std::vector<float> &rowMajor);
  Shape axesFromList(const Expr &listExpr, bool &ok,
                     std::vector<std::string> *listed = nullptr);

  // Selections and budgets (SemaSelections.cpp).
  ExprInfo analyzeSelection(CallExpr &call, Scope &scope);
  bool analyzePerHeadTopK(CallExpr &call, const CallArg &per, Scope &scope);
  bool requireBudget(Expr &expr, const std::string &role);
  bool checkBudgetValues(const Expr &expr);

  // Compile-time values (SemaEvaluation.cpp).
  std::optional<double> constEval(const Expr &expr, const Expr **offender);
  std::optional<double> requireConst(const Expr &expr, const std::string &role);
  /// Analyzes a named argument and requires a compile-time number for which
  /// `valid` holds; reports `invalid` at the argument when it does not.
  bool requireConstArg(const ast::CallArg &arg, Scope &scope,
                       const std::string &role, bool (*valid)(double),
                       const std::string &invalid);
  std::optional<int64_t>
  requirePositiveInt(const Expr &expr, const std::string &role, int64_t max);

  ExprInfo tensor(Shape shape, unsigned deps, bool host) {
    ExprInfo out;
    out.kind = ast::ValueKind::Tensor;
    out.shape = std::move(shape);
    out.deps = deps;
    out.hostEvaluable = host;
    return out;
  }
  ExprInfo error() { return ExprInfo(); }

  Flow &flow;
  FlowInfo &info;
  const SemaOptions &options;
  DiagnosticEngine &diags;
  std::set<std::string> &usedOverrides;
  /// The canonical position of an axis (Shape::insert's order).
  std::function<size_t(const std::string &)> axisRank;
  std::map<std::string, Declared> declared;
  std::vector<std::string> declaredNames;
  /// Names of user axes as they were declared, before creation by split or
  /// rename.
  std::set<std::string> constsDone, axesDone, paramsDone;
  /// Elements of the consts checked so far (-1: past the limit, reported).
  int64_t constElements = 0;
  /// Declarations whose value is in error: uses of them are silently in
  /// error too (the declaration already has its message).
  std::set<std::string> inError;
  /// Consts whose values markCompileTime has walked.
  std::unordered_set<const Expr *> markedConsts;
  /// States too large for the size model (their uses are silently in error).
  std::set<std::string> oversizedStates;
  /// The shape of each cache field as the index stage reads it.
  std::unordered_map<std::string, Shape> fieldReadShapes;
  /// Broadcasts that made a new shape, by their operands' identities.
  struct CachedUnion {
    Shape lhs, rhs, result;
  };
  std::map<std::pair<const void *, const void *>, CachedUnion> unionCache;
  /// Position of each declaration in the flow, and of the one being checked
  /// (-1 inside the stages, where order does not matter).
  std::map<std::string, int> declIndex;
  int currentDecl = -1;
  bool declaredLater(const std::string &name) const {
    auto it = declIndex.find(name);
    return currentDecl >= 0 && it != declIndex.end() &&
           it->second >= currentDecl;
  }
};

} // namespace vflow::sema

#endif // VFLOW_FRONTEND_SEMAIMPL_H
