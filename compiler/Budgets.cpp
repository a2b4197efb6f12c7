//===- Budgets.cpp - A flow's budgets as the runtime evaluates them -------===//

#include "vflow/Compiler/Budgets.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/TypeSwitch.h"

#include <map>
#include <stdexcept>

using namespace vflow;
using mlir::Operation;
using mlir::Value;

namespace {

/// A kernel result stands for what its kernel yields.
Value throughKernels(Value v) {
  while (auto k = llvm::dyn_cast_or_null<vt::KernelOp>(v.getDefiningOp())) {
    auto yield = llvm::cast<vt::YieldOp>(k.getBody().front().getTerminator());
    v = yield.getValues()[v.cast<mlir::OpResult>().getResultNumber()];
  }
  return v;
}

/// Visits the values of the DAG below `root` (through kernels) in
/// post-order, each once, without recursion: `children(v)` lists what `v`
/// is made of (none for a leaf; the last is visited first), `visit(v)`
/// comes after all of them and returns false to stop the walk.
template <typename Children, typename Visit>
bool walkPostOrder(Value root, Children children, Visit visit) {
  llvm::DenseSet<Value> done;
  std::vector<std::pair<Value, bool>> stack = {{throughKernels(root), false}};
  while (!stack.empty()) {
    auto [v, expanded] = stack.back();
    stack.pop_back();
    if (done.count(v))
      continue;
    if (!expanded) {
      llvm::SmallVector<Value, 2> parts = children(v);
      if (!parts.empty()) {
        stack.push_back({v, true});
        for (Value part : parts)
          stack.push_back({throughKernels(part), false});
        continue;
      }
    }
    done.insert(v);
    if (!visit(v))
      return false;
  }
  return true;
}

class BudgetBuilder {
public:
  explicit BudgetBuilder(vt::FlowOp flow) {
    int64_t i = 0;
    for (auto p : flow.getBody()->getOps<vt::ParamOp>())
      params[p.getSymName().str()] = i++;
  }

  /// The DAG of `root`'s definition, shared values once (no recursion).
  rt::BudgetExpr build(Value root, const std::string &what) {
    rt::BudgetExpr expr;
    expr.what = what;
    llvm::DenseMap<Value, int64_t> index;
    auto operands = [](Value v) {
      Operation *op = v.getDefiningOp();
      if (!op)
        throw std::runtime_error("a budget is not defined by an op");
      llvm::SmallVector<Value, 2> parts;
      if (!llvm::isa<vt::ConstantOp, vt::ParamLoadOp, vt::InputOp>(op))
        parts.append(op->operand_begin(), op->operand_end());
      return parts;
    };
    walkPostOrder(root, operands, [&](Value v) {
      rt::BudgetNode node = makeNode(v.getDefiningOp(), index);
      index[v] = int64_t(expr.nodes.size());
      expr.nodes.push_back(node);
      return true;
    });
    // The root is the last node: it is pushed first and finished last.
    return expr;
  }

private:
  std::map<std::string, int64_t> params;

  rt::BudgetNode makeNode(Operation *op,
                          const llvm::DenseMap<Value, int64_t> &index) {
    using K = rt::BudgetNode::Kind;
    rt::BudgetNode n;
    auto binary = [&](K kind) {
      n.kind = kind;
      n.a = index.lookup(throughKernels(op->getOperand(0)));
      n.b = index.lookup(throughKernels(op->getOperand(1)));
    };
    llvm::TypeSwitch<Operation *>(op)
        .Case<vt::ConstantOp>([&](vt::ConstantOp c) {
          n.kind = K::Const;
          n.value = double(c.getValue().convertToFloat());
        })
        .Case<vt::ParamLoadOp>([&](vt::ParamLoadOp p) {
          auto it = params.find(p.getParam().str());
          if (it == params.end())
            throw std::runtime_error("a budget reads unknown param '" +
                                     p.getParam().str() + "'");
          n.kind = K::Param;
          n.param = it->second;
        })
        .Case<vt::InputOp>([&](vt::InputOp in) {
          if (in.getKind() == vt::InputKind::num_blocks)
            n.kind = K::NumBlocks;
          else if (in.getKind() == vt::InputKind::context_len)
            n.kind = K::ContextLen;
          else if (in.getKind() == vt::InputKind::group)
            n.kind = K::Group;
          else if (in.getKind() == vt::InputKind::layer)
            n.kind = K::Layer;
          else if (in.getKind() == vt::InputKind::kv_head)
            n.kind = K::KVHead;
          else
            throw std::runtime_error("a budget reads a device input");
        })
        .Case<vt::AddOp>([&](auto) { binary(K::Add); })
        .Case<vt::SubOp>([&](auto) { binary(K::Sub); })
        .Case<vt::MulOp>([&](auto) { binary(K::Mul); })
        .Case<vt::DivOp>([&](auto) { binary(K::Div); })
        .Case<vt::MinimumOp>([&](auto) { binary(K::Min); })
        .Case<vt::MaximumOp>([&](auto) { binary(K::Max); })
        .Default([](Operation *o) {
          throw std::runtime_error("a budget uses " +
                                   o->getName().getStringRef().str() +
                                   ", which the host cannot evaluate");
        });
    return n;
  }
};

std::string describeSite(Operation *op) {
  std::string what = op->getName().getStringRef().str();
  if (auto at = op->getLoc().dyn_cast<mlir::FileLineColLoc>())
    what += " at line " + std::to_string(at.getLine()) + ", column " +
            std::to_string(at.getColumn());
  return what;
}

} // namespace

