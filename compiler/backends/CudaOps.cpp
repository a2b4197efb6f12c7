//===- CudaOps.cpp - One op at a time -------------------------------------===//
//
// emitOp: inlined ops only record their expression's size (or are
// materialized when it grows too large); the others are emitted as loops:
// stores to fields and states, the along-block ops (softmax, normalize,
// conv, kth_largest), the selections (topk, approx_topk, threshold, topp,
// union),
// reductions (CudaReductions.cpp) and, in the cache stage, nested kernels.
//
//===----------------------------------------------------------------------===//

#include "CudaEmitterImpl.h"

#include <cstdio>

using namespace vflow;
using namespace vflow::emit;
using namespace vflow::emit::cuda;

void CudaEmitter::emitOp(Operation *op) {
  if (llvm::isa<vt::YieldOp, vt::ReturnOp>(op))
    return;
  for (Value result : op->getResults())
    pendingUses[result] =
        static_cast<int>(std::distance(result.use_begin(), result.use_end()));
  if (isInlined(op)) {
    // Materialize a value whose expression would be too large to inline, or
    // that several ops use and is costly to repeat; the rest stay
    // expressions.
    Value v = op->getResult(0);
    int size = inlinedSize(op);
    bool manyUses = !v.hasOneUse() && !v.use_empty();
    if (!isSource(op) && !v.use_empty() &&
        (size > kMaxInlineOps || (manyUses && size > kMaxRepeatedOps))) {
      comment(op);
      materializeInline(v);
      size = 1;
      doneWith(op);
    } else if (v.use_empty()) {
      doneWith(op);
    }
    exprOps[v] = size;
    return;
  }
  comment(op);
  llvm::TypeSwitch<Operation *>(op)
      .Case<vt::ReduceOp>([&](vt::ReduceOp r) { emitReduce(r); })
      .Case<vt::SoftmaxOp, vt::NormalizeOp, vt::ConvOp, vt::KthLargestOp>(
          [&](auto) { emitAlongBlock(op); })
      .Case<vt::TopKOp, vt::ApproxTopKOp, vt::ThresholdOp, vt::TopPOp,
            vt::UnionOp>([&](auto) { emitSelection(op); })
      .Case<vt::FieldStoreOp>([&](vt::FieldStoreOp s) {
        std::string name = s.getField().str();
        vt::TensorType type = fieldTypes.at(name);
        Layout fl = Layout::of(type);
        emitStore(s.getValue(), fl,
                  "vd::store<" + storageType(type.getElementType()) +
                      ">(field_" + std::to_string(fieldIndex.at(name)) +
                      ", ((long long)page * a.numKVHeads + kvh) * " +
                      paren(elements(fl, "N")) + " + @OFF, @VAL);");
      })
      .Case<vt::StateStoreOp>([&](vt::StateStoreOp s) {
        std::string name = s.getState().str();
        vt::TensorType type = stateTypes.at(name);
        Layout sl = Layout::of(type);
        emitStore(s.getValue(), sl,
                  "stateNew_" + std::to_string(stateIndex.at(name)) +
                      "[((long long)slot * a.numKVHeads + kvh) * " +
                      paren(elements(sl, "a.maxBlocks")) +
                      " + @OFF] = vd::round<" +
                      storageType(type.getElementType()) + ">(@VAL);");
        storedStates.insert(name);
      })
      .Case<vt::KernelOp>([&](vt::KernelOp k) { emitKernelBody(k); })
      .Default([](Operation *o) {
        fail("the CUDA backend does not know op " +
             o->getName().getStringRef().str());
      });
  if (auto k = llvm::dyn_cast<vt::KernelOp>(op)) {
    // Inside one CTA (the cache stage) a kernel's result is its yield.
    auto yield = llvm::cast<vt::YieldOp>(k.getBody().front().getTerminator());
    for (auto [result, value] : llvm::zip(k.getResults(), yield.getValues()))
      exprOps[result] = exprSize(value);
    return;
  }
  doneWith(op);
  for (Value result : op->getResults())
    if (result.use_empty())
      if (auto s = slotOf.find(result); s != slotOf.end()) {
        freeSlots[slots[s->second].key].push_back(s->second);
        slotOf.erase(s);
      }
}

