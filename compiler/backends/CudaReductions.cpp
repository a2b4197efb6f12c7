//===- CudaReductions.cpp - Reductions ------------------------------------===//
//
// A reduction is emitted by one of four strategies, by the shape of its
// result and of what it reduces: a warp per block for [block, head] results
// of wide reductions (the heads share the loads of their terms), a warp per
// output element for other wide ones, a thread per output element for
// narrow ones, and the whole CTA per output element over `block`. Wide sums
// accumulate in f32 lanes in NumericRules' order (element e in lane e % 32,
// then an xor butterfly: both warp strategies are that order as they
// stand); other sums accumulate in f64; max and min are exact in f32.
//
//===----------------------------------------------------------------------===//

#include "CudaEmitterImpl.h"

#include <algorithm>

using namespace vflow;
using namespace vflow::emit;
using namespace vflow::emit::cuda;

namespace vflow::emit::cuda {

/// How a reduction accumulates (`acc`: vd::Sum, vd::Max, ...; `finish`
/// turns the total into the result), the reduced axes and their element
/// count as C++, and the reduced part of the input's layout.
struct ReductionPlan {
  std::string acc, finish;
  std::vector<std::string> axes;
  std::string count;
  bool overBlock = false;
  Layout reduced;

  /// The result of the total `value` (C++): finish(value, count).
  std::string finished(const std::string &value) const {
    return finish + "(" + value + ", double(" + count + "))";
  }
};

/// A field load a warp copies into shared memory per block: its storage
/// type (vd::BF16, ...), `field_<i>`, the names of its per-block byte count
/// and of its offset in the warp's buffer, and its per-block layout.
struct StagedField {
  Value leaf;
  std::string type, field, bytes, offset;
  Layout layout;
};

} // namespace vflow::emit::cuda

ReductionPlan CudaEmitter::planReduction(vt::ReduceOp op) {
  Layout in = Layout::of(op.getInput());
  ReductionPlan plan;
  ReduceSpelling spelling = reduceSpelling(op.getKind());
  plan.acc = std::string("vd::") + spelling.acc;
  plan.finish = std::string("vd::") + spelling.finish;
  std::vector<std::string> &axes = plan.axes;
  for (llvm::StringRef a : op.getAxisNames()) {
    int p = in.index(a.str());
    if (p < 0)
      fail("reduce over a missing axis");
    axes.push_back(a.str());
    plan.count += (plan.count.empty() ? "" : " * ") +
                  (in.sizes[p] == vt::kSizeBlocks ? blockCount("N")
                                                  : extent(in.sizes[p], "N"));
  }
  plan.overBlock = std::find(axes.begin(), axes.end(), "block") != axes.end();
  for (size_t i = 0; i < in.names.size(); ++i)
    if (std::find(axes.begin(), axes.end(), in.names[i]) != axes.end()) {
      plan.reduced.names.push_back(in.names[i]);
      plan.reduced.sizes.push_back(in.sizes[i]);
    }
  return plan;
}

void CudaEmitter::emitReduce(vt::ReduceOp op) {
  ReductionPlan plan = planReduction(op);
  Home h = allocate(op.getResult());
  // Wide reductions (and only they) take a warp per output: the lanes are
  // NumericRules' kSumLanes.
  bool wide = op.isWide();
  const Layout &out = h.layout;
  if (wide && out.names.size() == 2 && out.index("block") >= 0 &&
      out.index("head") >= 0 && out.sizes[out.index("head")] == vt::kSizeGroup)
    emitReduceWarpPerBlock(op, plan, h);
  else if (wide)
    emitReduceWarpPerElement(op, plan, h);
  else if (!plan.overBlock)
    emitReduceThreadPerElement(op, plan, h);
  else
    emitReduceOverBlocks(op, plan, h);
  homes[op.getResult()] = h;
}

