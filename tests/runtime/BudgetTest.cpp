//===- BudgetTest.cpp - The runtime's budget evaluator
//---------------------===//

#include "vflow/Runtime/Budget.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

using namespace vflow::rt;
using K = BudgetNode::Kind;

namespace {

BudgetNode leaf(K kind, double value = 0, int64_t param = 0) {
  BudgetNode n;
  n.kind = kind;
  n.value = value;
  n.param = param;
  return n;
}

BudgetNode op(K kind, int64_t a, int64_t b) {
  BudgetNode n;
  n.kind = kind;
  n.a = a;
  n.b = b;
  return n;
}

} // namespace

TEST(Budget, EvaluatesInDependencyOrder) {
  // min(budget, num_blocks / 2) + context_len * 0.25
  BudgetExpr e;
  e.what = "test";
  e.nodes = {leaf(K::Param, 0, 1), leaf(K::NumBlocks), leaf(K::Const, 2),
             op(K::Div, 1, 2),     op(K::Min, 0, 3),   leaf(K::ContextLen),
             leaf(K::Const, 0.25), op(K::Mul, 5, 6),   op(K::Add, 4, 7)};
  double params[] = {999, 10};
  EXPECT_DOUBLE_EQ(e.evaluate(params, {8, 100, 1}), 4 + 25);
  EXPECT_DOUBLE_EQ(e.evaluate(params, {100, 0, 1}), 10);
  params[1] = 3;
  EXPECT_DOUBLE_EQ(e.evaluate(params, {100, 4, 1}), 4);
}

TEST(Budget, SharedNodesAreLinear) {
  // x_{i+1} = x_i + x_i, 200 times: a tree of 2^200 terms, 201 nodes.
  BudgetExpr e;
  e.nodes = {leaf(K::Const, 1)};
  for (int i = 0; i < 200; ++i)
    e.nodes.push_back(op(K::Add, i, i));
  EXPECT_DOUBLE_EQ(e.evaluate(nullptr, {0, 0, 1}), std::ldexp(1.0, 200));
}

TEST(Budget, RoundingAndSelection) {
  EXPECT_EQ(roundBudget(2.9), 2);
  EXPECT_EQ(roundBudget(-1), 0);
  EXPECT_EQ(roundBudget(std::nan("")), 0);
  EXPECT_EQ(roundBudget(1e300), int64_t(9e15));
  BudgetExpr three, five;
  three.nodes = {leaf(K::Const, 3.5)};
  five.nodes = {leaf(K::Const, 5)};
  std::vector<BudgetExpr> budgets = {three, five};
  std::vector<SelectionNode> nodes(4);
  nodes[0].kind = SelectionNode::Kind::Budget;
  nodes[0].budget = 0;
  nodes[1].kind = SelectionNode::Kind::Budget;
  nodes[1].budget = 1;
  nodes[2].kind = SelectionNode::Kind::Union;
  nodes[2].a = 0;
  nodes[2].b = 1;
  nodes[3].kind = SelectionNode::Kind::Union; // union with all blocks
  nodes[3].a = 2;
  nodes[3].b = 2;
  std::vector<SelectionNode> unionOnly(nodes.begin(), nodes.begin() + 3);
  EXPECT_EQ(selectionBudget(unionOnly, budgets, nullptr, {100, 0, 1}), 8);
  EXPECT_EQ(selectionBudget(unionOnly, budgets, nullptr, {6, 0, 1}), 6);
  EXPECT_EQ(selectionBudget(unionOnly, budgets, nullptr, {2, 0, 1}), 2);
  std::vector<SelectionNode> all(1);
  all[0].kind = SelectionNode::Kind::All;
  EXPECT_EQ(selectionBudget(all, budgets, nullptr, {17, 0, 1}), 17);
}

