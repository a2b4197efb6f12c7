//===- ASTToVT.cpp - Lowering checked flows to the vt dialect -------------===//
//
// A direct walk over the checked AST. Semantic analysis already computed the
// shape of every expression, so each AST node becomes one or a few vt ops
// whose result type is that shape; `let` bindings and stored states become
// SSA values. Compile-time params are emitted as constants (the kernels are
// specialized on them); run-time params are loaded with vt.param_load.
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/ASTToVT.h"
#include "vflow/Dialect/VT/VTDialect.h"
#include "vflow/Dialect/VT/VTOps.h"
#include "vflow/Dialect/VT/VTTypes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/StringMap.h"

using namespace mlir;
using namespace vflow;
using namespace vflow::ast;

void vflow::registerCompilerDialects(MLIRContext &context) {
  context.getOrLoadDialect<vt::VTDialect>();
}

namespace {

class FlowLowering {
public:
  FlowLowering(MLIRContext &ctx, const FlowInfo &flow,
               const SourceBuffer &buffer)
      : ctx(ctx), builder(&ctx), flow(flow), buffer(buffer) {}

  void lower(ModuleOp module);

private:
  // Types and locations.
  Location loc(SourceRange range);
  vt::TensorType tensorType(const Shape &shape, Type element = {});
  Type storageType(DType dtype);

  // Declarations.
  void lowerParams();
  void lowerConsts();
  void lowerCacheStage();
  void lowerIndexStage();
  void lowerReturn(const Stmt &stmt);

  // Expressions.
  Value lowerExpr(const Expr &expr);
  Value lowerName(const NameExpr &expr);
  Value lowerCall(const CallExpr &call);
  Type callResultType(const CallExpr &call);
  /// By the builtin's group (AST.h): elementwise (with pow, maximum,
  /// minimum, clamp, where), reductions and ops along the block axis,
  /// split and rename, const generators, selections. Each gives null for a
  /// builtin of another group; `type` is callResultType(call).
  Value lowerElementwiseCall(const CallExpr &call, Location l, Type type);
  Value lowerReductionCall(const CallExpr &call, Location l, Type type);
  Value lowerShapeCall(const CallExpr &call, Location l, Type type);
  Value lowerGeneratorCall(const CallExpr &call, Location l, Type type);
  Value lowerSelection(const CallExpr &call, Location l, Type selection);
  Value scalar(float value, SourceRange range);
  Value input(vt::InputKind kind, const Shape &shape, SourceRange range);
  Value perHeadTopK(const CallExpr &call, Value score, Value k, Location l,
                    Type selection);
  Value arg(const CallExpr &call, size_t index) {
    return lowerExpr(*call.args[index].value);
  }

  MLIRContext &ctx;
  OpBuilder builder;
  const FlowInfo &flow;
  const SourceBuffer &buffer;

