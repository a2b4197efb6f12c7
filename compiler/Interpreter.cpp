//===- Interpreter.cpp - Reference interpreter of vt IR -------------------===//
//
// Straightforward loops over named-axis tensors: every op maps its operands
// onto the axes of its result type by name (broadcasting, transposing,
// splitting or renaming as the op says), so the interpreter never depends on
// the order in which a pass happens to list axes.
//
// The numeric rules (element functions, reduction steps, lines along block,
// ranking, thresholds, budgets, kept blocks, storage rounding) are
// NumericRules.h's, the code both backends compile; the loops and the
// selection algorithms here are the interpreter's own.
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/Interpreter.h"
#include "vflow/Compiler/Budgets.h"
#include "vflow/Compiler/StorageDType.h"
#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/NumericRules.h"
#include "vflow/Runtime/Random.h"

#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/TypeSwitch.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>

using namespace vflow;
using namespace vflow::interp;
using mlir::Operation;
using mlir::Value;

//===----------------------------------------------------------------------===//
// Tensor
//===----------------------------------------------------------------------===//

Tensor::Tensor(std::vector<std::string> names, std::vector<int64_t> sizes)
    : names(std::move(names)), sizes(std::move(sizes)) {
  data.assign(numElements(), 0.0f);
}

Tensor Tensor::scalar(float value) {
  Tensor t({}, {});
  t.data = {value};
  return t;
}

int64_t Tensor::numElements() const {
  int64_t n = 1;
  for (int64_t s : sizes)
    n *= s;
  return n;
}

int Tensor::axisIndex(const std::string &name) const {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name)
      return static_cast<int>(i);
  return -1;
}

std::string Tensor::shapeString() const {
  std::string out = "[";
  for (size_t i = 0; i < names.size(); ++i)
    out += (i ? ", " : "") + names[i] + ":" + std::to_string(sizes[i]);
  return out + "]";
}

namespace {

[[noreturn]] void fail(const std::string &message) {
  throw std::runtime_error(message);
}

std::vector<int64_t> rowMajorStrides(const std::vector<int64_t> &sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t i = sizes.size(); i-- > 1;)
    strides[i - 1] = strides[i] * sizes[i];
  return strides;
}

/// Calls fn(resultIndex, multiIndex) for every element of a shape.
template <typename Fn>
void forEachIndex(const std::vector<int64_t> &sizes, Fn fn) {
  int64_t total = 1;
  for (int64_t s : sizes)
    total *= s;
  std::vector<int64_t> idx(sizes.size(), 0);
  for (int64_t linear = 0; linear < total; ++linear) {
    fn(linear, idx);
    for (size_t d = sizes.size(); d-- > 0;) {
      if (++idx[d] < sizes[d])
        break;
      idx[d] = 0;
    }
  }
}

/// Strides of `t` along the axes `names` (0 where `t` lacks the axis, so it
/// broadcasts). `rename` maps a result axis name to the name in `t`.
std::vector<int64_t>
stridesAlong(const Tensor &t, const std::vector<std::string> &names,
             const std::map<std::string, std::string> &rename = {}) {
  std::vector<int64_t> own = rowMajorStrides(t.sizes);
  std::vector<int64_t> out(names.size(), 0);
  for (size_t i = 0; i < names.size(); ++i) {
    auto r = rename.find(names[i]);
    int a = t.axisIndex(r == rename.end() ? names[i] : r->second);
    if (a >= 0)
      out[i] = own[a];
  }
  return out;
}

int64_t offsetOf(const std::vector<int64_t> &idx,
                 const std::vector<int64_t> &strides) {
  int64_t off = 0;
  for (size_t i = 0; i < idx.size(); ++i)
    off += idx[i] * strides[i];
  return off;
}

/// Rounds a value to a storage element type (what reading it back gives).
float roundToStorage(mlir::Type type, float x) {
  return rt::roundToDType(storageDType(type), x);
}

int64_t roundBudget(double v) { return rules::roundBudget(v); }

} // namespace

//===----------------------------------------------------------------------===//
// The evaluator
//===----------------------------------------------------------------------===//

struct FlowInterpreter::Impl {
  vt::FlowOp flow;
  int64_t headDim = 0, group = 0;
  std::map<std::string, double> params;
  std::map<std::string, vt::TensorType> fieldTypes, stateTypes;
  std::map<std::string, float> stateInit;
  const std::map<std::string, Tensor> *consts = nullptr;
  int64_t keepFirst = 1, keepLast = 1, blockSize = 16;
  /// The budgets as the runtime evaluates them (Budget.h), with the params
  /// in declaration order.
  FlowBudgets budgets;
  std::vector<double> paramValues;

