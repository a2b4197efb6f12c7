//===- CudaExpressions.cpp - Values as CUDA expressions -------------------===//
//
// Elementwise ops, renames, splits and loads become expressions inlined
// where they are used: expr() gives element `idx` of a value, reading a
// home, a hoisted register, a named scalar or the value's sources. Memory
// offsets are row-major, 64-bit only where they count blocks. Also: the
// size of an inlined expression (the materialization rule reads it) and the
// block-invariant leaves a reduction may hoist into registers.
//
//===----------------------------------------------------------------------===//

#include "CudaEmitterImpl.h"

#include "vflow/Compiler/StorageDType.h"
#include "vflow/Runtime/Names.h"

#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <climits>

using namespace vflow;
using namespace vflow::emit;
using namespace vflow::emit::cuda;

namespace vflow::emit::cuda {

std::string storageType(mlir::Type type) {
  // FlowDevice.cuh's storage type of each dtype.
  static const char *const storageTypes[] = {"vd::F32", "vd::BF16", "vd::F16",
                                             "vd::FP8E4M3", "vd::FP8E5M2"};
  static_assert(rt::coversEnum(storageTypes, rt::DType::FP8E5M2),
                "one storage type per DType");
  return rt::nameOf(storageTypes, storageDType(type), "vd::F32");
}

std::string extent(int64_t size, const std::string &blockExtent) {
  if (size == vt::kSizeBlocks)
    return blockExtent;
  return sizeName(size);
}

} // namespace vflow::emit::cuda

void CudaEmitter::comment(Operation *op) {
  std::string text;
  llvm::raw_string_ostream s(text);
  op->print(s, asmState);
  s.flush();
  line() << "// " << oneLineText(text, 160) << "\n";
}

std::string CudaEmitter::symbol(const std::string &what) {
  return "vflow_" + flow.getSymName().str() + "_" + what;
}

//===----------------------------------------------------------------------===//
// Budgets
//===----------------------------------------------------------------------===//

std::string CudaEmitter::hostScalar(Value v) {
  static const HostInputs inputs{"double(N)", "double(L)", "double(a.layer)",
                                 "double(a.kvHeadBase + kvh)"};
  return hostExpr(v, paramIndex, inputs, true, [&](Value x) -> std::string {
    auto it = namedScalars.find(x);
    if (it == namedScalars.end() || x == defining)
      return "";
    usedBudgets.insert(x);
    return "hb" + std::to_string(it->second);
  });
}

std::string CudaEmitter::hostValue(Value v) {
  return "double(vd::roundBudget(" + hostScalar(v) + "))";
}

//===----------------------------------------------------------------------===//
// Offsets
//===----------------------------------------------------------------------===//

std::string CudaEmitter::blockCount(const std::string &blockExtent) {
  if (blockExtent == "TILE" || blockExtent == "tn")
    return blockExtent;
  return "(long long)" + blockExtent;
}

