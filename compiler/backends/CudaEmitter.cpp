//===- CudaEmitter.cpp - The CUDA backend: vt IR to CUDA C++ --------------===//
//
// Each CUDA kernel is a CTA program: the ops of one vt.kernel in order, each
// op a loop over its result's elements spread over the CTA's threads, with
// a barrier between ops. Elementwise ops, renames, splits and loads are not
// materialized: they become expressions inlined where they are used, so
// Quest's [block, head, dim] products never touch memory; reductions,
// along-block ops, stores and selections are materialized. Values live in
// shared memory inside a tile of blocks (block_map kernels) or in the
// per-list global workspace (values one kernel passes to another, and the
// values of per-list kernels).
//
// The math is the interpreter's: FlowDevice.cuh's element functions, double
// accumulation in the input's own order for per-element reductions,
// selections ranked by score with ties to the lower index. Reductions over
// `block` are CTA-cooperative (same values up to the order of f64 sums).
//
// Emission is linear in the flow's size and never recurses deeply: an
// inlined expression holds at most kMaxInlineOps ops (a longer one is
// materialized, as is a costly value used several times; host-evaluable
// scalars outside kernels become named locals), so expr() recursion and the
// text of one expression are bounded; memory offsets are named constants
// (each allocation adds one line), and a value's shared-memory or workspace
// slot is reused once every op that reads it has been emitted. Offsets that
// can pass 2^31 (a block index times a per-block size, anything times the
// maximum block count) are computed in 64 bits; flat loop indices are int
// unless the loop's count can pass 2^31 (vd::Index).
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/CudaEmitter.h"
#include "vflow/Compiler/StorageDType.h"
#include "vflow/Runtime/Limits.h"

#include "EmitCommon.h"

#include "mlir/IR/AsmState.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/Support/raw_ostream.h"

#include <climits>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <sstream>

using namespace vflow;
using namespace vflow::emit;

namespace {

using Idx = std::map<std::string, std::string>;

/// Where a materialized value lives: `ptr[offset]`, row-major over `layout`
/// with the block axis `blockExtent` long and indexed relative to `blockBase`.
/// Offsets within shared memory ("TILE" blocks) stay 32-bit; with any other
/// block extent, the block index is multiplied in 64 bits.
struct Home {
  std::string ptr;
  Layout layout;
  std::string blockExtent = "a.maxBlocks", blockBase;
};

/// The most ops one inlined expression holds: a value whose expression
/// would be larger is materialized, which bounds the depth of expr()'s
/// recursion and the size of any one emitted expression.
constexpr int kMaxInlineOps = 64;
/// A value used several times is materialized above this many ops.
constexpr int kMaxRepeatedOps = 24;

enum class GridKind { Cache, Tile, Row };

std::string storageType(mlir::Type type) {
  switch (storageDType(type)) {
  case rt::DType::BF16:
    return "vd::BF16";
  case rt::DType::F16:
    return "vd::F16";
  case rt::DType::FP8E4M3:
    return "vd::FP8E4M3";
  case rt::DType::FP8E5M2:
    return "vd::FP8E5M2";
  default:
    return "vd::F32";
  }
}

/// Sizes as C++ with G and D named (they are macros of the source).
std::string extent(int64_t size, const std::string &blockExtent) {
  if (size == vt::kSizeBlocks)
    return blockExtent;
  return sizeName(size);
}

class CudaEmitter : FlowSymbols {
public:
  explicit CudaEmitter(vt::FlowOp flow)
      : FlowSymbols(flow), flow(flow), asmState(flow) {
    if (!paramIndex.count("block_size"))
      fail("the flow has no 'block_size' param");
    for (auto p : flow.getBody()->getOps<vt::ParamOp>())
      if (p.getSymName() == "block_size")
        pageSize = static_cast<int64_t>(paramValue(p));
    if (pageSize < 1)
      fail("block_size must be positive");
  }

  void run(rt::GpuFlowInfo &info);

private:
  vt::FlowOp flow;
  mlir::AsmState asmState;
  std::ostringstream os, globals;
  int depth = 0, uniqueId = 0;
  int64_t pageSize = 0;
  rt::GpuFlowInfo *out = nullptr;

  /// A piece of shared memory or workspace that holds one value at a time.
  struct Slot {
    std::string key; ///< memory kind and sizes: slots with one key are alike
    std::string ptr;
  };

  // Per kernel.
  GridKind grid = GridKind::Row;
  bool cacheStage = false;
  int64_t planTile = 1; ///< tile kernels: the most blocks of a tile
  llvm::DenseMap<Value, Home> homes;
  /// Values read from registers inside a loop (hoisted leaves).
  llvm::DenseMap<Value, std::string> hoisted;
  std::vector<Slot> slots;
  llvm::DenseMap<Value, int> slotOf; ///< the slot of a value's home
  std::map<std::string, std::vector<int>> freeSlots;
  /// Shared memory: `smAt<i>` is where slot i starts (f32 elements);
  /// `smAt<sharedSlots>` is the end.
  int sharedSlots = 0;
  std::ostringstream sharedOffsets;
  std::vector<std::vector<int64_t>> perBlockShared, fixedShared;
  /// Named scalars (see namedScalars) the kernel reads as f32 (`hs<i>`)
  /// and as f64 budgets (`hb<i>`).
  llvm::SetVector<Value> usedScalars, usedBudgets;
  Value defining; ///< the named scalar whose definition is being emitted

  // Per flow.
  llvm::DenseMap<Value, Home> workspace; ///< kernel results
  /// Workspace: per-block and fixed f32 elements before the next slot,
  /// `wsB<i>` and `wsF<j>` (file-scope constants).
  int wsBlockSlots = 0, wsFixedSlots = 0;
  std::ostringstream wsOffsets;
  llvm::DenseMap<Operation *, bool> readsNewState;
  std::set<std::string> storedStates;
  Value returned;
  /// Ops of the expression expr() gives for a value now (1 for homes and
  /// leaves), set when the value's op is emitted.
  llvm::DenseMap<Value, int> exprOps;
  /// Uses of a value not yet emitted; when none is left, its slot is free.
  llvm::DenseMap<Value, int> pendingUses;
  /// Host-evaluable scalars outside kernels whose expression is too large
  /// to inline: each kernel that reads one computes it once, into a local,
  /// in the order of `position`.
  llvm::DenseMap<Value, int> namedScalars;
  llvm::DenseMap<Value, int> position;
  /// The global array of each literal.
  llvm::DenseMap<Operation *, std::string> literalArrays;