void CudaEmitter::emitKernelBody(vt::KernelOp kernel) {
  mlir::Block &body = kernel.getBody().front();
  for (Operation &op : body)
    emitOp(&op);
}

void CudaEmitter::emitStore(Value value, const Layout &target,
                            const std::string &write) {
  Layout l = Layout::of(value);
  parallelLoop(l, [&](Idx &idx) {
    std::string v = expr(value, idx);
    std::string offset = offsetIn(target, idx, "a.maxBlocks");
    std::string text = write;
    text.replace(text.find("@OFF"), 4, offset);
    text.replace(text.find("@VAL"), 4, v);
    line() << text << "\n";
  });
}

void CudaEmitter::emitAlongBlock(Operation *op) {
  if (grid != rt::GpuGrid::Row)
    fail("internal: " + op->getName().getStringRef().str() +
         " outside a per-list kernel");
  Value input = op->getOperand(0), result = op->getResult(0);
  Layout outL = Layout::of(result);
  Home h = allocate(result);
  Layout outer;
  for (size_t i = 0; i < outL.names.size(); ++i)
    if (outL.names[i] != "block") {
      outer.names.push_back(outL.names[i]);
      outer.sizes.push_back(outL.sizes[i]);
    }
  if (Layout::of(input).index("block") < 0)
    fail(op->getName().getStringRef().str() + " needs a block axis");
  Idx idx = outputLoop(outer);
  Idx at = idx;
  at["block"] = "i_block";
  line() << "auto x = [&](int i_block) -> float { return " << expr(input, at)
         << "; };\n";
  auto each = [&](const std::string &body) {
    open("for (int i_block = threadIdx.x; i_block < N; i_block += blockDim.x)");
    line() << body << "\n";
    close();
  };
  if (auto s = llvm::dyn_cast<vt::SoftmaxOp>(op)) {
    line() << "const float scale = " << expr(s.getScale(), idx) << ";\n";
    line() << "double m = -1.0 / 0.0, sum = 0;\n";
    each("m = vd::dmax(m, double(x(i_block)) * scale);");
    line() << "m = vd::ctaReduce<vd::HostMax>(m, scratch);\n";
    each("sum += ::exp(double(x(i_block)) * scale - m);");
    line() << "sum = vd::ctaReduce<vd::Sum>(sum, scratch);\n";
    each(read(h, at) +
         " = float(::exp(double(x(i_block)) * scale - m) / sum);");
  } else if (llvm::isa<vt::NormalizeOp>(op)) {
    line() << "double sum = 0;\n";
    each("sum += x(i_block);");
    line() << "sum = vd::ctaReduce<vd::Sum>(sum, scratch);\n";
    each(read(h, at) + " = float(x(i_block) / sum);");
  } else if (auto c = llvm::dyn_cast<vt::ConvOp>(op)) {
    std::string name = fresh("weights");
    llvm::ArrayRef<float> w = c.getWeights();
    globals << "__device__ const float " << name << "[] = {";
    for (size_t i = 0; i < w.size(); ++i)
      globals << (i ? ", " : "") << floatLiteral(w[i], true);
    globals << "};\n";
    open("for (int i_block = threadIdx.x; i_block < N; i_block += blockDim.x)");
    line() << "double acc = 0;\n";
    open("for (int t = 0; t < " + std::to_string(w.size()) + "; ++t)");
    line() << "const int src = i_block + t - " << w.size() / 2 << ";\n";
    line() << "if (src >= 0 && src < N)\n";
    line() << "  acc += double(" << name << "[t]) * x(src);\n";
    close();
    line() << read(h, at) << " = float(acc);\n";
    close();
  } else if (auto k = llvm::dyn_cast<vt::KthLargestOp>(op)) {
    line() << "const float kth = vd::ctaKthLargest(N, (long long)"
           << hostValue(k.getK()) << ", x, scratch);\n";
    line() << "if (threadIdx.x == 0)\n";
    line() << "  " << read(h, idx) << " = kth;\n";
  }
  line() << "__syncthreads();\n";
  close();
  homes[result] = h;
}

