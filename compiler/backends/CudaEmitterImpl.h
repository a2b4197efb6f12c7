//===- CudaEmitterImpl.h - The CUDA backend's emitter -----------*- C++ -*-===//
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
// The emitter's files, by kernel family:
//   CudaEmitter.cpp        the flow: its kernels in order and the file header
//   CudaExpressions.cpp    values as inlined expressions, memory offsets
//   CudaLoopsAndHomes.cpp  element loops, where values live (slots)
//   CudaOps.cpp            one op at a time: stores, along-block ops,
//                          selections
//   CudaReductions.cpp     reductions, one function per strategy
//   CudaKernels.cpp        the append/fields, index, retain and commit
//                          kernels
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_COMPILER_BACKENDS_CUDAEMITTERIMPL_H
#define VFLOW_COMPILER_BACKENDS_CUDAEMITTERIMPL_H

#include "vflow/Compiler/CudaEmitter.h"

#include "EmitCommon.h"

#include "mlir/IR/AsmState.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"

#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace vflow::emit::cuda {

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

/// The storage type of a field or state's element type ("vd::BF16").
std::string storageType(mlir::Type type);

/// Sizes as C++ with G and D named (they are macros of the source).
std::string extent(int64_t size, const std::string &blockExtent);

/// How a reduction accumulates and over what (CudaReductions.cpp).
struct ReductionPlan;
struct StagedField;

class CudaEmitter : FlowSymbols, CodeWriter {
public:
  explicit CudaEmitter(vt::FlowOp flow);

  void run(rt::GpuFlowInfo &info);

private:
  vt::FlowOp flow;
  mlir::AsmState asmState;
  std::ostringstream globals;
  int uniqueId = 0;
  int64_t pageSize = 0;
  rt::GpuFlowInfo *out = nullptr;

  /// A piece of shared memory or workspace that holds one value at a time.
  struct Slot {
    std::string key; ///< memory kind and sizes: slots with one key are alike
    std::string ptr;
  };

  // Per kernel.
  /// The grid the kernel being emitted is launched over (its vt.kernel's
  /// planned launch): Fields for the cache stage (the append kernel runs
  /// the same code), Tile or Row for an index kernel.
  rt::GpuGrid grid = rt::GpuGrid::Row;
  bool cacheStage = false;
  int64_t planTile = 1;        ///< tile kernels: the most blocks of a tile
  int64_t kernelThreads = 256; ///< the CTA size of the kernel being emitted
  /// Per staged loop of the kernel (emitWarpBlockLoop): the bytes one
  /// warp's stage takes, 0 where the loop cannot stage, as C++ valid at the
  /// kernel's top, where the one `stage` array is declared.
  std::vector<std::string> stageSlots;
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
  /// The cache stage's CTA size (the append kernel's): an index kernel of
  /// another size cannot run its code.
  int64_t cacheThreads = 256;
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

  //===--------------------------------------------------------------------===//
  // Printing
  //===--------------------------------------------------------------------===//

  std::string fresh(const std::string &stem) {
    return stem + std::to_string(uniqueId++);
  }
  /// `op` as a one-line comment.
  void comment(Operation *op);
  /// A kernel's name: vflow_<flow>_<what>.
  std::string symbol(const std::string &what);

  //===--------------------------------------------------------------------===//
  // Offsets and expressions (CudaExpressions.cpp)
  //===--------------------------------------------------------------------===//

  /// The f64 value of a budget, evaluated on the device as the host does.
  std::string hostScalar(Value v);
  /// A budget's value rounded as the host rounds it.
  std::string hostValue(Value v);

  /// A block count as C++: 64-bit unless it counts a tile's blocks (shared
  /// memory), so that products with it cannot overflow.
  static std::string blockCount(const std::string &blockExtent);
  /// The offset of element `idx` in `l` (row-major). A value holds fewer
  /// than 2^31 elements per block (limits::kMaxElements), so only the terms
  /// that count blocks are 64-bit.
  static std::string offsetIn(const Layout &l, const Idx &idx,
                              const std::string &blockExtent = "a.maxBlocks",
                              const std::string &blockBase = "");
  /// The elements of `l` as C++ (64-bit when they count blocks, see
  /// blockCount).
  static std::string elements(const Layout &l, const std::string &blockExtent);
  /// Element `idx` of the value at home `h`.
  std::string read(const Home &h, const Idx &idx);

  /// The expression of element `idx` of `v`.
  std::string expr(Value v, const Idx &idx);
  std::string inputExpr(vt::InputOp op, const Idx &idx);

