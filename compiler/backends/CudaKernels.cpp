//===- CudaKernels.cpp - The kernels of a flow ----------------------------===//
//
// The append kernel (a step's new K and V into the paged cache, then the
// cache stage on a block that filled up) and the fields kernel (the cache
// stage on given pages); one kernel per planned vt.kernel of the index stage
// (tiles of blocks or one CTA per list; the one that makes the returned
// selection writes the list); the retain kernel, which writes the retain
// block's score where the runtime asks for it; and the commit kernel, which
// makes this step's stored states the next step's. Each vt.kernel is emitted
// and described as its launch (vt-plan-launches) says: grid, threads, tile.
// Every kernel may start while the one before it runs (programmatic
// dependent launch) and waits for it in vd::awaitEarlierGrids.
//
//===----------------------------------------------------------------------===//

#include "CudaEmitterImpl.h"

#include <algorithm>

using namespace vflow;
using namespace vflow::emit;
using namespace vflow::emit::cuda;

namespace {

/// The runtime's name for a planned grid (the same cases).
rt::GpuGrid gpuGrid(vt::LaunchGrid grid) {
  switch (grid) {
  case vt::LaunchGrid::append:
    return rt::GpuGrid::Append;
  case vt::LaunchGrid::fields:
    return rt::GpuGrid::Fields;
  case vt::LaunchGrid::tile:
    return rt::GpuGrid::Tile;
  case vt::LaunchGrid::row:
    return rt::GpuGrid::Row;
  case vt::LaunchGrid::commit:
    return rt::GpuGrid::Commit;
  }
  return rt::GpuGrid::Row;
}

/// Threads of the kernels no vt.kernel plans: append without a cache
/// stage, and commit (both copy elements over the CTA).
constexpr int64_t kCopyThreads = 256;

/// Every kernel waits here, after reading only what the host wrote before
/// the step (lengths, block tables, slots, params) and before any early
/// return, for the grid before it (the runtime launches all but a step's
/// first kernel as programmatic dependents: GridDependency.cuh's contract).
constexpr const char *kAwaitEarlierGrids = "  vd::awaitEarlierGrids();\n";

/// Buffers per warp of a staged loop: its fetch runs kStages - 1 blocks
/// ahead of the block being reduced.
constexpr int kStages = 4;

} // namespace

/// The buffers of the kernel's staged loops (emitWarpBlockLoop): STAGES per
/// warp of the largest loop's bytes, where the kernel's static shared
/// memory stays under 48 KB with 4 KB to spare for the helpers' own arrays
/// (STAGE_FITS; else every loop takes its plain form).
std::string CudaEmitter::stageDeclaration(bool tile, bool appends) const {
  if (stageSlots.empty())
    return "";
  std::ostringstream out;
  std::string slots;
  for (size_t i = 0; i < stageSlots.size(); ++i) {
    out << "  constexpr int STAGE_SLOT" << i << " = " << stageSlots[i] << ";\n";
    slots += (i ? ", STAGE_SLOT" : "STAGE_SLOT") + std::to_string(i);
  }
  const int64_t warps = std::max<int64_t>(1, kernelThreads / 32);
  std::string sm = tile ? "int(sizeof(float)) * (1 + smAt" +
                              std::to_string(sharedSlots) + ")"
                        : "0";
  // The appending twin's cache stage has its own shared array.
  if (appends)
    sm += " + (APPEND ? int(sizeof(float)) * cacheSharedFloats() : 0)";
  out << "  constexpr int STAGES = " << kStages << ", STAGE_WARPS = " << warps
      << ", STAGE_SLOT = vd::constMax(" << slots << ");\n"
      << "  constexpr bool STAGE_FITS = STAGE_SLOT > 0 && STAGES * "
         "STAGE_WARPS * STAGE_SLOT + "
      << sm << " + int(sizeof(vd::CtaScratch)) + 4096 <= 49152;\n"
      << "  __shared__ __align__(16) unsigned char stage[STAGE_FITS ? "
         "STAGE_WARPS : 1][STAGES][STAGE_FITS ? STAGE_SLOT : 16];\n"
      << "  (void)stage;\n";
  return out.str();
}

vt::LaunchAttr CudaEmitter::launchOf(vt::KernelOp kernel) {
  vt::LaunchAttr launch = kernel.getLaunchAttr();
  if (!launch)
    fail("a vt.kernel " + vt::stringifyKernelKind(kernel.getKind()).str() +
         " has no launch (run vt-plan-launches)");
  return launch;
}