std::vector<std::pair<Value, std::string>>
CudaEmitter::hoistLeaves(const llvm::SetVector<Value> &leaves,
                         const Layout &red, const std::string &total,
                         bool perHead) {
  std::vector<std::pair<Value, std::string>> regs;
  if (leaves.empty())
    return regs;
  const std::string heads = perHead ? "G * " : "";
  const std::string headDim = perHead ? "[HOIST ? G : 1]" : "";
  const std::string headAt = perHead ? "[HOIST ? i_head : 0]" : "";
  line() << "constexpr bool HOIST = XI * " << heads << leaves.size()
         << " <= 64;\n";
  for (Value leaf : leaves) {
    regs.push_back({leaf, fresh("inv")});
    line() << "float " << regs.back().second << "[HOIST ? XI : 1]" << headDim
           << ";\n";
  }
  line() << "#pragma unroll\n";
  open("for (int xi = 0; xi < (HOIST ? XI : 0); ++xi)");
  line() << "const int x = lane + 32 * xi;\n";
  line() << "if (x >= " << total << ")\n";
  line() << "  break;\n";
  Idx idx;
  decode(red, "x", idx);
  if (perHead) {
    idx["head"] = "i_head";
    line() << "#pragma unroll\n";
    open("for (int i_head = 0; i_head < G; ++i_head)");
  }
  for (auto &[leaf, name] : regs)
    line() << name << "[HOIST ? xi : 0]" << headAt << " = " << expr(leaf, idx)
           << ";\n";
  if (perHead)
    close();
  close();
  return regs;
}

std::string CudaEmitter::openWarpReduction(const ReductionPlan &plan) {
  const std::string total = elements(plan.reduced, "N");
  open("");
  line() << "const int lane = threadIdx.x & 31;\n";
  return total;
}

// [block, head] results of a wide reduction: a warp per block, each lane
// holding the G heads' partials, so the terms' loads that do not depend on
// the head (the fields) are shared by the heads.
void CudaEmitter::emitReduceWarpPerBlock(vt::ReduceOp op,
                                         const ReductionPlan &plan,
                                         const Home &h) {
  const std::string &acc = plan.acc;
  const Layout &red = plan.reduced;
  const std::string total = openWarpReduction(plan);
  line() << "constexpr int XI = (" << total << " + 31) / 32;\n";
  // The query and the consts are the same for every block: each lane
  // decodes its elements of them once, into registers (at most 64).
  llvm::SetVector<Value> leaves;
  blockInvariantLeaves(op.getInput(), leaves);
  line() << "(void)XI;\n";
  std::vector<std::pair<Value, std::string>> regs =
      hoistLeaves(leaves, red, total, /*perHead=*/true);
  std::vector<StagedField> staged = stagedFields(op, red);
  emitWarpBlockLoop(staged, [&](bool fromStage) {
    Idx idx;
    idx["block"] = "i_block";
    line() << "float part[G];\n";
    line() << "#pragma unroll\n";
    line() << "for (int i_head = 0; i_head < G; ++i_head)\n";
    line() << "  part[i_head] = " << acc << "::initf();\n";
    line() << "#pragma unroll\n";
    open("for (int xi = 0; xi < XI; ++xi)");
    line() << "const int x = lane + 32 * xi;\n";
    line() << "if (x >= " << total << ")\n";
    line() << "  break;\n";
    decode(red, "x", idx);
    idx["head"] = "i_head";
    line() << "#pragma unroll\n";
    line() << "for (int i_head = 0; i_head < G; ++i_head)\n";
    // Hoisted leaves read their registers, or (too many for registers)
    // their usual expression; staged ones the warp's buffer.
    for (auto &[leaf, name] : regs)
      hoisted[leaf] =
          "(HOIST ? " + name +
          "[HOIST ? xi : 0][HOIST ? i_head : 0] : " + expr(leaf, idx) + ")";
    if (fromStage)
      readStaged(staged, idx);
    line() << "  " << acc << "::accf(part[i_head], " << expr(op.getInput(), idx)
           << ");\n";
    for (auto &entry : regs)
      hoisted.erase(entry.first);
    for (const StagedField &st : staged)
      hoisted.erase(st.leaf);
    close();
    idx["head"] = "h_";
    line() << "vd::warpReduceGroup<" << acc << ", G>(part, [&](int h_, double "
           << "total) { " << read(h, idx) << " = " << plan.finished("total")
           << "; });\n";
  });
  close();
  line() << "__syncthreads();\n";
}

