//===- VTFolds.cpp - vTensor folders and canonicalization -----------------===//
//
// Constant folding of scalar ops, algebraic identities (x*1, x+0, x-0, x/1,
// neg(neg x)), empty and nested reductions, identity and chained renames.
//
//===----------------------------------------------------------------------===//

#include "vflow/Dialect/VT/VTOps.h"
#include "vflow/Runtime/NumericRules.h"

#include "mlir/IR/Matchers.h"
#include "mlir/IR/PatternMatch.h"

#include <cmath>

using namespace mlir;

namespace vflow::vt {

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

static std::optional<float> getConstantValue(Attribute attr) {
  if (auto floatAttr = attr.dyn_cast_or_null<FloatAttr>())
    return static_cast<float>(floatAttr.getValueAsDouble());
  return std::nullopt;
}

static bool isConstantValue(Attribute attr, float value) {
  std::optional<float> constant = getConstantValue(attr);
  return constant && *constant == value;
}

/// True when the result of `op` is a scalar f32 tensor: a constant fold
/// produces a FloatAttr that vt.constant can hold.
static bool hasScalarF32Result(Operation *op) {
  auto type = op->getResult(0).getType().dyn_cast<TensorType>();
  return type && type.isScalar() && type.getElementType().isF32();
}

static OpFoldResult makeFloat(Operation *op, float value) {
  return FloatAttr::get(Float32Type::get(op->getContext()), value);
}

template <typename Fn>
static OpFoldResult foldBinaryConstants(Operation *op, Attribute lhs,
                                        Attribute rhs, Fn fn) {
  std::optional<float> l = getConstantValue(lhs);
  std::optional<float> r = getConstantValue(rhs);
  if (!l || !r || !hasScalarF32Result(op))
    return {};
  return makeFloat(op, fn(*l, *r));
}

template <typename Fn>
static OpFoldResult foldUnaryConstant(Operation *op, Attribute input, Fn fn) {
  std::optional<float> value = getConstantValue(input);
  if (!value || !hasScalarF32Result(op))
    return {};
  return makeFloat(op, fn(*value));
}

/// `value` when it already has the type of the result of `op`.
static OpFoldResult forwardIfSameType(Operation *op, Value value) {
  if (value.getType() == op->getResult(0).getType())
    return value;
  return {};
}

static float toBool(bool value) { return value ? 1.0f : 0.0f; }

/// Where a binary op's identity element may stand: on the right only
/// (x - 0, x / 1) or on either side (x + 0 and 0 + x, x * 1 and 1 * x).
enum class IdentitySide { Right, Either };

/// The fold of a binary op with an identity element: `x op identity` is x
/// (and so is `identity op x` on IdentitySide::Either) where the types
/// agree; two scalar constants fold with `fn`.
template <typename Op, typename Fn>
static OpFoldResult foldWithIdentity(Op op, typename Op::FoldAdaptor adaptor,
                                     float identity, IdentitySide side, Fn fn) {
  if (isConstantValue(adaptor.getRhs(), identity))
    if (OpFoldResult result = forwardIfSameType(op, op.getLhs()))
      return result;
  if (side == IdentitySide::Either &&
      isConstantValue(adaptor.getLhs(), identity))
    if (OpFoldResult result = forwardIfSameType(op, op.getRhs()))
      return result;
  return foldBinaryConstants(op, adaptor.getLhs(), adaptor.getRhs(), fn);
}

//===----------------------------------------------------------------------===//
// Constants and binary ops
//===----------------------------------------------------------------------===//

OpFoldResult ConstantOp::fold(FoldAdaptor adaptor) { return getValueAttr(); }

OpFoldResult AddOp::fold(FoldAdaptor adaptor) {
  return foldWithIdentity(*this, adaptor, 0.0f, IdentitySide::Either,
                          [](float a, float b) { return a + b; });
}

OpFoldResult SubOp::fold(FoldAdaptor adaptor) {
  return foldWithIdentity(*this, adaptor, 0.0f, IdentitySide::Right,
                          [](float a, float b) { return a - b; });
}

OpFoldResult MulOp::fold(FoldAdaptor adaptor) {
  return foldWithIdentity(*this, adaptor, 1.0f, IdentitySide::Either,
                          [](float a, float b) { return a * b; });
}

OpFoldResult DivOp::fold(FoldAdaptor adaptor) {
  return foldWithIdentity(*this, adaptor, 1.0f, IdentitySide::Right,
                          [](float a, float b) { return a / b; });
}

OpFoldResult PowOp::fold(FoldAdaptor adaptor) {
  return foldBinaryConstants(*this, adaptor.getLhs(), adaptor.getRhs(),
                             [](float a, float b) { return std::pow(a, b); });
}

OpFoldResult MaximumOp::fold(FoldAdaptor adaptor) {
  return foldBinaryConstants(
      *this, adaptor.getLhs(), adaptor.getRhs(),
      [](float a, float b) { return vflow::rules::maximum(a, b); });
}

OpFoldResult MinimumOp::fold(FoldAdaptor adaptor) {
  return foldBinaryConstants(
      *this, adaptor.getLhs(), adaptor.getRhs(),
      [](float a, float b) { return vflow::rules::minimum(a, b); });
}

OpFoldResult AndOp::fold(FoldAdaptor adaptor) {
  return foldBinaryConstants(
      *this, adaptor.getLhs(), adaptor.getRhs(),
      [](float a, float b) { return toBool(a != 0.0f && b != 0.0f); });
}

OpFoldResult OrOp::fold(FoldAdaptor adaptor) {
  return foldBinaryConstants(
      *this, adaptor.getLhs(), adaptor.getRhs(),
      [](float a, float b) { return toBool(a != 0.0f || b != 0.0f); });
}

OpFoldResult CmpOp::fold(FoldAdaptor adaptor) {
  CmpPredicate predicate = getPredicate();
  return foldBinaryConstants(*this, adaptor.getLhs(), adaptor.getRhs(),
                             [&](float a, float b) {
                               switch (predicate) {
                               case CmpPredicate::lt:
                                 return toBool(a < b);
                               case CmpPredicate::le:
                                 return toBool(a <= b);
                               case CmpPredicate::gt:
                                 return toBool(a > b);
                               case CmpPredicate::ge:
                                 return toBool(a >= b);
                               case CmpPredicate::eq:
                                 return toBool(a == b);
                               case CmpPredicate::ne:
                                 return toBool(a != b);
                               }
                               return 0.0f;
                             });
}

//===----------------------------------------------------------------------===//
// Unary ops
//===----------------------------------------------------------------------===//

static float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

OpFoldResult NegOp::fold(FoldAdaptor adaptor) {
  if (auto inner = getInput().getDefiningOp<NegOp>())
    if (OpFoldResult result = forwardIfSameType(*this, inner.getInput()))
      return result;
  return foldUnaryConstant(*this, adaptor.getInput(),
                           [](float x) { return -x; });
}

OpFoldResult NotOp::fold(FoldAdaptor adaptor) {
  return foldUnaryConstant(*this, adaptor.getInput(),
                           [](float x) { return toBool(x == 0.0f); });
}

OpFoldResult ExpOp::fold(FoldAdaptor adaptor) {
  return foldUnaryConstant(*this, adaptor.getInput(),
                           [](float x) { return std::exp(x); });
}

OpFoldResult LogOp::fold(FoldAdaptor adaptor) {
  return foldUnaryConstant(*this, adaptor.getInput(),
                           [](float x) { return std::log(x); });
}

OpFoldResult SqrtOp::fold(FoldAdaptor adaptor) {
  return foldUnaryConstant(*this, adaptor.getInput(),
                           [](float x) { return std::sqrt(x); });
}

OpFoldResult RsqrtOp::fold(FoldAdaptor adaptor) {
  return foldUnaryConstant(*this, adaptor.getInput(),
                           [](float x) { return 1.0f / std::sqrt(x); });
}

OpFoldResult AbsOp::fold(FoldAdaptor adaptor) {
  return foldUnaryConstant(*this, adaptor.getInput(),
                           [](float x) { return std::fabs(x); });
}

OpFoldResult ReluOp::fold(FoldAdaptor adaptor) {
  return foldUnaryConstant(*this, adaptor.getInput(),
                           [](float x) { return x > 0.0f ? x : 0.0f; });
}

OpFoldResult SigmoidOp::fold(FoldAdaptor adaptor) {
  return foldUnaryConstant(*this, adaptor.getInput(), sigmoid);
}

OpFoldResult SiluOp::fold(FoldAdaptor adaptor) {
  return foldUnaryConstant(*this, adaptor.getInput(),
                           [](float x) { return x * sigmoid(x); });
}

OpFoldResult TanhOp::fold(FoldAdaptor adaptor) {
  return foldUnaryConstant(*this, adaptor.getInput(),
                           [](float x) { return std::tanh(x); });
}

OpFoldResult HashOp::fold(FoldAdaptor adaptor) {
  return foldUnaryConstant(*this, adaptor.getInput(), vflow::rules::hash01);
}

//===----------------------------------------------------------------------===//
// Reductions and shape ops
//===----------------------------------------------------------------------===//

OpFoldResult ReduceOp::fold(FoldAdaptor adaptor) {
  if (getAxes().empty())
    return forwardIfSameType(*this, getInput());
  return {};
}

namespace {
/// reduce(reduce(x, A), B) -> reduce(x, A ∪ B) for max and min, which are
/// exact in any order. Sums are left alone: merging them changes how partial
/// sums round, and canonicalization must not change what a flow computes.
struct CombineNestedReduce : public OpRewritePattern<ReduceOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(ReduceOp op,
                                PatternRewriter &rewriter) const override {
    auto inner = op.getInput().getDefiningOp<ReduceOp>();
    if (!inner || inner.getKind() != op.getKind())
      return failure();
    ReduceKind kind = op.getKind();
    if (kind != ReduceKind::max && kind != ReduceKind::min)
      return failure();
    SmallVector<Attribute> axes(inner.getAxes().begin(), inner.getAxes().end());
    axes.append(op.getAxes().begin(), op.getAxes().end());
    rewriter.replaceOpWithNewOp<ReduceOp>(op, op.getResult().getType(), kind,
                                          inner.getInput(),
                                          rewriter.getArrayAttr(axes));
    return success();
  }
};
} // namespace

void ReduceOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                           MLIRContext *context) {
  results.add<CombineNestedReduce>(context);
}

OpFoldResult RenameOp::fold(FoldAdaptor adaptor) {
  // rename(rename(x, a -> b), b -> c) -> rename(x, a -> c), in place.
  if (auto inner = getInput().getDefiningOp<RenameOp>()) {
    if (inner.getTo() == getFrom()) {
      getInputMutable().assign(inner.getInput());
      setFromAttr(inner.getFromAttr());
      return getResult();
    }
  }
  if (getFrom() == getTo())
    return forwardIfSameType(*this, getInput());
  return {};
}

} // namespace vflow::vt