void CudaEmitter::prologue(rt::GpuGrid kind) {
  grid = kind;
  homes.clear();
  slots.clear();
  slotOf.clear();
  freeSlots.clear();
  sharedSlots = 0;
  stageSlots.clear();
  sharedOffsets.str("");
  sharedOffsets << "  constexpr int smAt0 = 0;\n";
  perBlockShared.clear();
  fixedShared.clear();
  usedScalars.clear();
  usedBudgets.clear();
}

std::string CudaEmitter::pointerLocals(const std::string &indent) {
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

std::string CudaEmitter::scalarDefinitions(const std::string &indent) {
  std::map<std::pair<int, int>, std::string> defs;
  for (size_t i = 0, j = 0; i < usedScalars.size() || j < usedBudgets.size();) {
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

//===----------------------------------------------------------------------===//
// The cache stage: append and fields
//===----------------------------------------------------------------------===//

void CudaEmitter::emitCacheStage() {
  vt::CacheStageOp cache = flow.getCacheStage();
  // The cache stage's planned launch is the fields kernel's and the append
  // kernel's, which runs the same code on a block it completes.
  int64_t threads = kCopyThreads;
  if (cache)
    for (auto kernel : cache.getBody().front().getOps<vt::KernelOp>()) {
      vt::LaunchAttr launch = launchOf(kernel);
      if (gpuGrid(launch.getGrid()) != rt::GpuGrid::Fields)
        fail("internal: the cache stage's kernel is not launched over pages");
      threads = launch.getThreads();
    }
  cacheStage = true;
  std::ostringstream saved;
  saved.swap(os);
  depth = 1;
  prologue(rt::GpuGrid::Fields);
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

  os << "// The cache stage's shared f32 elements.\n";
  os << "__host__ __device__ constexpr int cacheSharedFloats() {\n"
     << sharedOffsets.str() << "  return 1 + smAt" << sharedSlots << ";\n}\n\n";
  os << "// The cache stage: the fields of one (page, KV head) block.\n";
  os << "__device__ void cacheBlock(const VflowGpuArgs &a, int page, "
        "int kvh) {\n";
  os << sharedOffsets.str();
  os << "  __shared__ float sm[cacheSharedFloats()];\n";
  os << "  (void)sm;\n";
  os << pointerLocals("  ");
  os << body << "}\n\n";

  // The append: row b's token at KV head kvh into its page, then the cache
  // stage on the block it completes. Every thread of the CTA calls it (its
  // barriers); the append kernel and, fused, the first index kernel.
  os << "__device__ void appendToken(const VflowGpuArgs &a, int b, int kvh) "
        "{\n"
     << "  const int L = a.seqLen[b];\n"
     << "  if (L <= 0)\n    return;\n"
     << "  const int pos = L - 1, blk = pos / PAGE, at = pos % PAGE;\n"
     << "  const int page = a.blockTable[(long long)b * a.maxBlocks + blk];\n"
     << "  const long long dst = (((long long)page * a.numKVHeads + kvh) * "
        "PAGE + at) * D;\n"
     << "  const long long src = ((long long)b * a.numKVHeads + kvh) * D;\n"
     << "  // A warp a row (K, then V on the second warp when there is one).\n"
     << "  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n"
     << "  if (warp == 0)\n"
     << "    vd::storeKVRow<VFLOW_KV>(a.kPool, a.kTokenScale, dst, a.kNew + "
        "src, D, lane);\n"
     << "  if (warp == (blockDim.x > 32 ? 1 : 0))\n"
     << "    vd::storeKVRow<VFLOW_KV>(a.vPool, a.vTokenScale, dst, a.vNew + "
        "src, D, lane);\n";
  if (cache)
    os << "  if (at != PAGE - 1)\n    return;\n"
       << "  __syncthreads();\n"
       << "  cacheBlock(a, page, kvh);\n";
  os << "}\n\n";
  os << "extern \"C\" __global__ void __launch_bounds__(" << threads << ")\n"
     << symbol("append") << "(VflowGpuArgs a) {\n"
     << kAwaitEarlierGrids << "  appendToken(a, blockIdx.x, blockIdx.y);\n"
     << "}\n\n";
  cacheThreads = threads;

  out->kernels.push_back(
      {symbol("append"), rt::GpuGrid::Append, threads, 0, {}, cacheShared});
  if (!cache)
    return;
  os << "extern \"C\" __global__ void __launch_bounds__(" << threads << ")\n"
     << symbol("fields") << "(VflowGpuArgs a) {\n"
     << kAwaitEarlierGrids
     << "  cacheBlock(a, a.pages[blockIdx.x], blockIdx.y);\n"
     << "}\n\n";
  out->kernels.push_back(
      {symbol("fields"), rt::GpuGrid::Fields, threads, 0, {}, cacheShared});
}

//===----------------------------------------------------------------------===//
// The index stage
//===----------------------------------------------------------------------===//

void CudaEmitter::emitIndexKernel(vt::KernelOp kernel, int index) {
  vt::LaunchAttr launch = launchOf(kernel);
  rt::GpuGrid kernelGrid = gpuGrid(launch.getGrid());
  if (kernelGrid != rt::GpuGrid::Tile && kernelGrid != rt::GpuGrid::Row)
    fail("internal: an index kernel launched over " +
         std::string(rt::gpuGridName(kernelGrid)));
  bool tile = kernelGrid == rt::GpuGrid::Tile;
  std::string name = symbol("k" + std::to_string(index));
  bool writesList = false;
  for (Value r : kernel.getResults())
    if (r == returned)
      writesList = true;
  std::string body = emitIndexBody(kernel, kernelGrid, launch, writesList);

  // The first index kernel, where it has the cache stage's CTA size, can
  // do the append: a tile kernel in the CTA over the row's newest complete
  // block (the only one that reads a block this token completes), a row
  // kernel in its CTA; nothing else of it reads the token. Its body is then
  // a template on APPEND, and the kernel has a twin `<name>_append` (where
  // the runtime defines VFLOW_FUSED_APPEND: both fit in shared memory)
  // that does the append too: the runtime picks one per step.
  const bool appends = index == 0 && kernelThreads == cacheThreads;
  const std::string threadsText = std::to_string(launch.getThreads());
  writeIndexKernelHead("vt.kernel " +
                           vt::stringifyKernelKind(kernel.getKind()).str(),
                       name, tile, appends, writesList);
  os << body << "}\n\n";
  if (appends)
    os << "extern \"C\" __global__ void __launch_bounds__(" << threadsText
       << ")\n"
       << name << "(VflowGpuArgs a) {\n  " << name << "_body<false>(a);\n}\n\n"
       << "#ifdef VFLOW_FUSED_APPEND\n"
       << "extern \"C\" __global__ void __launch_bounds__(" << threadsText
       << ")\n"
       << name << "_append(VflowGpuArgs a) {\n  " << name
       << "_body<true>(a);\n}\n#endif\n\n";
  out->kernels.push_back({name, kernelGrid, launch.getThreads(),
                          launch.getTileBlocks(), perBlockShared, fixedShared,
                          appends});
}

std::string CudaEmitter::emitIndexBody(vt::KernelOp kernel,
                                       rt::GpuGrid kernelGrid,
                                       vt::LaunchAttr launch, bool writesList) {
  std::ostringstream saved;
  saved.swap(os);
  depth = 1;
  prologue(kernelGrid);
  // rt::gpuTileBlocks never makes a tile larger than the plan's.
  planTile = std::max<int64_t>(1, launch.getTileBlocks());
  kernelThreads = launch.getThreads();
  if (writesList)
    open("if (N > 0)");
  emitKernelBody(kernel);
  storeIndexResults(kernel);
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
  return body;
}

void CudaEmitter::storeIndexResults(vt::KernelOp kernel) {
  auto yield =
      llvm::cast<vt::YieldOp>(kernel.getBody().front().getTerminator());
  for (auto [result, value] :
       llvm::zip(kernel.getResults(), yield.getValues())) {
    if (result.getType().isa<vt::SelectionType>()) {
      workspace[result] = homes.lookup(value);
      continue;
    }
    if (grid == rt::GpuGrid::Row && homes.count(value)) {
      workspace[result] = homes.lookup(value);
      continue;
    }
    Home h = allocateWorkspace(Layout::of(result));
    parallelLoop(h.layout, [&](Idx &idx) {
      line() << read(h, idx) << " = " << expr(value, idx) << ";\n";
    });
    workspace[result] = h;
  }
}

void CudaEmitter::writeIndexKernelHead(const std::string &what,
                                       const std::string &name, bool tile,
                                       bool appends, bool writesList) {
  std::string tileMacro = "VFLOW_TILE_" + std::to_string(out->kernels.size());
  const std::string threadsText = std::to_string(kernelThreads);
  os << "// " << what << "\n";
  if (appends)
    os << "template <bool APPEND>\n__device__ __forceinline__ void " << name
       << "_body(const VflowGpuArgs &a) {\n";
  else
    os << "extern \"C\" __global__ void __launch_bounds__(" << threadsText
       << ")\n"
       << name << "(VflowGpuArgs a) {\n";
  if (tile) {
    os << "#ifndef " << tileMacro << "\n#error \"" << tileMacro
       << " is not defined\"\n#endif\n";
    os << "  constexpr int TILE = " << tileMacro << ";\n";
    // The blocks of this CTA: the tile, or a part of it where the runtime
    // splits tiles to fill the GPU (small batches).
    os << "  const int tileBlocks = a.tileSplit > 1 ? max(1, TILE / "
          "a.tileSplit) : TILE;\n";
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
     << pointerLocals("  ") << kAwaitEarlierGrids;
  if (appends)
    os << "  if constexpr (APPEND) {\n"
       << (tile ? "    if (a.kNew && blockIdx.x == (max(N, 1) - 1) / "
                  "tileBlocks)\n"
                : "    if (a.kNew)\n")
       << "      appendToken(a, b, kvh);\n  }\n";
  if (tile)
    os << "  const int t0 = blockIdx.x * tileBlocks;\n"
       << "  if (t0 >= N)\n    return;\n"
       << "  const int tn = min(tileBlocks, N - t0);\n"
       << sharedOffsets.str() << "  __shared__ float sm[1 + smAt" << sharedSlots
       << "];\n";
  else if (!writesList)
    os << "  if (N == 0)\n    return;\n";
  os << stageDeclaration(tile, appends);
  os << "  auto candidate = [&](int j) {\n"
     << "    return !(j < (long long)P[" << paramIndex.at("keep_first")
     << "] || (long long)j >= (long long)N - (long long)P["
     << paramIndex.at("keep_last") << "]);\n"
     << "  };\n"
     << "  (void)candidate;\n";
}

//===----------------------------------------------------------------------===//
// Retain
//===----------------------------------------------------------------------===//

void CudaEmitter::emitRetain(Value score) {
  Layout l = Layout::of(score);
  // A [block] score, or a [block, token] one (token grain: PAGE scores a
  // block); the checker allows no other.
  const bool tokens = l.names == std::vector<std::string>{"block", "token"};
  if (!tokens && l.names != std::vector<std::string>{"block"})
    fail("internal: a retain score of layout other than [block] or [block, "
         "token]");
  std::ostringstream saved;
  saved.swap(os);
  depth = 1;
  prologue(rt::GpuGrid::Row);
  planTile = 1;
  kernelThreads = kCopyThreads;
  parallelLoop(l, [&](Idx &idx) {
    if (tokens)
      line() << "a.retainScore[((long long)r * a.maxBlocks + "
             << idx.at("block") << ") * PAGE + " << idx.at("token")
             << "] = " << expr(score, idx) << ";\n";
    else
      line() << "a.retainScore[(long long)r * a.maxBlocks + " << idx.at("block")
             << "] = " << expr(score, idx) << ";\n";
  });
  std::string body = scalarDefinitions("  ") + os.str();
  os.swap(saved);
  depth = 0;
  const std::string name = symbol("retain");
  writeIndexKernelHead("the retain block's score of every complete block", name,
                       false, false, false);
  os << "  if (!a.retainScore)\n    return;\n" << body << "}\n\n";
  out->kernels.push_back(
      {name, rt::GpuGrid::Retain, kCopyThreads, 0, {}, fixedShared});
}

//===----------------------------------------------------------------------===//
// Commit
//===----------------------------------------------------------------------===//

void CudaEmitter::emitCommit() {
  if (storedStates.empty())
    return;
  os << "// This step's stored states become the next step's.\n";
  os << "extern \"C\" __global__ void __launch_bounds__(" << kCopyThreads
     << ")\n"
     << symbol("commit") << "(VflowGpuArgs a) {\n"
     << "  const int r = blockIdx.x;\n"
     << "  const int b = r / a.numKVHeads, kvh = r % a.numKVHeads;\n"
     << "  const int N = a.seqLen[b] / PAGE, slot = a.slot[b];\n"
     << kAwaitEarlierGrids << "  if (N == 0)\n    return;\n";
  for (const std::string &name : storedStates) {
    Layout sl = Layout::of(stateTypes.at(name));
    std::string i = std::to_string(stateIndex.at(name));
    // elements() counts blocks in 64 bits: a state may pass 2^31 elements.
    // vd::copyInFlight keeps several loads of each thread in flight.
    os << "  {\n"
       << "    const long long base = ((long long)slot * a.numKVHeads + kvh) * "
       << paren(elements(sl, "a.maxBlocks")) << ";\n"
       << "    float *to = a.statesOld[" << i << "] + base;\n"
       << "    vd::copyInFlight(a.statesNew[" << i << "] + base, "
       << elements(sl, "N") << ", 0, (long long)vd::kInFlight * blockDim.x,\n"
       << "                     [&](long long e, float v) { to[e] = v; });\n"
       << "  }\n";
  }
  os << "}\n\n";
  out->kernels.push_back(
      {symbol("commit"), rt::GpuGrid::Commit, kCopyThreads, 0, {}, {}});
}