  std::ostream &line() {
    for (int i = 0; i < depth; ++i)
      os << "  ";
    return os;
  }
  void open(const std::string &text) {
    line() << text << (text.empty() ? "{\n" : " {\n");
    ++depth;
  }
  void close(const std::string &suffix = "") {
    --depth;
    line() << "}" << suffix << "\n";
  }
  std::string fresh(const std::string &stem) {
    return stem + std::to_string(uniqueId++);
  }
  void comment(Operation *op) {
    std::string text;
    llvm::raw_string_ostream s(text);
    op->print(s, asmState);
    s.flush();
    for (char &c : text)
      if (c == '\n')
        c = ' ';
    if (text.size() > 160)
      text = text.substr(0, 160) + " ...";
    line() << "// " << text << "\n";
  }
  std::string symbol(const std::string &what) {
    return "vflow_" + flow.getSymName().str() + "_" + what;
  }
  /// The f64 value of a budget, evaluated on the device as the host does.
  std::string hostScalar(Value v) {
    return hostExpr(v, paramIndex, "double(N)", "double(L)", true,
                    [&](Value x) -> std::string {
                      auto it = namedScalars.find(x);
                      if (it == namedScalars.end() || x == defining)
                        return "";
                      usedBudgets.insert(x);
                      return "hb" + std::to_string(it->second);
                    });
  }
  std::string hostValue(Value v) {
    return "double(vd::roundBudget(" + hostScalar(v) + "))";
  }

  //===--------------------------------------------------------------------===//
  // Offsets and expressions
  //===--------------------------------------------------------------------===//

  /// A block count as C++: 64-bit unless it counts a tile's blocks (shared
  /// memory), so that products with it cannot overflow.
  static std::string blockCount(const std::string &blockExtent) {
    if (blockExtent == "TILE" || blockExtent == "tn")
      return blockExtent;
    return "(long long)" + blockExtent;
  }

  /// The offset of element `idx` in `l` (row-major). A value holds fewer
  /// than 2^31 elements per block (limits::kMaxElements), so only the terms
  /// that count blocks are 64-bit.
  static std::string offsetIn(const Layout &l, const Idx &idx,
                              const std::string &blockExtent = "a.maxBlocks",
                              const std::string &blockBase = "") {
    int blockAt = l.index("block");
    bool wide = blockAt >= 0 && blockCount(blockExtent) != blockExtent;
    std::string result;
    for (size_t i = 0; i < l.names.size(); ++i) {
      auto it = idx.find(l.names[i]);
      if (it == idx.end())
        fail("internal: no index for axis '" + l.names[i] + "'");
      std::string index = it->second;
      if (l.names[i] == "block" && !blockBase.empty())
        index = "(" + index + " - " + blockBase + ")";
      // Strides before the block axis count blocks (64-bit already).
      std::string stride;
      for (size_t j = i + 1; j < l.names.size(); ++j)
        stride +=
            (stride.empty() ? "" : " * ") +
            (l.sizes[j] == vt::kSizeBlocks ? blockCount(blockExtent)
                                           : extent(l.sizes[j], blockExtent));
      if (wide && int(i) == blockAt && !stride.empty())
        index = "(long long)" + index;
      std::string term = stride.empty() ? index : index + " * " + paren(stride);
      result += (result.empty() ? "" : " + ") + term;
    }
    return result.empty() ? "0" : result;
  }

  /// The elements of `l` as C++ (64-bit when they count blocks, see
  /// blockCount).
  static std::string elements(const Layout &l, const std::string &blockExtent) {
    std::string result;
    for (int64_t s : l.sizes)
      result += (result.empty() ? "" : " * ") + (s == vt::kSizeBlocks
                                                     ? blockCount(blockExtent)
                                                     : extent(s, blockExtent));
    return result.empty() ? "1" : result;
  }

  std::string read(const Home &h, const Idx &idx) {
    return h.ptr + "[" + offsetIn(h.layout, idx, h.blockExtent, h.blockBase) +
           "]";
  }

  /// The expression of element `idx` of `v`.
  std::string expr(Value v, const Idx &idx);
  std::string inputExpr(vt::InputOp op, const Idx &idx);

  /// How many ops the expression of `v` holds now: 1 for a value read from
  /// memory, a register or a named local, else what was recorded when its
  /// op was emitted (bounded by the materialization rule).
  int exprSize(Value v) {
    if (homes.count(v) || workspace.count(v) || hoisted.count(v) ||
        namedScalars.count(v))
      return 1;
    if (auto it = exprOps.find(v); it != exprOps.end())
      return it->second;
    Operation *op = v.getDefiningOp();
    if (!op || !isInlined(op) || isSource(op))
      return 1;
    fail("internal: an inlined value used before its op was emitted");
  }
  /// exprSize of an op's result from its operands' (saturating).
  int inlinedSize(Operation *op) {
    if (isSource(op))
      return 1;
    int64_t n = 1;
    for (Value operand : op->getOperands())
      n = std::min<int64_t>(n + exprSize(operand), INT_MAX / 4);
    return int(n);
  }
  static bool isSource(Operation *op) {
    return llvm::isa<vt::InputOp, vt::ParamLoadOp, vt::ConstantOp,
                     vt::ConstLoadOp, vt::FieldLoadOp, vt::StateLoadOp,
                     vt::LiteralOp>(op);
  }
  /// The inputs and consts without a block axis that the inlined
  /// expression of `v` reads: the same for every block of a tile. A leaf
  /// read through a rename or a split is left out: it is read at other
  /// indices than its own axes' (a register indexed by them would be
  /// wrong, or missing an axis).
  void blockInvariantLeaves(Value v, llvm::SetVector<Value> &leaves) {
    llvm::SetVector<Value> renamed;
    collectLeaves(v, false, leaves, renamed);
    leaves.set_subtract(renamed);
  }
  void collectLeaves(Value v, bool underRename, llvm::SetVector<Value> &leaves,
                     llvm::SetVector<Value> &renamed) {
    if (homes.count(v) || workspace.count(v) || hoisted.count(v) ||
        namedScalars.count(v))
      return;
    Operation *op = v.getDefiningOp();
    if (!op)
      return;
    if (llvm::isa<vt::InputOp, vt::ConstLoadOp>(op)) {
      if (Layout::of(v).index("block") < 0)
        (underRename ? renamed : leaves).insert(v);
      return;
    }
    if (!isInlined(op))
      return;
    underRename |= llvm::isa<vt::RenameOp, vt::SplitOp>(op);
    for (Value operand : op->getOperands())
      collectLeaves(operand, underRename, leaves, renamed);
  }
  static bool isInlined(Operation *op) {
    return op->getNumResults() == 1 && op->getNumRegions() == 0 &&
           !llvm::isa<vt::ReduceOp, vt::SoftmaxOp, vt::NormalizeOp, vt::ConvOp,
                      vt::KthLargestOp, vt::TopKOp, vt::ApproxTopKOp,
                      vt::ThresholdOp, vt::UnionOp, vt::RademacherOp,
                      vt::GaussianOp, vt::KernelOp>(op) &&
           !op->getResult(0).getType().isa<vt::SelectionType>();
  }

  //===--------------------------------------------------------------------===//
  // Loops
  //===--------------------------------------------------------------------===//

  /// The block axis' loop extent and base in the current kernel.
  std::string blockLoopExtent() const {
    return grid == GridKind::Tile ? "tn" : "N";
  }
  std::string blockLoopBase() const {
    return grid == GridKind::Tile ? "t0" : "0";
  }

