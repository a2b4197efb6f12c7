//===- InferLayouts.cpp - Give every tensor value its layout --------------===//
//
// --vt-infer-layouts. One forward walk per region: sources get the layout of
// where they come from, and every other value joins its operands' layouts
// under the rules of docs/design/vt-dialect.md.
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/Passes.h"

#include "llvm/ADT/TypeSwitch.h"

namespace vflow {
#define GEN_PASS_DEF_INFERLAYOUTS
#include "vflow/Compiler/Passes.h.inc"
} // namespace vflow

using namespace mlir;
using namespace vflow;
using vt::Layout;

namespace {

Layout layoutOf(Value v) {
  if (auto t = v.getType().dyn_cast<vt::TensorType>())
    return t.getLayout();
  return Layout::unspecified;
}

void setLayout(Value v, Layout layout) {
  if (auto t = v.getType().dyn_cast<vt::TensorType>())
    v.setType(t.withLayout(layout));
}

/// The layout of a source op's result, or unspecified for computed values.
Layout sourceLayout(Operation *op, bool inCache) {
  return llvm::TypeSwitch<Operation *, Layout>(op)
      .Case<vt::InputOp>([&](vt::InputOp in) {
        switch (in.getKind()) {
        case vt::InputKind::K:
        case vt::InputKind::V:
          return Layout::paged;
        case vt::InputKind::q:
        case vt::InputKind::num_blocks:
        case vt::InputKind::context_len:
        case vt::InputKind::step:
          return Layout::batched;
        case vt::InputKind::mass:
        case vt::InputKind::position:
          return Layout::ragged;
        }
        return Layout::unspecified;
      })
      .Case<vt::FieldLoadOp>([](auto) { return Layout::paged; })
      .Case<vt::StateLoadOp>([](vt::StateLoadOp s) {
        return s.getResult().getType().cast<vt::TensorType>().hasAxis("block")
                   ? Layout::ragged
                   : Layout::batched;
      })
      .Case<vt::ParamLoadOp, vt::ConstLoadOp, vt::ConstantOp, vt::RademacherOp,
            vt::GaussianOp, vt::LiteralOp>(
          [](auto) { return Layout::parameter; })
      .Default([](Operation *) { return Layout::unspecified; });
}

/// The layout of a computed value from its operands: in the cache stage
/// everything that depends on K/V is per page; in the index stage a value
/// with a block axis is per logical block, one without depends on the
/// sequence unless every operand is shared by the batch.
Layout joined(Operation *op, Value result, bool inCache) {
  bool anyPerSequence = false;
  for (Value operand : op->getOperands()) {
    Layout l = layoutOf(operand);
    anyPerSequence |=
        l == Layout::batched || l == Layout::ragged || l == Layout::paged;
  }
  auto type = result.getType().cast<vt::TensorType>();
  if (!anyPerSequence)
    return Layout::parameter;
  if (inCache)
    return Layout::paged;
  return type.hasAxis("block") ? Layout::ragged : Layout::batched;
}

/// Walks a block in program order; a kernel's body is done before the
/// kernel's results, which take the layouts of what the body yields.
void inferBlock(Block &block, bool inCache) {
  for (Operation &op : block) {
    if (auto kernel = dyn_cast<vt::KernelOp>(op)) {
      Block &body = kernel.getBody().front();
      inferBlock(body, inCache);
      auto yield = cast<vt::YieldOp>(body.getTerminator());
      for (auto [result, yielded] :
           llvm::zip(kernel.getResults(), yield.getValues()))
        result.setType(yielded.getType());
      continue;
    }
    for (Region &region : op.getRegions())
      for (Block &inner : region)
        inferBlock(inner, inCache || isa<vt::CacheStageOp>(op));
    for (Value result : op.getResults()) {
      if (!result.getType().isa<vt::TensorType>())
        continue;
      Layout l = sourceLayout(&op, inCache);
      if (l == Layout::unspecified)
        l = joined(&op, result, inCache);
      setLayout(result, l);
    }
  }
}

struct InferLayouts : vflow::impl::InferLayoutsBase<InferLayouts> {
  void runOnOperation() override {
    Block &body = *getOperation().getBody();
    // Declarations: where their values live.
    for (Operation &op : body) {
      if (auto c = dyn_cast<vt::ConstOp>(op))
        c.setTypeAttr(
            TypeAttr::get(c.getTensorType().withLayout(Layout::parameter)));
      else if (auto f = dyn_cast<vt::CacheFieldOp>(op))
        f.setTypeAttr(
            TypeAttr::get(f.getTensorType().withLayout(Layout::paged)));
      else if (auto s = dyn_cast<vt::StateOp>(op))
        s.setTypeAttr(TypeAttr::get(s.getTensorType().withLayout(
            s.getTensorType().hasAxis("block") ? Layout::ragged
                                               : Layout::batched)));
    }
    inferBlock(body, /*inCache=*/false);
  }
};

} // namespace
