//===- Sema.h - Semantic analysis of .vflow programs ------------*- C++ -*-===//
//
// Resolves names, infers named-axis shapes with broadcasting, enforces the
// stage rules, evaluates params (with command-line overrides) and checks
// that every budget can be computed on the host. On success every expression
// of the AST carries its ExprInfo and each flow has a FlowInfo describing its
// declarations; the lowering to vt reads both.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_FRONTEND_SEMA_H
#define VFLOW_FRONTEND_SEMA_H

#include "vflow/Frontend/AST.h"

#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace vflow {

/// `-p name=value` or `-p flow.name=value`.
struct ParamOverride {
  std::string name;
  std::string value;
};

/// Parses "name=value" where name is `NAME` or `FLOW.NAME`. Returns false
/// with a one-line reason in `error` (without the "-p TEXT: " prefix) on a
/// malformed string.
bool parseParamOverride(const std::string &text, ParamOverride &out,
                        std::string &error);

/// The same without the reason. Kept for callers that print their own
/// message: it only requires a non-empty name before '='; analyzeModule then
/// reports a malformed name with the reason.
bool parseParamOverride(const std::string &text, ParamOverride &out);

/// Why an override's name is not `NAME` or `FLOW.NAME` (each a name such as
/// `budget`), or "" when it is.
std::string checkParamOverrideName(const std::string &name);

/// A param's type; its name ("int", "float", "bool") is the one artifacts
/// record (rt::kParamTypeNames).
enum class ParamType { Int, Float, Bool };
const char *paramTypeName(ParamType type);
/// The type named `name` in source (`param x: float = ...`), if any.
std::optional<ParamType> paramTypeNamed(std::string_view name);

struct ParamInfo {
  std::string name;
  ParamType type = ParamType::Int;
  double value = 0;
  /// Sizes an axis or a split, seeds a const, ... : the kernel is
  /// specialized on it. Other params are run-time arguments.
  bool compileTime = false;
  /// block_size, keep_first, keep_last, head_dim.
  bool reserved = false;
  /// Declared in the source (reserved params may be implicit).
  bool declared = false;
  bool overridden = false;
  SourceRange range;
};

enum class AxisOrigin { Builtin, Declared, Split, Rename };

struct AxisInfo {
  std::string name;
  int64_t size = 0;
  AxisOrigin origin = AxisOrigin::Builtin;
  SourceRange range;
};

struct ConstInfo {
  std::string name;
  Shape shape;
  const ast::Expr *init = nullptr;
  SourceRange range;
};

struct FieldInfo {
  std::string name;
  DType dtype = DType::BF16;
  /// Per-block shape (no block or token axis).
  Shape shape;
  const ast::Expr *value = nullptr;
  SourceRange range;
  bool readInIndex = false;
};

struct StateInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  double init = 0;
  SourceRange range;
  bool perBlock() const { return shape.has("block"); }
  bool stored = false;
};

/// Data of a load("file.npy", ...) or tensor(...) literal, in the canonical
/// axis order of its shape (row-major).
struct LiteralData {
  std::vector<float> values;
  std::string source; ///< The file name for load, empty for tensor(...).
};

struct FlowInfo {
  const ast::Flow *flow = nullptr;
  std::string name;
  std::vector<ParamInfo> params;
  /// Every axis the flow knows, in canonical order: block, head, token, dim,
  /// then user axes in order of declaration or creation.
  std::vector<AxisInfo> axes;
  std::vector<ConstInfo> consts;
  std::vector<FieldInfo> fields;
  std::vector<StateInfo> states;
  const ast::Decl *index = nullptr;
  const ast::Expr *selection = nullptr; ///< The returned expression.
  /// The retain block (null without one): its capacity (a budget in
  /// blocks), its returned [block] score and how the runtime combines the
  /// scores of KV heads and layers ("sum" or "max").
  const ast::Decl *retain = nullptr;
  const ast::Expr *retainCapacity = nullptr;
  const ast::Expr *retainScore = nullptr;
  /// The score is per token ([block, token]): the capacity counts tokens.
  bool retainTokens = false;
  std::string retainCombine = "sum";
  std::map<const ast::Expr *, LiteralData> literals;

  /// Extend the vectors above and their name indexes (the checker uses
  /// these; lookups by name take constant time). With duplicate names, the
  /// first one is found.
  ParamInfo &addParam(ParamInfo param);
  AxisInfo &addAxis(AxisInfo axis);
  ConstInfo &addConst(ConstInfo c);
  FieldInfo &addField(FieldInfo field);
  StateInfo &addState(StateInfo state);

  const ParamInfo *findParam(const std::string &name) const;
  const AxisInfo *findAxis(const std::string &name) const;
  const ConstInfo *findConst(const std::string &name) const;
  const FieldInfo *findField(const std::string &name) const;
  const StateInfo *findState(const std::string &name) const;
  std::vector<std::string> axisOrder() const;
  /// The position of an axis in the canonical order (past the end for an
  /// unknown name).
  size_t axisRank(const std::string &name) const;
  int64_t blockSize() const;

private:
  std::unordered_map<std::string, size_t> paramIndex, axisIndex, constIndex,
      fieldIndex, stateIndex;
};

struct CheckedModule {
  std::vector<FlowInfo> flows;
};

struct SemaOptions {
  std::vector<ParamOverride> overrides;
  /// Where load("...") resolves relative file names.
  std::string baseDir = ".";
  /// Report overrides that match no param of this file. A driver that
  /// compiles several files turns this off and checks `usedOverrides`
  /// across all of them.
  bool reportUnusedOverrides = true;
  /// When set, receives the names of the overrides that matched a param.
  std::set<std::string> *usedOverrides = nullptr;
};

/// Analyzes the module. Returns false (with diagnostics) on any error; the
/// AST is annotated either way.
bool analyzeModule(ast::Module &module, const SemaOptions &options,
                   DiagnosticEngine &diags, CheckedModule &out);

/// The f64 value of a budget expression for given values of num_blocks,
/// context_len, group, layer and kv_head, as the host computes it before
/// rounding (NaN and
/// negative values included); nullopt when it cannot be computed on the host.
/// The checker rejects a budget that is NaN or negative at any of a sample of
/// sizes (docs/language.md).
std::optional<double> evaluateBudgetValue(const ast::Expr &expr,
                                          const FlowInfo &flow,
                                          int64_t numBlocks, int64_t contextLen,
                                          int64_t group, int64_t layer = 0,
                                          int64_t kvHead = 0);

/// How the host turns a budget's f64 value into a block count: rounded down,
/// 0 for NaN and values below 1, at most 9e15 (the runtime's roundBudget).
int64_t roundBudget(double value);

/// The statically known value of a budget expression for given values of
/// num_blocks, context_len, group, layer and kv_head (the host's evaluation;
/// used by the summary and by tests): roundBudget of evaluateBudgetValue,
/// nullopt for NaN.
std::optional<int64_t> evaluateBudget(const ast::Expr &expr,
                                      const FlowInfo &flow, int64_t numBlocks,
                                      int64_t contextLen, int64_t group,
                                      int64_t layer = 0, int64_t kvHead = 0);

/// The value of a compile-time scalar expression (literals, params and
/// elementwise math on them), or nullopt.
std::optional<double> evaluateConstant(const ast::Expr &expr,
                                       const FlowInfo &flow);

/// The names of the language's builtins (for completions and suggestions).
const std::vector<std::string> &builtinFunctionNames();

} // namespace vflow

#endif // VFLOW_FRONTEND_SEMA_H
