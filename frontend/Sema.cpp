//===- Sema.cpp - Semantic analysis of .vflow programs --------------------===//
//
// One FlowChecker per flow. It registers every declared name first (so that
// duplicates and uses before declaration get precise messages), then checks
// params, axes, consts, states, the cache stage and the index stage in that
// order. Expressions are analyzed bottom-up into ExprInfo; an expression in
// error gets ValueKind::Unknown, which silences follow-on errors about it.
//
//===----------------------------------------------------------------------===//

#include "vflow/Frontend/Sema.h"
#include "vflow/Frontend/Npy.h"
#include "vflow/Runtime/Limits.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <set>
#include <unordered_map>
#include <unordered_set>

using namespace vflow;
using namespace vflow::ast;

//===----------------------------------------------------------------------===//
// Small helpers
//===----------------------------------------------------------------------===//

namespace {

bool isIdentifier(const std::string &text) {
  if (text.empty() || std::isdigit(static_cast<unsigned char>(text[0])))
    return false;
  for (char c : text)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_')
      return false;
  return true;
}

} // namespace

std::string vflow::checkParamOverrideName(const std::string &name) {
  const char *form = "; write NAME=VALUE or FLOW.NAME=VALUE, e.g. budget=32 "
                     "or quest.budget=32";
  if (name.empty())
    return std::string("the param name before '=' is missing") + form;
  size_t dot = name.find('.');
  if (dot != std::string::npos) {
    if (name.find('.', dot + 1) != std::string::npos)
      return "'" + shortName(name) + "' has more than one '.'" + form;
    std::string flowName = name.substr(0, dot);
    std::string paramName = name.substr(dot + 1);
    if (flowName.empty())
      return "the flow name before '.' is missing" + std::string(form);
    if (paramName.empty())
      return "the param name after '.' is missing" + std::string(form);
    if (!isIdentifier(flowName))
      return "'" + shortName(flowName) +
             "' is not a valid flow name (letters, digits and '_', not "
             "starting with a digit)";
    if (!isIdentifier(paramName))
      return "'" + shortName(paramName) +
             "' is not a valid param name (letters, digits and '_', not "
             "starting with a digit)";
    return "";
  }
  if (!isIdentifier(name))
    return "'" + shortName(name) +
           "' is not a valid param name (letters, digits and '_', not "
           "starting with a digit)";
  return "";
}

bool vflow::parseParamOverride(const std::string &text, ParamOverride &out,
                               std::string &error) {
  size_t eq = text.find('=');
  if (eq == std::string::npos) {
    error = "expected NAME=VALUE or FLOW.NAME=VALUE, e.g. budget=32 or "
            "quest.budget=32";
    return false;
  }
  std::string name = text.substr(0, eq);
  error = checkParamOverrideName(name);
  if (!error.empty())
    return false;
  out.name = name;
  out.value = text.substr(eq + 1);
  return true;
}

bool vflow::parseParamOverride(const std::string &text, ParamOverride &out) {
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    return false;
  out.name = text.substr(0, eq);
  out.value = text.substr(eq + 1);
  return true;
}

const char *vflow::paramTypeName(ParamType type) {
  switch (type) {
  case ParamType::Int:
    return "int";
  case ParamType::Float:
    return "float";
  case ParamType::Bool:
    return "bool";
  }
  return "int";
}

template <typename T>
static T &addByName(std::vector<T> &items,
                    std::unordered_map<std::string, size_t> &index, T item) {
  index.emplace(item.name, items.size());
  items.push_back(std::move(item));
  return items.back();
}

template <typename T>
static const T *findByName(const std::vector<T> &items,
                           const std::unordered_map<std::string, size_t> &index,
                           const std::string &name) {
  auto it = index.find(name);
  return it == index.end() ? nullptr : &items[it->second];
}

ParamInfo &FlowInfo::addParam(ParamInfo p) {
  return addByName(params, paramIndex, std::move(p));
}
AxisInfo &FlowInfo::addAxis(AxisInfo a) {
  return addByName(axes, axisIndex, std::move(a));
}
ConstInfo &FlowInfo::addConst(ConstInfo c) {
  return addByName(consts, constIndex, std::move(c));
}
FieldInfo &FlowInfo::addField(FieldInfo f) {
  return addByName(fields, fieldIndex, std::move(f));
}
StateInfo &FlowInfo::addState(StateInfo s) {
  return addByName(states, stateIndex, std::move(s));
}

const ParamInfo *FlowInfo::findParam(const std::string &n) const {
  return findByName(params, paramIndex, n);
}
const AxisInfo *FlowInfo::findAxis(const std::string &n) const {
  return findByName(axes, axisIndex, n);
}
const ConstInfo *FlowInfo::findConst(const std::string &n) const {
  return findByName(consts, constIndex, n);
}
const FieldInfo *FlowInfo::findField(const std::string &n) const {
  return findByName(fields, fieldIndex, n);
}
const StateInfo *FlowInfo::findState(const std::string &n) const {
  return findByName(states, stateIndex, n);
}
std::vector<std::string> FlowInfo::axisOrder() const {
  std::vector<std::string> order;
  for (const AxisInfo &a : axes)
    order.push_back(a.name);
  return order;
}
size_t FlowInfo::axisRank(const std::string &name) const {
  auto it = axisIndex.find(name);
  return it == axisIndex.end() ? axes.size() : it->second;
}
int64_t FlowInfo::blockSize() const {
  const ParamInfo *p = findParam("block_size");
  return p ? static_cast<int64_t>(p->value) : 16;
}

