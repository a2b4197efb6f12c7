//===- AssignBuffers.cpp - Scratch buffers between kernels ----------------===//
//
// --vt-assign-buffers. Kernels run in order; a kernel result lives from the
// kernel that writes it to the last kernel (or return) that reads it. Slots
// are handed out first-fit and freed after the last reader, so a flow needs
// as many slots as values are alive at once. Each kernel gets a `buffers`
// array, one dictionary per result:
//   slot:       the buffer index
//   per_block:  elements per block (axes besides block, symbols kept: "G*D")
//   fixed:      elements per (sequence, KV head) when the value has no block
//               axis ("1" for scalars)
//   selection:  true for a selection (block ids, sized by the budget)
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/Passes.h"

#include "mlir/IR/Builders.h"

namespace vflow {
#define GEN_PASS_DEF_ASSIGNBUFFERS
#include "vflow/Compiler/Passes.h.inc"
} // namespace vflow

using namespace mlir;
using namespace vflow;

namespace {

/// "G*D*8", "1" for none.
std::string product(vt::TensorType type) {
  std::string out;
  int64_t constant = 1;
  for (vt::AxisAttr a : type.getAxes()) {
    if (a.getName() == "block")
      continue;
    if (a.getSize() > 0)
      constant *= a.getSize();
    else
      out += (out.empty() ? "" : "*") + vt::formatAxisSize(a.getSize());
  }
  if (constant != 1 || out.empty())
    out += (out.empty() ? "" : "*") + std::to_string(constant);
  return out;
}

void assignStage(Block &block, Builder &b) {
  SmallVector<vt::KernelOp> kernels(block.getOps<vt::KernelOp>());
  llvm::DenseMap<Operation *, unsigned> order;
  for (auto [i, k] : llvm::enumerate(kernels))
    order[k] = i;
  unsigned end = kernels.size();
  // Last reader (in kernel order; the terminator counts as the end).
  auto lastUse = [&](Value v) {
    unsigned last = 0;
    for (Operation *user : v.getUsers()) {
      Operation *top = user;
      while (top->getBlock() != &block)
        top = top->getParentOp();
      last = std::max(last, order.count(top) ? order[top] : end);
    }
    return last;
  };
  std::vector<unsigned> slotFreeAfter; // slot -> last reader
  for (auto [i, kernel] : llvm::enumerate(kernels)) {
    SmallVector<Attribute> buffers;
    for (Value result : kernel.getResults()) {
      unsigned last = lastUse(result);
      unsigned slot = 0;
      while (slot < slotFreeAfter.size() && slotFreeAfter[slot] >= i)
        ++slot;
      if (slot == slotFreeAfter.size())
        slotFreeAfter.push_back(last);
      else
        slotFreeAfter[slot] = last;
      SmallVector<NamedAttribute> desc;
      desc.push_back(b.getNamedAttr("slot", b.getI64IntegerAttr(slot)));
      if (auto t = result.getType().dyn_cast<vt::TensorType>()) {
        bool perBlock = t.hasAxis("block");
        desc.push_back(b.getNamedAttr(
            "per_block", b.getStringAttr(perBlock ? product(t) : "0")));
        desc.push_back(b.getNamedAttr(
            "fixed", b.getStringAttr(perBlock ? "0" : product(t))));
        desc.push_back(b.getNamedAttr("selection", b.getBoolAttr(false)));
      } else {
        desc.push_back(b.getNamedAttr("per_block", b.getStringAttr("0")));
        desc.push_back(b.getNamedAttr("fixed", b.getStringAttr("0")));
        desc.push_back(b.getNamedAttr("selection", b.getBoolAttr(true)));
      }
      buffers.push_back(b.getDictionaryAttr(desc));
    }
    kernel->setAttr("buffers", b.getArrayAttr(buffers));
  }
}

struct AssignBuffers : vflow::impl::AssignBuffersBase<AssignBuffers> {
  void runOnOperation() override {
    Builder b(&getContext());
    vt::FlowOp flow = getOperation();
    if (vt::CacheStageOp cache = flow.getCacheStage())
      assignStage(cache.getBody().front(), b);
    assignStage(flow.getIndexStage().getBody().front(), b);
  }
};

} // namespace