void CudaEmitter::emitSelection(Operation *op) {
  if (grid != rt::GpuGrid::Row)
    fail("internal: a selection outside a per-list kernel");
  Value result = op->getResult(0);
  Layout flagsLayout{{"block"}, {vt::kSizeBlocks}};
  Home h = allocateWorkspace(flagsLayout, result);
  homes[result] = h;
  std::string flags = h.ptr;
  if (auto u = llvm::dyn_cast<vt::UnionOp>(op)) {
    const Home &x =
        homes.count(u.getLhs()) ? homes[u.getLhs()] : workspace[u.getLhs()];
    const Home &y =
        homes.count(u.getRhs()) ? homes[u.getRhs()] : workspace[u.getRhs()];
    open("for (int j = threadIdx.x; j < N; j += blockDim.x)");
    line() << flags << "[j] = (" << x.ptr << "[j] != 0 || " << y.ptr
           << "[j] != 0) ? 1.0f : 0.0f;\n";
    close();
    line() << "__syncthreads();\n";
    return;
  }
  Value score = op->getOperand(0);
  if (Layout::of(score).names != std::vector<std::string>{"block"})
    fail("a selection's score must have exactly the axes [block]");
  open("");
  line() << "auto score = [&](int i_block) -> float { return "
         << expr(score, {{"block", "i_block"}}) << "; };\n";
  if (auto t = llvm::dyn_cast<vt::ThresholdOp>(op)) {
    line() << "const float t = " << expr(t.getThreshold(), {}) << ";\n";
    std::string pass = flags;
    if (t.getMax())
      pass = allocateWorkspace(flagsLayout).ptr;
    open("for (int j = threadIdx.x; j < N; j += blockDim.x)");
    line() << "const float s = score(j);\n";
    line() << pass << "[j] = (candidate(j) && !vd::isNaN(s) && s >= t) ? "
           << "1.0f : 0.0f;\n";
    close();
    line() << "__syncthreads();\n";
    if (t.getMax())
      line() << "vd::ctaTopK(N, (long long)" << hostValue(t.getMax())
             << ", 0, score, [&](int j) { return " << pass << "[j] != 0; }, "
             << flags << ", scratch);\n";
  } else if (auto t = llvm::dyn_cast<vt::TopPOp>(op)) {
    // The count that reaches p, then the best that many (at most max).
    line() << "long long k = vd::ctaTopPCount(N, " << expr(t.getP(), {})
           << ", score, candidate, scratch);\n";
    if (t.getMax())
      line() << "k = min(k, (long long)" << hostValue(t.getMax()) << ");\n";
    line() << "vd::ctaTopK(N, k, 0, score, candidate, " << flags
           << ", scratch);\n";
  } else {
    // Exact top-k misses none of the k best; approximate top-k may miss
    // (1 - recall) * k of them, which lets the radix select stop early.
    line() << "const long long k = (long long)" << hostValue(op->getOperand(1))
           << ";\n";
    std::string slack = "0";
    if (auto approx = llvm::dyn_cast<vt::ApproxTopKOp>(op)) {
      char miss[32];
      std::snprintf(miss, sizeof(miss), "%.17g",
                    1.0 - approx.getRecall().convertToDouble());
      // (1 - recall) in binary is a hair off: 1e-9 keeps 0.1 * 10 at 1.
      slack = std::string("(long long)(") + miss + " * (double)k + 1e-9)";
    }
    line() << "vd::ctaTopK(N, k, " << slack << ", score, candidate, " << flags
           << ", scratch);\n";
  }
  close();
}