  /// The number of elements of `l` in the current kernel.
  std::string loopTotal(const Layout &l) const {
    std::string total;
    for (int64_t s : l.sizes)
      total += (total.empty() ? "" : " * ") + extent(s, blockLoopExtent());
    return total.empty() ? "1" : total;
  }

  /// The type of a flat index over `l` in the current kernel: int when the
  /// count (plus a step) stays below 2^31 at the largest G and D, else
  /// vd::Index, which NVRTC makes int or 64-bit at the real G and D. A
  /// block count is at most the tile, or INT_MAX / PAGE (N = L / PAGE).
  std::string indexType(const Layout &l) const {
    constexpr int64_t kLimit = INT_MAX - 65536;
    int64_t bound = 1;
    std::string text = "1LL";
    for (int64_t s : l.sizes) {
      int64_t most = s;
      std::string name = sizeName(s);
      if (s == vt::kSizeBlocks) {
        most = grid == GridKind::Tile ? planTile : INT_MAX / pageSize;
        name = grid == GridKind::Tile ? "TILE" : "(0x7fffffff / PAGE)";
      } else if (s == vt::kSizeGroup) {
        most = limits::kMaxGroup;
      } else if (s == vt::kSizeHeadDim) {
        most = limits::kMaxHeadDim;
      }
      bound = bound < 0 ? -1 : limits::boundedProduct(bound, most, kLimit);
      text += " * " + name;
    }
    if (bound >= 0)
      return "int";
    return "vd::Index<" + text + ">";
  }

  /// Defines `i_<axis>` for the element `flat` of `l` (row-major).
  void decode(const Layout &l, const std::string &flat, Idx &idx) {
    std::string rem = "rem_" + flat;
    line() << "int " << rem << " = " << flat << ";\n";
    line() << "(void)" << rem << ";\n";
    for (size_t i = l.names.size(); i-- > 0;) {
      std::string var = loopVar(l.names[i]);
      std::string ext = extent(l.sizes[i], blockLoopExtent());
      if (l.names[i] == "block")
        line() << "const int " << var << " = " << blockLoopBase() << " + "
               << rem << " % " << paren(ext) << ";\n";
      else
        line() << "const int " << var << " = " << rem << " % " << paren(ext)
               << ";\n";
      if (i > 0)
        line() << rem << " /= " << paren(ext) << ";\n";
      idx[l.names[i]] = var;
    }
  }

  /// decode() for a 64-bit `flat`: each axis' index is int (it is below the
  /// axis' size), the outermost one is what remains.
  void decodeWide(const Layout &l, const std::string &flat, Idx &idx) {
    std::string rem = "rem_" + flat;
    line() << "decltype(" << flat << ") " << rem << " = " << flat << ";\n";
    for (size_t i = l.names.size(); i-- > 0;) {
      std::string var = loopVar(l.names[i]);
      std::string ext = extent(l.sizes[i], blockLoopExtent());
      std::string value =
          i == 0 ? "int(" + rem + ")" : "int(" + rem + " % " + paren(ext) + ")";
      if (l.names[i] == "block")
        value = blockLoopBase() + " + " + value;
      line() << "const int " << var << " = " << value << ";\n";
      if (i > 0)
        line() << rem << " /= " << paren(ext) << ";\n";
      idx[l.names[i]] = var;
    }
  }

  /// Opens `for (flat = start; flat < elements of l; flat += step)` with
  /// `i_<axis>` defined.
  void elementLoop(const Layout &l, const std::string &flat,
                   const std::string &start, const std::string &step,
                   Idx &idx) {
    std::string type = indexType(l);
    if (type == "int") {
      open("for (int " + flat + " = " + start + "; " + flat + " < " +
           loopTotal(l) + "; " + flat + " += " + step + ")");
      decode(l, flat, idx);
      return;
    }
    std::string total;
    for (int64_t s : l.sizes)
      total += (total.empty() ? "" : " * ") +
               (s == vt::kSizeBlocks
                    ? "decltype(" + flat + ")(" + blockLoopExtent() + ")"
                    : extent(s, blockLoopExtent()));
    open("for (" + type + " " + flat + " = " + start + "; " + flat + " < " +
         total + "; " + flat + " += " + step + ")");
    decodeWide(l, flat, idx);
  }

  /// for each element of `l`, spread over the CTA, with `i_<axis>` defined.
  void parallelLoop(const Layout &l, const std::function<void(Idx &)> &body) {
    Idx idx;
    elementLoop(l, "e", "threadIdx.x", "blockDim.x", idx);
    body(idx);
    close();
    line() << "__syncthreads();\n";
  }

  /// Serial loops over `axes` of `l` (a reduction's reduced axes).
  int serialLoops(const Layout &l, const std::vector<std::string> &axes,
                  Idx &idx) {
    int n = 0;
    for (size_t i = 0; i < l.names.size(); ++i) {
      if (std::find(axes.begin(), axes.end(), l.names[i]) == axes.end())
        continue;
      std::string var = loopVar(l.names[i]);
      open("for (int " + var + " = 0; " + var + " < " +
           extent(l.sizes[i], "N") + "; ++" + var + ")");
      idx[l.names[i]] = var;
      ++n;
    }
    return n;
  }

  /// A home for `v` in the current kernel: shared memory inside a tile or
  /// the cache stage, the list's workspace otherwise. The home's slot is
  /// freed when `v`'s last use has been emitted.
  Home allocate(Value v) {
    Home h = allocateSlot(Layout::of(v), grid != GridKind::Row, v);
    return h;
  }

  /// A slot for a value of layout `l` (shared memory or workspace), a free
  /// one of the same kind and sizes if there is one. `owner`, if any, is
  /// the value that will live there.
  Home allocateSlot(const Layout &l, bool shared, Value owner = {}) {
    Home h;
    h.layout = l;
    if (shared) {
      h.blockExtent = "TILE";
      h.blockBase = grid == GridKind::Tile ? "t0" : "";
    }
    bool perBlock = false;
    std::vector<int64_t> sizes;
    std::string key = shared ? "sm" : "ws";
    for (int64_t s : l.sizes) {
      if (s == vt::kSizeBlocks) {
        perBlock = true;
        continue;
      }
      sizes.push_back(s);
      key += " " + std::to_string(s);
    }
    key += perBlock ? " block" : "";
    int id;
    std::vector<int> &free = freeSlots[key];
    if (!free.empty()) {
      id = free.back();
      free.pop_back();
    } else {
      id = static_cast<int>(slots.size());
      slots.push_back({key, shared ? sharedSlot(l, perBlock, sizes)
                                   : workspaceSlot(perBlock, sizes)});
    }
    h.ptr = slots[id].ptr;
    if (owner)
      slotOf[owner] = id;
    return h;
  }

  /// A new slot of shared memory: `(sm + smAt<i>)`.
  std::string sharedSlot(const Layout &l, bool perBlock,
                         const std::vector<int64_t> &sizes) {
    std::string at = "smAt" + std::to_string(sharedSlots++);
    sharedOffsets << "  constexpr int smAt" << sharedSlots << " = " << at
                  << " + " << paren(elements(l, "TILE")) << ";\n";
    (perBlock ? perBlockShared : fixedShared).push_back(sizes);
    return "(sm + " + at + ")";
  }