namespace {

const char *const kInputNames[] = {
    "K", "V", "q", "mass", "position", "num_blocks", "context_len", "step"};
const char *const kBuiltinAxes[] = {"block", "head", "token", "dim"};

bool isInputName(const std::string &name) {
  for (const char *n : kInputNames)
    if (name == n)
      return true;
  return false;
}

bool isBuiltinAxis(const std::string &name) {
  for (const char *n : kBuiltinAxes)
    if (name == n)
      return true;
  return false;
}

struct BuiltinEntry {
  const char *name;
  Builtin builtin;
};

const BuiltinEntry kBuiltins[] = {
    {"exp", Builtin::Exp},
    {"log", Builtin::Log},
    {"sqrt", Builtin::Sqrt},
    {"rsqrt", Builtin::Rsqrt},
    {"abs", Builtin::Abs},
    {"relu", Builtin::Relu},
    {"sigmoid", Builtin::Sigmoid},
    {"silu", Builtin::Silu},
    {"tanh", Builtin::Tanh},
    {"pow", Builtin::Pow},
    {"maximum", Builtin::Maximum},
    {"minimum", Builtin::Minimum},
    {"clamp", Builtin::Clamp},
    {"where", Builtin::Where},
    {"sum", Builtin::Sum},
    {"mean", Builtin::Mean},
    {"max", Builtin::Max},
    {"min", Builtin::Min},
    {"l2norm", Builtin::L2Norm},
    {"softmax", Builtin::Softmax},
    {"normalize", Builtin::Normalize},
    {"conv", Builtin::Conv},
    {"kth_largest", Builtin::KthLargest},
    {"split", Builtin::Split},
    {"rename", Builtin::Rename},
    {"rademacher", Builtin::Rademacher},
    {"gaussian", Builtin::Gaussian},
    {"tensor", Builtin::TensorLiteral},
    {"load", Builtin::Load},
    {"topk", Builtin::TopK},
    {"approx_topk", Builtin::ApproxTopK},
    {"threshold", Builtin::Threshold},
    {"union", Builtin::Union},
};

bool isUnaryMath(Builtin b) {
  switch (b) {
  case Builtin::Exp:
  case Builtin::Log:
  case Builtin::Sqrt:
  case Builtin::Rsqrt:
  case Builtin::Abs:
  case Builtin::Relu:
  case Builtin::Sigmoid:
  case Builtin::Silu:
  case Builtin::Tanh:
    return true;
  default:
    return false;
  }
}

bool isReduction(Builtin b) {
  return b == Builtin::Sum || b == Builtin::Mean || b == Builtin::Max ||
         b == Builtin::Min || b == Builtin::L2Norm;
}

bool isSelectionBuiltin(Builtin b) {
  return b == Builtin::TopK || b == Builtin::ApproxTopK ||
         b == Builtin::Threshold || b == Builtin::Union;
}

bool isGenerator(Builtin b) {
  return b == Builtin::Rademacher || b == Builtin::Gaussian ||
         b == Builtin::TensorLiteral || b == Builtin::Load;
}

/// Where an expression is being analyzed.
enum class Stage { ParamValue, AxisSize, StateInit, Const, Cache, Index };

const char *stageName(Stage stage) {
  switch (stage) {
  case Stage::ParamValue:
    return "a param's value";
  case Stage::AxisSize:
    return "an axis size";
  case Stage::StateInit:
    return "a state's initial value";
  case Stage::Const:
    return "a const";
  case Stage::Cache:
    return "the cache stage";
  case Stage::Index:
    return "the index stage";
  }
  return "";
}

/// What a declared name is, for duplicate and use-before-declaration checks.
enum class DeclaredKind { Param, Axis, Const, Field, State };

const char *declaredKindName(DeclaredKind kind) {
  switch (kind) {
  case DeclaredKind::Param:
    return "param";
  case DeclaredKind::Axis:
    return "axis";
  case DeclaredKind::Const:
    return "const";
  case DeclaredKind::Field:
    return "cache field";
  case DeclaredKind::State:
    return "state";
  }
  return "";
}

struct Declared {
  DeclaredKind kind;
  SourceRange range;
};

SourceRange declRangeOrNone(const std::map<std::string, Declared> &declared,
                            const std::string &name) {
  auto it = declared.find(name);
  return it == declared.end() ? SourceRange() : it->second.range;
}

struct LetBinding {
  std::string name;
  SourceRange range;
  const Expr *value;
};

struct Scope {
  Stage stage;
  std::map<std::string, LetBinding> lets;
  /// Cache stage: fields defined so far (readable by later statements).
  std::set<std::string> definedFields;
  /// Index stage: states stored so far, with the store's range.
  std::map<std::string, SourceRange> storedStates;
  explicit Scope(Stage stage) : stage(stage) {}
  const LetBinding *findLet(const std::string &name) const {
    auto it = lets.find(name);
    return it == lets.end() ? nullptr : &it->second;
  }
};

/// The per-sequence values the host knows when it evaluates a budget.
struct HostValues {
  double numBlocks;
  double contextLen;
};

/// Calls `fn` on `root` and every node below it, and with `followLets` on
/// the values of the lets they read (each once). Iterative: a chain of lets
/// can be as long as the file.
void forEachNode(const Expr &root, bool followLets,
                 const std::function<void(const Expr &)> &fn) {
  std::vector<const Expr *> stack = {&root};
  std::unordered_set<const Expr *> seenLets;
  while (!stack.empty()) {
    const Expr *e = stack.back();
    stack.pop_back();
    fn(*e);
    if (auto *n = dyn_cast<NameExpr>(e)) {
      if (followLets && n->ref == NameRef::Let && n->binding &&
          seenLets.insert(n->binding).second)
        stack.push_back(n->binding);
    } else if (auto *u = dyn_cast<UnaryExpr>(e)) {
      stack.push_back(u->operand.get());
    } else if (auto *b = dyn_cast<BinaryExpr>(e)) {
      stack.push_back(b->rhs.get());
      stack.push_back(b->lhs.get());
    } else if (auto *c = dyn_cast<CallExpr>(e)) {
      for (auto it = c->args.rbegin(); it != c->args.rend(); ++it)
        if (it->value)
          stack.push_back(it->value.get());
    } else if (auto *l = dyn_cast<ListExpr>(e)) {
      for (auto it = l->elements.rbegin(); it != l->elements.rend(); ++it)
        stack.push_back(it->get());
    }
  }
}

/// The let-bound values `expr` reads, directly or through other lets, in
/// source order: each reads only lets before it.
std::vector<const Expr *> letsReadBy(const Expr &expr) {
  std::vector<const Expr *> lets;
  forEachNode(expr, true, [&](const Expr &e) {
    if (auto *n = dyn_cast<NameExpr>(&e))
      if (n->ref == NameRef::Let && n->binding)
        lets.push_back(n->binding);
  });
  std::sort(lets.begin(), lets.end(), [](const Expr *a, const Expr *b) {
    return a->range.begin < b->range.begin;
  });
  lets.erase(std::unique(lets.begin(), lets.end()), lets.end());
  return lets;
}

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

std::optional<double> ScalarEvaluator::eval(const Expr &expr) {
  switch (expr.kind) {
  case ExprKind::Number:
    return cast<NumberExpr>(expr).value;
  case ExprKind::Bool:
    return cast<BoolExpr>(expr).value ? 1.0 : 0.0;
  case ExprKind::Inf:
    return INFINITY;
  case ExprKind::Name: {
    auto &name = cast<NameExpr>(expr);
    if (name.ref == NameRef::Param)
      if (const ParamInfo *p = flow.findParam(name.name))
        return p->value;
    if (host && name.ref == NameRef::Input) {
      if (name.name == "num_blocks")
        return host->numBlocks;
      if (name.name == "context_len")
        return host->contextLen;
    }
    if (host && name.ref == NameRef::Let && name.binding) {
      auto it = letValues.find(name.binding);
      if (it != letValues.end())
        return it->second;
      std::optional<double> v = eval(*name.binding);
      letValues[name.binding] = v;
      return v;
    }
    return fail(expr);
  }
  case ExprKind::Unary: {
    auto &u = cast<UnaryExpr>(expr);
    auto v = eval(*u.operand);
    if (!v)
      return v;
    return u.op == UnaryOp::Neg ? -*v : (*v == 0 ? 1.0 : 0.0);
  }
  case ExprKind::Binary: {
    auto &b = cast<BinaryExpr>(expr);
    auto l = eval(*b.lhs);
    auto r = eval(*b.rhs);
    if (!l || !r)
      return std::nullopt;
    switch (b.op) {
    case BinaryOp::Add:
      return *l + *r;
    case BinaryOp::Sub:
      return *l - *r;
    case BinaryOp::Mul:
      return *l * *r;
    case BinaryOp::Div:
      return *l / *r;
    case BinaryOp::Lt:
      return double(*l < *r);
    case BinaryOp::Le:
      return double(*l <= *r);
    case BinaryOp::Gt:
      return double(*l > *r);
    case BinaryOp::Ge:
      return double(*l >= *r);
    case BinaryOp::Eq:
      return double(*l == *r);
    case BinaryOp::Ne:
      return double(*l != *r);
    case BinaryOp::And:
      return double(*l != 0 && *r != 0);
    case BinaryOp::Or:
      return double(*l != 0 || *r != 0);
    }
    return fail(expr);
  }
  case ExprKind::Call: {
    auto &call = cast<CallExpr>(expr);
    std::vector<double> args;
    for (const CallArg &a : call.args) {
      if (a.kind != CallArg::Kind::Positional)
        return fail(expr);
      auto v = eval(*a.value);
      if (!v)
        return std::nullopt;
      args.push_back(*v);
    }
    size_t want = call.builtin == Builtin::Maximum ||
                          call.builtin == Builtin::Minimum ||
                          call.builtin == Builtin::Pow
                      ? 2
                      : 1;
    if (args.size() != want)
      return fail(expr);
    switch (call.builtin) {
    case Builtin::Maximum:
      return std::max(args[0], args[1]);
    case Builtin::Minimum:
      return std::min(args[0], args[1]);
    case Builtin::Pow:
      return std::pow(args[0], args[1]);
    case Builtin::Sqrt:
      return std::sqrt(args[0]);
    case Builtin::Exp:
      return std::exp(args[0]);
    case Builtin::Log:
      return std::log(args[0]);
    case Builtin::Abs:
      return std::abs(args[0]);
    default:
      return fail(expr);
    }
  }
  default:
    return fail(expr);
  }
}

std::optional<double> evalScalar(const Expr &expr, const FlowInfo &flow,
                                 const HostValues *host,
                                 const Expr **offender) {
  ScalarEvaluator evaluator(flow, host, offender);
  if (!host)
    return evaluator.eval(expr);
  return evaluator.evalAfterLets(expr, letsReadBy(expr));
}

/// "16777216 (2^24)", "2147483647 (2^31 - 1)".
std::string describeLimit(int64_t limit) {
  std::string out = std::to_string(limit);
  for (int p = 1; p < 63; ++p) {
    if (limit == (int64_t(1) << p))
      return out + " (2^" + std::to_string(p) + ")";
    if (limit == (int64_t(1) << p) - 1)
      return out + " (2^" + std::to_string(p) + " - 1)";
  }
  return out;
}

/// "a scalar" or "a tensor with axes [...]" (reads after "this is").
std::string describeValue(const Shape &shape) {
  return shape.isScalar() ? "a scalar" : "a tensor with axes " + shape.str();
}

/// "it is a scalar" or "it has axes [...]".
std::string itHasAxes(const Shape &shape) {
  return shape.isScalar() ? "it is a scalar" : "it has axes " + shape.str();
}

/// A size with its meaning when it is a symbol: "G (query heads per KV
/// head)".
std::string describeSize(int64_t size) {
  switch (size) {
  case kSizeBlocks:
    return "N (the number of blocks)";
  case kSizeGroup:
    return "G (query heads per KV head)";
  case kSizeHeadDim:
    return "D (the head dimension)";
  default:
    return std::to_string(size);
  }
}

//===----------------------------------------------------------------------===//
// FlowChecker
//===----------------------------------------------------------------------===//

struct ReservedParam {
  const char *name;
  double defaultValue;
  const char *meaning;
};

const ReservedParam kReservedParams[] = {
    {"block_size", 16, "tokens per block"},
    {"keep_first", 1, "first blocks always attended"},
    {"keep_last", 1, "last blocks always attended"},
    {"head_dim", 0, "head dimension the flow is specialized to (0: any)"},
};

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
  // Declarations.
  void registerNames();
  void checkParams();
  void addReservedParams();
  void applyOverrides(ParamInfo &param);
  void checkAxes();
  void checkConsts();
  void checkStates();
  void checkCache();
  void checkIndex();
  void defineLet(Stmt &stmt, Scope &scope);
  std::optional<DType> checkDType(const std::optional<Ident> &dtype,
                                  DType fallback);
  void markCompileTime(const Expr &expr);

  // Expressions.
  ExprInfo analyze(Expr &expr, Scope &scope);
  ExprInfo analyzeKind(Expr &expr, Scope &scope);
  ExprInfo analyzeName(NameExpr &expr, Scope &scope);
  ExprInfo analyzeUnary(UnaryExpr &expr, Scope &scope);
  ExprInfo analyzeBinary(BinaryExpr &expr, Scope &scope);
  ExprInfo analyzeCall(CallExpr &expr, Scope &scope);
  ExprInfo analyzeReduction(CallExpr &call, Scope &scope);
  ExprInfo analyzeBlockOp(CallExpr &call, Scope &scope);
  ExprInfo analyzeShapeOp(CallExpr &call, Scope &scope);
  ExprInfo analyzeGenerator(CallExpr &call, Scope &scope);
  ExprInfo analyzeSelection(CallExpr &call, Scope &scope);

  bool requireTensor(Expr &expr, const std::string &role);
  bool requireBudget(Expr &expr, const std::string &role);
  bool checkBudgetValues(const Expr &expr);
  bool checkSize(const Shape &shape, bool perBlock, SourceRange at,
                 const std::string &what);
  bool requireAxisOf(const Expr &arg, const ExprInfo &value,
                     const Expr &valueExpr, std::string &axisName);
  std::optional<Shape> broadcast(const std::vector<const Expr *> &operands,
                                 SourceRange at);
  std::optional<double> constEval(const Expr &expr, const Expr **offender);
  std::optional<double> requireConst(const Expr &expr, const std::string &role);
  std::optional<int64_t>
  requirePositiveInt(const Expr &expr, const std::string &role, int64_t max);
  bool checkArgs(CallExpr &call, size_t minPositional, size_t maxPositional,
                 const std::vector<std::string> &named);
  const CallArg *namedArg(const CallExpr &call, const std::string &name);
  Shape axesFromList(const Expr &listExpr, bool &ok,
                     std::vector<std::string> *listed = nullptr);
  void registerAxis(const std::string &name, int64_t size, AxisOrigin origin,
                    SourceRange range);
  bool checkAxisCreation(const std::string &name, int64_t size,
                         SourceRange range);
  std::vector<std::string> visibleNames(const Scope &scope);
  void unknownName(const std::string &name, SourceRange range,
                   const Scope &scope);
  int64_t axisSize(const std::string &name) const;

