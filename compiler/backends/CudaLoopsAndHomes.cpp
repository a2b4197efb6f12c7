//===- CudaLoopsAndHomes.cpp - Element loops and value homes --------------===//
//
// The loops every op emits (a flat index over a layout spread over the
// CTA, decoded into one index per axis, int unless the count can pass
// 2^31), and the homes of materialized values: slots of shared memory or of
// the list's workspace, reused once the last reader has been emitted.
//
//===----------------------------------------------------------------------===//

#include "CudaEmitterImpl.h"

#include "vflow/Runtime/Limits.h"

#include <algorithm>
#include <climits>

using namespace vflow;
using namespace vflow::emit;
using namespace vflow::emit::cuda;

//===----------------------------------------------------------------------===//
// Loops
//===----------------------------------------------------------------------===//

std::string CudaEmitter::blockLoopExtent() const {
  return grid == rt::GpuGrid::Tile ? "tn" : "N";
}

std::string CudaEmitter::blockLoopBase() const {
  return grid == rt::GpuGrid::Tile ? "t0" : "0";
}

std::string CudaEmitter::loopTotal(const Layout &l) const {
  std::string total;
  for (int64_t s : l.sizes)
    total += (total.empty() ? "" : " * ") + extent(s, blockLoopExtent());
  return total.empty() ? "1" : total;
}

std::string CudaEmitter::indexType(const Layout &l) const {
  constexpr int64_t kLimit = INT_MAX - 65536;
  int64_t bound = 1;
  std::string text = "1LL";
  for (int64_t s : l.sizes) {
    int64_t most = s;
    std::string name = sizeName(s);
    if (s == vt::kSizeBlocks) {
      most = grid == rt::GpuGrid::Tile ? planTile : INT_MAX / pageSize;
      name = grid == rt::GpuGrid::Tile ? "TILE" : "(0x7fffffff / PAGE)";
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

// Every caller's flat index is below the layout's element count, so the
// outermost axis needs no `%` (a run-time extent's costs a dozen
// instructions per element). A wide index keeps its type while it is
// divided; each axis's value is an int.
void CudaEmitter::decode(const Layout &l, const std::string &flat, Idx &idx,
                         bool wide) {
  std::string rem = "rem_" + flat;
  line() << (wide ? "decltype(" + flat + ")" : std::string("int")) << " " << rem
         << " = " << flat << ";\n";
  line() << "(void)" << rem << ";\n";
  for (size_t i = l.names.size(); i-- > 0;) {
    std::string var = loopVar(l.names[i]);
    std::string ext = extent(l.sizes[i], blockLoopExtent());
    std::string value = i == 0 ? rem : rem + " % " + paren(ext);
    if (wide)
      value = "int(" + value + ")";
    if (l.names[i] == "block")
      value = blockLoopBase() + " + " + value;
    line() << "const int " << var << " = " << value << ";\n";
    if (i > 0)
      line() << rem << " /= " << paren(ext) << ";\n";
    idx[l.names[i]] = var;
  }
}

void CudaEmitter::elementLoop(const Layout &l, const std::string &flat,
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
  decode(l, flat, idx, /*wide=*/true);
}

Idx CudaEmitter::outputLoop(const Layout &l) {
  open("for (int o = 0; o < " + elements(l, "N") + "; ++o)");
  line() << "int rem = o;\n";
  line() << "(void)rem;\n";
  Idx idx;
  for (size_t i = l.names.size(); i-- > 0;) {
    std::string var = loopVar(l.names[i]);
    line() << "const int " << var << " = rem % " << sizeName(l.sizes[i])
           << ";\n";
    line() << "rem /= " << sizeName(l.sizes[i]) << ";\n";
    idx[l.names[i]] = var;
  }
  return idx;
}

void CudaEmitter::parallelLoop(const Layout &l,
                               const std::function<void(Idx &)> &body) {
  Idx idx;
  elementLoop(l, "e", "threadIdx.x", "blockDim.x", idx);
  body(idx);
  close();
  line() << "__syncthreads();\n";
}

int CudaEmitter::serialLoops(const Layout &l,
                             const std::vector<std::string> &axes, Idx &idx) {
  int n = 0;
  for (size_t i = 0; i < l.names.size(); ++i) {
    if (std::find(axes.begin(), axes.end(), l.names[i]) == axes.end())
      continue;
    std::string var = loopVar(l.names[i]);
    open("for (int " + var + " = 0; " + var + " < " + extent(l.sizes[i], "N") +
         "; ++" + var + ")");
    idx[l.names[i]] = var;
    ++n;
  }
  return n;
}

//===----------------------------------------------------------------------===//
// Homes
//===----------------------------------------------------------------------===//

Home CudaEmitter::allocate(Value v) {
  Home h = allocateSlot(Layout::of(v), grid != rt::GpuGrid::Row, v);
  return h;
}

Home CudaEmitter::allocateSlot(const Layout &l, bool shared, Value owner) {
  Home h;
  h.layout = l;
  if (shared) {
    h.blockExtent = "TILE";
    h.blockBase = grid == rt::GpuGrid::Tile ? "t0" : "";
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

std::string CudaEmitter::sharedSlot(const Layout &l, bool perBlock,
                                    const std::vector<int64_t> &sizes) {
  std::string at = "smAt" + std::to_string(sharedSlots++);
  sharedOffsets << "  constexpr int smAt" << sharedSlots << " = " << at << " + "
                << paren(elements(l, "TILE")) << ";\n";
  (perBlock ? perBlockShared : fixedShared).push_back(sizes);
  return "(sm + " + at + ")";
}

std::string CudaEmitter::workspaceSlot(bool perBlock,
                                       const std::vector<int64_t> &sizes) {
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

Home CudaEmitter::allocateWorkspace(const Layout &l, Value owner) {
  return allocateSlot(l, /*shared=*/false, owner);
}

void CudaEmitter::materializeInline(Value v) {
  Home h = allocate(v);
  parallelLoop(h.layout, [&](Idx &idx) {
    line() << read(h, idx) << " = " << expr(v, idx) << ";\n";
  });
  homes[v] = h;
}

void CudaEmitter::doneWith(Operation *op) {
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