  /// A new slot of the list's workspace.
  std::string workspaceSlot(bool perBlock, const std::vector<int64_t> &sizes) {
    rt::GpuWorkspaceSlot slot;
    slot.perBlock = perBlock;
    slot.sizes = sizes;
    out->workspace.push_back(slot);
    std::string size = sizes.empty() ? "1" : product(sizes);
    std::string ptr = "(ws + (wsB" + std::to_string(wsBlockSlots) +
                      " * (long long)a.maxBlocks + wsF" +
                      std::to_string(wsFixedSlots) + "))";
    const char *stem = perBlock ? "wsB" : "wsF";
    int &count = perBlock ? wsBlockSlots : wsFixedSlots;
    wsOffsets << "constexpr long long " << stem << count + 1 << " = " << stem
              << count << " + " << paren(size) << ";\n";
    ++count;
    return ptr;
  }

  Home allocateWorkspace(const Layout &l, Value owner = {}) {
    return allocateSlot(l, /*shared=*/false, owner);
  }

  /// Computes `v` (an inlinable value) into its own home.
  void materializeInline(Value v) {
    Home h = allocate(v);
    parallelLoop(h.layout, [&](Idx &idx) {
      line() << read(h, idx) << " = " << expr(v, idx) << ";\n";
    });
    homes[v] = h;
  }

  /// `op` has been emitted: nothing will read its operands for it any
  /// more. An operand with no use left frees its slot; an inlined operand
  /// with no use left is done too (its expression will not be emitted
  /// again). Iterative, so that a long chain does not recurse.
  void doneWith(Operation *op) {
    llvm::SmallVector<Operation *, 8> work{op};
    while (!work.empty()) {
      Operation *o = work.pop_back_val();
      for (Value operand : o->getOperands()) {
        auto it = pendingUses.find(operand);
        if (it == pendingUses.end() || --it->second > 0)
          continue;
        if (auto s = slotOf.find(operand); s != slotOf.end()) {
          freeSlots[slots[s->second].key].push_back(s->second);
          slotOf.erase(s);
          continue;
        }
        Operation *def = operand.getDefiningOp();
        if (def && isInlined(def) && !homes.count(operand))
          work.push_back(def);
      }
    }
  }

  /// The definitions of the named scalars the current kernel read (and
  /// those they read), in program order.
  std::string scalarDefinitions(const std::string &indent) {
    std::map<std::pair<int, int>, std::string> defs;
    for (size_t i = 0, j = 0;
         i < usedScalars.size() || j < usedBudgets.size();) {
      bool f32 = i < usedScalars.size();
      Value v = f32 ? usedScalars[i++] : usedBudgets[j++];
      std::string name = std::to_string(namedScalars.lookup(v));
      defining = v;
      std::string text =
          f32 ? "const float hs" + name + " = " + expr(v, {}) + ";\n"
              : "const double hb" + name + " = " + hostScalar(v) + ";\n";
      defining = {};
      defs[{position.lookup(v), f32 ? 0 : 1}] = indent + text;
    }
    std::string result;
    for (auto &entry : defs)
      result += entry.second;
    return result;
  }

  //===--------------------------------------------------------------------===//
  // Ops
  //===--------------------------------------------------------------------===//

  void emitOp(Operation *op);
  void emitReduce(vt::ReduceOp op);
  void emitAlongBlock(Operation *op);
  void emitSelection(Operation *op);
  void emitStore(Value value, const Layout &target, const std::string &write);
  void emitKernelBody(vt::KernelOp kernel);

