//===- ArtifactValidation.cpp - An artifact's metadata checked
//-------------===//
//
// validateFlowArtifact: a flow's metadata against itself, the limits of
// Limits.h and the signature its code carries (Artifact.h).
//
//===----------------------------------------------------------------------===//

#include "vflow/Runtime/Artifact.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Limits.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

using namespace vflow::rt;
namespace limits = vflow::limits;

//===----------------------------------------------------------------------===//
// Validation
//===----------------------------------------------------------------------===//

namespace {

/// A name as the language writes it; `dotted` also allows the names the
/// compiler makes itself ("hoisted.0").
bool isIdentifier(const std::string &name, bool dotted = false,
                  size_t maxLength = 64) {
  if (name.empty() || name.size() > maxLength ||
      !(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_'))
    return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' &&
        !(dotted && c == '.'))
      return false;
  return true;
}

/// Collects the problems of one flow; the first one is thrown.
class FlowChecker {
public:
  FlowChecker(const FlowArtifact &f, const std::string &source)
      : f(f), where(source + ": flow '" + f.name + "'") {}

  void run() {
    if (!isIdentifier(f.name))
      fail("the flow name is not an identifier of at most 64 characters");
    checkParams();
    std::set<std::string> names;
    for (const ArtifactParam &p : f.params)
      names.insert(p.name);
    for (const ArtifactTensor &t : f.consts)
      checkTensor(t, "const", names);
    for (const ArtifactTensor &t : f.fields)
      checkTensor(t, "field", names);
    for (const ArtifactTensor &t : f.states)
      checkTensor(t, "state", names);
    checkInputs();
    checkConstValues();
    for (const BudgetExpr &b : f.budgets)
      validateBudget(b, f.params.size(), where);
    validateSelection(f.selectionBudget, f.budgets.size(), where);
    checkCode();
    checkGpu();
  }

private:
  const FlowArtifact &f;
  std::string where;

  [[noreturn]] void fail(const std::string &why) const {
    throw Error(where + ": " + why +
                " (the artifact is damaged or was edited; recompile the "
                "program with vflowc)");
  }

  const ArtifactParam &reserved(const char *name, int64_t lo, int64_t hi,
                                bool compileTime) const {
    const ArtifactParam *p = f.findParam(name);
    if (!p)
      fail(std::string("it has no '") + name + "' param");
    if (p->type != "int" || p->value != std::floor(p->value) ||
        p->value < double(lo) || p->value > double(hi))
      fail(std::string("param '") + name + "' must be an int in [" +
           std::to_string(lo) + ", " + std::to_string(hi) + "]");
    if (compileTime && !p->compileTime)
      fail(std::string("param '") + name + "' must be compile-time");
    return *p;
  }

  void checkParams() const {
    std::set<std::string> seen;
    for (const ArtifactParam &p : f.params) {
      if (!isIdentifier(p.name))
        fail("param name '" + p.name + "' is not an identifier");
      if (!seen.insert(p.name).second)
        fail("param '" + p.name + "' is declared twice");
      std::string what = "param '" + p.name + "'";
      if (std::isnan(p.value))
        fail(what + " is NaN");
      if (p.type == "int" &&
          (p.value != std::floor(p.value) ||
           std::fabs(p.value) > double(limits::kMaxExactInt)))
        fail(what + " is an int but its value is not an integer within "
                    "+-2^53");
      if (p.type == "bool" && p.value != 0 && p.value != 1)
        fail(what + " is a bool but its value is not 0 or 1");
    }
    const ArtifactParam &bs = reserved("block_size", 1, 1024, true);
    int64_t blockSize = static_cast<int64_t>(bs.value);
    if (blockSize & (blockSize - 1))
      fail("block_size " + std::to_string(blockSize) +
           " is not a power of two");
    if (blockSize != f.blockSize)
      fail("its block_size (" + std::to_string(f.blockSize) +
           ") differs from its param's (" + std::to_string(blockSize) + ")");
    const int64_t big = limits::kMaxExactInt;
    if (int64_t(reserved("keep_first", 0, big, false).value) != f.keepFirst)
      fail("its keep_first differs from its param's");
    if (int64_t(reserved("keep_last", 0, big, false).value) != f.keepLast)
      fail("its keep_last differs from its param's");
    if (int64_t(reserved("head_dim", 0, limits::kMaxHeadDim, true).value) !=
        f.headDim)
      fail("its head_dim differs from its param's");
  }

  void checkTensor(const ArtifactTensor &t, const std::string &kind,
                   std::set<std::string> &names) const {
    std::string what = kind + " '" + t.name + "'";
    if (!isIdentifier(t.name, /*dotted=*/true))
      fail(kind + " name '" + t.name + "' is not an identifier");
    if (!names.insert(t.name).second)
      fail(what + ": the name is used twice");
    std::set<std::string> axes;
    int64_t worst = 1, fixed = 1;
    bool hasBlock = false;
    for (size_t i = 0; i < t.axes.size(); ++i) {
      const ArtifactAxis &a = t.axes[i];
      std::string axis = what + " axis '" + a.name + "'";
      if (!isIdentifier(a.name) || !axes.insert(a.name).second)
        fail(axis + " is not a valid, distinct axis name");
      if (a.name == "token")
        fail(axis + ": a " + kind + " cannot have the token axis");
      int64_t size = a.size;
      if (a.name == "block") {
        if (kind != "state" || i != 0 || size != -1)
          fail(axis + ": only states have the block axis, first and of size "
                      "N");
        hasBlock = true;
        continue;
      }
      if (a.name == "head") {
        if (kind != "state" || size != -2)
          fail(axis + ": only states have the head axis, of size G");
        worst = limits::boundedProduct(worst, limits::kMaxGroup,
                                       limits::kMaxElements);
      } else if (a.name == "dim") {
        if (!(size == -3 || (f.headDim > 0 && size == f.headDim)))
          fail(axis + ": the dim axis must have size D (or head_dim)");
        worst = limits::boundedProduct(
            worst, f.headDim > 0 ? f.headDim : limits::kMaxHeadDim,
            limits::kMaxElements);
      } else if (size == -3) {
        // A user axis of size D (a renamed `dim`).
        worst = limits::boundedProduct(
            worst, f.headDim > 0 ? f.headDim : limits::kMaxHeadDim,
            limits::kMaxElements);
      } else if (size == -2) {
        // A user axis of size G (a renamed `head`): per sequence only.
        if (kind != "state")
          fail(axis + ": only states have an axis of size G");
        worst = limits::boundedProduct(worst, limits::kMaxGroup,
                                       limits::kMaxElements);
      } else {
        if (size < 1 || size > limits::kMaxAxisSize)
          fail(axis + " has size " + std::to_string(size) + ", not in [1, " +
               std::to_string(limits::kMaxAxisSize) + "]");
        worst = limits::boundedProduct(worst, size, limits::kMaxElements);
        fixed = limits::boundedProduct(fixed, size, limits::kMaxStaticElements);
      }
      if (worst < 0 || fixed < 0)
        fail(what + " has more elements than the limits allow");
    }
    if (kind == "state" && hasBlock != t.perBlock)
      fail(what + ": per_block disagrees with its axes");
    if (kind != "state" && t.perBlock)
      fail(what + " is marked per block");
  }

  void checkConstValues() const {
    std::set<int64_t> dims;
    for (const FlowArtifact::ConstValues &c : f.constValues) {
      std::string what =
          "const values for head dim " + std::to_string(c.headDim);
      if (c.headDim < 1 || c.headDim > limits::kMaxHeadDim ||
          !dims.insert(c.headDim).second)
        fail(what + ": the head dim is out of range or repeated");
      if (f.headDim > 0 && c.headDim != f.headDim)
        fail(what + ": the flow is specialized to head_dim " +
             std::to_string(f.headDim));
      if (c.values.size() != f.consts.size())
        fail(what + ": " + std::to_string(c.values.size()) + " arrays for " +
             std::to_string(f.consts.size()) + " consts");
      for (size_t i = 0; i < c.values.size(); ++i)
        if (int64_t(c.values[i].size()) !=
            f.consts[i].elements(c.headDim, /*group=*/1))
          fail(what + ": const '" + f.consts[i].name + "' has " +
               std::to_string(c.values[i].size()) + " values, not " +
               std::to_string(f.consts[i].elements(c.headDim, 1)));
    }
  }

  void checkInputs() const {
    static const std::set<std::string> known = {
        "q",           "mass", "position", "K",     "V",       "num_blocks",
        "context_len", "step", "group",    "layer", "kv_head", "first_token"};
    std::set<std::string> seen;
    for (const std::string &in : f.indexInputs)
      if (!known.count(in) || !seen.insert(in).second)
        fail("index input '" + in + "' is unknown or repeated");
  }

  void checkCode() const {
    std::string signature = flowSignature(f);
    std::string line = kSignaturePrefix + signature + "\n";
    bool cpp = false;
    for (const ArtifactSource &src : f.sources) {
      if (src.language != "c++")
        fail("source '" + src.name + "' has an unknown language '" +
             src.language + "'");
      if (src.text.compare(0, line.size(), line) != 0)
        fail("source '" + src.name +
             "' was not generated for this metadata (its signature line "
             "does not match)");
      cpp = true;
    }
    if (!cpp)
      fail("it has no C++ source");
    std::map<std::string, std::string> expected;
    for (const char *role : {"consts", "cache", "index"})
      expected[role] = "vflow_" + f.name + "_" + role;
    if (f.entryPoints != expected)
      fail("its entry points are not vflow_" + f.name +
           "_{consts,cache,index}");
    if (!f.gpu.source.empty() &&
        f.gpu.source.compare(0, line.size(), line) != 0)
      fail("its CUDA source was not generated for this metadata (its "
           "signature line does not match)");
  }

  void checkGpu() const {
    if (f.gpu.source.empty()) {
      if (!f.gpu.kernels.empty() || !f.gpu.binaries.empty())
        fail("it has GPU kernels or binaries but no CUDA source");
      return;
    }
    bool firstIndex = true;
    for (const GpuKernelInfo &k : f.gpu.kernels) {
      const bool index = k.grid == GpuGrid::Tile || k.grid == GpuGrid::Row;
      if (k.appends && !(index && firstIndex))
        fail("GPU kernel '" + k.symbol +
             "' appends but is not the first index kernel");
      firstIndex = firstIndex && !index;
      if (!isIdentifier(k.symbol, false, 256))
        fail("GPU kernel symbol '" + k.symbol + "' is not an identifier");
      if ((k.grid == GpuGrid::Tile) != (k.planTile > 0) || k.planTile < 0)
        fail("GPU kernel '" + k.symbol + "' of grid " + gpuGridName(k.grid) +
             " has plan_tile " + std::to_string(k.planTile) +
             " (a tile kernel's is at least 1, any other's 0)");
      for (const auto *lists : {&k.perBlockShared, &k.fixedShared})
        for (const std::vector<int64_t> &sizes : *lists)
          checkSizes(sizes, "GPU kernel '" + k.symbol + "' shared memory");
    }
    const auto retainKernels = std::count_if(
        f.gpu.kernels.begin(), f.gpu.kernels.end(),
        [](const GpuKernelInfo &k) { return k.grid == GpuGrid::Retain; });
    // One retain kernel per retain block (its score per block, or per
    // token at token grain).
    const bool wantsKernel = f.retains();
    if (retainKernels != (wantsKernel ? 1 : 0))
      fail(wantsKernel ? "it has a retain block but not one retain kernel"
                       : "it has a retain kernel but no retain block");
    for (const GpuWorkspaceSlot &slot : f.gpu.workspace)
      checkSizes(slot.sizes, "GPU workspace");
    for (const GpuBinary &b : f.gpu.binaries) {
      if (b.group < 1 || b.group > limits::kMaxGroup || b.headDim < 1 ||
          b.headDim > limits::kMaxHeadDim)
        fail("a PTX binary has an invalid group or head dimension");
      if (!isGpuKVDType(b.kvDType))
        fail(std::string("a PTX binary has KV dtype ") + dtypeName(b.kvDType) +
             " (the GPU's are " + gpuKVDTypeList() + ")");
    }
  }

  void checkSizes(const std::vector<int64_t> &sizes,
                  const std::string &what) const {
    int64_t worst = 1;
    for (int64_t s : sizes) {
      int64_t n = s == -2                               ? limits::kMaxGroup
                  : s == -3                             ? limits::kMaxHeadDim
                  : s >= 1 && s <= limits::kMaxAxisSize ? s
                                                        : -1;
      if (n < 0)
        fail(what + " has a size " + std::to_string(s) + " out of range");
      worst = limits::boundedProduct(worst, n, limits::kMaxElements);
      if (worst < 0)
        fail(what + " is larger than the limits allow");
    }
  }
};

} // namespace

void vflow::rt::validateFlowArtifact(const FlowArtifact &flow,
                                     const std::string &source) {
  FlowChecker(flow, source).run();
}