std::vector<StagedField> CudaEmitter::stagedFields(vt::ReduceOp op,
                                                   const Layout &reduced) {
  std::vector<StagedField> staged;
  if (cacheStage)
    return staged;
  llvm::SetVector<Value> fieldValues;
  fieldLeaves(op.getInput(), fieldValues);
  for (Value f : fieldValues) {
    auto load = f.getDefiningOp<vt::FieldLoadOp>();
    std::string name = load.getField().str();
    if (!fieldIndex.count(name))
      continue;
    bool byReduced = true;
    for (const std::string &axis : Layout::of(f).names)
      byReduced &= axis == "block" || reduced.index(axis) >= 0;
    if (!byReduced)
      continue;
    vt::TensorType type = fieldTypes.at(name);
    StagedField st;
    st.leaf = f;
    st.type = storageType(type.getElementType());
    st.field = "field_" + std::to_string(fieldIndex.at(name));
    st.layout = Layout::of(type);
    st.bytes = fresh("SB");
    st.offset = fresh("SO");
    staged.push_back(st);
  }
  return staged;
}

void CudaEmitter::readStaged(const std::vector<StagedField> &staged,
                             const Idx &idx) {
  for (const StagedField &st : staged)
    hoisted[st.leaf] = "vd::load<" + st.type + ">(&stage[warp][buf][" +
                       st.offset + "], " + paren(offsetIn(st.layout, idx)) +
                       ")";
}