TEST(Budget, ATopKTakesEveryCandidateOnceItsBudgetReachesThem) {
  BudgetExpr four, perBlocks;
  four.nodes = {leaf(K::Const, 4.9)}; // rounds down to 4
  // num_blocks / 2
  perBlocks.nodes = {leaf(K::NumBlocks), leaf(K::Const, 2), op(K::Div, 0, 1)};
  std::vector<BudgetExpr> budgets = {four, perBlocks};
  auto node = [](SelectionNode::Kind kind, int64_t budget) {
    SelectionNode n;
    n.kind = kind;
    n.budget = budget;
    return n;
  };
  const std::vector<SelectionNode> topk = {node(SelectionNode::Kind::TopK, 0)};
  EXPECT_TRUE(selectionTakesAll(topk, budgets, nullptr, {100, 1600, 1}, 4));
  EXPECT_TRUE(selectionTakesAll(topk, budgets, nullptr, {100, 1600, 1}, 3));
  EXPECT_FALSE(selectionTakesAll(topk, budgets, nullptr, {100, 1600, 1}, 5));
  // No candidates (every complete block kept): nothing to choose.
  EXPECT_TRUE(selectionTakesAll(topk, budgets, nullptr, {2, 40, 1}, 0));
  // A budget of the length: num_blocks / 2 reaches 5 candidates at 10.
  const std::vector<SelectionNode> half = {node(SelectionNode::Kind::TopK, 1)};
  EXPECT_TRUE(selectionTakesAll(half, budgets, nullptr, {10, 160, 1}, 5));
  EXPECT_FALSE(selectionTakesAll(half, budgets, nullptr, {12, 192, 1}, 7));
  // A threshold's or top-p's max is a bound: the scores decide.
  const std::vector<SelectionNode> bound = {
      node(SelectionNode::Kind::Budget, 0)};
  EXPECT_FALSE(selectionTakesAll(bound, budgets, nullptr, {100, 1600, 1}, 2));
  std::vector<SelectionNode> all(1);
  all[0].kind = SelectionNode::Kind::All;
  EXPECT_FALSE(selectionTakesAll(all, budgets, nullptr, {100, 1600, 1}, 2));
  // A union takes all when either side does.
  std::vector<SelectionNode> both = {node(SelectionNode::Kind::Budget, 0),
                                     node(SelectionNode::Kind::TopK, 0)};
  SelectionNode u;
  u.kind = SelectionNode::Kind::Union;
  u.a = 0;
  u.b = 1;
  both.push_back(u);
  EXPECT_TRUE(selectionTakesAll(both, budgets, nullptr, {100, 1600, 1}, 4));
  EXPECT_FALSE(selectionTakesAll(both, budgets, nullptr, {100, 1600, 1}, 9));
  // As a bound a top-k is its budget.
  EXPECT_EQ(selectionBudget(topk, budgets, nullptr, {100, 1600, 1}), 4);
}

TEST(Budget, NegativeOrNaNIsAnError) {
  // budget - num_blocks: fine at 0 blocks, negative later.
  BudgetExpr e;
  e.what = "vt.topk at line 3, column 9";
  e.nodes = {leaf(K::Param, 0, 0), leaf(K::NumBlocks), op(K::Sub, 0, 1)};
  double params[] = {4, 16};
  try {
    checkBudgets({e}, params, {"budget", "block_size"}, {false, true}, 16,
                 BudgetScope{1}, "f");
    ADD_FAILURE() << "a negative budget passed";
  } catch (const Error &err) {
    EXPECT_STREQ(err.what(),
                 "flow 'f': the budget of vt.topk at line 3, column 9 is -4 "
                 "at num_blocks = 8, context_len = 128 with budget = 4; a "
                 "budget must be a number >= 0");
  }
  BudgetExpr nan;
  nan.what = "kth";
  nan.nodes = {leaf(K::Const, 0), op(K::Div, 0, 0)};
  EXPECT_THROW(checkBudgets({nan}, params, {"budget", "block_size"},
                            {false, true}, 16, BudgetScope{1}, "f"),
               Error);
  BudgetExpr fine;
  fine.nodes = {leaf(K::NumBlocks)};
  EXPECT_NO_THROW(checkBudgets({fine}, params, {"budget", "block_size"},
                               {false, true}, 16, BudgetScope{1}, "f"));
}

TEST(Budget, GroupIsTheSessionsGroup) {
  // budget - 4 * group: the session's group decides, and says so.
  BudgetExpr e;
  e.what = "vt.topk at line 5, column 9";
  e.nodes = {leaf(K::Param, 0, 0), leaf(K::Const, 4), leaf(K::Group),
             op(K::Mul, 1, 2), op(K::Sub, 0, 3)};
  double params[] = {16, 16};
  EXPECT_DOUBLE_EQ(e.evaluate(params, {8, 128, 2}), 8);
  EXPECT_DOUBLE_EQ(e.evaluate(params, {8, 128, 4}), 0);
  EXPECT_NO_THROW(checkBudgets({e}, params, {"budget", "block_size"},
                               {false, true}, 16, BudgetScope{4}, "f"));
  try {
    checkBudgets({e}, params, {"budget", "block_size"}, {false, true}, 16,
                 BudgetScope{8}, "f");
    ADD_FAILURE() << "a negative budget at group 8 passed";
  } catch (const Error &err) {
    EXPECT_STREQ(err.what(),
                 "flow 'f': the budget of vt.topk at line 5, column 9 is -16 "
                 "at num_blocks = 0, context_len = 0, group = 8 with budget = "
                 "16; a budget must be a number >= 0");
  }
}