  /// Per-run evaluation state.
  struct Run {
    int64_t numBlocks = 0;
    bool index = false;
    const Tensor *K = nullptr, *V = nullptr;
    const IndexInputs *inputs = nullptr;
    StateValues *states = nullptr;
    std::map<std::string, Tensor> *fieldsOut = nullptr;
    llvm::DenseMap<Value, Tensor> values;
    llvm::DenseMap<Value, Selection> selections;
    rules::KeptBlocks kept{0, 0, 0};
  };

  /// The unrounded value of the budget of `op` (a selection or kth_largest).
  double budgetOf(Operation *op, const Run &run) const {
    auto it = budgets.budgetOf.find(op);
    if (it == budgets.budgetOf.end())
      fail("no budget for " + op->getName().getStringRef().str());
    rt::BudgetPoint at;
    at.numBlocks = run.numBlocks;
    at.group = group;
    if (run.inputs) {
      at.contextLen = run.inputs->contextLen;
      at.layer = run.inputs->layer;
      at.kvHead = run.inputs->kvHead;
    }
    return budgets.budgets[size_t(it->second)].evaluate(paramValues.data(), at);
  }

  int64_t resolve(int64_t size, const Run &run) const {
    switch (size) {
    case vt::kSizeBlocks:
      return run.numBlocks;
    case vt::kSizeGroup:
      return group;
    case vt::kSizeHeadDim:
      return headDim;
    default:
      return size;
    }
  }

  Tensor shaped(vt::TensorType type, const Run &run) const {
    std::vector<std::string> names;
    std::vector<int64_t> sizes;
    for (vt::AxisAttr a : type.getAxes()) {
      names.push_back(a.getName().str());
      sizes.push_back(resolve(a.getSize(), run));
    }
    return Tensor(names, sizes);
  }

  /// Reorders (and checks) an input tensor to the axes of `type`.
  Tensor conform(const Tensor &in, vt::TensorType type, const Run &run,
                 const std::string &what) const {
    Tensor out = shaped(type, run);
    if (in.names.size() != out.names.size())
      fail(what + " has axes " + in.shapeString() + ", expected " +
           out.shapeString());
    for (size_t i = 0; i < out.names.size(); ++i) {
      int a = in.axisIndex(out.names[i]);
      if (a < 0 || in.sizes[a] != out.sizes[i])
        fail(what + " has axes " + in.shapeString() + ", expected " +
             out.shapeString());
    }
    if (static_cast<int64_t>(in.data.size()) != in.numElements())
      fail(what + " holds " + std::to_string(in.data.size()) +
           " values for shape " + in.shapeString());
    std::vector<int64_t> strides = stridesAlong(in, out.names);
    forEachIndex(out.sizes, [&](int64_t i, const std::vector<int64_t> &idx) {
      out.data[i] = in.data[offsetOf(idx, strides)];
    });
    return out;
  }

  const Tensor &value(Value v, Run &run) const {
    auto it = run.values.find(v);
    if (it == run.values.end())
      fail("internal: value used before it was computed");
    return it->second;
  }

  float scalarOf(Value v, Run &run) const { return value(v, run).data.at(0); }

  Tensor elementwise(Operation *op, Run &run,
                     const std::function<float(const float *)> &fn) const {
    Tensor out = shaped(op->getResult(0).getType().cast<vt::TensorType>(), run);
    std::vector<const Tensor *> ins;
    std::vector<std::vector<int64_t>> strides;
    for (Value operand : op->getOperands()) {
      ins.push_back(&value(operand, run));
      strides.push_back(stridesAlong(*ins.back(), out.names));
    }
    std::vector<float> args(ins.size());
    forEachIndex(out.sizes, [&](int64_t i, const std::vector<int64_t> &idx) {
      for (size_t k = 0; k < ins.size(); ++k)
        args[k] = ins[k]->data[offsetOf(idx, strides[k])];
      out.data[i] = fn(args.data());
    });
    return out;
  }