  void prologue(GridKind kind);
  /// Locals holding the argument struct's pointer arrays (loaded once, not
  /// at every use).
  std::string pointerLocals(const std::string &indent) {
    std::ostringstream o;
    for (const auto &[name, i] : fieldIndex)
      o << indent << "void *const field_" << i << " = a.fields[" << i << "];\n";
    for (const auto &[name, i] : constIndex)
      o << indent << "const float *const const_" << i << " = a.consts[" << i
        << "];\n";
    for (const auto &[name, i] : stateIndex)
      o << indent << "float *const stateOld_" << i << " = a.statesOld[" << i
        << "];\n"
        << indent << "float *const stateNew_" << i << " = a.statesNew[" << i
        << "];\n";
    o << indent << "(void)0";
    for (const auto &[name, i] : fieldIndex)
      o << ", (void)field_" << i;
    for (const auto &[name, i] : constIndex)
      o << ", (void)const_" << i;
    for (const auto &[name, i] : stateIndex)
      o << ", (void)stateOld_" << i << ", (void)stateNew_" << i;
    o << ";\n";
    return o.str();
  }
  void emitCacheStage();
  void emitIndexKernel(vt::KernelOp kernel, int index);
  void emitCommit();
  void scanStateOrder();
};

std::string CudaEmitter::inputExpr(vt::InputOp op, const Idx &idx) {
  auto get = [&](const std::string &axis) {
    auto it = idx.find(axis);
    if (it == idx.end())
      fail("internal: no index for axis '" + axis + "'");
    return it->second;
  };
  switch (op.getKind()) {
  case vt::InputKind::K:
  case vt::InputKind::V: {
    bool k = op.getKind() == vt::InputKind::K;
    std::string page = cacheStage ? "page" : "tbl[" + get("block") + "]";
    return "vd::loadKV<VFLOW_KV>(" + std::string(k ? "a.kPool" : "a.vPool") +
           ", ((((long long)" + page + " * a.numKVHeads + kvh) * PAGE + " +
           get("token") + ") * D + " + get("dim") + "), " +
           (k ? "a.kScale" : "a.vScale") + ", kvh)";
  }
  case vt::InputKind::q:
    return "vd::decodeBF16(a.q[((long long)r * G + " + get("head") +
           ") * D + " + get("dim") + "])";
  case vt::InputKind::mass:
    // Per sequence slot: the mass the last step's attention left.
    return "(a.mass ? a.mass[(((long long)slot * a.numKVHeads + kvh) * "
           "a.maxBlocks + " +
           get("block") + ") * G + " + get("head") + "] : 0.0f)";
  case vt::InputKind::position:
    return "float(" + get("block") + ")";
  case vt::InputKind::num_blocks:
    return "float(N)";
  case vt::InputKind::context_len:
    return "float(L)";
  case vt::InputKind::step:
    return "float(a.step[b])";
  }
  fail("unknown input");
}

std::string CudaEmitter::expr(Value v, const Idx &idx) {
  if (auto it = hoisted.find(v); it != hoisted.end())
    return it->second;
  if (auto it = namedScalars.find(v);
      it != namedScalars.end() && v != defining) {
    usedScalars.insert(v);
    return "hs" + std::to_string(it->second);
  }
  if (auto it = homes.find(v); it != homes.end())
    return read(it->second, idx);
  if (auto it = workspace.find(v); it != workspace.end())
    return read(it->second, idx);
  Operation *op = v.getDefiningOp();
  if (!op)
    fail("internal: a block argument in a stage");
  if (auto k = llvm::dyn_cast<vt::KernelOp>(op)) {
    // Inside one CTA (the cache stage) a kernel's result is its yield.
    auto yield = llvm::cast<vt::YieldOp>(k.getBody().front().getTerminator());
    return expr(yield.getValues()[v.cast<mlir::OpResult>().getResultNumber()],
                idx);
  }
  auto operand = [&](unsigned i) { return expr(op->getOperand(i), idx); };
  auto call = [&](const char *fn) {
    std::string args;
    for (unsigned i = 0; i < op->getNumOperands(); ++i)
      args += (i ? ", " : "") + operand(i);
    return std::string(fn) + "(" + args + ")";
  };
  std::string fn = elementFunction(op);
  if (!fn.empty())
    return call(("vd::" + fn).c_str());
  return llvm::TypeSwitch<Operation *, std::string>(op)
      .Case<vt::InputOp>([&](vt::InputOp in) { return inputExpr(in, idx); })
      .Case<vt::ParamLoadOp>([&](vt::ParamLoadOp p) {
        auto it = paramIndex.find(p.getParam().str());
        if (it == paramIndex.end())
          fail("unknown param " + p.getParam().str());
        return "float(P[" + std::to_string(it->second) + "])";
      })
      .Case<vt::ConstantOp>([&](vt::ConstantOp c) {
        return floatLiteral(c.getValue().convertToFloat(), true);
      })
      .Case<vt::ConstLoadOp>([&](vt::ConstLoadOp c) {
        std::string name = c.getName().str();
        if (!constIndex.count(name))
          fail("unknown const " + name);
        return "const_" + std::to_string(constIndex.at(name)) + "[" +
               offsetIn(Layout::of(constTypes.at(name)), idx) + "]";
      })
      .Case<vt::FieldLoadOp>([&](vt::FieldLoadOp l) {
        std::string name = l.getField().str();
        if (!fieldIndex.count(name))
          fail("unknown field " + name);
        vt::TensorType type = fieldTypes.at(name);
        Layout fl = Layout::of(type);
        return "vd::load<" + storageType(type.getElementType()) + ">(field_" +
               std::to_string(fieldIndex.at(name)) + ", ((long long)tbl[" +
               idx.at("block") + "] * a.numKVHeads + kvh) * " +
               paren(elements(fl, "N")) + " + " + paren(offsetIn(fl, idx)) +
               ")";
      })
      .Case<vt::StateLoadOp>([&](vt::StateLoadOp l) {
        std::string name = l.getState().str();
        if (!stateIndex.count(name))
          fail("unknown state " + name);
        Layout sl = Layout::of(stateTypes.at(name));
        std::string buffer =
            readsNewState.lookup(op) ? "stateNew_" : "stateOld_";
        return buffer + std::to_string(stateIndex.at(name)) +
               "[((long long)slot * a.numKVHeads + kvh) * " +
               paren(elements(sl, "a.maxBlocks")) + " + " +
               paren(offsetIn(sl, idx)) + "]";
      })
      .Case<vt::LiteralOp>([&](vt::LiteralOp l) {
        std::string &name = literalArrays[op];
        if (name.empty()) {
          name = fresh("literal");
          llvm::ArrayRef<float> values = l.getValues();
          globals << "__device__ const float " << name << "[] = {";
          for (size_t i = 0; i < values.size(); ++i)
            globals << (i ? ", " : "") << floatLiteral(values[i], true);
          globals << "};\n";
        }
        return name + "[" + offsetIn(Layout::of(l.getResult()), idx) + "]";
      })
      .Case<vt::RenameOp>([&](vt::RenameOp r) {
        Idx inner = idx;
        inner.erase(r.getTo().str());
        inner[r.getFrom().str()] = idx.at(r.getTo().str());
        return expr(r.getInput(), inner);
      })
      .Case<vt::SplitOp>([&](vt::SplitOp s) {
        Layout outL = Layout::of(s.getResult());
        std::string axis = s.getAxis().str(), outer = s.getOuter().str();
        int po = outL.index(axis);
        if (po < 0 || outL.sizes[po] <= 0)
          fail("split of a missing or symbolic axis");
        Idx inner = idx;
        inner.erase(outer);
        inner[axis] = "(" + idx.at(outer) + " * " +
                      std::to_string(outL.sizes[po]) + " + " + idx.at(axis) +
                      ")";
        return expr(s.getInput(), inner);
      })
      .Default([](Operation *o) -> std::string {
        fail("the CUDA backend cannot use " +
             o->getName().getStringRef().str() + " here");
      });
}

void CudaEmitter::emitReduce(vt::ReduceOp op) {
  Layout in = Layout::of(op.getInput());
  std::string acc, finish;
  switch (op.getKind()) {
  case vt::ReduceKind::sum:
    acc = "vd::Sum", finish = "vd::finishPlain";
    break;
  case vt::ReduceKind::mean:
    acc = "vd::Sum", finish = "vd::finishMean";
    break;
  case vt::ReduceKind::max:
    acc = "vd::Max", finish = "vd::finishPlain";
    break;
  case vt::ReduceKind::min:
    acc = "vd::Min", finish = "vd::finishPlain";
    break;
  case vt::ReduceKind::l2norm:
    acc = "vd::Squares", finish = "vd::finishL2";
    break;
  }
  std::vector<std::string> axes;
  std::string count;
  for (llvm::StringRef a : op.getAxisNames()) {
    int p = in.index(a.str());
    if (p < 0)
      fail("reduce over a missing axis");
    axes.push_back(a.str());
    count += (count.empty() ? "" : " * ") + (in.sizes[p] == vt::kSizeBlocks
                                                 ? blockCount("N")
                                                 : extent(in.sizes[p], "N"));
  }
  bool overBlock = std::find(axes.begin(), axes.end(), "block") != axes.end();
  Home h = allocate(op.getResult());
  Layout red;
  bool wide = false;
  int64_t staticReduced = 1;
  for (size_t i = 0; i < in.names.size(); ++i)
    if (std::find(axes.begin(), axes.end(), in.names[i]) != axes.end()) {
      red.names.push_back(in.names[i]);
      red.sizes.push_back(in.sizes[i]);
      if (in.sizes[i] == vt::kSizeHeadDim)
        wide = true;
      else if (in.sizes[i] > 0)
        staticReduced *= in.sizes[i];
    }
  // [block, head] results of a wide reduction: a warp per block, each lane
  // holding the G heads' partials, so the terms' loads that do not depend
  // on the head (the fields) are shared by the heads.
  if (!overBlock && (wide || staticReduced >= 32) &&
      h.layout.names.size() == 2 && h.layout.index("block") >= 0 &&
      h.layout.index("head") >= 0 &&
      h.layout.sizes[h.layout.index("head")] == vt::kSizeGroup) {
    bool f32 = acc == "vd::Max" || acc == "vd::Min";
    std::string type = f32 ? "float" : "double";
    std::string suffix = f32 ? "f" : "";
    const std::string total = elements(red, "N");
    open("");
    line() << "const int lane = threadIdx.x & 31;\n";
    line() << "constexpr int XI = (" << total << " + 31) / 32;\n";
    // The query and the consts are the same for every block: each lane
    // decodes its elements of them once, into registers (at most 64).
    llvm::SetVector<Value> leaves;
    blockInvariantLeaves(op.getInput(), leaves);
    std::vector<std::pair<Value, std::string>> regs;
    line() << "(void)XI;\n";
    if (!leaves.empty()) {
      line() << "constexpr bool HOIST = XI * G * " << leaves.size()
             << " <= 64;\n";
      for (Value leaf : leaves) {
        std::string name = fresh("inv");
        regs.push_back({leaf, name});
        line() << "float " << name << "[HOIST ? XI : 1][HOIST ? G : 1];\n";
      }
      line() << "#pragma unroll\n";
      open("for (int xi = 0; xi < (HOIST ? XI : 0); ++xi)");
      line() << "const int x = lane + 32 * xi;\n";
      line() << "if (x >= " << total << ")\n";
      line() << "  break;\n";
      Idx idx;
      decode(red, "x", idx);
      idx["head"] = "i_head";
      line() << "#pragma unroll\n";
      open("for (int i_head = 0; i_head < G; ++i_head)");
      for (auto &[leaf, name] : regs)
        line() << name
               << "[HOIST ? xi : 0][HOIST ? i_head : 0] = " << expr(leaf, idx)
               << ";\n";
      close();
      close();
    }
    open("for (int w = threadIdx.x >> 5; w < " + blockLoopExtent() +
         "; w += blockDim.x >> 5)");
    Idx idx;
    line() << "const int i_block = " << blockLoopBase() << " + w;\n";
    idx["block"] = "i_block";
    line() << type << " part[G];\n";
    line() << "#pragma unroll\n";
    line() << "for (int i_head = 0; i_head < G; ++i_head)\n";
    line() << "  part[i_head] = " << acc << "::init" << suffix << "();\n";
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
    // their usual expression.
    for (auto &[leaf, name] : regs)
      hoisted[leaf] =
          "(HOIST ? " + name +
          "[HOIST ? xi : 0][HOIST ? i_head : 0] : " + expr(leaf, idx) + ")";
    line() << "  " << acc << "::acc" << suffix << "(part[i_head], " << type
           << "(" << expr(op.getInput(), idx) << "));\n";
    for (auto &entry : regs)
      hoisted.erase(entry.first);
    close();
    idx["head"] = "h_";
    line() << "vd::warpReduceGroup<" << acc << ", G>(part, [&](int h_, double "
           << "total) { " << read(h, idx) << " = " << finish
           << "(total, double(" << count << ")); });\n";
    close();
    close();
    line() << "__syncthreads();\n";
    homes[op.getResult()] = h;
    return;
  }
  if (!overBlock && (wide || staticReduced >= 32)) {
    // One warp per output element, lanes along the reduced elements (the
    // innermost fastest, so loads coalesce), combined by shuffles.
    open("");
    line() << "const int lane = threadIdx.x & 31;\n";
    Idx idx;
    elementLoop(h.layout, "w", "threadIdx.x >> 5", "blockDim.x >> 5", idx);
    // Max and min are exact in f32; sums keep f64, so that the result does
    // not depend on the order of the terms (f32 lane partials measured no
    // faster on an H100: docs/perf/).
    bool f32 = acc == "vd::Max" || acc == "vd::Min";
    std::string type = f32 ? "float" : "double";
    std::string suffix = f32 ? "f" : "";
    line() << type << " part = " << acc << "::init" << suffix << "();\n";
    open("for (int x = lane; x < " + elements(red, "N") + "; x += 32)");
    decode(red, "x", idx);
    line() << acc << "::acc" << suffix << "(part, " << type << "("
           << expr(op.getInput(), idx) << "));\n";
    close();
    line() << "double acc = vd::warpReduce<" << acc << ">(double(part));\n";
    line() << "if (lane == 0)\n";
    line() << "  " << read(h, idx) << " = " << finish << "(acc, double("
           << count << "));\n";
    close();
    close();
    line() << "__syncthreads();\n";
    homes[op.getResult()] = h;
    return;
  }
  if (!overBlock) {
    parallelLoop(h.layout, [&](Idx &idx) {
      line() << "double acc = " << acc << "::init();\n";
      int n = serialLoops(in, axes, idx);
      line() << acc << "::acc(acc, double(" << expr(op.getInput(), idx)
             << "));\n";
      for (int i = 0; i < n; ++i)
        close();
      line() << read(h, idx) << " = " << finish << "(acc, double(" << count
             << "));\n";
    });
    homes[op.getResult()] = h;
    return;
  }
  if (grid != GridKind::Row)
    fail("internal: a reduction over block outside a per-list kernel");
  // All threads cooperate on each output element.
  Layout outL = h.layout;
  std::string outTotal = elements(outL, "N");
  open("for (int o = 0; o < " + outTotal + "; ++o)");
  line() << "int rem = o;\n";
  line() << "(void)rem;\n";
  Idx idx;
  for (size_t i = outL.names.size(); i-- > 0;) {
    std::string var = loopVar(outL.names[i]);
    line() << "const int " << var << " = rem % " << sizeName(outL.sizes[i])
           << ";\n";
    line() << "rem /= " << sizeName(outL.sizes[i]) << ";\n";
    idx[outL.names[i]] = var;
  }
  line() << "double acc = " << acc << "::init();\n";
  elementLoop(red, "e", "threadIdx.x", "blockDim.x", idx);
  line() << acc << "::acc(acc, double(" << expr(op.getInput(), idx) << "));\n";
  close();
  line() << "acc = vd::ctaReduce<" << acc << ">(acc, scratch);\n";
  line() << "if (threadIdx.x == 0)\n";
  line() << "  " << read(h, idx) << " = " << finish << "(acc, double(" << count
         << "));\n";
  close();
  line() << "__syncthreads();\n";
  homes[op.getResult()] = h;
}

void CudaEmitter::emitAlongBlock(Operation *op) {
  if (grid != GridKind::Row)
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
  open("for (int o = 0; o < " + elements(outer, "N") + "; ++o)");
  line() << "int rem = o;\n";
  line() << "(void)rem;\n";
  Idx idx;
  for (size_t i = outer.names.size(); i-- > 0;) {
    std::string var = loopVar(outer.names[i]);
    line() << "const int " << var << " = rem % " << sizeName(outer.sizes[i])
           << ";\n";
    line() << "rem /= " << sizeName(outer.sizes[i]) << ";\n";
    idx[outer.names[i]] = var;
  }
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
  if (grid != GridKind::Row)
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
      .Case<vt::TopKOp, vt::ApproxTopKOp, vt::ThresholdOp, vt::UnionOp>(
          [&](auto) { emitSelection(op); })
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

void CudaEmitter::scanStateOrder() {
  std::set<std::string> stored;
  flow.walk([&](Operation *op) {
    if (auto s = llvm::dyn_cast<vt::StateStoreOp>(op))
      stored.insert(s.getState().str());
    if (auto l = llvm::dyn_cast<vt::StateLoadOp>(op))
      readsNewState[op] = stored.count(l.getState().str()) > 0;
  });
}

void CudaEmitter::prologue(GridKind kind) {
  grid = kind;
  homes.clear();
  slots.clear();
  slotOf.clear();
  freeSlots.clear();
  sharedSlots = 0;
  sharedOffsets.str("");
  sharedOffsets << "  constexpr int smAt0 = 0;\n";
  perBlockShared.clear();
  fixedShared.clear();
  usedScalars.clear();
  usedBudgets.clear();
}

void CudaEmitter::emitCacheStage() {
  vt::CacheStageOp cache = flow.getCacheStage();
  cacheStage = true;
  std::ostringstream saved;
  saved.swap(os);
  depth = 1;
  prologue(GridKind::Cache);
  line() << "const double *P = a.params;\n";
  line() << "(void)P;\n";
  line() << "const int r = 0;\n";
  line() << "(void)r;\n";
  if (cache)
    for (Operation &op : cache.getBody().front())
      emitOp(&op);
  std::string body = os.str();
  const std::vector<std::vector<int64_t>> cacheShared = fixedShared;
  os.swap(saved);
  depth = 0;
  cacheStage = false;

  os << "// The cache stage: the fields of one (page, KV head) block.\n";
  os << "__device__ void cacheBlock(const VflowGpuArgs &a, int page, "
        "int kvh) {\n";
  os << sharedOffsets.str();
  os << "  __shared__ float sm[1 + smAt" << sharedSlots << "];\n";
  os << "  (void)sm;\n";
  os << pointerLocals("  ");
  os << body << "}\n\n";

  os << "extern \"C\" __global__ void __launch_bounds__(256)\n"
     << symbol("append") << "(VflowGpuArgs a) {\n"
     << "  const int b = blockIdx.x, kvh = blockIdx.y;\n"
     << "  const int L = a.seqLen[b];\n"
     << "  if (L <= 0)\n    return;\n"
     << "  const int pos = L - 1, blk = pos / PAGE, at = pos % PAGE;\n"
     << "  const int page = a.blockTable[(long long)b * a.maxBlocks + blk];\n"
     << "  const long long dst = (((long long)page * a.numKVHeads + kvh) * "
        "PAGE + at) * D;\n"
     << "  const long long src = ((long long)b * a.numKVHeads + kvh) * D;\n"
     << "  for (int d = threadIdx.x; d < D; d += blockDim.x) {\n"
     << "    float k = vd::decodeBF16(a.kNew[src + d]);\n"
     << "    float v = vd::decodeBF16(a.vNew[src + d]);\n"
     << "    if (a.kScale)\n      k /= a.kScale[kvh];\n"
     << "    if (a.vScale)\n      v /= a.vScale[kvh];\n"
     << "    vd::store<VFLOW_KV>(a.kPool, dst + d, k);\n"
     << "    vd::store<VFLOW_KV>(a.vPool, dst + d, v);\n"
     << "  }\n";
  if (cache)
    os << "  if (at != PAGE - 1)\n    return;\n"
       << "  __syncthreads();\n"
       << "  cacheBlock(a, page, kvh);\n";
  os << "}\n\n";

  out->kernels.push_back({symbol("append"), "append", 256, 0, {}, cacheShared});
  if (!cache)
    return;
  os << "extern \"C\" __global__ void __launch_bounds__(256)\n"
     << symbol("fields") << "(VflowGpuArgs a) {\n"
     << "  cacheBlock(a, a.pages[blockIdx.x], blockIdx.y);\n"
     << "}\n\n";
  out->kernels.push_back({symbol("fields"), "fields", 256, 0, {}, cacheShared});
}

void CudaEmitter::emitIndexKernel(vt::KernelOp kernel, int index) {
  bool tile = kernel.getKind() == vt::KernelKind::block_map;
  std::string name = symbol("k" + std::to_string(index));
  std::ostringstream saved;
  saved.swap(os);
  depth = 1;
  prologue(tile ? GridKind::Tile : GridKind::Row);
  int64_t plannedTile = 0;
  if (tile) {
    auto plan = kernel->getAttrOfType<mlir::DictionaryAttr>("plan");
    auto blocks = plan ? plan.getAs<mlir::IntegerAttr>("tile_blocks") : nullptr;
    if (!blocks)
      fail("internal: a block_map kernel without a planned tile");
    plannedTile = blocks.getInt();
  }
  // rt::gpuTileBlocks never makes a tile larger than the plan's.
  planTile = std::max<int64_t>(1, plannedTile);
  bool writesList = false;
  auto yield =
      llvm::cast<vt::YieldOp>(kernel.getBody().front().getTerminator());
  for (Value r : kernel.getResults())
    if (r == returned)
      writesList = true;
  if (writesList)
    open("if (N > 0)");
  emitKernelBody(kernel);
  // Results used by later kernels go to the workspace.
  for (auto [result, value] :
       llvm::zip(kernel.getResults(), yield.getValues())) {
    if (result.getType().isa<vt::SelectionType>()) {
      workspace[result] = homes.lookup(value);
      continue;
    }
    if (grid == GridKind::Row && homes.count(value)) {
      workspace[result] = homes.lookup(value);
      continue;
    }
    Home h = allocateWorkspace(Layout::of(result));
    parallelLoop(h.layout, [&](Idx &idx) {
      line() << read(h, idx) << " = " << expr(value, idx) << ";\n";
    });
    workspace[result] = h;
  }
  if (writesList) {
    close();
    line() << "vd::ctaWriteList(a, b, r, N > 0 ? " << workspace[returned].ptr
           << " : nullptr, N, numBlocks, (long long)P["
           << paramIndex.at("keep_first") << "], (long long)P["
           << paramIndex.at("keep_last") << "], scratch);\n";
  }
  std::string body = scalarDefinitions("  ") + os.str();
  os.swap(saved);
  depth = 0;

  std::string tileMacro = "VFLOW_TILE_" + std::to_string(out->kernels.size());
  os << "// vt.kernel " << vt::stringifyKernelKind(kernel.getKind()).str()
     << "\n";
  // Per-list kernels run one CTA per (sequence, KV head) over every block:
  // 1024 threads (GpuKernelInfo::threads), so their scans and selections
  // take fewer serial steps; tiles use 256.
  os << "extern \"C\" __global__ void __launch_bounds__(" << (tile ? 256 : 1024)
     << ")\n"
     << name << "(VflowGpuArgs a) {\n";
  if (tile) {
    os << "#ifndef " << tileMacro << "\n#error \"" << tileMacro
       << " is not defined\"\n#endif\n";
    os << "  constexpr int TILE = " << tileMacro << ";\n";
    os << "  const int r = blockIdx.y;\n";
  } else {
    os << "  const int r = blockIdx.x;\n";
  }
  os << "  const int b = r / a.numKVHeads, kvh = r % a.numKVHeads;\n"
     << "  const int L = a.seqLen[b], N = L / PAGE, numBlocks = (L + PAGE - 1) "
        "/ PAGE;\n"
     << "  const int *tbl = a.blockTable + (long long)b * a.maxBlocks;\n"
     << "  const int slot = a.slot[b];\n"
     << "  const double *P = a.params;\n"
     << "  float *ws = a.workspace + (long long)r * WS_STRIDE;\n"
     << "  __shared__ vd::CtaScratch scratch;\n"
     << "  (void)numBlocks, (void)tbl, (void)slot, (void)P, (void)ws, "
        "(void)scratch;\n"
     << pointerLocals("  ");
  if (tile)
    os << "  const int t0 = blockIdx.x * TILE;\n"
       << "  if (t0 >= N)\n    return;\n"
       << "  const int tn = min(TILE, N - t0);\n"
       << sharedOffsets.str() << "  __shared__ float sm[1 + smAt" << sharedSlots
       << "];\n";
  else if (!writesList)
    os << "  if (N == 0)\n    return;\n";
  os << "  auto candidate = [&](int j) {\n"
     << "    return !(j < (long long)P[" << paramIndex.at("keep_first")
     << "] || (long long)j >= (long long)N - (long long)P["
     << paramIndex.at("keep_last") << "]);\n"
     << "  };\n"
     << "  (void)candidate;\n";
  os << body << "}\n\n";
  out->kernels.push_back({name, tile ? "tile" : "row", tile ? 256 : 1024,
                          plannedTile, perBlockShared, fixedShared});
}

void CudaEmitter::emitCommit() {
  if (storedStates.empty())
    return;
  os << "// This step's stored states become the next step's.\n";
  os << "extern \"C\" __global__ void __launch_bounds__(256)\n"
     << symbol("commit") << "(VflowGpuArgs a) {\n"
     << "  const int r = blockIdx.x;\n"
     << "  const int b = r / a.numKVHeads, kvh = r % a.numKVHeads;\n"
     << "  const int N = a.seqLen[b] / PAGE, slot = a.slot[b];\n"
     << "  if (N == 0)\n    return;\n";
  for (const std::string &name : storedStates) {
    Layout sl = Layout::of(stateTypes.at(name));
    std::string i = std::to_string(stateIndex.at(name));
    // elements() counts blocks in 64 bits: a state may pass 2^31 elements.
    os << "  {\n"
       << "    const long long base = ((long long)slot * a.numKVHeads + kvh) * "
       << paren(elements(sl, "a.maxBlocks")) << ";\n"
       << "    for (long long e = threadIdx.x; e < " << elements(sl, "N")
       << "; e += blockDim.x)\n"
       << "      a.statesOld[" << i << "][base + e] = a.statesNew[" << i
       << "][base + e];\n"
       << "  }\n";
  }
  os << "}\n\n";
  out->kernels.push_back({symbol("commit"), "commit", 256, 0, {}, {}});
}

void CudaEmitter::run(rt::GpuFlowInfo &info) {
  out = &info;
  info = rt::GpuFlowInfo();
  scanStateOrder();
  vt::IndexStageOp index = flow.getIndexStage();
  if (!index)
    fail("the flow has no index stage");
  mlir::Block &indexBody = index.getBody().front();
  returned = llvm::cast<vt::ReturnOp>(indexBody.getTerminator()).getSelection();
  if (!returned.getDefiningOp<vt::KernelOp>())
    fail("the index stage is not planned (run the pass pipeline first)");

  for (auto state : flow.getBody()->getOps<vt::StateOp>()) {
    Layout sl = Layout::of(state.getTensorType());
    if (!sl.names.empty() && sl.index("block") > 0)
      fail("state '" + state.getSymName().str() +
           "' does not have its block axis first");
  }

  // Host-evaluable scalars outside kernels: too large to inline, they get
  // a name (see scalarDefinitions).
  int at = 0;
  for (Operation &op : indexBody) {
    ++at;
    if (!isInlined(&op))
      continue;
    Value v = op.getResult(0);
    int size = inlinedSize(&op);
    if (size > kMaxInlineOps && Layout::of(v).names.empty()) {
      int id = static_cast<int>(namedScalars.size());
      namedScalars[v] = id;
      position[v] = at;
      size = 1;
    }
    exprOps[v] = size;
  }

  emitCacheStage();
  int k = 0;
  for (Operation &op : indexBody) {
    if (auto kernel = llvm::dyn_cast<vt::KernelOp>(op)) {
      emitIndexKernel(kernel, k++);
      continue;
    }
    if (!isInlined(&op) && !llvm::isa<vt::ReturnOp>(op))
      fail("op " + op.getName().getStringRef().str() +
           " outside a vt.kernel in the index stage");
  }
  emitCommit();

  std::ostringstream file;
  file
      << "// Generated by vflow's CUDA backend (vflow::emitCuda) from vt.flow @"
      << flow.getSymName().str() << ".\n";
  file << "// Specialized at NVRTC time by VFLOW_G, VFLOW_D, VFLOW_KV and "
          "VFLOW_TILE_<i>.\n";
  file << "// params (P):";
  for (auto p : flow.getBody()->getOps<vt::ParamOp>())
    file << " [" << paramIndex.at(p.getSymName().str()) << "] "
         << p.getSymName().str();
  file << "\n#include \"vflow/FlowDevice.cuh\"\n\n";
  file << "#if !defined(VFLOW_G) || !defined(VFLOW_D) || !defined(VFLOW_KV)\n"
       << "#error \"compile with -DVFLOW_G=<group> -DVFLOW_D=<head dim> "
          "-DVFLOW_KV=<vd::BF16|vd::F16|vd::FP8E4M3>\"\n#endif\n";
  file << "constexpr int G = VFLOW_G, D = VFLOW_D, PAGE = " << pageSize
       << ";\n";
  // Each workspace slot starts at wsB<i> * maxBlocks + wsF<j>.
  file << "constexpr long long wsB0 = 0, wsF0 = 0;\n" << wsOffsets.str();
  file << "constexpr long long WS_PER_BLOCK = wsB" << wsBlockSlots
       << ", WS_FIXED = wsF" << wsFixedSlots << ";\n";
  file << "#define WS_STRIDE (WS_PER_BLOCK * (long long)a.maxBlocks + "
          "WS_FIXED)\n\n";
  file << globals.str() << "\n" << os.str();
  info.source = file.str();
}

} // namespace

bool vflow::emitCuda(vt::FlowOp flow, rt::GpuFlowInfo &info,
                     std::string &error) {
  try {
    CudaEmitter emitter(flow);
    emitter.run(info);
    return true;
  } catch (const std::exception &e) {
    error = "cannot emit CUDA for flow '" + flow.getSymName().str() +
            "': " + e.what();
    return false;
  }
}