bool vflow::describeBudgets(vt::FlowOp flow, FlowBudgets &out,
                            std::string &error) {
  out = FlowBudgets();
  vt::IndexStageOp index = flow.getIndexStage();
  if (!index) {
    error = "the flow has no index stage";
    return false;
  }
  try {
    BudgetBuilder builder(flow);
    index.walk<mlir::WalkOrder::PreOrder>([&](Operation *op) {
      Value k;
      if (llvm::isa<vt::TopKOp, vt::ApproxTopKOp>(op))
        k = op->getOperand(1);
      else if (auto t = llvm::dyn_cast<vt::ThresholdOp>(op))
        k = t.getMax();
      else if (auto t = llvm::dyn_cast<vt::TopPOp>(op))
        k = t.getMax();
      else if (auto kth = llvm::dyn_cast<vt::KthLargestOp>(op))
        k = kth.getK();
      if (!k)
        return;
      out.budgetOf[op] = int64_t(out.budgets.size());
      out.budgets.push_back(builder.build(k, describeSite(op)));
    });
    // The returned selection's bound, post-order over unions.
    auto ret =
        llvm::cast<vt::ReturnOp>(index.getBody().front().getTerminator());
    llvm::DenseMap<Value, int64_t> done;
    auto unionOperands = [](Value v) {
      llvm::SmallVector<Value, 2> parts;
      if (auto u = llvm::dyn_cast_or_null<vt::UnionOp>(v.getDefiningOp()))
        parts = {u.getRhs(), u.getLhs()};
      return parts;
    };
    auto visit = [&](Value v) {
      Operation *op = v.getDefiningOp();
      rt::SelectionNode node;
      if (auto u = llvm::dyn_cast_or_null<vt::UnionOp>(op)) {
        node.kind = rt::SelectionNode::Kind::Union;
        node.a = done.lookup(throughKernels(u.getLhs()));
        node.b = done.lookup(throughKernels(u.getRhs()));
      } else if (llvm::isa_and_nonnull<vt::ThresholdOp, vt::TopPOp>(op)) {
        if (op->getNumOperands() > 2) {
          node.kind = rt::SelectionNode::Kind::Budget;
          node.budget = out.budgetOf.lookup(op);
        } else {
          node.kind = rt::SelectionNode::Kind::All;
        }
      } else if (llvm::isa_and_nonnull<vt::TopKOp, vt::ApproxTopKOp>(op)) {
        // Exactly min(k, candidates) blocks, approximate or not.
        node.kind = rt::SelectionNode::Kind::TopK;
        node.budget = out.budgetOf.lookup(op);
      } else {
        error = "the index stage does not return a selection op";
        return false;
      }
      done[v] = int64_t(out.selection.size());
      out.selection.push_back(node);
      return true;
    };
    if (!walkPostOrder(ret.getSelection(), unionOperands, visit))
      return false;
    // The retain block's capacity: one more budget, after the selection's.
    if (Value capacity = ret.getRetainCapacity()) {
      out.retainBudget = int64_t(out.budgets.size());
      out.budgets.push_back(builder.build(capacity, "retain capacity"));
    }
  } catch (const std::exception &e) {
    error = e.what();
    return false;
  }
  return true;
}