  Tensor reduce(vt::ReduceOp op, Run &run) const {
    const Tensor &in = value(op.getInput(), run);
    Tensor out = shaped(op.getResult().getType().cast<vt::TensorType>(), run);
    std::vector<std::string> reduced;
    for (mlir::Attribute a : op.getAxes())
      reduced.push_back(a.cast<mlir::StringAttr>().str());
    // Iterate the input; accumulate into the output position.
    std::vector<int64_t> outStrides(in.names.size(), 0);
    std::vector<int64_t> own = rowMajorStrides(out.sizes);
    for (size_t i = 0; i < in.names.size(); ++i) {
      int a = out.axisIndex(in.names[i]);
      if (a >= 0)
        outStrides[i] = own[a];
    }
    vt::ReduceKind kind = op.getKind();
    double count = 1;
    for (const std::string &r : reduced) {
      int a = in.axisIndex(r);
      if (a < 0)
        fail("internal: reduce over a missing axis " + r);
      count *= in.sizes[a];
    }
    double init = rules::sumInit();
    void (*acc)(double &, double) = rules::accSum;
    float (*finish)(double, double) = rules::finishPlain;
    switch (kind) {
    case vt::ReduceKind::sum:
      break;
    case vt::ReduceKind::mean:
      finish = rules::finishMean;
      break;
    case vt::ReduceKind::max:
      init = rules::maxInit(), acc = rules::accMax;
      break;
    case vt::ReduceKind::min:
      init = rules::minInit(), acc = rules::accMin;
      break;
    case vt::ReduceKind::l2norm:
      acc = rules::accSquares, finish = rules::finishL2;
      break;
    }
    if (op.sumsInLanes()) {
      // rules::kSumLanes f32 partials per output element; element e of the
      // reduced ones (row major over the reduced axes) goes to lane e % 32.
      std::vector<int64_t> reducedStrides(in.names.size(), 0);
      int64_t stride = 1;
      for (size_t i = in.names.size(); i-- > 0;)
        if (out.axisIndex(in.names[i]) < 0) {
          reducedStrides[i] = stride;
          stride *= in.sizes[i];
        }
      const int64_t lanes = rules::kSumLanes;
      std::vector<float> lane(size_t(out.numElements() * lanes), 0.0f);
      bool squares = kind == vt::ReduceKind::l2norm;
      forEachIndex(in.sizes, [&](int64_t i, const std::vector<int64_t> &idx) {
        float &a = lane[size_t(offsetOf(idx, outStrides) * lanes +
                               offsetOf(idx, reducedStrides) % lanes)];
        if (squares)
          rules::accSquaresLane(a, in.data[i]);
        else
          rules::accSumLane(a, in.data[i]);
      });
      for (size_t o = 0; o < out.data.size(); ++o)
        out.data[o] =
            finish(double(rules::combineSumLanes(&lane[o * lanes])), count);
      return out;
    }
    std::vector<double> partial(out.numElements(), init);
    forEachIndex(in.sizes, [&](int64_t i, const std::vector<int64_t> &idx) {
      acc(partial[offsetOf(idx, outStrides)], in.data[i]);
    });
    for (size_t i = 0; i < partial.size(); ++i)
      out.data[i] = finish(partial[i], count);
    return out;
  }

  /// Applies fn to every line along `block`: fn(values, count, out).
  Tensor alongBlock(Operation *op, const Tensor &in, Run &run,
                    const std::function<void(const std::vector<float> &,
                                             std::vector<float> &)> &fn) const {
    Tensor out = shaped(op->getResult(0).getType().cast<vt::TensorType>(), run);
    Tensor src = conform(in, op->getResult(0).getType().cast<vt::TensorType>(),
                         run, "operand");
    int b = src.axisIndex("block");
    std::vector<int64_t> strides = rowMajorStrides(src.sizes);
    std::vector<int64_t> outer = src.sizes;
    outer[b] = 1;
    int64_t n = src.sizes[b];
    std::vector<float> line(n), result(n);
    forEachIndex(outer, [&](int64_t, const std::vector<int64_t> &idx) {
      int64_t base = offsetOf(idx, strides);
      for (int64_t j = 0; j < n; ++j)
        line[j] = src.data[base + j * strides[b]];
      fn(line, result);
      for (int64_t j = 0; j < n; ++j)
        out.data[base + j * strides[b]] = result[j];
    });
    return out;
  }

  Tensor kthLargest(vt::KthLargestOp op, Run &run) const {
    const Tensor &in = value(op.getInput(), run);
    Tensor out = shaped(op.getResult().getType().cast<vt::TensorType>(), run);
    int64_t k = roundBudget(budgetOf(op, run));
    int b = in.axisIndex("block");
    int64_t n = in.sizes[b];
    std::vector<int64_t> strides = rowMajorStrides(in.sizes);
    std::vector<int64_t> outStrides = stridesAlong(out, in.names);
    std::vector<int64_t> outer = in.sizes;
    outer[b] = 1;
    forEachIndex(outer, [&](int64_t, const std::vector<int64_t> &idx) {
      int64_t base = offsetOf(idx, strides);
      std::vector<float> line(n);
      for (int64_t j = 0; j < n; ++j)
        line[j] = in.data[base + j * strides[b]];
      std::sort(line.begin(), line.end(), rules::valueRanksBefore);
      // k < 1: nothing is that large; k > n: the smallest.
      int64_t rank = rules::kthLargestRank(k, n);
      out.data[offsetOf(idx, outStrides)] =
          rank < 0 ? rules::infinity() : rules::kthLargestValue(line[rank]);
    });
    return out;
  }

  /// Maps every result element to an input element through `srcOffset`.
  Tensor remap(Operation *op, const Tensor &in, Run &run,
               const std::function<int64_t(const std::vector<int64_t> &,
                                           const std::vector<std::string> &)>
                   &srcOffset) const {
    Tensor out = shaped(op->getResult(0).getType().cast<vt::TensorType>(), run);
    forEachIndex(out.sizes, [&](int64_t i, const std::vector<int64_t> &idx) {
      out.data[i] = in.data[srcOffset(idx, out.names)];
    });
    return out;
  }