  /// How many ops the expression of `v` holds now: 1 for a value read from
  /// memory, a register or a named local, else what was recorded when its
  /// op was emitted (bounded by the materialization rule).
  int exprSize(Value v);
  /// exprSize of an op's result from its operands' (saturating).
  int inlinedSize(Operation *op);
  /// Inputs, params, consts, fields, states and literals: leaves of every
  /// expression.
  static bool isSource(Operation *op);
  /// Whether `op` becomes an expression inlined where it is used (instead
  /// of a loop that materializes it).
  static bool isInlined(Operation *op);
  /// The inputs and consts without a block axis that the inlined
  /// expression of `v` reads: the same for every block of a tile. A leaf
  /// read through a rename or a split is left out: it is read at other
  /// indices than its own axes' (a register indexed by them would be
  /// wrong, or missing an axis).
  void blockInvariantLeaves(Value v, llvm::SetVector<Value> &leaves);
  /// The field loads the inlined expression of `v` reads (not through a
  /// rename or a split).
  void fieldLeaves(Value v, llvm::SetVector<Value> &leaves);
  /// The values the inlined expression of `v` reads that have none of
  /// `out`'s axes: inputs, consts and values with a home (shared memory,
  /// the workspace), the same for every element of `out` (not through a
  /// rename or a split).
  void elementInvariantLeaves(Value v, const Layout &out,
                              llvm::SetVector<Value> &leaves);
  enum class LeafKind { BlockInvariant, Field, ElementInvariant };
  void collectLeaves(Value v, bool underRename, LeafKind kind,
                     const Layout *out, llvm::SetVector<Value> &leaves,
                     llvm::SetVector<Value> &renamed);

  //===--------------------------------------------------------------------===//
  // Loops and homes (CudaLoopsAndHomes.cpp)
  //===--------------------------------------------------------------------===//

  /// The block axis' loop extent and base in the current kernel.
  std::string blockLoopExtent() const;
  std::string blockLoopBase() const;
  /// The number of elements of `l` in the current kernel.
  std::string loopTotal(const Layout &l) const;
  /// The type of a flat index over `l` in the current kernel: int when the
  /// count (plus a step) stays below 2^31 at the largest G and D, else
  /// vd::Index, which NVRTC makes int or 64-bit at the real G and D. A
  /// block count is at most the tile, or INT_MAX / PAGE (N = L / PAGE).
  std::string indexType(const Layout &l) const;
  /// Defines `i_<axis>` for the element `flat` of `l` (row-major), flat
  /// below l's element count. `wide`: flat may be 64-bit (each axis' index
  /// is int: it is below the axis' size).
  void decode(const Layout &l, const std::string &flat, Idx &idx,
              bool wide = false);
  /// Opens `for (flat = start; flat < elements of l; flat += step)` with
  /// `i_<axis>` defined.
  void elementLoop(const Layout &l, const std::string &flat,
                   const std::string &start, const std::string &step, Idx &idx);
  /// Opens `for (o = 0; o < elements of l; ++o)`, every thread over every
  /// element (they cooperate on each), with `i_<axis>` defined.
  Idx outputLoop(const Layout &l);
  /// for each element of `l`, spread over the CTA, with `i_<axis>` defined.
  void parallelLoop(const Layout &l, const std::function<void(Idx &)> &body);
  /// Serial loops over `axes` of `l` (a reduction's reduced axes).
  int serialLoops(const Layout &l, const std::vector<std::string> &axes,
                  Idx &idx);

  /// A home for `v` in the current kernel: shared memory inside a tile or
  /// the cache stage, the list's workspace otherwise. The home's slot is
  /// freed when `v`'s last use has been emitted.
  Home allocate(Value v);
  /// A slot for a value of layout `l` (shared memory or workspace), a free
  /// one of the same kind and sizes if there is one. `owner`, if any, is
  /// the value that will live there.
  Home allocateSlot(const Layout &l, bool shared, Value owner = {});
  /// A new slot of shared memory: `(sm + smAt<i>)`.
  std::string sharedSlot(const Layout &l, bool perBlock,
                         const std::vector<int64_t> &sizes);
  /// A new slot of the list's workspace.
  std::string workspaceSlot(bool perBlock, const std::vector<int64_t> &sizes);
  Home allocateWorkspace(const Layout &l, Value owner = {});
  /// Computes `v` (an inlinable value) into its own home.
  void materializeInline(Value v);
  /// `op` has been emitted: nothing will read its operands for it any
  /// more. An operand with no use left frees its slot; an inlined operand
  /// with no use left is done too (its expression will not be emitted
  /// again). Iterative, so that a long chain does not recurse.
  void doneWith(Operation *op);