  ExprInfo tensor(Shape shape, unsigned deps, bool host) {
    ExprInfo out;
    out.kind = ValueKind::Tensor;
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

void FlowChecker::run() {
  info.flow = &flow;
  info.name = flow.name.name;
  // Builtin axes in canonical order; sizes of token and dim follow params.
  info.addAxis({"block", kSizeBlocks, AxisOrigin::Builtin, {}});
  info.addAxis({"head", kSizeGroup, AxisOrigin::Builtin, {}});
  info.addAxis({"token", 16, AxisOrigin::Builtin, {}});
  info.addAxis({"dim", kSizeHeadDim, AxisOrigin::Builtin, {}});

  // Each phase stops at the error limit: past it nothing more is shown, and
  // checking on would cost time for nothing (a file of 40,000 bad
  // declarations would look for a suggestion for each).
  registerNames();
  checkParams();
  if (diags.shouldStop())
    return;
  info.axes[2].size = info.blockSize();
  if (const ParamInfo *hd = info.findParam("head_dim"))
    if (hd->value > 0)
      info.axes[3].size = static_cast<int64_t>(hd->value);
  checkAxes();
  if (diags.shouldStop())
    return;
  checkConsts();
  if (diags.shouldStop())
    return;
  // States after the cache stage, so they may use axes made there.
  checkCache();
  if (diags.shouldStop())
    return;
  checkStates();
  if (diags.shouldStop())
    return;
  checkIndex();
}

void FlowChecker::registerNames() {
  int index = 0;
  auto add = [&](const Ident &name, DeclaredKind kind) {
    if (name.name.empty())
      return;
    if (isInputName(name.name)) {
      diags.error(name.range, "'" + name.name +
                                  "' is a reserved input name and cannot be "
                                  "declared as " +
                                  withArticle(declaredKindName(kind)));
      return;
    }
    if (isBuiltinAxis(name.name)) {
      diags.error(name.range, "'" + name.name +
                                  "' is a builtin axis and cannot be "
                                  "declared as " +
                                  withArticle(declaredKindName(kind)));
      return;
    }
    if (kind != DeclaredKind::Param && findReserved(name.name)) {
      diags.error(name.range, "'" + name.name +
                                  "' is a reserved param and cannot be "
                                  "declared as " +
                                  withArticle(declaredKindName(kind)));
      return;
    }
    auto it = declared.find(name.name);
    if (it != declared.end()) {
      diags.error(name.range, "redefinition of '" + name.name + "' as " +
                                  withArticle(declaredKindName(kind)));
      diags.note(it->second.range,
                 "previous definition as " +
                     withArticle(declaredKindName(it->second.kind)) +
                     " is here");
      return;
    }
    declared[name.name] = {kind, name.range};
    declIndex[name.name] = index;
  };
  for (Decl &decl : flow.decls) {
    ++index;
    switch (decl.kind) {
    case DeclKind::Param:
      add(decl.name, DeclaredKind::Param);
      break;
    case DeclKind::Axis:
      add(decl.name, DeclaredKind::Axis);
      break;
    case DeclKind::Const:
      add(decl.name, DeclaredKind::Const);
      break;
    case DeclKind::CacheField:
      add(decl.name, DeclaredKind::Field);
      break;
    case DeclKind::CacheBlock:
      for (Stmt &stmt : decl.body)
        if (stmt.kind == StmtKind::Field)
          add(stmt.name, DeclaredKind::Field);
      break;
    case DeclKind::State:
      add(decl.name, DeclaredKind::State);
      break;
    case DeclKind::Index:
      break;
    }
  }
}

//===----------------------------------------------------------------------===//
// Params
//===----------------------------------------------------------------------===//

void FlowChecker::checkParams() {
  Scope scope(Stage::ParamValue);
  // Overrides apply as soon as a param is known, so params computed from it
  // see the overridden value.
  auto finish = [&](ParamInfo &param) { applyOverrides(info.addParam(param)); };
  for (Decl &decl : flow.decls) {
    if (decl.kind != DeclKind::Param)
      continue;
    if (diags.shouldStop())
      break;
    ParamInfo param;
    param.name = decl.name.name;
    param.range = decl.name.range;
    param.declared = true;
    currentDecl = declIndex.count(param.name) ? declIndex[param.name] : -1;
    const ReservedParam *reserved = findReserved(param.name);
    param.reserved = reserved != nullptr;

    ExprInfo value = analyze(*decl.value, scope);
    paramsDone.insert(param.name);
    if (value.kind == ValueKind::Unknown) {
      finish(param);
      continue;
    }
    std::optional<double> v =
        requireConst(*decl.value, "the value of param '" + param.name + "'");
    if (!v) {
      finish(param);
      continue;
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
      diags.error(decl.value->range,
                  "the value of int param '" + param.name + "' is " + buf +
                      ", out of range: " + intRangeRule() + why);
    };
    if (!decl.type && !reserved && param.type == ParamType::Int)
      checkIntRange(" (it is an int because its value is computed from ints; "
                    "declare it ': float' if a float is meant)");
    if (decl.type) {
      const std::string &ty = decl.type->name;
      if (ty == "int") {
        if (!integral)
          diags.error(decl.value->range,
                      "param '" + param.name +
                          "' is declared int but its value is not an integer");
        else
          checkIntRange("");
        param.type = ParamType::Int;
      } else if (ty == "float") {
        param.type = ParamType::Float;
      } else if (ty == "bool") {
        if (*v != 0 && *v != 1)
          diags.error(decl.value->range, "param '" + param.name +
                                             "' is declared bool but its "
                                             "value is not true or false");
        param.type = ParamType::Bool;
      } else {
        diags.error(decl.type->range, "unknown param type '" + ty +
                                          "'; expected int, float or bool");
      }
    }
    if (reserved) {
      if (param.type != ParamType::Int)
        diags.error(decl.type ? decl.type->range : decl.name.range,
                    "reserved param '" + param.name + "' is an int");
      std::string msg = checkReservedValue(param.name, param.value);
      if (!msg.empty())
        diags.error(decl.value->range, msg);
    }
    finish(param);
  }
  currentDecl = -1;
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
    double value = 0;
    bool ok = true;
    if (param->type == ParamType::Bool) {
      if (text == "true" || text == "1")
        value = 1;
      else if (text == "false" || text == "0")
        value = 0;
      else
        ok = false;
    } else {
      char *end = nullptr;
      value = std::strtod(text.c_str(), &end);
      ok = !text.empty() && end && *end == '\0' && std::isfinite(value) &&
           text.find_first_of("xXpP") == std::string::npos;
      if (param->type == ParamType::Int) {
        // Digits are parsed exactly (a double would round 2^53 + 1); other
        // numbers must be integral. Both must fit the int range.
        int64_t exact = 0;
        std::string why = parseIntValue(text, exact);
        bool digits = why.empty() || why.rfind("out of range", 0) == 0;
        bool outOfRange =
            digits ? !why.empty()
                   : ok && value == std::floor(value) && !isExactInt(value);
        if (outOfRange) {
          diags.error(SourceRange(), where + ": '" + shortName(text) +
                                         "' is out of range for int param '" +
                                         name + "' of flow '" + info.name +
                                         "': " + intRangeRule());
          if (param->declared)
            diags.note(param->range, "param '" + name + "' is declared here");
          continue;
        }
        if (digits)
          value = double(exact);
        ok = digits || (ok && value == std::floor(value));
      }
    }
    if (!ok) {
      diags.error(SourceRange(), where + ": '" + text + "' is not a valid " +
                                     paramTypeName(param->type) +
                                     " for param '" + name + "' of flow '" +
                                     info.name + "'");
      if (param->declared)
        diags.note(param->range, "param '" + name + "' is declared here");
      continue;
    }
    if (param->reserved) {
      std::string msg = checkReservedValue(name, value);
      if (!msg.empty()) {
        diags.error(SourceRange(), where + ": " + msg);
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

//===----------------------------------------------------------------------===//
// Axes, consts, states
//===----------------------------------------------------------------------===//

void FlowChecker::checkAxes() {
  Scope scope(Stage::AxisSize);
  for (Decl &decl : flow.decls) {
    if (decl.kind != DeclKind::Axis)
      continue;
    if (diags.shouldStop())
      return;
    axesDone.insert(decl.name.name);
    currentDecl =
        declIndex.count(decl.name.name) ? declIndex[decl.name.name] : -1;
    ExprInfo value = analyze(*decl.value, scope);
    if (value.kind == ValueKind::Unknown)
      continue;
    std::optional<int64_t> size = requirePositiveInt(
        *decl.value, "the size of axis '" + decl.name.name + "'",
        limits::kMaxAxisSize);
    if (!size)
      continue;
    markCompileTime(*decl.value);
    if (!info.findAxis(decl.name.name))
      registerAxis(decl.name.name, *size, AxisOrigin::Declared,
                   decl.name.range);
  }
}

void FlowChecker::registerAxis(const std::string &name, int64_t size,
                               AxisOrigin origin, SourceRange range) {
  info.addAxis({name, size, origin, range});
}

int64_t FlowChecker::axisSize(const std::string &name) const {
  const AxisInfo *a = info.findAxis(name);
  return a ? a->size : 0;
}

void FlowChecker::checkConsts() {
  Scope scope(Stage::Const);
  for (Decl &decl : flow.decls) {
    if (decl.kind != DeclKind::Const)
      continue;
    if (diags.shouldStop())
      break;
    currentDecl =
        declIndex.count(decl.name.name) ? declIndex[decl.name.name] : -1;
    ExprInfo value = analyze(*decl.value, scope);
    constsDone.insert(decl.name.name);
    ConstInfo c;
    c.name = decl.name.name;
    c.range = decl.name.range;
    c.init = decl.value.get();
    if (value.kind == ValueKind::Tensor) {
      c.shape = value.shape;
      if (c.shape.has("block") || c.shape.has("head")) {
        diags.error(decl.value->range,
                    "const '" + c.name + "' cannot have axis '" +
                        (c.shape.has("block") ? "block" : "head") +
                        "': consts are the same for every sequence and head");
      }
      markCompileTime(*decl.value);
    } else if (value.kind != ValueKind::Unknown) {
      requireTensor(*decl.value, "the value of const '" + c.name + "'");
    }
    if (value.kind != ValueKind::Tensor)
      inError.insert(c.name);
    info.addConst(c);
  }
  currentDecl = -1;
}

std::optional<DType> FlowChecker::checkDType(const std::optional<Ident> &dtype,
                                             DType fallback) {
  if (!dtype)
    return fallback;
  std::optional<DType> parsed = parseDType(dtype->name);
  if (!parsed) {
    diags.error(dtype->range, "unknown storage dtype '" + dtype->name +
                                  "'; expected f32, bf16, f16, fp8e4m3 or "
                                  "fp8e5m2");
    return std::nullopt;
  }
  return parsed;
}

void FlowChecker::checkStates() {
  Scope scope(Stage::StateInit);
  for (Decl &decl : flow.decls) {
    if (decl.kind != DeclKind::State)
      continue;
    if (diags.shouldStop())
      return;
    unsigned errorsAtStart = diags.getNumErrors();
    StateInfo state;
    state.name = decl.name.name;
    state.range = decl.name.range;
    if (auto dtype = checkDType(decl.type, DType::F32))
      state.dtype = *dtype;
    if (decl.axes.size() > kMaxAxesPerValue) {
      diags.error(decl.name.range.merge(decl.axes.back().range),
                  "state '" + state.name + "' has " +
                      std::to_string(decl.axes.size()) +
                      " axes; a value may have at most " +
                      std::to_string(kMaxAxesPerValue));
      oversizedStates.insert(state.name);
    }
    for (size_t i = 0; i < decl.axes.size() && i < kMaxAxesPerValue; ++i) {
      const Ident &axis = decl.axes[i];
      const AxisInfo *a = info.findAxis(axis.name);
      if (!a) {
        diags.error(axis.range, "unknown axis '" + axis.name + "'");
        if (auto close = closestName(axis.name, info.axisOrder()))
          diags.note(SourceRange(), "did you mean '" + *close + "'?");
        continue;
      }
      if (axis.name == "token") {
        diags.error(axis.range, "a state cannot have axis 'token': states "
                                "live per sequence or per block");
        continue;
      }
      if (state.shape.has(axis.name)) {
        diags.error(axis.range, "axis '" + axis.name +
                                    "' appears twice in state '" + state.name +
                                    "'");
        continue;
      }
      state.shape.insert({a->name, a->size}, axisRank);
    }
    SourceRange declared = decl.name.range;
    if (!decl.axes.empty())
      declared = declared.merge(decl.axes.back().range);
    if (!oversizedStates.count(state.name) &&
        !checkSize(state.shape, state.shape.has("block"), declared,
                   "state '" + state.name + "'"))
      oversizedStates.insert(state.name);
    ExprInfo value = analyze(*decl.value, scope);
    if (value.kind != ValueKind::Unknown) {
      if (std::optional<double> init = requireConst(
              *decl.value, "the initial value of state '" + state.name + "'"))
        state.init = *init;
      markCompileTime(*decl.value);
    }
    if (diags.getNumErrors() != errorsAtStart)
      inError.insert(state.name);
    info.addState(state);
  }
}

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
        diags.error(value.range,
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
      scope.lets.clear();
      defineField(decl.name, decl.type, *decl.value, scope);
    } else if (decl.kind == DeclKind::CacheBlock) {
      // Lets are local to their cache block.
      scope.lets.clear();
      if (decl.body.empty())
        diags.warning(decl.keywordRange, "empty cache block");
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
    diags.error(stmt.name.range,
                "'" + name + "' is an input and cannot be redefined");
  } else if (isBuiltinAxis(name)) {
    diags.error(stmt.name.range,
                "'" + name + "' is a builtin axis and cannot name a value");
  } else if (findReserved(name) && !declared.count(name)) {
    diags.error(stmt.name.range,
                "'" + name + "' is a reserved param and cannot be redefined");
  } else if (const LetBinding *prev = scope.findLet(name)) {
    diags.error(stmt.name.range, "redefinition of '" + name + "'");
    diags.note(prev->range, "previous definition is here");
  } else if (declared.count(name)) {
    diags.error(stmt.name.range,
                "'" + name + "' is already declared as " +
                    withArticle(declaredKindName(declared[name].kind)));
    diags.note(declared[name].range, "declared here");
  } else if (info.findAxis(name)) {
    diags.error(stmt.name.range,
                "'" + name + "' is an axis and cannot name a value");
  }
  scope.lets[name] = {name, stmt.name.range, stmt.value.get()};
}

//===----------------------------------------------------------------------===//
// The index stage
//===----------------------------------------------------------------------===//

void FlowChecker::checkIndex() {
  Decl *index = nullptr;
  for (Decl &decl : flow.decls) {
    if (decl.kind != DeclKind::Index)
      continue;
    if (index) {
      diags.error(decl.keywordRange,
                  "flow '" + info.name + "' has more than one index block");
      diags.note(index->keywordRange, "the first index block is here");
      continue;
    }
    index = &decl;
  }
  if (!index) {
    diags.error(flow.name.range, "flow '" + info.name +
                                     "' has no index block; add 'index { ... "
                                     "return topk(score, k); }'");
    return;
  }
  info.index = index;

  Scope scope(Stage::Index);
  const Stmt *returned = nullptr;
  for (Stmt &stmt : index->body) {
    if (returned) {
      diags.error(stmt.range, "statement after 'return' is never executed");
      diags.note(returned->range, "the index block returns here");
      break;
    }
    switch (stmt.kind) {
    case StmtKind::Let:
      defineLet(stmt, scope);
      break;
    case StmtKind::Assign: {
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
          diags.error(stmt.name.range,
                      "cannot assign to '" + name + "', " + what +
                          "; only states can be stored (use 'let' for a new "
                          "value)");
        } else {
          diags.error(stmt.name.range, "unknown state '" + name + "'");
          std::vector<std::string> names;
          for (const StateInfo &s : info.states)
            names.push_back(s.name);
          if (auto close = closestName(name, names))
            diags.note(declRangeOrNone(declared, *close),
                       "did you mean '" + *close + "'?");
          else
            diags.note(SourceRange(), "declare it with 'state " + name +
                                          "[block] = 0;' before assigning");
        }
        break;
      }
      auto prev = scope.storedStates.find(name);
      if (prev != scope.storedStates.end()) {
        diags.error(stmt.name.range,
                    "state '" + name + "' is stored twice in one step");
        diags.note(prev->second, "first stored here");
        break;
      }
      scope.storedStates[name] = stmt.range;
      state->stored = true;
      if (inError.count(name))
        break;
      if (v.kind == ValueKind::Tensor && v.shape != state->shape) {
        diags.error(stmt.value->range, "the value stored to state '" + name +
                                           "' has axes " + v.shape.str() +
                                           ", but the state has " +
                                           state->shape.str());
        diags.note(state->range, "state '" + name + "' is declared here");
      } else if (v.kind != ValueKind::Unknown) {
        requireTensor(*stmt.value, "the value stored to state '" + name + "'");
      }
      break;
    }
    case StmtKind::Return: {
      returned = &stmt;
      ExprInfo v = analyze(*stmt.value, scope);
      info.selection = stmt.value.get();
      if (v.kind == ValueKind::Tensor) {
        diags.error(stmt.value->range,
                    "'return' needs a selection such as topk(score, k), "
                    "threshold(score, t) or union(...); this is " +
                        describeValue(v.shape));
      } else if (v.kind != ValueKind::Unknown &&
                 v.kind != ValueKind::Selection) {
        diags.error(stmt.value->range,
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
    diags.error(index->closeBrace,
                "index block of flow '" + info.name +
                    "' does not return a selection; end it with 'return "
                    "topk(score, k);'");
  }
  // Unused cache fields cost memory and bandwidth (said only when the flow
  // is otherwise fine: a misspelled read would make it a false alarm).
  if (diags.hasErrors())
    return;
  for (FieldInfo &field : info.fields)
    if (!field.readInIndex && declared.count(field.name) &&
        declared[field.name].range.begin == field.range.begin)
      diags.warning(field.range, "cache field '" + field.name +
                                     "' is never read in the index stage");
}

//===----------------------------------------------------------------------===//
// Expressions
//===----------------------------------------------------------------------===//

bool FlowChecker::requireTensor(Expr &expr, const std::string &role) {
  switch (expr.info.kind) {
  case ValueKind::Tensor:
    return true;
  case ValueKind::Unknown:
    return false;
  case ValueKind::Axis:
    diags.error(expr.range,
                "'" + cast<NameExpr>(expr).name +
                    "' is an axis, not a value; " +
                    "axes appear only as arguments of reductions and shape "
                    "functions");
    return false;
  case ValueKind::Selection:
    diags.error(expr.range, role + " must be a tensor, but this is a "
                                   "selection; selections can only be "
                                   "returned or combined with union");
    return false;
  case ValueKind::String:
    diags.error(expr.range,
                "a string is only allowed as the file name of load(...)");
    return false;
  case ValueKind::List:
    diags.error(expr.range, "a list is only allowed as an argument of "
                            "rademacher, gaussian, tensor, load or conv");
    return false;
  }
  return false;
}

bool FlowChecker::requireBudget(Expr &expr, const std::string &role) {
  if (!requireTensor(expr, role))
    return false;
  if (!expr.info.shape.isScalar()) {
    diags.error(expr.range, role + " must be a scalar, but it has axes " +
                                expr.info.shape.str());
    return false;
  }
  if (expr.info.hostEvaluable)
    return checkBudgetValues(expr);
  diags.error(expr.range,
              role + " must be computable on the host, from literals, params, "
                     "num_blocks and context_len with + - * / min max");
  // Point at the first part that only the device knows.
  std::function<const Expr *(const Expr &)> culprit =
      [&](const Expr &e) -> const Expr * {
    if (e.info.hostEvaluable)
      return nullptr;
    if (auto *b = dyn_cast<BinaryExpr>(&e)) {
      if (const Expr *c = culprit(*b->lhs))
        return c;
      if (const Expr *c = culprit(*b->rhs))
        return c;
    } else if (auto *u = dyn_cast<UnaryExpr>(&e)) {
      if (const Expr *c = culprit(*u->operand))
        return c;
    } else if (auto *call = dyn_cast<CallExpr>(&e)) {
      if (call->builtin == Builtin::Maximum ||
          call->builtin == Builtin::Minimum)
        for (const CallArg &a : call->args)
          if (a.value)
            if (const Expr *c = culprit(*a.value))
              return c;
    }
    return &e;
  };
  if (const Expr *c = culprit(expr)) {
    std::string what = "this";
    if (auto *n = dyn_cast<NameExpr>(c))
      what = "'" + n->name + "'";
    else if (auto *call = dyn_cast<CallExpr>(c))
      what = "'" + call->callee + "(...)'";
    diags.note(c->range, what + (c->info.deps & DepDevice
                                     ? " is only known on the device"
                                     : " cannot be evaluated by the host"));
  }
  return false;
}

/// The size model: a value may have at most limits::kMaxElements elements,
/// per block for values with the block axis (and the cache stage's), in all
/// otherwise; G and D (unless head_dim fixes it) count at their largest.
bool FlowChecker::checkSize(const Shape &shape, bool perBlock, SourceRange at,
                            const std::string &what) {
  if (shape.getAxes().size() > kMaxAxesPerValue) {
    diags.error(at, what + " has " + std::to_string(shape.getAxes().size()) +
                        " axes; a value may have at most " +
                        std::to_string(kMaxAxesPerValue));
    return false;
  }
  // Two products, overflow-safe: all axes with G and D at their largest
  // (N not counted), and the fixed-size axes alone.
  int64_t worst = 1, fixed = 1;
  bool usesG = false, usesD = false;
  for (const Axis &a : shape.getAxes()) {
    int64_t n = a.size;
    if (n == kSizeBlocks)
      continue;
    if (n == kSizeGroup) {
      n = limits::kMaxGroup;
      usesG = true;
    } else if (n == kSizeHeadDim) {
      n = limits::kMaxHeadDim;
      usesD = true;
    } else if (fixed >= 0) {
      fixed = limits::boundedProduct(fixed, n, limits::kMaxStaticElements);
    }
    if (worst >= 0)
      worst = limits::boundedProduct(worst, n, limits::kMaxElements);
  }
  if (worst >= 0 && fixed >= 0)
    return true;
  bool staticOnly = worst >= 0;
  // The count for the message: exact when it fits int64, else about.
  int64_t exact = 1;
  bool overflow = false;
  double approx = 1;
  for (const Axis &a : shape.getAxes()) {
    int64_t n = a.size == kSizeGroup     ? limits::kMaxGroup
                : a.size == kSizeHeadDim ? limits::kMaxHeadDim
                                         : a.size;
    if (a.size == kSizeBlocks || (staticOnly && a.size < 0))
      continue;
    approx *= double(n);
    overflow = overflow || __builtin_mul_overflow(exact, n, &exact);
  }
  std::string count;
  if (!overflow) {
    count = std::to_string(exact);
  } else {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "about %.3g", approx);
    count = buf;
  }
  const char *per = perBlock ? " per block" : "";
  if (staticOnly) {
    diags.error(at, what + " is too large: " + shape.str() + " has " + count +
                        " elements in its fixed-size axes" + per +
                        "; the limit is " +
                        describeLimit(limits::kMaxStaticElements) + per);
    return false;
  }
  std::string assumed;
  if (usesG || usesD)
    assumed =
        std::string(" with ") + (usesG ? "G = 64" : "") +
        (usesG && usesD ? " and " : "") + (usesD ? "D = 1024" : "") +
        (usesG && usesD ? " (their largest values)" : " (its largest value)");
  diags.error(at, what + " is too large: " + shape.str() + " is " + count +
                      " elements" + per + assumed + "; the limit is " +
                      describeLimit(limits::kMaxElements) + per);
  if (usesD)
    diags.note(SourceRange(), "'dim' has the head dimension D as its size; "
                              "set 'param head_dim = ...;' to specialize the "
                              "flow to one head dimension");
  return false;
}

namespace {

/// The params and host inputs a budget reads (through lets).
struct BudgetReads {
  bool numBlocks = false, contextLen = false;
  std::vector<const ParamInfo *> params;
};

BudgetReads collectBudgetReads(const Expr &expr, const FlowInfo &flow) {
  BudgetReads reads;
  forEachNode(expr, true, [&](const Expr &e) {
    auto *n = dyn_cast<NameExpr>(&e);
    if (!n)
      return;
    if (n->ref == NameRef::Input) {
      reads.numBlocks |= n->name == "num_blocks";
      reads.contextLen |= n->name == "context_len";
    } else if (n->ref == NameRef::Param) {
      const ParamInfo *p = flow.findParam(n->name);
      if (p &&
          std::find(reads.params.begin(), reads.params.end(), p) ==
              reads.params.end() &&
          reads.params.size() < 8)
        reads.params.push_back(p);
    }
  });
  return reads;
}

std::string formatNumber(double v) {
  char buf[32];
  if (v == std::floor(v) && std::abs(v) < 1e17)
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  else
    std::snprintf(buf, sizeof(buf), "%.10g", v);
  return buf;
}

/// Source text on one line, shortened for a message.
std::string oneLine(const std::string &text) {
  std::string out = collapseWhitespace(text);
  return out.size() > 60 ? out.substr(0, 57) + "..." : out;
}

} // namespace

/// A budget must not be NaN or negative for the params given, at any of a
/// sample of sequence lengths: num_blocks in limits::budgetSampleBlocks()
/// ({0, 1, 2, 3, 4, 8, ..., 2^20}), context_len at both ends of each (the
/// host rounds the f64 value down).
bool FlowChecker::checkBudgetValues(const Expr &expr) {
  BudgetReads reads = collectBudgetReads(expr, info);
  std::vector<const Expr *> lets = letsReadBy(expr);
  int64_t blockSize = info.blockSize();
  // The runtime checks the same samples when a param is set; a budget that
  // reads neither input has one value.
  std::vector<int64_t> blocks = {0};
  if (reads.numBlocks || reads.contextLen)
    blocks = limits::budgetSampleBlocks();
  for (int64_t n : blocks) {
    std::vector<int64_t> lengths = {n * blockSize};
    if (reads.contextLen)
      lengths.push_back(n * blockSize + blockSize - 1);
    for (int64_t len : lengths) {
      HostValues host{double(n), double(len)};
      std::optional<double> v =
          ScalarEvaluator(info, &host, nullptr).evalAfterLets(expr, lets);
      if (!v || (!std::isnan(*v) && *v >= 0))
        continue;
      std::string at;
      if (reads.numBlocks)
        at += "num_blocks = " + std::to_string(n);
      if (reads.contextLen)
        at += (at.empty() ? "" : ", ") + std::string("context_len = ") +
              std::to_string(len);
      std::string with;
      for (const ParamInfo *p : reads.params)
        with += (with.empty() ? "" : ", ") + p->name + " = " +
                formatNumber(p->value) + (p->overridden ? " (from -p)" : "");
      std::string text =
          diags.getBuffer()
              ? oneLine(diags.getBuffer()->getRangeText(expr.range))
              : std::string("k");
      std::string message = "budget '" + text + "' is " +
                            (std::isnan(*v) ? std::string("NaN (not a number)")
                                            : formatNumber(*v)) +
                            (at.empty() ? "" : " at " + at) +
                            (with.empty() ? "" : " with " + with);
      diags.error(expr.range,
                  message + (std::isnan(*v)
                                 ? "; a budget must be a number >= 0"
                                 : "; a budget must be >= 0: write max(0, "
                                   "...)"));
      return false;
    }
  }
  return true;
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
    diags.error(range, "'" + name + "' is used in its own declaration");
    return;
  }
  if (it != declared.end()) {
    diags.error(range, "'" + name + "' is used before its declaration");
    diags.note(it->second.range,
               std::string(declaredKindName(it->second.kind)) + " '" + name +
                   "' is declared here");
    return;
  }
  diags.error(range, "unknown name '" + shortName(name) + "'");
  if (auto close = closestName(name, visibleNames(scope))) {
    SourceRange at;
    auto d = declared.find(*close);
    if (d != declared.end())
      at = d->second.range;
    else if (const LetBinding *let = scope.findLet(*close))
      at = let->range;
    diags.note(at, "did you mean '" + *close + "'?");
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
    diags.error(expr.range, "internal error: this expression could not be "
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

ExprInfo FlowChecker::analyzeName(NameExpr &expr, Scope &scope) {
  const std::string &name = expr.name;
  Stage stage = scope.stage;
  bool inStage = stage == Stage::Cache || stage == Stage::Index;

  if (const LetBinding *let = scope.findLet(name)) {
    expr.ref = NameRef::Let;
    expr.binding = let->value;
    return let->value->info;
  }

  if (isInputName(name)) {
    expr.ref = NameRef::Input;
    if (!inStage) {
      diags.error(expr.range, "input '" + name + "' cannot be used in " +
                                  stageName(stage) +
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
      diags.error(expr.range, "'" + name +
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
    if (name == "position")
      return tensor(Shape({axis("block")}), DepDevice, false);
    // num_blocks, context_len, step: per-sequence scalars the host knows.
    bool budgetInput = name == "num_blocks" || name == "context_len";
    return tensor(Shape(), DepHostInput, budgetInput);
  }

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
    diags.error(expr.range, "cache field '" + name + "' cannot be used in " +
                                stageName(stage));
    return error();
  }

  if (decl != declared.end() && kind == DeclaredKind::State) {
    if (stage != Stage::Index) {
      diags.error(expr.range,
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

std::optional<Shape>
FlowChecker::broadcast(const std::vector<const Expr *> &operands,
                       SourceRange at) {
  // The result shares an operand's axes when that operand has them all
  // (the usual case), so typing an expression copies no axes.
  Shape out;
  bool firstOperand = true;
  for (const Expr *e : operands) {
    const Shape &shape = e->info.shape;
    if (firstOperand) {
      out = shape;
      firstOperand = false;
      continue;
    }
    std::vector<const Axis *> missing;
    for (const Axis &a : shape.getAxes()) {
      const Axis *have = out.find(a.name);
      if (!have) {
        missing.push_back(&a);
        continue;
      }
      if (have->size == a.size)
        continue;
      const Expr *owner = nullptr;
      for (const Expr *o : operands) {
        if (o == e)
          break;
        if (o->info.shape.has(a.name)) {
          owner = o;
          break;
        }
      }
      diags.error(at, "axis '" + a.name + "' has size " +
                          describeSize(have->size) + " on one side but " +
                          describeSize(a.size) + " on the other");
      if (owner)
        diags.note(owner->range,
                   "this operand has axes " + owner->info.shape.str());
      diags.note(e->range, "this operand has axes " + e->info.shape.str());
      return std::nullopt;
    }
    if (missing.empty())
      continue;
    if (out.getAxes().size() + missing.size() == shape.getAxes().size()) {
      out = shape;
      continue;
    }
    // A union made before is shared too (the cache keeps its operands
    // alive, so their identities stay unique).
    auto key = std::make_pair(out.identity(), shape.identity());
    auto cached = unionCache.find(key);
    if (cached != unionCache.end()) {
      out = cached->second.result;
      continue;
    }
    CachedUnion entry{out, shape, out};
    for (const Axis *a : missing)
      entry.result.insert(*a, axisRank);
    out = entry.result;
    unionCache.emplace(key, std::move(entry));
  }
  return out;
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
      diags.error(expr.opRange,
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

const CallArg *FlowChecker::namedArg(const CallExpr &call,
                                     const std::string &name) {
  for (const CallArg &a : call.args)
    if (a.kind == CallArg::Kind::Named && a.name == name)
      return &a;
  return nullptr;
}

/// Checks the argument list shape: counts of positional arguments, allowed
/// named arguments (an empty name in `named` allows any one name: split's new
/// axis), no rename pairs unless the call is rename, positional before named.
bool FlowChecker::checkArgs(CallExpr &call, size_t minPositional,
                            size_t maxPositional,
                            const std::vector<std::string> &named) {
  size_t positional = 0;
  bool seenNamed = false, ok = true;
  std::set<std::string> seen;
  for (CallArg &arg : call.args) {
    if (arg.kind == CallArg::Kind::Rename) {
      if (call.builtin != Builtin::Rename) {
        diags.error(arg.range, "'a -> b' is only allowed in rename(...)");
        ok = false;
      }
      continue;
    }
    if (arg.kind == CallArg::Kind::Positional) {
      if (seenNamed) {
        diags.error(arg.range,
                    "positional argument after a named argument in " +
                        call.callee + "(...)");
        ok = false;
      }
      ++positional;
      continue;
    }
    seenNamed = true;
    if (!seen.insert(arg.name).second) {
      diags.error(arg.nameRange, "argument '" + arg.name + "' is given twice");
      ok = false;
      continue;
    }
    bool allowed =
        std::find(named.begin(), named.end(), arg.name) != named.end() ||
        std::find(named.begin(), named.end(), "") != named.end();
    if (!allowed) {
      std::string expected;
      for (const std::string &n : named)
        expected += (expected.empty() ? "'" : ", '") + n + "'";
      diags.error(arg.nameRange,
                  "unknown argument '" + arg.name + "' for " + call.callee +
                      (expected.empty() ? "; it takes no named arguments"
                                        : "; expected " + expected));
      ok = false;
    }
  }
  if (positional < minPositional || positional > maxPositional) {
    std::string want = minPositional == maxPositional
                           ? std::to_string(minPositional)
                       : maxPositional == SIZE_MAX
                           ? "at least " + std::to_string(minPositional)
                           : std::to_string(minPositional) + " to " +
                                 std::to_string(maxPositional);
    diags.error(call.range,
                call.callee + " takes " + want + " positional argument" +
                    (want == "1" ? "" : "s") + ", but " +
                    std::to_string(positional) +
                    (positional == 1 ? " was" : " were") + " given");
    ok = false;
  }
  return ok;
}

ExprInfo FlowChecker::analyzeCall(CallExpr &call, Scope &scope) {
  call.builtin = Builtin::Unknown;
  for (const BuiltinEntry &entry : kBuiltins)
    if (call.callee == entry.name)
      call.builtin = entry.builtin;
  if (call.builtin == Builtin::Unknown) {
    diags.error(call.calleeRange,
                "unknown function '" + shortName(call.callee) + "'");
    if (auto close = closestName(call.callee, builtinFunctionNames()))
      diags.note(SourceRange(), "did you mean '" + *close + "'?");
    return error();
  }
  Builtin b = call.builtin;

  // Stage rules for whole families of builtins.
  if (isGenerator(b) && scope.stage != Stage::Const) {
    diags.error(call.calleeRange, call.callee +
                                      "(...) makes a constant tensor and is "
                                      "only allowed in a const declaration");
    return error();
  }
  bool blockOp = b == Builtin::Softmax || b == Builtin::Normalize ||
                 b == Builtin::Conv || b == Builtin::KthLargest;
  if ((blockOp || isSelectionBuiltin(b)) && scope.stage != Stage::Index) {
    diags.error(call.calleeRange, call.callee + "(...) works across blocks "
                                                "and is only allowed in the "
                                                "index stage");
    return error();
  }

  if (isSelectionBuiltin(b))
    return analyzeSelection(call, scope);
  if (isGenerator(b))
    return analyzeGenerator(call, scope);
  if (isReduction(b))
    return analyzeReduction(call, scope);
  if (blockOp)
    return analyzeBlockOp(call, scope);
  if (b == Builtin::Split || b == Builtin::Rename)
    return analyzeShapeOp(call, scope);

  // Elementwise.
  size_t arity = isUnaryMath(b)                                 ? 1
                 : (b == Builtin::Clamp || b == Builtin::Where) ? 3
                                                                : 2;
  bool argsOk = checkArgs(call, arity, arity, {});
  std::vector<const Expr *> operands;
  bool ok = argsOk;
  for (CallArg &arg : call.args) {
    if (!arg.value)
      continue;
    analyze(*arg.value, scope);
    if (!requireTensor(*arg.value, "an argument of " + call.callee))
      ok = false;
    operands.push_back(arg.value.get());
  }
  if (!ok)
    return error();
  std::optional<Shape> shape = broadcast(operands, call.range);
  if (!shape)
    return error();
  unsigned deps = 0;
  bool host = b == Builtin::Maximum || b == Builtin::Minimum;
  for (const Expr *e : operands) {
    deps |= e->info.deps;
    host &= e->info.hostEvaluable;
  }
  return tensor(*shape, deps, host);
}

/// `arg` must be a bare axis name that `value` has.
bool FlowChecker::requireAxisOf(const Expr &arg, const ExprInfo &value,
                                const Expr &valueExpr, std::string &axisName) {
  auto *name = dyn_cast<NameExpr>(const_cast<Expr *>(&arg));
  if (!name) {
    diags.error(arg.range, "expected an axis name");
    return false;
  }
  axisName = name->name;
  name->ref = NameRef::Axis;
  name->info.kind = ValueKind::Axis;
  if (!info.findAxis(axisName)) {
    diags.error(arg.range, "unknown axis '" + shortName(axisName) + "'");
    if (auto close = closestName(axisName, info.axisOrder()))
      diags.note(SourceRange(), "did you mean '" + *close + "'?");
    return false;
  }
  if (value.kind == ValueKind::Tensor && !value.shape.has(axisName)) {
    diags.error(arg.range, "the value has no axis '" + axisName + "'");
    diags.note(valueExpr.range, "the value has axes " + value.shape.str());
    return false;
  }
  return true;
}

ExprInfo FlowChecker::analyzeReduction(CallExpr &call, Scope &scope) {
  if (!checkArgs(call, 1, SIZE_MAX, {}))
    return error();
  // The value first: it may create axes (rename, split) that later
  // arguments name.
  Expr &value = *call.args[0].value;
  analyze(value, scope);

  // max(a, b) and min(a, b) of two values are the elementwise maximum and
  // minimum (how budgets write min(budget, num_blocks / 2)).
  if ((call.builtin == Builtin::Max || call.builtin == Builtin::Min) &&
      call.args.size() == 2) {
    auto *second = dyn_cast<NameExpr>(call.args[1].value.get());
    bool secondIsAxis =
        second && info.findAxis(second->name) && !scope.findLet(second->name);
    if (!secondIsAxis) {
      call.builtin =
          call.builtin == Builtin::Max ? Builtin::Maximum : Builtin::Minimum;
      Expr &other = *call.args[1].value;
      analyze(other, scope);
      bool ok = requireTensor(value, "an argument of " + call.callee);
      ok &= requireTensor(other, "an argument of " + call.callee);
      if (!ok)
        return error();
      std::optional<Shape> shape = broadcast({&value, &other}, call.range);
      if (!shape)
        return error();
      return tensor(*shape, value.info.deps | other.info.deps,
                    value.info.hostEvaluable && other.info.hostEvaluable);
    }
  }
  if (!requireTensor(value, "the value reduced by " + call.callee))
    return error();
  if (call.args.size() < 2) {
    diags.error(call.range, call.callee +
                                "(x, axis, ...) needs the axes to reduce, "
                                "e.g. " +
                                call.callee + "(x, dim)");
    if (!value.info.shape.isScalar())
      diags.note(value.range, "the value has axes " + value.info.shape.str());
    return error();
  }
  Shape shape = value.info.shape;
  std::set<std::string> seen;
  for (size_t i = 1; i < call.args.size(); ++i) {
    std::string axis;
    if (!requireAxisOf(*call.args[i].value, value.info, value, axis))
      return error();
    if (!seen.insert(axis).second) {
      diags.error(call.args[i].range, "axis '" + axis + "' is reduced twice");
      return error();
    }
    shape.remove(axis);
  }
  return tensor(shape, value.info.deps, false);
}

ExprInfo FlowChecker::analyzeBlockOp(CallExpr &call, Scope &scope) {
  Builtin b = call.builtin;
  size_t positional = b == Builtin::Conv ? 3 : 2;
  std::vector<std::string> named;
  if (b == Builtin::Softmax)
    named.push_back("scale");
  if (!checkArgs(call, positional, positional, named))
    return error();
  Expr &value = *call.args[0].value;
  analyze(value, scope);
  if (!requireTensor(value, "the value of " + call.callee))
    return error();
  if (!value.info.shape.has("block")) {
    diags.error(value.range, call.callee +
                                 "(...) works along 'block', but the value "
                                 "has axes " +
                                 value.info.shape.str());
    return error();
  }
  if (b == Builtin::KthLargest) {
    Expr &k = *call.args[1].value;
    analyze(k, scope);
    if (!requireBudget(k, "k of kth_largest"))
      return error();
    Shape shape = value.info.shape;
    shape.remove("block");
    return tensor(shape, value.info.deps, false);
  }
  auto *axis = dyn_cast<NameExpr>(call.args[1].value.get());
  if (!axis || axis->name != "block") {
    diags.error(
        call.args[1].range,
        call.callee + "(...) runs along 'block'; write " + call.callee +
            (b == Builtin::Conv ? "(x, block, [w0, w1, w2])" : "(x, block)"));
    return error();
  }
  axis->ref = NameRef::Axis;
  axis->info.kind = ValueKind::Axis;
  unsigned deps = value.info.deps;
  if (b == Builtin::Softmax) {
    if (const CallArg *scale = namedArg(call, "scale")) {
      analyze(*scale->value, scope);
      if (!requireTensor(*scale->value, "the scale of softmax"))
        return error();
      if (!scale->value->info.shape.isScalar()) {
        diags.error(scale->value->range,
                    "the scale of softmax must be a scalar, but it has axes " +
                        scale->value->info.shape.str());
        return error();
      }
      deps |= scale->value->info.deps;
    }
  }
  if (b == Builtin::Conv) {
    Expr &weights = *call.args[2].value;
    analyze(weights, scope);
    auto *list = dyn_cast<ListExpr>(&weights);
    if (!list) {
      diags.error(weights.range,
                  "conv weights must be a list of numbers, e.g. [0.25, 0.5, "
                  "0.25]");
      return error();
    }
    if (list->elements.empty() || list->elements.size() % 2 == 0 ||
        list->elements.size() > 15) {
      diags.error(weights.range,
                  "conv needs an odd number of weights (1 to 15) so that it "
                  "is centered; got " +
                      std::to_string(list->elements.size()));
      return error();
    }
    for (const ExprPtr &w : list->elements) {
      if (!requireConst(*w, "a conv weight"))
        return error();
      markCompileTime(*w);
    }
  }
  return tensor(value.info.shape, deps, false);
}

bool FlowChecker::checkAxisCreation(const std::string &name, int64_t size,
                                    SourceRange range) {
  if (const AxisInfo *a = info.findAxis(name)) {
    if (a->size != size) {
      bool declaredAxis = a->origin == AxisOrigin::Declared;
      diags.error(range, "axis '" + name + "' is " +
                             (declaredAxis ? "declared" : "made elsewhere") +
                             " with size " + formatAxisSize(a->size) +
                             ", but this makes it " + describeSize(size));
      diags.note(a->range, "axis '" + name + "' is " +
                               (declaredAxis ? "declared" : "first made") +
                               " here");
      return false;
    }
    return true;
  }
  if (declared.count(name)) {
    diags.error(range, "'" + name + "' is already " +
                           withArticle(declaredKindName(declared[name].kind)) +
                           " and cannot name an axis");
    return false;
  }
  registerAxis(name, size, AxisOrigin::Split, range);
  return true;
}

ExprInfo FlowChecker::analyzeShapeOp(CallExpr &call, Scope &scope) {
  if (call.builtin == Builtin::Split) {
    if (!checkArgs(call, 2, 2, {""}))
      return error();
    const CallArg *outer = nullptr;
    for (const CallArg &a : call.args) {
      if (a.kind != CallArg::Kind::Named)
        continue;
      if (outer) {
        diags.error(a.nameRange, "split makes one new axis; '" + outer->name +
                                     "' is already it");
        return error();
      }
      outer = &a;
    }
    if (!outer) {
      diags.error(call.range, "split needs the new axis and its size, e.g. "
                              "split(x, token, sub = 4)");
      return error();
    }
    Expr &value = *call.args[0].value;
    analyze(value, scope);
    if (!requireTensor(value, "the value of split"))
      return error();
    std::string axis;
    if (!requireAxisOf(*call.args[1].value, value.info, value, axis))
      return error();
    if (axis == "block") {
      diags.error(call.args[1].range, "the 'block' axis cannot be split");
      return error();
    }
    int64_t size = value.info.shape.find(axis)->size;
    analyze(*outer->value, scope);
    std::optional<int64_t> factor = requirePositiveInt(
        *outer->value, "the size of split axis '" + outer->name + "'",
        limits::kMaxAxisSize);
    if (!factor)
      return error();
    markCompileTime(*outer->value);
    if (size < 0) {
      diags.error(
          call.args[1].range,
          "axis '" + axis + "' has size " + describeSize(size) +
              ", known only when the flow is attached to a cache, so "
              "it cannot be split" +
              (axis == "dim" ? "; fix it with 'param head_dim = ...;'" : ""));
      return error();
    }
    if (size % *factor != 0) {
      diags.error(outer->value->range, "cannot split axis '" + axis +
                                           "' of size " + std::to_string(size) +
                                           " into " + std::to_string(*factor) +
                                           " parts");
      return error();
    }
    if (isBuiltinAxis(outer->name) || value.info.shape.has(outer->name)) {
      diags.error(outer->nameRange, "the new axis '" + outer->name +
                                        "' already exists on the value");
      return error();
    }
    if (!checkAxisCreation(outer->name, *factor, outer->nameRange))
      return error();
    Shape shape = value.info.shape;
    shape.remove(axis);
    shape.insert({axis, size / *factor}, axisRank);
    shape.insert({outer->name, *factor}, axisRank);
    return tensor(shape, value.info.deps, false);
  }

  // rename(x, a -> b, ...)
  if (call.args.empty() || call.args[0].kind != CallArg::Kind::Positional) {
    diags.error(call.range, "rename needs a value and pairs like 'm -> n'");
    return error();
  }
  Expr &value = *call.args[0].value;
  analyze(value, scope);
  if (!requireTensor(value, "the value of rename"))
    return error();
  if (call.args.size() < 2) {
    diags.error(call.range, "rename needs at least one pair like 'm -> n'");
    return error();
  }
  Shape shape = value.info.shape;
  for (size_t i = 1; i < call.args.size(); ++i) {
    CallArg &arg = call.args[i];
    if (arg.kind != CallArg::Kind::Rename) {
      diags.error(arg.range, "expected a pair like 'm -> n'");
      return error();
    }
    if (!info.findAxis(arg.name)) {
      diags.error(arg.nameRange, "unknown axis '" + arg.name + "'");
      return error();
    }
    const Axis *from = shape.find(arg.name);
    if (!from) {
      diags.error(arg.nameRange, "the value has no axis '" + arg.name + "'");
      diags.note(value.range, "the value has axes " + shape.str());
      return error();
    }
    if (arg.name == "block" || arg.to == "block") {
      diags.error(arg.range, "the 'block' axis cannot be renamed");
      return error();
    }
    if (shape.has(arg.to)) {
      diags.error(arg.toRange,
                  "the value already has an axis '" + arg.to + "'");
      return error();
    }
    int64_t size = from->size;
    if (isBuiltinAxis(arg.to) && axisSize(arg.to) != size) {
      diags.error(arg.toRange, "axis '" + arg.to + "' has size " +
                                   describeSize(axisSize(arg.to)) + ", but '" +
                                   arg.name + "' has size " +
                                   describeSize(size));
      return error();
    }
    if (!isBuiltinAxis(arg.to) && !checkAxisCreation(arg.to, size, arg.toRange))
      return error();
    shape.remove(arg.name);
    shape.insert({arg.to, size}, axisRank);
  }
  return tensor(shape, value.info.deps, false);
}

Shape FlowChecker::axesFromList(const Expr &listExpr, bool &ok,
                                std::vector<std::string> *listed) {
  ok = false;
  auto *list = dyn_cast<ListExpr>(&listExpr);
  if (!list) {
    diags.error(listExpr.range, "expected a list of axes, e.g. [dim, m]");
    return Shape();
  }
  if (list->elements.size() > kMaxAxesPerValue) {
    diags.error(listExpr.range, "this list has " +
                                    std::to_string(list->elements.size()) +
                                    " axes; a value may have at most " +
                                    std::to_string(kMaxAxesPerValue));
    return Shape();
  }
  Shape shape;
  for (const ExprPtr &e : list->elements) {
    auto *name = dyn_cast<NameExpr>(e.get());
    if (!name || !info.findAxis(name->name)) {
      diags.error(e->range, name ? "unknown axis '" + name->name + "'"
                                 : std::string("expected an axis name"));
      if (name)
        if (auto close = closestName(name->name, info.axisOrder()))
          diags.note(SourceRange(), "did you mean '" + *close + "'?");
      return Shape();
    }
    const AxisInfo *axis = info.findAxis(name->name);
    if (axis->origin == AxisOrigin::Declared && declaredLater(name->name)) {
      diags.error(e->range,
                  "axis '" + name->name + "' is used before its declaration");
      diags.note(axis->range, "axis '" + name->name + "' is declared here");
      return Shape();
    }
    if (name->name == "block" || name->name == "head") {
      diags.error(e->range, "a const cannot have axis '" + name->name +
                                "': consts are the same for every sequence "
                                "and head");
      return Shape();
    }
    if (shape.has(name->name)) {
      diags.error(e->range, "axis '" + name->name + "' is listed twice");
      return Shape();
    }
    name->ref = NameRef::Axis;
    name->info.kind = ValueKind::Axis;
    shape.insert({name->name, axisSize(name->name)}, axisRank);
    if (listed)
      listed->push_back(name->name);
  }
  ok = true;
  return shape;
}

ExprInfo FlowChecker::analyzeGenerator(CallExpr &call, Scope &scope) {
  Builtin b = call.builtin;
  if (b == Builtin::Rademacher || b == Builtin::Gaussian) {
    if (!checkArgs(call, 1, 1, {"seed"}))
      return error();
    bool ok;
    Shape shape = axesFromList(*call.args[0].value, ok);
    if (!ok)
      return error();
    if (const CallArg *seed = namedArg(call, "seed")) {
      analyze(*seed->value, scope);
      std::optional<double> s = requireConst(*seed->value, "the seed");
      if (!s)
        return error();
      if (*s < 0 || *s != std::floor(*s) || *s > 4294967295.0) {
        diags.error(seed->value->range,
                    "the seed must be an integer between 0 and 2^32-1");
        return error();
      }
    }
    return tensor(shape, DepNone, false);
  }

  // tensor([axes], values) and load("file.npy", [axes]).
  bool isLoad = b == Builtin::Load;
  if (!checkArgs(call, 2, 2, {}))
    return error();
  Expr &axesArg = isLoad ? *call.args[1].value : *call.args[0].value;
  Expr &dataArg = isLoad ? *call.args[0].value : *call.args[1].value;
  bool ok;
  std::vector<std::string> listed;
  Shape shape = axesFromList(axesArg, ok, &listed);
  if (!ok)
    return error();
  std::vector<int64_t> sizes;
  for (const std::string &name : listed) {
    int64_t size = axisSize(name);
    if (size < 0) {
      diags.error(axesArg.range,
                  "axis '" + name + "' has size " + describeSize(size) +
                      ", known only when the flow is attached to a cache; "
                      "literal data needs fixed sizes" +
                      (name == "dim" ? " (fix it with 'param head_dim = "
                                       "...;')"
                                     : ""));
      return error();
    }
    sizes.push_back(size);
  }
  // The size model before anything is read or allocated.
  if (!checkSize(shape, false, call.range, "this value"))
    return error();
  int64_t count = 1;
  for (int64_t s : sizes)
    count *= s;
  if (count > limits::kMaxLiteralElements) {
    diags.error(call.range,
                "literal data of " + std::to_string(count) +
                    " elements is over the limit of " +
                    std::to_string(limits::kMaxLiteralElements) +
                    " (2^20): it is compiled into the flow's code as a "
                    "table");
    return error();
  }

  std::vector<float> rowMajor; // In listed axis order.
  LiteralData data;
  if (isLoad) {
    auto *file = dyn_cast<StringExpr>(&dataArg);
    if (!file) {
      diags.error(dataArg.range, "load needs a file name string, e.g. "
                                 "load(\"mask.npy\", [dim])");
      return error();
    }
    std::string path = file->value;
    if (!path.empty() && path[0] != '/')
      path = options.baseDir + "/" + path;
    NpyArray array;
    std::string why;
    if (!readNpy(path, array, why)) {
      diags.error(call.range, "cannot load const data: " + why);
      return error();
    }
    if (array.shape != sizes) {
      std::string have = "(", want = "(";
      for (size_t i = 0; i < array.shape.size(); ++i)
        have += (i ? ", " : "") + std::to_string(array.shape[i]);
      for (size_t i = 0; i < sizes.size(); ++i)
        want += (i ? ", " : "") + std::to_string(sizes[i]);
      diags.error(call.range, "'" + file->value + "' has shape " + have +
                                  ") but the axes need " + want + ")");
      return error();
    }
    rowMajor = std::move(array.values);
    data.source = file->value;
  } else {
    // Nested lists, one level per listed axis.
    std::function<bool(const Expr &, size_t)> flatten = [&](const Expr &e,
                                                            size_t depth) {
      if (depth == sizes.size()) {
        std::optional<double> v = requireConst(e, "a tensor literal value");
        if (!v)
          return false;
        markCompileTime(e);
        rowMajor.push_back(static_cast<float>(*v));
        return true;
      }
      auto *list = dyn_cast<ListExpr>(&e);
      if (!list || list->elements.size() != size_t(sizes[depth])) {
        diags.error(e.range, "expected a list of " +
                                 std::to_string(sizes[depth]) +
                                 " entries for axis '" + listed[depth] + "'");
        return false;
      }
      for (const ExprPtr &child : list->elements)
        if (!flatten(*child, depth + 1))
          return false;
      return true;
    };
    analyze(dataArg, scope);
    if (!flatten(dataArg, 0))
      return error();
  }
  // Reorder from the listed order to the canonical order of `shape`: walk
  // the canonical index like an odometer, moving the source offset by the
  // listed stride of the axis that steps (linear time).
  std::vector<std::string> canon = shape.names();
  std::vector<int64_t> strides(listed.size(), 1);
  for (size_t i = listed.size(); i-- > 1;)
    strides[i - 1] = strides[i] * sizes[i];
  if (canon == listed || int64_t(rowMajor.size()) != count) {
    data.values = std::move(rowMajor);
  } else {
    std::vector<int64_t> canonStride(canon.size()), canonSize(canon.size());
    for (size_t c = 0; c < canon.size(); ++c) {
      size_t l =
          std::find(listed.begin(), listed.end(), canon[c]) - listed.begin();
      canonStride[c] = strides[l];
      canonSize[c] = sizes[l];
    }
    data.values.resize(count);
    std::vector<int64_t> idx(canon.size(), 0);
    int64_t src = 0;
    for (int64_t linear = 0; linear < count; ++linear) {
      data.values[linear] = rowMajor[src];
      for (size_t c = canon.size(); c-- > 0;) {
        src += canonStride[c];
        if (++idx[c] < canonSize[c])
          break;
        src -= canonStride[c] * canonSize[c];
        idx[c] = 0;
      }
    }
  }
  info.literals[&call] = std::move(data);
  return tensor(shape, DepNone, false);
}

ExprInfo FlowChecker::analyzeSelection(CallExpr &call, Scope &scope) {
  ExprInfo out;
  out.kind = ValueKind::Selection;
  out.deps = DepDevice;
  Builtin b = call.builtin;
  if (b == Builtin::Union) {
    if (!checkArgs(call, 2, SIZE_MAX, {}))
      return error();
    bool ok = true;
    for (CallArg &arg : call.args) {
      ExprInfo v = analyze(*arg.value, scope);
      if (v.kind != ValueKind::Selection && v.kind != ValueKind::Unknown) {
        diags.error(arg.value->range,
                    "union combines selections such as topk(...), but this "
                    "is " +
                        std::string(v.kind == ValueKind::Tensor
                                        ? describeValue(v.shape)
                                        : "not a selection"));
        ok = false;
      }
      ok &= v.kind == ValueKind::Selection;
    }
    return ok ? out : error();
  }

  std::vector<std::string> named;
  if (b == Builtin::ApproxTopK)
    named = {"recall"};
  if (b == Builtin::Threshold)
    named = {"max"};
  if (!checkArgs(call, 2, 2, named))
    return error();
  Expr &score = *call.args[0].value;
  analyze(score, scope);
  if (!requireTensor(score, "the score of " + call.callee))
    return error();
  const Shape &s = score.info.shape;
  if (s.getAxes().size() != 1 || !s.has("block")) {
    diags.error(score.range, "the score of " + call.callee +
                                 " must have exactly the axes [block], but " +
                                 itHasAxes(s));
    std::string extra;
    for (const Axis &a : s.getAxes())
      if (a.name != "block")
        extra += (extra.empty() ? "" : ", ") + a.name;
    if (!extra.empty())
      diags.note(score.range, "reduce " + extra + " first, e.g. max(score, " +
                                  s.getAxes().back().name + ")");
    return error();
  }
  Expr &second = *call.args[1].value;
  analyze(second, scope);
  if (b == Builtin::Threshold) {
    if (!requireTensor(second, "the threshold"))
      return error();
    if (!second.info.shape.isScalar()) {
      diags.error(second.range, "the threshold must be a scalar (one value "
                                "per sequence), but it has axes " +
                                    second.info.shape.str());
      return error();
    }
    if (const CallArg *max = namedArg(call, "max")) {
      analyze(*max->value, scope);
      if (!requireBudget(*max->value, "the max of threshold"))
        return error();
    }
    return out;
  }
  if (!requireBudget(second, "the budget k of " + call.callee))
    return error();
  if (const CallArg *recall = namedArg(call, "recall")) {
    analyze(*recall->value, scope);
    std::optional<double> r = requireConst(*recall->value, "the recall");
    if (!r)
      return error();
    if (!(*r > 0 && *r <= 1)) {
      diags.error(recall->value->range,
                  "the recall of approx_topk must be in (0, 1]");
      return error();
    }
    markCompileTime(*recall->value);
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Compile-time evaluation
//===----------------------------------------------------------------------===//

std::optional<double> FlowChecker::constEval(const Expr &expr,
                                             const Expr **offender) {
  return evalScalar(expr, info, nullptr, offender);
}

std::optional<double> FlowChecker::requireConst(const Expr &expr,
                                                const std::string &role) {
  if (expr.info.kind == ValueKind::Unknown)
    return std::nullopt;
  if (expr.info.kind == ValueKind::List ||
      expr.info.kind == ValueKind::String ||
      expr.info.kind == ValueKind::Selection ||
      expr.info.kind == ValueKind::Axis) {
    diags.error(expr.range, role + " must be a number");
    return std::nullopt;
  }
  if (expr.info.kind == ValueKind::Tensor && !expr.info.shape.isScalar()) {
    diags.error(expr.range, role + " must be a number, but it has axes " +
                                expr.info.shape.str());
    return std::nullopt;
  }
  const Expr *offender = nullptr;
  std::optional<double> v = constEval(expr, &offender);
  if (!v) {
    diags.error(expr.range, role + " must be known at compile time (numbers "
                                   "and params only)");
    if (offender && offender != &expr)
      diags.note(offender->range, "this is not a compile-time value");
    return std::nullopt;
  }
  if (std::isnan(*v)) {
    diags.error(expr.range, role + " is not a number (NaN)");
    return std::nullopt;
  }
  return v;
}

std::optional<int64_t> FlowChecker::requirePositiveInt(const Expr &expr,
                                                       const std::string &role,
                                                       int64_t max) {
  std::optional<double> v = requireConst(expr, role);
  if (!v)
    return std::nullopt;
  if (*v != std::floor(*v) || *v < 1 || *v > double(max)) {
    diags.error(
        expr.range, role + " must be an integer between 1 and " +
                        std::to_string(max) + ", but it is " + [&] {
                          char buf[32];
                          std::snprintf(buf, sizeof(buf), "%g", *v);
                          return std::string(buf);
                        }());
    return std::nullopt;
  }
  return static_cast<int64_t>(*v);
}

} // namespace

//===----------------------------------------------------------------------===//
// Entry points
//===----------------------------------------------------------------------===//

const std::vector<std::string> &vflow::builtinFunctionNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const BuiltinEntry &e : kBuiltins)
      out.push_back(e.name);
    return out;
  }();
  return names;
}

bool vflow::analyzeModule(Module &module, const SemaOptions &options,
                          DiagnosticEngine &diags, CheckedModule &out) {
  unsigned errorsBefore = diags.getNumErrors();
  if (module.flows.empty()) {
    diags.error(SourceRange(0, 0),
                "no flow in this file; a program is 'flow NAME { ... }'");
    return false;
  }
  // Overrides from a caller that did not parse them with the reason
  // (parseParamOverride's short form) are checked here.
  std::set<std::string> malformed;
  for (const ParamOverride &ov : options.overrides) {
    std::string why = checkParamOverrideName(ov.name);
    if (why.empty())
      continue;
    malformed.insert(ov.name);
    diags.error(SourceRange(), "-p " + shortName(ov.name) + "=" +
                                   shortName(ov.value) + ": " + why);
  }
  std::map<std::string, SourceRange> flowNames;
  std::set<std::string> usedOverrides;
  out.flows.clear();
  out.flows.reserve(module.flows.size());
  for (Flow &flow : module.flows) {
    auto prev = flowNames.find(flow.name.name);
    if (prev != flowNames.end()) {
      diags.error(flow.name.range,
                  "redefinition of flow '" + flow.name.name + "'");
      diags.note(prev->second, "previous definition is here");
      continue;
    }
    flowNames[flow.name.name] = flow.name.range;
    out.flows.emplace_back();
    FlowChecker checker(flow, out.flows.back(), options, diags, usedOverrides);
    checker.run();
    if (diags.shouldStop())
      break;
  }
  if (options.usedOverrides)
    options.usedOverrides->insert(usedOverrides.begin(), usedOverrides.end());
  for (const ParamOverride &ov : options.overrides) {
    if (!options.reportUnusedOverrides)
      break;
    if (usedOverrides.count(ov.name) || malformed.count(ov.name))
      continue;
    std::string where = "-p " + ov.name + "=" + ov.value + ": ";
    std::string flowName, paramName = ov.name;
    size_t dot = ov.name.find('.');
    if (dot != std::string::npos) {
      flowName = ov.name.substr(0, dot);
      paramName = ov.name.substr(dot + 1);
    }
    std::vector<std::string> names;
    const FlowInfo *target = nullptr;
    for (const FlowInfo &f : out.flows) {
      if (f.name == flowName)
        target = &f;
      if (flowName.empty() || f.name == flowName)
        for (const ParamInfo &p : f.params)
          names.push_back(p.name);
    }
    if (!flowName.empty() && !target) {
      std::vector<std::string> flows;
      for (const FlowInfo &f : out.flows)
        flows.push_back(f.name);
      diags.error(SourceRange(), where + "there is no flow '" +
                                     shortName(flowName) + "' in this file");
      if (auto close = closestName(flowName, flows))
        diags.note(SourceRange(), "did you mean '" + *close + "'?");
      continue;
    }
    diags.error(SourceRange(),
                where +
                    (target ? "flow '" + target->name + "' has"
                            : std::string("no flow in this file has")) +
                    (target ? " no param '" : " a param '") +
                    shortName(paramName) + "'");
    if (auto close = closestName(paramName, names))
      diags.note(SourceRange(), "did you mean '" + *close + "'?");
  }
  return diags.getNumErrors() == errorsBefore;
}

std::optional<double> vflow::evaluateConstant(const Expr &expr,
                                              const FlowInfo &flow) {
  return evalScalar(expr, flow, nullptr, nullptr);
}

std::optional<double> vflow::evaluateBudgetValue(const Expr &expr,
                                                 const FlowInfo &flow,
                                                 int64_t numBlocks,
                                                 int64_t contextLen) {
  HostValues host{double(numBlocks), double(contextLen)};
  return evalScalar(expr, flow, &host, nullptr);
}

int64_t vflow::roundBudget(double value) {
  if (std::isnan(value) || value <= 0)
    return 0;
  if (value > 9.0e15)
    return int64_t(9.0e15);
  return static_cast<int64_t>(std::floor(value));
}

std::optional<int64_t> vflow::evaluateBudget(const Expr &expr,
                                             const FlowInfo &flow,
                                             int64_t numBlocks,
                                             int64_t contextLen) {
  std::optional<double> v =
      evaluateBudgetValue(expr, flow, numBlocks, contextLen);
  if (!v || std::isnan(*v))
    return std::nullopt;
  return roundBudget(*v);
}
