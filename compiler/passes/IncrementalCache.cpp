//===- IncrementalCache.cpp - Mark mergeable cache fields -----------------===//
//
// --vt-incremental-cache. A field is mergeable when the value it stores is
//   epilogue(reduce<kind>(x, [token, ...]))
// where x is computed per token (no reduction over token inside), kind is
// sum, mean, max, min or l2norm, and the epilogue is elementwise on the
// per-block value (possibly nothing). Then the field can be kept as a
// running partial (sum of squares for l2norm; sum and count for mean) while
// tokens are appended, and finalized when the block completes.
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/Passes.h"

#include "mlir/IR/Builders.h"

namespace vflow {
#define GEN_PASS_DEF_INCREMENTALCACHE
#include "vflow/Compiler/Passes.h.inc"
} // namespace vflow

using namespace mlir;
using namespace vflow;

namespace {

bool hasToken(Value v) {
  auto t = v.getType().dyn_cast<vt::TensorType>();
  return t && t.hasAxis("token");
}

/// True when `v` is computed per token: nothing on its way reduces over
/// token or mixes tokens.
bool perToken(Value v, llvm::DenseMap<Value, bool> &memo) {
  auto it = memo.find(v);
  if (it != memo.end())
    return it->second;
  Operation *def = v.getDefiningOp();
  bool ok = true;
  if (def &&
      !isa<vt::InputOp, vt::ConstLoadOp, vt::ParamLoadOp, vt::ConstantOp>(
          def)) {
    if (auto r = dyn_cast<vt::ReduceOp>(def)) {
      for (Attribute a : r.getAxes())
        ok &= a.cast<StringAttr>().getValue() != "token";
    } else if (auto s = dyn_cast<vt::SplitOp>(def)) {
      // Splitting token regroups tokens: not a per-token map.
      ok = s.getAxis() != "token";
    } else if (auto rn = dyn_cast<vt::RenameOp>(def)) {
      ok = rn.getFrom() != "token" && rn.getTo() != "token";
    } else if (def->getNumRegions() != 0) {
      ok = false;
    }
    for (Value operand : def->getOperands())
      ok = ok && perToken(operand, memo);
  }
  memo[v] = ok;
  return ok;
}

struct Classification {
  std::string merge = "none";
  bool finalize = false;
};

Classification classify(Value stored) {
  Classification c;
  // Peel an elementwise epilogue on values without token.
  Value v = stored;
  while (Operation *def = v.getDefiningOp()) {
    if (auto r = dyn_cast<vt::ReduceOp>(def)) {
      bool overToken = false;
      for (Attribute a : r.getAxes())
        overToken |= a.cast<StringAttr>().getValue() == "token";
      if (!overToken || !hasToken(r.getInput()))
        return c;
      llvm::DenseMap<Value, bool> memo;
      if (!perToken(r.getInput(), memo))
        return c;
      c.merge = vt::stringifyReduceKind(r.getKind()).str();
      c.finalize = v != stored || r.getKind() == vt::ReduceKind::mean ||
                   r.getKind() == vt::ReduceKind::l2norm;
      return c;
    }
    if (def->getNumOperands() != 1 || def->getNumResults() != 1 ||
        hasToken(def->getOperand(0)) || def->getNumRegions() != 0)
      return c;
    // A unary elementwise epilogue (sqrt, exp, ...) of the reduction.
    v = def->getOperand(0);
  }
  return c;
}

struct IncrementalCache : vflow::impl::IncrementalCacheBase<IncrementalCache> {
  void runOnOperation() override {
    vt::FlowOp flow = getOperation();
    llvm::StringMap<Classification> byField;
    flow.walk([&](vt::FieldStoreOp store) {
      byField[store.getField()] = classify(store.getValue());
    });
    Builder b(flow.getContext());
    for (auto field : flow.getBody()->getOps<vt::CacheFieldOp>()) {
      Classification c = byField.lookup(field.getSymName());
      field->setAttr("merge", b.getStringAttr(c.merge));
      field->setAttr("finalize", b.getBoolAttr(c.finalize));
    }
  }
};

} // namespace