// The fields the terms read at (block, reduced axes) are staged per warp in
// shared memory with asynchronous copies, STAGES - 1 blocks ahead of the
// one being reduced: the loads of a block otherwise wait behind the
// previous block's arithmetic (ptxas sinks them to their uses), and one
// block's loads alone leave the SM waiting on DRAM. Only where every
// staged field's block is a multiple of 16 bytes and STAGES buffers per
// warp fit in the kernel's static shared memory (STAGED, at NVRTC time);
// else the plain loop.
void CudaEmitter::emitWarpBlockLoop(
    const std::vector<StagedField> &staged,
    const std::function<void(bool fromStage)> &body) {
  const std::string warps = "(blockDim.x >> 5)";
  auto iteration = [&](bool fromStage) {
    line() << "const int i_block = " << blockLoopBase() << " + w;\n";
    if (fromStage) {
      line() << "const int ahead = w + (STAGES - 1) * " << warps << ";\n";
      line() << "if (ahead < " << blockLoopExtent() << ")\n";
      line() << "  fetch((buf + STAGES - 1) % STAGES, " << blockLoopBase()
             << " + ahead);\n";
      line() << "else\n";
      line() << "  vd::asyncCommit();\n";
      line() << "vd::asyncWait<STAGES - 1>();\n";
      line() << "__syncwarp();\n";
    }
    body(fromStage);
    if (fromStage)
      line() << "__syncwarp();\n";
  };
  if (!staged.empty()) {
    // The kernel declares one `stage` array for all its staged loops
    // (CudaKernels.cpp: the largest loop's bytes, where they fit).
    std::string end = "0", aligned, slotBytes, slotAligned;
    for (const StagedField &st : staged) {
      std::string bytes = "int(" + elements(st.layout, "N") +
                          ") * int(sizeof(" + st.type + "::Code))";
      line() << "constexpr int " << st.bytes << " = " << bytes << ";\n";
      line() << "constexpr int " << st.offset << " = " << end << ";\n";
      end = st.offset + " + " + st.bytes;
      std::string sep = aligned.empty() ? "" : " && ";
      aligned += sep + st.bytes + " % 16 == 0";
      slotAligned += sep + "(" + bytes + ") % 16 == 0";
      slotBytes += (slotBytes.empty() ? "" : " + ") + bytes;
    }
    stageSlots.push_back("(" + slotAligned + ") ? " + slotBytes + " : 0");
    line() << "constexpr bool STAGED = STAGE_FITS && " << aligned << ";\n";
    open("if constexpr (STAGED)");
    line() << "const int warp = threadIdx.x >> 5;\n";
    // The warp's buffers as a shared-space address, once; the buffer index
    // unsigned (a power-of-two modulo is a mask).
    line() << "const unsigned stageAt = vd::sharedAddress(&stage[warp][0][0]);"
              "\n";
    open("auto fetch = [&](unsigned buf, int i_block)");
    line() << "const long long at = (long long)tbl[i_block] * a.numKVHeads + "
              "kvh;\n";
    for (const StagedField &st : staged)
      line() << "vd::warpCopyAsync(stageAt + buf * STAGE_SLOT + " << st.offset
             << ", static_cast<const char *>(" << st.field << ") + at * "
             << st.bytes << ", " << st.bytes << ");\n";
    line() << "vd::asyncCommit();\n";
    close(";");
    line() << "#pragma unroll\n";
    open("for (int s = 0; s < STAGES - 1; ++s)");
    line() << "const int ahead = (threadIdx.x >> 5) + s * " << warps << ";\n";
    line() << "if (ahead < " << blockLoopExtent() << ")\n";
    line() << "  fetch(s, " << blockLoopBase() << " + ahead);\n";
    line() << "else\n";
    line() << "  vd::asyncCommit();\n";
    close();
    line() << "unsigned buf = 0;\n";
    open("for (int w = threadIdx.x >> 5; w < " + blockLoopExtent() +
         "; w += " + warps + ", buf = (buf + 1) % STAGES)");
    iteration(true);
    close();
    close(" else {");
    depth++;
  }
  open("for (int w = threadIdx.x >> 5; w < " + blockLoopExtent() +
       "; w += " + warps + ")");
  iteration(false);
  close();
  if (!staged.empty()) {
    depth--;
    line() << "}\n";
  }
}

// One warp per output element, lanes along the reduced elements (the
// innermost fastest, so loads coalesce), combined by shuffles. Not staged:
// block top-k's score (a warp per block) measured no faster with its field
// staged (lab/records/perf/). Terms that are the same for every output element
// (a query mean in shared memory, the query, consts) are read into registers
// once when the reduced elements are few (at most 64 registers), each lane
// taking its elements in the same order as the loop.
void CudaEmitter::emitReduceWarpPerElement(vt::ReduceOp op,
                                           const ReductionPlan &plan,
                                           const Home &h) {
  const std::string &acc = plan.acc;
  const Layout &red = plan.reduced;
  const std::string total = openWarpReduction(plan);
  llvm::SetVector<Value> leaves;
  if (red.index("block") < 0)
    elementInvariantLeaves(op.getInput(), h.layout, leaves);
  if (!leaves.empty())
    line() << "constexpr int XI = (" << total << " + 31) / 32;\n";
  std::vector<std::pair<Value, std::string>> regs =
      hoistLeaves(leaves, red, total, /*perHead=*/false);
  Idx idx;
  elementLoop(h.layout, "w", "threadIdx.x >> 5", "blockDim.x >> 5", idx);
  line() << "float part = " << acc << "::initf();\n";
  auto accumulate = [&] {
    decode(red, "x", idx);
    line() << acc << "::accf(part, " << expr(op.getInput(), idx) << ");\n";
  };
  auto plainLoop = [&] {
    open("for (int x = lane; x < " + total + "; x += 32)");
    accumulate();
    close();
  };
  if (regs.empty()) {
    plainLoop();
  } else {
    open("if constexpr (HOIST)");
    line() << "#pragma unroll\n";
    open("for (int xi = 0; xi < XI; ++xi)");
    line() << "const int x = lane + 32 * xi;\n";
    line() << "if (x >= " << total << ")\n";
    line() << "  break;\n";
    for (auto &[leaf, name] : regs)
      hoisted[leaf] = name + "[xi]";
    accumulate();
    for (auto &entry : regs)
      hoisted.erase(entry.first);
    close();
    close(" else {");
    depth++;
    plainLoop();
    close();
  }
  line() << "const float acc = vd::warpReduce<" << acc << ">(part);\n";
  line() << "if (lane == 0)\n";
  line() << "  " << read(h, idx) << " = " << plan.finished("acc") << ";\n";
  close();
  close();
  line() << "__syncthreads();\n";
}