  //===--------------------------------------------------------------------===//
  // Ops (CudaOps.cpp, CudaReductions.cpp)
  //===--------------------------------------------------------------------===//

  void emitOp(Operation *op);
  void emitKernelBody(vt::KernelOp kernel);
  void emitStore(Value value, const Layout &target, const std::string &write);
  void emitAlongBlock(Operation *op);
  void emitSelection(Operation *op);

  void emitReduce(vt::ReduceOp op);
  static ReductionPlan planReduction(vt::ReduceOp op);
  /// [block, head] results of a wide reduction: a warp per block.
  /// Opens a warp-level reduction's scope (its lane index declared) and
  /// returns the expression of its reduced elements' count.
  std::string openWarpReduction(const ReductionPlan &plan);
  void emitReduceWarpPerBlock(vt::ReduceOp op, const ReductionPlan &plan,
                              const Home &h);
  /// Other wide reductions: a warp per output element.
  /// The field loads of `op`'s terms that a warp can stage per block: read
  /// at (block, `reduced` axes) only. None in the cache stage.
  std::vector<StagedField> stagedFields(vt::ReduceOp op, const Layout &reduced);
  /// Points the staged leaves at the warp's buffer (`hoisted`) at `idx`.
  void readStaged(const std::vector<StagedField> &staged, const Idx &idx);
  /// The loop of a warp over its blocks (`i_block`; `w` the block within
  /// the tile): with `staged` fields, one that copies them STAGES - 1
  /// blocks ahead and the plain one as the fallback. `body(fromStage)`
  /// emits one block's work.
  void emitWarpBlockLoop(const std::vector<StagedField> &staged,
                         const std::function<void(bool fromStage)> &body);
  /// The kernel-level declaration of the staged loops' buffers.
  std::string stageDeclaration(bool tile, bool appends) const;
  /// Reads `leaves` (terms the same for every output of a warp reduction
  /// over `red`, `total` elements, XI per lane) into per-lane registers
  /// once: `inv<n>[XI]`, or `[XI][G]` with `perHead`, each lane's elements
  /// lane + 32 xi, when at most 64 registers (HOIST). The register array of
  /// each leaf.
  std::vector<std::pair<Value, std::string>>
  hoistLeaves(const llvm::SetVector<Value> &leaves, const Layout &red,
              const std::string &total, bool perHead);
  void emitReduceWarpPerElement(vt::ReduceOp op, const ReductionPlan &plan,
                                const Home &h);
  /// Narrow reductions: a thread per output element.
  void emitReduceThreadPerElement(vt::ReduceOp op, const ReductionPlan &plan,
                                  const Home &h);
  /// Reductions over `block`: the whole CTA per output element.
  void emitReduceOverBlocks(vt::ReduceOp op, const ReductionPlan &plan,
                            const Home &h);

  //===--------------------------------------------------------------------===//
  // Kernels (CudaKernels.cpp)
  //===--------------------------------------------------------------------===//

  /// The planned launch of `kernel` (vt-plan-launches); fails without one.
  vt::LaunchAttr launchOf(vt::KernelOp kernel);
  /// Resets the per-kernel state for a kernel launched over `kind`.
  void prologue(rt::GpuGrid kind);
  /// Locals holding the argument struct's pointer arrays (loaded once, not
  /// at every use).
  std::string pointerLocals(const std::string &indent);
  /// The definitions of the named scalars the current kernel read (and
  /// those they read), in program order.
  std::string scalarDefinitions(const std::string &indent);
  void emitCacheStage();
  void emitIndexKernel(vt::KernelOp kernel, int index);
  /// An index kernel's body (run with its launch): its ops, the results
  /// later kernels read stored to the workspace, and with `writesList` the
  /// returned selection's list written.
  std::string emitIndexBody(vt::KernelOp kernel, rt::GpuGrid kernelGrid,
                            vt::LaunchAttr launch, bool writesList);
  void storeIndexResults(vt::KernelOp kernel);
  /// An index kernel's signature (or its body template's, with `appends`)
  /// and the locals every body uses, up to where the body starts.
  void writeIndexKernelHead(const std::string &what, const std::string &name,
                            bool tile, bool appends, bool writesList);
  /// The retain kernel: a CTA per list writes `score` ([block]) of its
  /// complete blocks to VflowGpuArgs::retainScore.
  void emitRetain(Value score);
  void emitCommit();

  /// Which state loads read this step's stored value (a store before them).
  void scanStateOrder();
};

} // namespace vflow::emit::cuda

#endif // VFLOW_COMPILER_BACKENDS_CUDAEMITTERIMPL_H