  Tensor generate(Operation *op, Run &run) const {
    auto type = op->getResult(0).getType().cast<vt::TensorType>();
    Tensor out = shaped(type, run);
    if (auto r = llvm::dyn_cast<vt::RademacherOp>(op))
      out.data = rt::rademacherValues(r.getSeed(), out.numElements());
    else if (auto g = llvm::dyn_cast<vt::GaussianOp>(op))
      out.data = rt::gaussianValues(g.getSeed(), out.numElements());
    else if (auto l = llvm::dyn_cast<vt::LiteralOp>(op)) {
      llvm::ArrayRef<float> values = l.getValues();
      if (static_cast<int64_t>(values.size()) != out.numElements())
        fail("literal size does not match its type");
      out.data.assign(values.begin(), values.end());
    }
    return out;
  }

  /// Candidates of a selection: blocks that are not kept, ranked.
  std::vector<int64_t> ranked(const Tensor &score, Run &run) const {
    std::vector<int64_t> ids;
    for (int64_t j = 0; j < run.numBlocks; ++j)
      if (!run.kept.contains(j))
        ids.push_back(j);
    std::sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) {
      return rules::ranksBefore(score.data[a], a, score.data[b], b);
    });
    return ids;
  }

  Selection select(Operation *op, Run &run) const {
    Selection sel;
    if (auto u = llvm::dyn_cast<vt::UnionOp>(op)) {
      std::set<int64_t> all;
      for (Value v : {u.getLhs(), u.getRhs()})
        for (int64_t b : run.selections.lookup(v).blocks)
          all.insert(b);
      sel.blocks.assign(all.begin(), all.end());
      return sel;
    }
    Value scoreValue = op->getOperand(0);
    Tensor score =
        conform(value(scoreValue, run),
                scoreValue.getType().cast<vt::TensorType>(), run, "score");
    std::vector<int64_t> ids = ranked(score, run);
    size_t take = ids.size();
    if (llvm::isa<vt::TopKOp, vt::ApproxTopKOp>(op)) {
      // approx_topk may miss blocks on a backend; the oracle is exact.
      take = std::min<size_t>(take, roundBudget(budgetOf(op, run)));
    } else if (auto t = llvm::dyn_cast<vt::ThresholdOp>(op)) {
      float threshold = scalarOf(t.getThreshold(), run);
      size_t passing = 0;
      while (passing < ids.size() &&
             rules::passesThreshold(score.data[ids[passing]], threshold))
        ++passing;
      take = passing;
      if (t.getMax())
        take = std::min<size_t>(take, roundBudget(budgetOf(op, run)));
    } else if (auto t = llvm::dyn_cast<vt::TopPOp>(op)) {
      take = size_t(rules::toppCount(
          static_cast<long long>(ids.size()), scalarOf(t.getP(), run),
          [&](long long i) { return score.data[ids[i]]; }));
      if (t.getMax())
        take = std::min<size_t>(take, roundBudget(budgetOf(op, run)));
    }
    sel.blocks.assign(ids.begin(), ids.begin() + take);
    std::sort(sel.blocks.begin(), sel.blocks.end());
    return sel;
  }

  void runOp(Operation *op, Run &run) const {
    auto set = [&](Tensor t) { run.values[op->getResult(0)] = std::move(t); };
    if (std::optional<Tensor> t = elementwiseOp(op, run)) {
      set(std::move(*t));
      return;
    }
    llvm::TypeSwitch<Operation *>(op)
        .Case<vt::InputOp>([&](vt::InputOp in) { set(input(in, run)); })
        .Case<vt::ParamLoadOp, vt::ConstLoadOp, vt::FieldLoadOp,
              vt::FieldStoreOp, vt::StateLoadOp, vt::StateStoreOp>(
            [&](auto) { runDeclarationAccess(op, run); })
        .Case<vt::ConstantOp>([&](vt::ConstantOp c) {
          set(Tensor::scalar(c.getValue().convertToFloat()));
        })
        .Case<vt::ReduceOp>([&](vt::ReduceOp r) { set(reduce(r, run)); })
        .Case<vt::SoftmaxOp, vt::NormalizeOp, vt::ConvOp>(
            [&](auto) { set(lineOp(op, run)); })
        .Case<vt::KthLargestOp>(
            [&](vt::KthLargestOp k) { set(kthLargest(k, run)); })
        .Case<vt::SplitOp>([&](vt::SplitOp s) { set(split(s, run)); })
        .Case<vt::RenameOp>([&](vt::RenameOp r) { set(renamed(r, run)); })
        .Case<vt::RademacherOp, vt::GaussianOp, vt::LiteralOp>(
            [&](auto) { set(generate(op, run)); })
        .Case<vt::TopKOp, vt::ApproxTopKOp, vt::ThresholdOp, vt::TopPOp,
              vt::UnionOp>(
            [&](auto) { run.selections[op->getResult(0)] = select(op, run); })
        .Case<vt::KernelOp>([&](vt::KernelOp k) { runKernel(k, run); })
        .Case<vt::YieldOp, vt::ReturnOp>([](auto) {})
        .Default([](Operation *o) {
          fail("the interpreter does not know op " +
               o->getName().getStringRef().str());
        });
  }

  /// The value of an elementwise op (arithmetic, comparison, logic, a math
  /// function, clamp, where); nothing for any other op.
  std::optional<Tensor> elementwiseOp(Operation *op, Run &run) const {
    auto unary = [&](float (*fn)(float)) {
      return elementwise(op, run, [fn](const float *a) { return fn(a[0]); });
    };
    auto binary = [&](float (*fn)(float, float)) {
      return elementwise(op, run,
                         [fn](const float *a) { return fn(a[0], a[1]); });
    };
    return llvm::TypeSwitch<Operation *, std::optional<Tensor>>(op)
        .Case<vt::AddOp>([&](auto) { return binary(rules::add); })
        .Case<vt::SubOp>([&](auto) { return binary(rules::sub); })
        .Case<vt::MulOp>([&](auto) { return binary(rules::mul); })
        .Case<vt::DivOp>([&](auto) { return binary(rules::div); })
        .Case<vt::PowOp>([&](auto) { return binary(rules::pow); })
        .Case<vt::MaximumOp>([&](auto) { return binary(rules::maximum); })
        .Case<vt::MinimumOp>([&](auto) { return binary(rules::minimum); })
        .Case<vt::AndOp>([&](auto) { return binary(rules::logicalAnd); })
        .Case<vt::OrOp>([&](auto) { return binary(rules::logicalOr); })
        .Case<vt::CmpOp>([&](vt::CmpOp c) {
          // The rule of each predicate, in CmpPredicate's order.
          static float (*const compare[])(float, float) = {
              rules::cmpLt, rules::cmpLe, rules::cmpGt,
              rules::cmpGe, rules::cmpEq, rules::cmpNe};
          static_assert(std::size(compare) ==
                            vt::getMaxEnumValForCmpPredicate() + 1,
                        "one rule per CmpPredicate");
          size_t i = static_cast<size_t>(c.getPredicate());
          if (i >= std::size(compare))
            fail("unknown comparison");
          return binary(compare[i]);
        })
        .Case<vt::NegOp>([&](auto) { return unary(rules::neg); })
        .Case<vt::NotOp>([&](auto) { return unary(rules::logicalNot); })
        .Case<vt::ExpOp>([&](auto) { return unary(rules::exp); })
        .Case<vt::LogOp>([&](auto) { return unary(rules::log); })
        .Case<vt::SqrtOp>([&](auto) { return unary(rules::sqrt); })
        .Case<vt::RsqrtOp>([&](auto) { return unary(rules::rsqrt); })
        .Case<vt::AbsOp>([&](auto) { return unary(rules::abs); })
        .Case<vt::ReluOp>([&](auto) { return unary(rules::relu); })
        .Case<vt::SigmoidOp>([&](auto) { return unary(rules::sigmoid); })
        .Case<vt::SiluOp>([&](auto) { return unary(rules::silu); })
        .Case<vt::TanhOp>([&](auto) { return unary(rules::tanh); })
        .Case<vt::HashOp>([&](auto) { return unary(rules::hash01); })
        .Case<vt::ClampOp>([&](auto) {
          return elementwise(op, run, [](const float *a) {
            return rules::clamp(a[0], a[1], a[2]);
          });
        })
        .Case<vt::WhereOp>([&](auto) {
          return elementwise(op, run, [](const float *a) {
            return rules::where(a[0], a[1], a[2]);
          });
        })
        .Default([](Operation *) { return std::nullopt; });
  }

  /// param, const, field and state loads (which set their value) and
  /// stores (which write the run's fields and states).
  void runDeclarationAccess(Operation *op, Run &run) const {
    auto set = [&](Tensor t) { run.values[op->getResult(0)] = std::move(t); };
    llvm::TypeSwitch<Operation *>(op)
        .Case<vt::ParamLoadOp>([&](vt::ParamLoadOp p) {
          set(Tensor::scalar(
              static_cast<float>(params.at(p.getParam().str()))));
        })
        .Case<vt::ConstLoadOp>([&](vt::ConstLoadOp c) {
          auto it = consts->find(c.getName().str());
          if (it == consts->end())
            fail("const " + c.getName().str() + " is not materialized");
          set(conform(it->second,
                      c.getResult().getType().cast<vt::TensorType>(), run,
                      "const " + c.getName().str()));
        })
        .Case<vt::FieldStoreOp>([&](vt::FieldStoreOp s) {
          std::string name = s.getField().str();
          vt::TensorType type = fieldTypes.at(name);
          Tensor v = conform(
              value(s.getValue(), run),
              type.withElementType(mlir::Float32Type::get(op->getContext())),
              run, "field " + name);
          for (float &x : v.data)
            x = roundToStorage(type.getElementType(), x);
          (*run.fieldsOut)[name] = std::move(v);
        })
        .Case<vt::FieldLoadOp>([&](vt::FieldLoadOp l) {
          std::string name = l.getField().str();
          auto it = run.inputs->fields.find(name);
          if (it == run.inputs->fields.end())
            fail("the index stage reads field '" + name +
                 "', which the inputs do not hold");
          set(conform(it->second,
                      l.getResult().getType().cast<vt::TensorType>(), run,
                      "field " + name));
        })
        .Case<vt::StateLoadOp>([&](vt::StateLoadOp l) {
          std::string name = l.getState().str();
          auto it = run.states->find(name);
          if (it == run.states->end())
            fail("state '" + name + "' is missing from the state values");
          set(conform(it->second,
                      l.getResult().getType().cast<vt::TensorType>(), run,
                      "state " + name));
        })
        .Case<vt::StateStoreOp>([&](vt::StateStoreOp s) {
          std::string name = s.getState().str();
          vt::TensorType type = stateTypes.at(name);
          Tensor v =
              conform(value(s.getValue(), run), type, run, "state " + name);
          for (float &x : v.data)
            x = roundToStorage(type.getElementType(), x);
          (*run.states)[name] = std::move(v);
        });
  }

  /// softmax, normalize and conv: one line along the block axis at a time.
  Tensor lineOp(Operation *op, Run &run) const {
    return llvm::TypeSwitch<Operation *, Tensor>(op)
        .Case<vt::SoftmaxOp>([&](vt::SoftmaxOp s) {
          float scale = scalarOf(s.getScale(), run);
          return alongBlock(
              op, value(s.getInput(), run), run,
              [scale](const std::vector<float> &x, std::vector<float> &y) {
                rules::softmaxLine(x.data(), 1, y.data(), 1, x.size(), scale);
              });
        })
        .Case<vt::NormalizeOp>([&](vt::NormalizeOp n) {
          return alongBlock(
              op, value(n.getInput(), run), run,
              [](const std::vector<float> &x, std::vector<float> &y) {
                rules::normalizeLine(x.data(), 1, y.data(), 1, x.size());
              });
        })
        .Case<vt::ConvOp>([&](vt::ConvOp c) {
          std::vector<float> w(c.getWeights().begin(), c.getWeights().end());
          return alongBlock(
              op, value(c.getInput(), run), run,
              [&w](const std::vector<float> &x, std::vector<float> &y) {
                rules::convLine(x.data(), 1, y.data(), 1, x.size(), w.data(),
                                w.size());
              });
        })
        .Default([](Operation *o) -> Tensor {
          fail("not a line op: " + o->getName().getStringRef().str());
        });
  }

  Tensor split(vt::SplitOp s, Run &run) const {
    const Tensor &in = value(s.getInput(), run);
    std::string axis = s.getAxis().str(), outerName = s.getOuter().str();
    int64_t factor = s.getFactor();
    int64_t inner = in.sizes[in.axisIndex(axis)] / factor;
    std::vector<int64_t> strides = rowMajorStrides(in.sizes);
    return remap(s, in, run,
                 [&](const std::vector<int64_t> &idx,
                     const std::vector<std::string> &names) {
                   int64_t off = 0, o = 0, i = 0;
                   for (size_t d = 0; d < names.size(); ++d) {
                     if (names[d] == outerName)
                       o = idx[d];
                     else if (names[d] == axis)
                       i = idx[d];
                     else
                       off += idx[d] * strides[in.axisIndex(names[d])];
                   }
                   return off + (o * inner + i) * strides[in.axisIndex(axis)];
                 });
  }

  Tensor renamed(vt::RenameOp r, Run &run) const {
    const Tensor &in = value(r.getInput(), run);
    std::map<std::string, std::string> rename{
        {r.getTo().str(), r.getFrom().str()}};
    Tensor out = shaped(r.getResult().getType().cast<vt::TensorType>(), run);
    std::vector<int64_t> strides = stridesAlong(in, out.names, rename);
    forEachIndex(out.sizes, [&](int64_t i, const std::vector<int64_t> &idx) {
      out.data[i] = in.data[offsetOf(idx, strides)];
    });
    return out;
  }

  /// A fused group runs its ops in order; its results are what it yields.
  void runKernel(vt::KernelOp k, Run &run) const {
    mlir::Block &body = k.getBody().front();
    runBlock(body, run);
    auto yield = llvm::cast<vt::YieldOp>(body.getTerminator());
    for (auto [result, yielded] :
         llvm::zip(k.getResults(), yield.getValues())) {
      if (yielded.getType().isa<vt::SelectionType>())
        run.selections[result] = run.selections.lookup(yielded);
      else {
        // Copy first: inserting may move the map's storage.
        Tensor copy = value(yielded, run);
        run.values[result] = std::move(copy);
      }
    }
  }

  Tensor input(vt::InputOp in, Run &run) const {
    auto type = in.getResult().getType().cast<vt::TensorType>();
    switch (in.getKind()) {
    case vt::InputKind::K:
    case vt::InputKind::V: {
      bool isK = in.getKind() == vt::InputKind::K;
      const Tensor *src = run.index ? (isK ? &run.inputs->K : &run.inputs->V)
                                    : (isK ? run.K : run.V);
      return conform(*src, type, run, isK ? "K" : "V");
    }
    case vt::InputKind::q:
      return conform(run.inputs->q, type, run, "q");
    case vt::InputKind::mass:
      return conform(run.inputs->mass, type, run, "mass");
    case vt::InputKind::position: {
      Tensor t = shaped(type, run);
      for (int64_t j = 0; j < run.numBlocks; ++j)
        t.data[j] = static_cast<float>(j);
      return t;
    }
    case vt::InputKind::first_token: {
      Tensor t = shaped(type, run);
      const std::vector<float> &given = run.inputs->firstToken;
      for (int64_t j = 0; j < run.numBlocks; ++j)
        t.data[j] = size_t(j) < given.size()
                        ? given[size_t(j)]
                        : static_cast<float>(j * blockSize);
      return t;
    }
    case vt::InputKind::num_blocks:
      return Tensor::scalar(static_cast<float>(run.numBlocks));
    case vt::InputKind::context_len:
      return Tensor::scalar(static_cast<float>(run.inputs->contextLen));
    case vt::InputKind::step:
      return Tensor::scalar(static_cast<float>(run.inputs->step));
    case vt::InputKind::group:
      return Tensor::scalar(static_cast<float>(group));
    case vt::InputKind::layer:
      return Tensor::scalar(static_cast<float>(run.inputs->layer));
    case vt::InputKind::kv_head:
      return Tensor::scalar(static_cast<float>(run.inputs->kvHead));
    }
    fail("unknown input");
  }

  void runBlock(mlir::Block &block, Run &run) const {
    for (Operation &op : block)
      runOp(&op, run);
  }
};