TEST(Budget, LayerAndKVHeadAreBoundedOverTheScope) {
  // max(2, budget - 4 * layer) + kv_head: per layer and KV head; the
  // session's lists hold the most over its layers and KV heads.
  BudgetExpr e;
  e.what = "vt.topk at line 6, column 9";
  e.nodes = {leaf(K::Param, 0, 0), leaf(K::Const, 4), leaf(K::Layer),
             op(K::Mul, 1, 2),     op(K::Sub, 0, 3),  leaf(K::Const, 2),
             op(K::Max, 5, 4),     leaf(K::KVHead),   op(K::Add, 6, 7)};
  double params[] = {16, 16};
  EXPECT_DOUBLE_EQ(e.evaluate(params, {100, 1600, 1, 0, 0}), 16);
  EXPECT_DOUBLE_EQ(e.evaluate(params, {100, 1600, 1, 3, 1}), 5);
  EXPECT_DOUBLE_EQ(e.evaluate(params, {100, 1600, 1, 9, 2}), 4);
  EXPECT_EQ(budgetInputs({e}).layer, true);
  EXPECT_EQ(budgetInputs({e}).kvHead, true);

  std::vector<SelectionNode> topk(1);
  topk[0].kind = SelectionNode::Kind::TopK;
  topk[0].budget = 0;
  ParamSpec budget{"budget", "int", 16, false};
  ParamSpec blockSize{"block_size", "int", 16, true};
  ParamSpec first{"keep_first", "int", 0, false};
  ParamSpec last{"keep_last", "int", 0, false};
  BudgetScope scope;
  scope.firstLayer = 2; // layers 0 and 1 dense
  scope.numLayers = 4;
  scope.firstKVHead = 4; // a tensor-parallel rank's second half
  scope.numKVHeads = 4;
  FlowParams p("f", {budget, blockSize, first, last}, {e}, topk, scope);
  // The most: layer 2 (16 - 8 = 8) at KV head 7.
  EXPECT_EQ(p.budget(100, 1600), 8 + 7);
  EXPECT_EQ(p.budgetAt({100, 1600, 1, 5, 4}), 2 + 4);
  // Every block only where every layer and KV head takes them all.
  EXPECT_FALSE(p.takesEveryBlock(14 * 16));
  EXPECT_TRUE(p.takesEveryBlock(6 * 16));
  EXPECT_NO_THROW(p.checkInScope("x", 5, 7));
  try {
    p.checkInScope("GPU index stage", 6, 4);
    ADD_FAILURE() << "layer 6 outside the scope passed";
  } catch (const Error &err) {
    EXPECT_STREQ(err.what(),
                 "GPU index stage: layer 6 is outside the layers [2, 6) "
                 "flow 'f' was planned for (a budget reads 'layer'): give "
                 "the flow the model's layers");
  }
  EXPECT_THROW(p.checkInScope("x", 2, 3), Error);
  // A budget negative at one of the scope's layers is refused, naming it.
  BudgetExpr neg;
  neg.what = "vt.topk at line 7, column 9";
  neg.nodes = {leaf(K::Param, 0, 0), leaf(K::Const, 4), leaf(K::Layer),
               op(K::Mul, 1, 2), op(K::Sub, 0, 3)};
  try {
    FlowParams q("f", {budget, blockSize, first, last}, {neg}, topk, scope);
    ADD_FAILURE() << "a budget negative at layer 5 passed";
  } catch (const Error &err) {
    EXPECT_STREQ(err.what(),
                 "flow 'f': the budget of vt.topk at line 7, column 9 is -4 "
                 "at num_blocks = 0, context_len = 0, layer = 5 with budget "
                 "= 16, keep_first = 0, keep_last = 0; a budget must be a "
                 "number >= 0");
  }
}

TEST(Budget, StructureIsValidated) {
  BudgetExpr forward;
  forward.nodes = {op(K::Add, 1, 1), leaf(K::Const, 1)};
  EXPECT_THROW(validateBudget(forward, 0, "x"), Error);
  BudgetExpr param;
  param.nodes = {leaf(K::Param, 0, 3)};
  EXPECT_THROW(validateBudget(param, 2, "x"), Error);
  EXPECT_NO_THROW(validateBudget(param, 4, "x"));
  std::vector<SelectionNode> bad(1);
  bad[0].kind = SelectionNode::Kind::Budget;
  bad[0].budget = 2;
  EXPECT_THROW(validateSelection(bad, 2, "x"), Error);
  EXPECT_THROW(validateSelection({}, 0, "x"), Error);
}