// A thread per output element. Over one axis of a fixed extent of at most
// kTermsInRegisters (a cache stage's tokens) every term is read before the
// first is combined: the combining chain's branches (NaN rules) otherwise
// keep the loads one or two terms ahead of it, one memory round trip per
// term or two. Same terms, same order: the same bits.
constexpr int64_t kTermsInRegisters = 32;

void CudaEmitter::emitReduceThreadPerElement(vt::ReduceOp op,
                                             const ReductionPlan &plan,
                                             const Home &h) {
  Layout in = Layout::of(op.getInput());
  int64_t terms = 0;
  if (plan.axes.size() == 1) {
    int64_t size = in.sizes[size_t(in.index(plan.axes[0]))];
    if (size > 0 && size <= kTermsInRegisters)
      terms = size;
  }
  parallelLoop(h.layout, [&](Idx &idx) {
    if (terms > 0) {
      const std::string var = loopVar(plan.axes[0]);
      const std::string n = std::to_string(terms);
      const std::string term = fresh("term"), values = fresh("terms");
      idx[plan.axes[0]] = var;
      line() << "auto " << term << " = [&](int " << var << ") { return "
             << expr(op.getInput(), idx) << "; };\n";
      line() << "decltype(" << term << "(0)) " << values << "[" << n << "];\n";
      line() << "#pragma unroll\n";
      open("for (int " + var + " = 0; " + var + " < " + n + "; ++" + var + ")");
      line() << values << "[" << var << "] = " << term << "(" << var << ");\n";
      close();
      line() << "double acc = " << plan.acc << "::init();\n";
      line() << "#pragma unroll\n";
      open("for (int " + var + " = 0; " + var + " < " + n + "; ++" + var + ")");
      line() << plan.acc << "::acc(acc, double(" << values << "[" << var
             << "]));\n";
      close();
      line() << read(h, idx) << " = " << plan.finished("acc") << ";\n";
      return;
    }
    line() << "double acc = " << plan.acc << "::init();\n";
    int n = serialLoops(in, plan.axes, idx);
    line() << plan.acc << "::acc(acc, double(" << expr(op.getInput(), idx)
           << "));\n";
    for (int i = 0; i < n; ++i)
      close();
    line() << read(h, idx) << " = " << plan.finished("acc") << ";\n";
  });
}

// All threads cooperate on each output element.
void CudaEmitter::emitReduceOverBlocks(vt::ReduceOp op,
                                       const ReductionPlan &plan,
                                       const Home &h) {
  if (grid != rt::GpuGrid::Row)
    fail("internal: a reduction over block outside a per-list kernel");
  const std::string &acc = plan.acc;
  Idx idx = outputLoop(h.layout);
  line() << "double acc = " << acc << "::init();\n";
  elementLoop(plan.reduced, "e", "threadIdx.x", "blockDim.x", idx);
  line() << acc << "::acc(acc, double(" << expr(op.getInput(), idx) << "));\n";
  close();
  line() << "acc = vd::ctaReduce<" << acc << ">(acc, scratch);\n";
  line() << "if (threadIdx.x == 0)\n";
  line() << "  " << read(h, idx) << " = " << plan.finished("acc") << ";\n";
  close();
  line() << "__syncthreads();\n";
}