//===----------------------------------------------------------------------===//
// FlowInterpreter
//===----------------------------------------------------------------------===//

FlowInterpreter::~FlowInterpreter() = default;

std::unique_ptr<FlowInterpreter>
FlowInterpreter::create(vt::FlowOp flow, int64_t headDim, int64_t group,
                        const std::map<std::string, double> &params,
                        std::string &error) {
  std::unique_ptr<FlowInterpreter> fi(new FlowInterpreter());
  fi->impl = std::make_unique<Impl>();
  Impl &impl = *fi->impl;
  impl.flow = flow;
  impl.headDim = headDim;
  impl.group = group;
  if (headDim <= 0 || group <= 0) {
    error = "head dimension and group size must be positive";
    return nullptr;
  }
  std::set<std::string> compileTime;
  for (auto param : flow.getBody()->getOps<vt::ParamOp>()) {
    double v = 0;
    mlir::Attribute a = param.getValue();
    if (auto i = a.dyn_cast<mlir::IntegerAttr>())
      v = i.getType().isInteger(1) ? double(i.getValue().getBoolValue())
                                   : double(i.getInt());
    else if (auto f = a.dyn_cast<mlir::FloatAttr>())
      v = f.getValueAsDouble();
    else if (auto b = a.dyn_cast<mlir::BoolAttr>())
      v = b.getValue();
    impl.params[param.getSymName().str()] = v;
    if (param.getCompileTime())
      compileTime.insert(param.getSymName().str());
  }
  for (const auto &entry : params) {
    auto it = impl.params.find(entry.first);
    if (it == impl.params.end()) {
      error = "flow '" + flow.getSymName().str() + "' has no param '" +
              entry.first + "'";
      return nullptr;
    }
    if (compileTime.count(entry.first) && it->second != entry.second) {
      error = "param '" + entry.first +
              "' is compile-time: the flow was specialized on it; recompile "
              "with -p " +
              entry.first + "=...";
      return nullptr;
    }
    it->second = entry.second;
  }
  fi->blockSizeValue = static_cast<int64_t>(impl.params["block_size"]);
  fi->keepFirstValue = static_cast<int64_t>(impl.params["keep_first"]);
  fi->keepLastValue = static_cast<int64_t>(impl.params["keep_last"]);
  impl.blockSize = fi->blockSizeValue;
  impl.keepFirst = fi->keepFirstValue;
  impl.keepLast = fi->keepLastValue;
  int64_t fixedDim = static_cast<int64_t>(impl.params["head_dim"]);
  if (fixedDim > 0 && fixedDim != headDim) {
    error = "flow '" + flow.getSymName().str() +
            "' is specialized to head_dim " + std::to_string(fixedDim) +
            ", but the cache has head dimension " + std::to_string(headDim);
    return nullptr;
  }

  for (auto field : flow.getBody()->getOps<vt::CacheFieldOp>()) {
    impl.fieldTypes[field.getSymName().str()] = field.getTensorType();
    fi->fieldNames.push_back(field.getSymName().str());
  }
  for (auto state : flow.getBody()->getOps<vt::StateOp>()) {
    impl.stateTypes[state.getSymName().str()] = state.getTensorType();
    impl.stateInit[state.getSymName().str()] = state.getInit().convertToFloat();
  }
  std::string budgetError;
  if (!describeBudgets(flow, impl.budgets, budgetError)) {
    error = budgetError;
    return nullptr;
  }
  for (auto param : flow.getBody()->getOps<vt::ParamOp>())
    impl.paramValues.push_back(impl.params.at(param.getSymName().str()));
  impl.consts = &fi->consts;
  try {
    for (auto c : flow.getBody()->getOps<vt::ConstOp>()) {
      Impl::Run run;
      impl.runBlock(c.getBody().front(), run);
      auto yield = llvm::cast<vt::YieldOp>(c.getBody().front().getTerminator());
      fi->consts[c.getSymName().str()] = run.values[yield.getValues().front()];
    }
  } catch (const std::exception &e) {
    error = std::string("cannot materialize consts: ") + e.what();
    return nullptr;
  }
  return fi;
}