  /// Per-stage values: lets, stored states, fields defined in the cache
  /// stage, loaded states and inputs (so each is read once).
  llvm::StringMap<Value> lets;
  llvm::StringMap<Value> states;
  llvm::StringMap<Value> fields;
  llvm::StringMap<Value> inputs;
};

Location FlowLowering::loc(SourceRange range) {
  // Implicit declarations (reserved params, stages) point at the flow.
  if (!range.isValid())
    range = flow.flow->name.range;
  LineCol lc = buffer.getLineCol(range.begin);
  return FileLineColLoc::get(&ctx, buffer.getName(), lc.line, lc.column);
}

vt::TensorType FlowLowering::tensorType(const Shape &shape, Type element) {
  SmallVector<vt::AxisAttr> axes;
  for (const Axis &a : shape.getAxes())
    axes.push_back(vt::AxisAttr::get(&ctx, a.name, a.size));
  return vt::TensorType::get(&ctx, axes,
                             element ? element : builder.getF32Type());
}

Type FlowLowering::storageType(DType dtype) {
  switch (dtype) {
  case DType::F32:
    return builder.getF32Type();
  case DType::BF16:
    return builder.getBF16Type();
  case DType::F16:
    return builder.getF16Type();
  case DType::FP8E4M3:
    return FloatType::getFloat8E4M3FN(&ctx);
  case DType::FP8E5M2:
    return FloatType::getFloat8E5M2(&ctx);
  case DType::INT8: // KV only: the checker refuses it for fields and states
    break;
  }
  return builder.getF32Type();
}

void FlowLowering::lower(ModuleOp module) {
  builder.setInsertionPointToEnd(module.getBody());
  auto flowOp =
      builder.create<vt::FlowOp>(loc(flow.flow->name.range), flow.name);
  Block &body = flowOp.getBodyRegion().front();
  builder.setInsertionPointToEnd(&body);

  lowerParams();
  for (const AxisInfo &axis : flow.axes)
    if (axis.origin == AxisOrigin::Declared)
      builder.create<vt::AxisOp>(loc(axis.range), axis.name, axis.size);
  lowerConsts();
  for (const FieldInfo &field : flow.fields)
    builder.create<vt::CacheFieldOp>(
        loc(field.range), field.name,
        tensorType(field.shape, storageType(field.dtype)));
  for (const StateInfo &state : flow.states)
    builder.create<vt::StateOp>(
        loc(state.range), builder.getStringAttr(state.name),
        TypeAttr::get(tensorType(state.shape, storageType(state.dtype))),
        builder.getF32FloatAttr(static_cast<float>(state.init)));
  if (!flow.fields.empty())
    lowerCacheStage();
  lowerIndexStage();
}

void FlowLowering::lowerParams() {
  for (const ParamInfo &param : flow.params) {
    TypedAttr value;
    switch (param.type) {
    case ParamType::Int:
      value = builder.getI64IntegerAttr(static_cast<int64_t>(param.value));
      break;
    case ParamType::Float:
      value = builder.getF64FloatAttr(param.value);
      break;
    case ParamType::Bool:
      value = builder.getBoolAttr(param.value != 0);
      break;
    }
    builder.create<vt::ParamOp>(loc(param.range), param.name, value,
                                param.compileTime);
  }
}

void FlowLowering::lowerConsts() {
  for (const ConstInfo &c : flow.consts) {
    auto constOp =
        builder.create<vt::ConstOp>(loc(c.range), c.name, tensorType(c.shape));
    Block *block = new Block();
    constOp.getBody().push_back(block);
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointToEnd(block);
    lets.clear();
    inputs.clear();
    Value v = lowerExpr(*c.init);
    builder.create<vt::YieldOp>(loc(c.range), ValueRange{v});
  }
}

void FlowLowering::lowerCacheStage() {
  auto stage = builder.create<vt::CacheStageOp>(loc(SourceRange()));
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToEnd(&stage.getBody().front());
  inputs.clear();
  fields.clear();
  auto store = [&](const Ident &name, const Expr &value) {
    Value v = lowerExpr(value);
    builder.create<vt::FieldStoreOp>(loc(name.range), name.name, v);
    fields[name.name] = v;
  };
  for (const Decl &decl : flow.flow->decls) {
    if (decl.kind == DeclKind::CacheField) {
      lets.clear();
      store(decl.name, *decl.value);
    } else if (decl.kind == DeclKind::CacheBlock) {
      lets.clear();
      for (const Stmt &stmt : decl.body) {
        if (stmt.kind == StmtKind::Let)
          lets[stmt.name.name] = lowerExpr(*stmt.value);
        else
          store(stmt.name, *stmt.value);
      }
    }
  }
  builder.create<vt::YieldOp>(loc(SourceRange()));
}

void FlowLowering::lowerIndexStage() {
  auto stage = builder.create<vt::IndexStageOp>(loc(flow.index->keywordRange));
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToEnd(&stage.getBody().front());
  inputs.clear();
  lets.clear();
  states.clear();
  fields.clear();
  for (const Stmt &stmt : flow.index->body) {
    switch (stmt.kind) {
    case StmtKind::Let:
      lets[stmt.name.name] = lowerExpr(*stmt.value);
      break;
    case StmtKind::Assign: {
      Value v = lowerExpr(*stmt.value);
      builder.create<vt::StateStoreOp>(loc(stmt.range), stmt.name.name, v);
      // Later reads see the stored value, rounded to the state's dtype: they
      // load it again.
      states.erase(stmt.name.name);
      break;
    }
    case StmtKind::Return:
      lowerReturn(stmt);
      break;
    case StmtKind::Field:
      break;
    }
  }
}

/// The index stage's return, with the retain block's score and capacity
/// when the flow has one (its lets are its own; states read as stored).
void FlowLowering::lowerReturn(const Stmt &stmt) {
  Value selection = lowerExpr(*stmt.value);
  if (!flow.retain) {
    builder.create<vt::ReturnOp>(loc(stmt.range), selection);
    return;
  }
  lets.clear();
  Value score;
  for (const Stmt &r : flow.retain->body) {
    if (r.kind == StmtKind::Let)
      lets[r.name.name] = lowerExpr(*r.value);
    else if (r.kind == StmtKind::Return)
      score = lowerExpr(*r.value);
  }
  Value capacity = lowerExpr(*flow.retainCapacity);
  builder.create<vt::ReturnOp>(loc(flow.retain->keywordRange), selection, score,
                               capacity,
                               builder.getStringAttr(flow.retainCombine));
}

Value FlowLowering::scalar(float value, SourceRange range) {
  return builder.create<vt::ConstantOp>(loc(range), value);
}

Value FlowLowering::input(vt::InputKind kind, const Shape &shape,
                          SourceRange range) {
  std::string key = vt::stringifyInputKind(kind).str();
  auto it = inputs.find(key);
  if (it != inputs.end())
    return it->second;
  // Inputs are placed at the start of the stage so every later use sees them.
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToStart(builder.getInsertionBlock());
  Value v = builder.create<vt::InputOp>(loc(range), tensorType(shape), kind);
  inputs[key] = v;
  return v;
}

Value FlowLowering::lowerName(const NameExpr &expr) {
  const std::string &name = expr.name;
  Location l = loc(expr.range);
  switch (expr.ref) {
  case NameRef::Let:
    return lets.lookup(name);
  case NameRef::Input: {
    auto kind = vt::symbolizeInputKind(name);
    return input(*kind, expr.info.shape, expr.range);
  }
  case NameRef::Param: {
    const ParamInfo *param = flow.findParam(name);
    if (param->compileTime)
      return scalar(static_cast<float>(param->value), expr.range);
    return builder.create<vt::ParamLoadOp>(l, vt::TensorType::getScalar(&ctx),
                                           name);
  }
  case NameRef::Const:
    return builder.create<vt::ConstLoadOp>(l, tensorType(expr.info.shape),
                                           name);
  case NameRef::CacheField:
    if (Value v = fields.lookup(name))
      return v;
    return builder.create<vt::FieldLoadOp>(l, tensorType(expr.info.shape),
                                           name);
  case NameRef::State: {
    if (Value v = states.lookup(name))
      return v;
    Value v =
        builder.create<vt::StateLoadOp>(l, tensorType(expr.info.shape), name);
    states[name] = v;
    return v;
  }
  case NameRef::Axis:
  case NameRef::Unresolved:
    break;
  }
  return Value();
}

template <typename OpTy>
Value binary(OpBuilder &b, Location l, Type type, Value lhs, Value rhs) {
  return b.create<OpTy>(l, type, lhs, rhs);
}

Value FlowLowering::lowerExpr(const Expr &expr) {
  Location l = loc(expr.range);
  switch (expr.kind) {
  case ExprKind::Number:
    return scalar(static_cast<float>(cast<NumberExpr>(expr).value), expr.range);
  case ExprKind::Bool:
    return scalar(cast<BoolExpr>(expr).value ? 1.0f : 0.0f, expr.range);
  case ExprKind::Inf:
    return scalar(std::numeric_limits<float>::infinity(), expr.range);
  case ExprKind::Name:
    return lowerName(cast<NameExpr>(expr));
  case ExprKind::Unary: {
    auto &u = cast<UnaryExpr>(expr);
    Value operand = lowerExpr(*u.operand);
    Type type = tensorType(expr.info.shape);
    if (u.op == UnaryOp::Not)
      return builder.create<vt::NotOp>(l, type, operand);
    // A negated budget stays host-evaluable as 0 - x.
    if (u.operand->info.hostEvaluable)
      return builder.create<vt::SubOp>(l, type, scalar(0, expr.range), operand);
    return builder.create<vt::NegOp>(l, type, operand);
  }
  case ExprKind::Binary: {
    auto &b = cast<BinaryExpr>(expr);
    Value lhs = lowerExpr(*b.lhs);
    Value rhs = lowerExpr(*b.rhs);
    Type type = tensorType(expr.info.shape);
    switch (b.op) {
    case BinaryOp::Add:
      return binary<vt::AddOp>(builder, l, type, lhs, rhs);
    case BinaryOp::Sub:
      return binary<vt::SubOp>(builder, l, type, lhs, rhs);
    case BinaryOp::Mul:
      return binary<vt::MulOp>(builder, l, type, lhs, rhs);
    case BinaryOp::Div:
      return binary<vt::DivOp>(builder, l, type, lhs, rhs);
    case BinaryOp::And:
      return binary<vt::AndOp>(builder, l, type, lhs, rhs);
    case BinaryOp::Or:
      return binary<vt::OrOp>(builder, l, type, lhs, rhs);
    case BinaryOp::Lt:
    case BinaryOp::Le:
    case BinaryOp::Gt:
    case BinaryOp::Ge:
    case BinaryOp::Eq:
    case BinaryOp::Ne: {
      static const vt::CmpPredicate preds[] = {
          vt::CmpPredicate::lt, vt::CmpPredicate::le, vt::CmpPredicate::gt,
          vt::CmpPredicate::ge, vt::CmpPredicate::eq, vt::CmpPredicate::ne};
      vt::CmpPredicate pred =
          preds[static_cast<int>(b.op) - static_cast<int>(BinaryOp::Lt)];
      return builder.create<vt::CmpOp>(l, type, pred, lhs, rhs);
    }
    }
    break;
  }
  case ExprKind::Call:
    return lowerCall(cast<CallExpr>(expr));
  case ExprKind::String:
  case ExprKind::List:
    break;
  }
  return Value();
}

/// The type of a call's value: its tensor type, or the selection type.
Type FlowLowering::callResultType(const CallExpr &call) {
  if (call.info.kind == ValueKind::Tensor)
    return tensorType(call.info.shape);
  return vt::SelectionType::get(&ctx);
}

/// Each family lowers its own builtins (and gives null for the others').
Value FlowLowering::lowerCall(const CallExpr &call) {
  Location l = loc(call.range);
  Type type = callResultType(call);
  for (auto lower :
       {&FlowLowering::lowerElementwiseCall, &FlowLowering::lowerReductionCall,
        &FlowLowering::lowerShapeCall, &FlowLowering::lowerGeneratorCall,
        &FlowLowering::lowerSelection})
    if (Value v = (this->*lower)(call, l, type))
      return v;
  return Value();
}

Value FlowLowering::lowerElementwiseCall(const CallExpr &call, Location l,
                                         Type type) {
  switch (call.builtin) {
#define VFLOW_UNARY(B, OP)                                                     \
  case Builtin::B:                                                             \
    return builder.create<vt::OP>(l, type, arg(call, 0));
    VFLOW_UNARY(Exp, ExpOp)
    VFLOW_UNARY(Log, LogOp)
    VFLOW_UNARY(Sqrt, SqrtOp)
    VFLOW_UNARY(Rsqrt, RsqrtOp)
    VFLOW_UNARY(Abs, AbsOp)
    VFLOW_UNARY(Relu, ReluOp)
    VFLOW_UNARY(Sigmoid, SigmoidOp)
    VFLOW_UNARY(Silu, SiluOp)
    VFLOW_UNARY(Tanh, TanhOp)
    VFLOW_UNARY(Hash, HashOp)
#undef VFLOW_UNARY
  case Builtin::Pow:
  case Builtin::Maximum:
  case Builtin::Minimum: {
    // Operands are lowered in source order, so the IR reads like the program.
    Value lhs = arg(call, 0);
    Value rhs = arg(call, 1);
    if (call.builtin == Builtin::Pow)
      return binary<vt::PowOp>(builder, l, type, lhs, rhs);
    // maximum(a, b, c, ...) folds left: maximum(maximum(a, b), c), ...
    for (size_t i = 2;; ++i) {
      const bool last = i == call.args.size();
      Type t = last ? type : vt::inferBroadcastResultType({lhs, rhs});
      lhs = call.builtin == Builtin::Maximum
                ? binary<vt::MaximumOp>(builder, l, t, lhs, rhs)
                : binary<vt::MinimumOp>(builder, l, t, lhs, rhs);
      if (last)
        return lhs;
      rhs = arg(call, i);
    }
  }
  case Builtin::Clamp:
  case Builtin::Where: {
    Value a = arg(call, 0);
    Value b = arg(call, 1);
    Value c = arg(call, 2);
    if (call.builtin == Builtin::Clamp)
      return builder.create<vt::ClampOp>(l, type, a, b, c);
    return builder.create<vt::WhereOp>(l, type, a, b, c);
  }
  default:
    break;
  }
  return Value();
}

Value FlowLowering::lowerReductionCall(const CallExpr &call, Location l,
                                       Type type) {
  switch (call.builtin) {
  case Builtin::Sum:
  case Builtin::Mean:
  case Builtin::Max:
  case Builtin::Min:
  case Builtin::L2Norm: {
    static const vt::ReduceKind kinds[] = {
        vt::ReduceKind::sum, vt::ReduceKind::mean, vt::ReduceKind::max,
        vt::ReduceKind::min, vt::ReduceKind::l2norm};
    vt::ReduceKind kind =
        kinds[static_cast<int>(call.builtin) - static_cast<int>(Builtin::Sum)];
    SmallVector<StringRef> axes;
    for (size_t i = 1; i < call.args.size(); ++i)
      axes.push_back(cast<NameExpr>(*call.args[i].value).name);
    return builder.create<vt::ReduceOp>(l, type, kind, arg(call, 0),
                                        builder.getStrArrayAttr(axes));
  }
  case Builtin::Softmax: {
    Value x = arg(call, 0);
    const CallArg *s = call.namedArg("scale");
    Value scale = s ? lowerExpr(*s->value) : scalar(1.0f, call.range);
    return builder.create<vt::SoftmaxOp>(l, type, x, scale);
  }
  case Builtin::Normalize:
    return builder.create<vt::NormalizeOp>(l, type, arg(call, 0));
  case Builtin::Conv: {
    SmallVector<float> weights;
    for (const ExprPtr &w : cast<ListExpr>(*call.args[2].value).elements)
      weights.push_back(
          static_cast<float>(evaluateConstant(*w, flow).value_or(0.0)));
    return builder.create<vt::ConvOp>(l, type, arg(call, 0),
                                      builder.getDenseF32ArrayAttr(weights));
  }
  case Builtin::KthLargest: {
    Value x = arg(call, 0);
    Value k = arg(call, 1);
    return builder.create<vt::KthLargestOp>(l, type, x, k);
  }
  default:
    break;
  }
  return Value();
}

Value FlowLowering::lowerShapeCall(const CallExpr &call, Location l,
                                   Type type) {
  switch (call.builtin) {
  case Builtin::Split: {
    const CallArg *outer = nullptr;
    for (const CallArg &a : call.args)
      if (a.kind == CallArg::Kind::Named)
        outer = &a;
    int64_t factor =
        static_cast<int64_t>(evaluateConstant(*outer->value, flow).value_or(1));
    return builder.create<vt::SplitOp>(l, type, arg(call, 0),
                                       cast<NameExpr>(*call.args[1].value).name,
                                       outer->name, factor);
  }
  case Builtin::Rename: {
    Value v = arg(call, 0);
    Shape shape = call.args[0].value->info.shape;
    auto rank = [&](const std::string &name) { return flow.axisRank(name); };
    for (size_t i = 1; i < call.args.size(); ++i) {
      const CallArg &pair = call.args[i];
      int64_t size = shape.find(pair.name)->size;
      shape.remove(pair.name);
      shape.insert({pair.to, size}, rank);
      v = builder.create<vt::RenameOp>(loc(pair.range), tensorType(shape), v,
                                       pair.name, pair.to);
    }
    return v;
  }
  default:
    break;
  }
  return Value();
}

Value FlowLowering::lowerGeneratorCall(const CallExpr &call, Location l,
                                       Type type) {
  switch (call.builtin) {
  case Builtin::Rademacher:
  case Builtin::Gaussian: {
    const CallArg *seedArg = call.namedArg("seed");
    int64_t seed =
        seedArg ? static_cast<int64_t>(
                      evaluateConstant(*seedArg->value, flow).value_or(0))
                : 0;
    if (call.builtin == Builtin::Rademacher)
      return builder.create<vt::RademacherOp>(l, type, seed);
    return builder.create<vt::GaussianOp>(l, type, seed);
  }
  case Builtin::TensorLiteral:
  case Builtin::Load: {
    const LiteralData &data = flow.literals.at(&call);
    StringAttr source =
        data.source.empty() ? StringAttr() : builder.getStringAttr(data.source);
    return builder.create<vt::LiteralOp>(
        l, type, builder.getDenseF32ArrayAttr(data.values), source);
  }
  default:
    break;
  }
  return Value();
}

/// topk(score, k, per = head) as the union of each query head's top k:
/// threshold(max(score - kth_largest(score, k), head), 0, max = group * k).
Value FlowLowering::perHeadTopK(const CallExpr &call, Value score, Value k,
                                Location l, Type selection) {
  Shape heads = call.args[0].value->info.shape;
  Shape blocks = heads;
  heads.remove("block");
  blocks.remove("head");
  Value kth = builder.create<vt::KthLargestOp>(l, tensorType(heads), score, k);
  Value margin = binary<vt::SubOp>(builder, l, score.getType(), score, kth);
  Value best =
      builder.create<vt::ReduceOp>(l, tensorType(blocks), vt::ReduceKind::max,
                                   margin, builder.getStrArrayAttr({"head"}));
  Value group = input(vt::InputKind::group, Shape(), call.range);
  Value max =
      binary<vt::MulOp>(builder, l, vt::TensorType::getScalar(&ctx), group, k);
  return builder.create<vt::ThresholdOp>(l, selection, best,
                                         scalar(0, call.range), max);
}

Value FlowLowering::lowerSelection(const CallExpr &call, Location l,
                                   Type selection) {
  switch (call.builtin) {
  case Builtin::TopK:
  case Builtin::ApproxTopK: {
    Value score = arg(call, 0);
    Value k = arg(call, 1);
    if (call.namedArg("per"))
      return perHeadTopK(call, score, k, l, selection);
    if (call.builtin == Builtin::TopK)
      return builder.create<vt::TopKOp>(l, selection, score, k);
    const CallArg *r = call.namedArg("recall");
    double recall = r ? evaluateConstant(*r->value, flow).value_or(0.95) : 0.95;
    return builder.create<vt::ApproxTopKOp>(l, selection, score, k,
                                            builder.getF64FloatAttr(recall));
  }
  case Builtin::Threshold:
  case Builtin::TopP: {
    Value score = arg(call, 0);
    Value second = arg(call, 1);
    const CallArg *m = call.namedArg("max");
    Value max = m ? lowerExpr(*m->value) : Value();
    if (call.builtin == Builtin::TopP)
      return builder.create<vt::TopPOp>(l, selection, score, second, max);
    return builder.create<vt::ThresholdOp>(l, selection, score, second, max);
  }
  case Builtin::Union: {
    Value acc = arg(call, 0);
    for (size_t i = 1; i < call.args.size(); ++i) {
      Value next = arg(call, i);
      acc = builder.create<vt::UnionOp>(l, selection, acc, next);
    }
    return acc;
  }
  default:
    return Value();
  }
}

} // namespace

OwningOpRef<ModuleOp> vflow::lowerToVT(MLIRContext &context,
                                       const Module &module,
                                       const CheckedModule &checked,
                                       const SourceBuffer &buffer) {
  registerCompilerDialects(context);
  OwningOpRef<ModuleOp> out =
      ModuleOp::create(FileLineColLoc::get(&context, buffer.getName(), 1, 1));
  for (const FlowInfo &flow : checked.flows)
    FlowLowering(context, flow, buffer).lower(*out);
  return out;
}