std::string CudaEmitter::offsetIn(const Layout &l, const Idx &idx,
                                  const std::string &blockExtent,
                                  const std::string &blockBase) {
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

std::string CudaEmitter::elements(const Layout &l,
                                  const std::string &blockExtent) {
  std::string result;
  for (int64_t s : l.sizes)
    result += (result.empty() ? "" : " * ") + (s == vt::kSizeBlocks
                                                   ? blockCount(blockExtent)
                                                   : extent(s, blockExtent));
  return result.empty() ? "1" : result;
}

std::string CudaEmitter::read(const Home &h, const Idx &idx) {
  return h.ptr + "[" + offsetIn(h.layout, idx, h.blockExtent, h.blockBase) +
         "]";
}

//===----------------------------------------------------------------------===//
// Expressions
//===----------------------------------------------------------------------===//

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
    return "vd::loadKV<VFLOW_KV, D>(" + std::string(k ? "a.kPool" : "a.vPool") +
           ", ((((long long)" + page + " * a.numKVHeads + kvh) * PAGE + " +
           get("token") + ") * D + " + get("dim") + "), " +
           (k ? "a.kTokenScale" : "a.vTokenScale") + ")";
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
  case vt::InputKind::first_token:
    // Set by the session for a flow that reads it; else never evicted.
    return "(a.firstToken ? float(a.firstToken[(long long)b * a.maxBlocks + " +
           get("block") + "]) : float(" + get("block") +
           ") * float(a.pageSize))";
  case vt::InputKind::group:
    return "float(G)";
  case vt::InputKind::layer:
    return "float(a.layer)";
  case vt::InputKind::kv_head:
    return "float(a.kvHeadBase + kvh)";
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
        int i = symbolIndex(paramIndex, "param", p.getParam().str());
        return "float(P[" + std::to_string(i) + "])";
      })
      .Case<vt::ConstantOp>([&](vt::ConstantOp c) {
        return floatLiteral(c.getValue().convertToFloat(), true);
      })
      .Case<vt::ConstLoadOp>([&](vt::ConstLoadOp c) {
        std::string name = c.getName().str();
        int i = symbolIndex(constIndex, "const", name);
        return "const_" + std::to_string(i) + "[" +
               offsetIn(Layout::of(constTypes.at(name)), idx) + "]";
      })
      .Case<vt::FieldLoadOp>([&](vt::FieldLoadOp l) {
        std::string name = l.getField().str();
        int i = symbolIndex(fieldIndex, "field", name);
        vt::TensorType type = fieldTypes.at(name);
        Layout fl = Layout::of(type);
        return "vd::load<" + storageType(type.getElementType()) + ">(field_" +
               std::to_string(i) + ", ((long long)tbl[" + idx.at("block") +
               "] * a.numKVHeads + kvh) * " + paren(elements(fl, "N")) + " + " +
               paren(offsetIn(fl, idx)) + ")";
      })
      .Case<vt::StateLoadOp>([&](vt::StateLoadOp l) {
        std::string name = l.getState().str();
        int i = symbolIndex(stateIndex, "state", name);
        Layout sl = Layout::of(stateTypes.at(name));
        std::string buffer =
            readsNewState.lookup(op) ? "stateNew_" : "stateOld_";
        return buffer + std::to_string(i) +
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

//===----------------------------------------------------------------------===//
// Inlining
//===----------------------------------------------------------------------===//

int CudaEmitter::exprSize(Value v) {
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

int CudaEmitter::inlinedSize(Operation *op) {
  if (isSource(op))
    return 1;
  int64_t n = 1;
  for (Value operand : op->getOperands())
    n = std::min<int64_t>(n + exprSize(operand), INT_MAX / 4);
  return int(n);
}

bool CudaEmitter::isSource(Operation *op) {
  return llvm::isa<vt::InputOp, vt::ParamLoadOp, vt::ConstantOp,
                   vt::ConstLoadOp, vt::FieldLoadOp, vt::StateLoadOp,
                   vt::LiteralOp>(op);
}

bool CudaEmitter::isInlined(Operation *op) {
  return op->getNumResults() == 1 && op->getNumRegions() == 0 &&
         !llvm::isa<vt::ReduceOp, vt::SoftmaxOp, vt::NormalizeOp, vt::ConvOp,
                    vt::KthLargestOp, vt::TopKOp, vt::ApproxTopKOp,
                    vt::ThresholdOp, vt::TopPOp, vt::UnionOp, vt::RademacherOp,
                    vt::GaussianOp, vt::KernelOp>(op) &&
         !op->getResult(0).getType().isa<vt::SelectionType>();
}

void CudaEmitter::blockInvariantLeaves(Value v,
                                       llvm::SetVector<Value> &leaves) {
  llvm::SetVector<Value> renamed;
  collectLeaves(v, false, LeafKind::BlockInvariant, nullptr, leaves, renamed);
  leaves.set_subtract(renamed);
}

void CudaEmitter::fieldLeaves(Value v, llvm::SetVector<Value> &leaves) {
  llvm::SetVector<Value> renamed;
  collectLeaves(v, false, LeafKind::Field, nullptr, leaves, renamed);
  leaves.set_subtract(renamed);
}

void CudaEmitter::elementInvariantLeaves(Value v, const Layout &out,
                                         llvm::SetVector<Value> &leaves) {
  llvm::SetVector<Value> renamed;
  collectLeaves(v, false, LeafKind::ElementInvariant, &out, leaves, renamed);
  leaves.set_subtract(renamed);
}

void CudaEmitter::collectLeaves(Value v, bool underRename, LeafKind kind,
                                const Layout *out,
                                llvm::SetVector<Value> &leaves,
                                llvm::SetVector<Value> &renamed) {
  auto withoutOutAxes = [&] {
    const Layout l = Layout::of(v);
    if (l.names.empty())
      return false; // a scalar: one read either way
    for (const std::string &name : out->names)
      if (l.index(name) >= 0)
        return false;
    return true;
  };
  if (kind == LeafKind::ElementInvariant &&
      (homes.count(v) || workspace.count(v)) && !hoisted.count(v)) {
    if (withoutOutAxes())
      (underRename ? renamed : leaves).insert(v);
    return;
  }
  if (homes.count(v) || workspace.count(v) || hoisted.count(v) ||
      namedScalars.count(v))
    return;
  Operation *op = v.getDefiningOp();
  if (!op)
    return;
  if (llvm::isa<vt::FieldLoadOp>(op)) {
    if (kind == LeafKind::Field)
      (underRename ? renamed : leaves).insert(v);
    return;
  }
  if (llvm::isa<vt::InputOp, vt::ConstLoadOp>(op)) {
    if ((kind == LeafKind::BlockInvariant &&
         Layout::of(v).index("block") < 0) ||
        (kind == LeafKind::ElementInvariant && withoutOutAxes()))
      (underRename ? renamed : leaves).insert(v);
    return;
  }
  if (!isInlined(op))
    return;
  underRename |= llvm::isa<vt::RenameOp, vt::SplitOp>(op);
  for (Value operand : op->getOperands())
    collectLeaves(operand, underRename, kind, out, leaves, renamed);
}