std::map<std::string, Tensor>
FlowInterpreter::runCacheStage(const Tensor &K, const Tensor &V) const {
  std::map<std::string, Tensor> fields;
  vt::CacheStageOp stage = impl->flow.getCacheStage();
  if (!stage)
    return fields;
  Impl::Run run;
  run.K = &K;
  run.V = &V;
  run.fieldsOut = &fields;
  impl->runBlock(stage.getBody().front(), run);
  return fields;
}

StateValues FlowInterpreter::initialStates(int64_t numBlocks) const {
  StateValues states;
  Impl::Run run;
  run.numBlocks = numBlocks;
  for (const auto &entry : impl->stateTypes) {
    Tensor t = impl->shaped(entry.second, run);
    std::fill(t.data.begin(), t.data.end(),
              roundToStorage(entry.second.getElementType(),
                             impl->stateInit.at(entry.first)));
    states[entry.first] = std::move(t);
  }
  return states;
}

void FlowInterpreter::growStates(StateValues &states, int64_t numBlocks) const {
  for (const auto &entry : impl->stateTypes) {
    Tensor &t = states[entry.first];
    int b = t.axisIndex("block");
    if (b < 0 || t.sizes[b] >= numBlocks)
      continue;
    Tensor grown(t.names, t.sizes);
    grown.sizes[b] = numBlocks;
    grown.data.assign(grown.numElements(),
                      roundToStorage(entry.second.getElementType(),
                                     impl->stateInit.at(entry.first)));
    std::vector<int64_t> strides = stridesAlong(grown, t.names);
    forEachIndex(t.sizes, [&](int64_t i, const std::vector<int64_t> &idx) {
      grown.data[offsetOf(idx, strides)] = t.data[i];
    });
    t = std::move(grown);
  }
}

Selection
FlowInterpreter::runIndexStage(const IndexInputs &inputs, StateValues &states,
                               std::vector<float> *retainScore) const {
  Impl::Run run;
  run.index = true;
  run.inputs = &inputs;
  run.numBlocks = inputs.numBlocks;
  run.states = &states;
  run.kept = {inputs.numBlocks, keepFirstValue, keepLastValue};
  vt::IndexStageOp stage = impl->flow.getIndexStage();
  mlir::Block &block = stage.getBody().front();
  impl->runBlock(block, run);
  auto ret = llvm::cast<vt::ReturnOp>(block.getTerminator());
  if (retainScore) {
    retainScore->clear();
    if (Value score = ret.getRetainScore())
      *retainScore = run.values.lookup(score).data;
  }
  return run.selections.lookup(ret.getSelection());
}

std::vector<int64_t> FlowInterpreter::finalBlocks(const Selection &selection,
                                                  int64_t numBlocks) const {
  std::set<int64_t> all(selection.blocks.begin(), selection.blocks.end());
  const rules::KeptBlocks kept{numBlocks, keepFirstValue, keepLastValue};
  for (int64_t j = 0; j < numBlocks; ++j)
    if (kept.contains(j))
      all.insert(j);
  return std::vector<int64_t>(all.begin(), all.end());
}

int64_t FlowInterpreter::budget(int64_t numBlocks, int64_t contextLen,
                                int64_t layer, int64_t kvHead) const {
  return rt::selectionBudget(
      impl->budgets.selection, impl->budgets.budgets, impl->paramValues.data(),
      rt::BudgetPoint{numBlocks, contextLen, impl->group, layer, kvHead});
}
