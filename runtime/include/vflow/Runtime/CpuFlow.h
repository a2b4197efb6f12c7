//===- CpuFlow.h - Run a flow's generated C++ on the host -------*- C++ -*-===//
//
// The CPU backend's runtime side: a flow compiled from the C++ that
// `vflowc --emit=cpp` prints (vflow::emitCpp), loaded through HostJit and
// bound to a head dimension and a GQA group size. It computes exactly what
// the reference interpreter computes: the fields of a complete block, and
// per decode step the selection and the new states of one (sequence, kv
// head).
//
// CpuFlowInfo is the metadata it needs besides the source; the compiler
// fills one from the IR (vflow::describeCpuFlow), an artifact loader from
// its manifest.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CPUFLOW_H
#define VFLOW_RUNTIME_CPUFLOW_H

#include "vflow/Runtime/AxisSize.h"
#include "vflow/Runtime/Budget.h"
#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/HostJit.h"
#include "vflow/Runtime/KernelABI.h"
#include "vflow/Runtime/Params.h"
#include "vflow/Runtime/Retain.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace vflow {
namespace rt {

/// Symbolic sizes in CpuTensorSpec::sizes, in the vt dialect's encoding
/// (AxisSize.h): N (complete blocks), G (query heads per kv head) and D
/// (head dimension).
constexpr int64_t kCpuSizeBlocks = kAxisSizeBlocks;
constexpr int64_t kCpuSizeGroup = kAxisSizeGroup;
constexpr int64_t kCpuSizeHeadDim = kAxisSizeHeadDim;

/// A const, field or state: its axes (declaration order, which is the
/// memory layout) and storage dtype. A field's axes are per block (no
/// `block`); a per-block state has `block` (first).
struct CpuTensorSpec {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::string> axes;
  std::vector<int64_t> sizes;
  /// A state's initial value.
  float init = 0.0f;
};

struct CpuFlowInfo {
  std::string flowName;
  /// Every param in declaration order (the order of VflowIndexArgs::params),
  /// with its type and whether the code was specialized on it.
  std::vector<ParamSpec> params;
  std::vector<CpuTensorSpec> consts, fields, states;
  /// The index stage reads `mass` / `K` and `V`.
  bool readsMass = false, readsKV = false;
  /// The consts' values when they are known already (an artifact's, for
  /// this head dimension): used instead of running the consts entry point.
  std::vector<std::vector<float>> constValues;
  /// The budgets and the selection's bound (Budget.h).
  std::vector<BudgetExpr> budgets;
  std::vector<SelectionNode> selection;
  /// The retain block: its capacity's budget (-1 without one), how the
  /// scores combine over KV heads and layers ("sum" or "max"), and whether
  /// it scores tokens ([block, token]: capacity in tokens) or blocks.
  int64_t retainBudget = -1;
  std::string retainCombine;
  bool retainTokens = false;
};

/// Per-(sequence, kv head) states, in declaration order.
using CpuStates = std::vector<std::vector<float>>;

/// What one index step reads (plain arrays, see KernelABI.h for layouts).
struct CpuIndexInputs {
  const float *q = nullptr;               ///< [group, headDim]
  std::vector<const float *> fields;      ///< per field: [numBlocks, ...]
  const float *mass = nullptr;            ///< [numBlocks, group], if read
  const float *K = nullptr, *V = nullptr; ///< [numBlocks, blockSize, headDim]
  int64_t numBlocks = 0, contextLen = 0, step = 0;
  /// The model's layer and KV head this step runs for (`layer`, `kv_head`).
  int64_t layer = 0, kvHead = 0;
  /// [numBlocks] original position of each block's first token (the
  /// `first_token` input); null: block * block_size.
  const float *firstToken = nullptr;
};

class CpuFlow {
public:
  /// Compiles (or loads from the JIT cache) `source`, which defines the
  /// entry points of `info.flowName`, and materializes the consts for
  /// (headDim, group). Throws Error.
  CpuFlow(const std::string &source, CpuFlowInfo info, int64_t headDim,
          int64_t group, HostJitOptions options = {});
  ~CpuFlow();

  const CpuFlowInfo &info() const { return flowInfo; }
  int64_t headDim() const { return dim; }
  int64_t group() const { return groupSize; }
  int64_t blockSize() const;
  int64_t keepFirst() const;
  int64_t keepLast() const;
  const HostJit &jit() const { return *library; }

  /// Sets a run-time param; a compile-time or unknown one is an Error.
  void setParam(const std::string &name, double value);
  double param(const std::string &name) const;

  /// Values of one block of field `i` (its per-block element count).
  int64_t fieldElements(size_t i) const;
  /// The materialized consts, in declaration order.
  const std::vector<std::vector<float>> &consts() const { return constValues; }

  /// Runs the cache stage on one complete block; K and V are [blockSize,
  /// headDim]. `fields` is resized to one vector per field, each holding the
  /// block's values rounded to the field's storage dtype.
  void runCacheStage(const float *K, const float *V,
                     std::vector<std::vector<float>> &fields) const;

  /// Fresh states for a sequence of `numBlocks` complete blocks.
  CpuStates initialStates(int64_t numBlocks) const;
  /// Grows per-block states to `numBlocks` blocks with init values.
  void growStates(CpuStates &states, int64_t numBlocks) const;

  /// One decode step: the selection (ascending logical ids, kept blocks
  /// excluded). Grows per-block states to inputs.numBlocks first and
  /// updates `states`.
  /// With `retainScore` ([inputs.numBlocks], times the block size for a
  /// token-grain score) a flow with a retain block
  /// also writes its score there.
  std::vector<int64_t> runIndexStage(const CpuIndexInputs &inputs,
                                     CpuStates &states,
                                     float *retainScore = nullptr) const;
  /// The flow has a retain block.
  bool retains() const { return flowInfo.retainBudget >= 0; }
  /// The retain block's rule with the current params (its capacity is a
  /// budget that reads params, literals and `group` only).
  RetainRule retainRule() const;

  /// The selection plus the kept first and last blocks, sorted.
  std::vector<int64_t> finalBlocks(const std::vector<int64_t> &selection,
                                   int64_t numBlocks) const;

  /// The selection's budget as the host evaluates it, in [0, numBlocks]:
  /// the most over the budget scope's layers and KV heads.
  int64_t budget(int64_t numBlocks, int64_t contextLen) const;
  /// The layers and KV heads the index stage runs for (FlowParams::setScope;
  /// the group stays the flow's). Until set: layer 0 and KV head 0, and an
  /// index step elsewhere is an Error when a budget reads `layer` or
  /// `kv_head`.
  void setBudgetScope(int64_t firstLayer, int64_t numLayers,
                      int64_t firstKVHead, int64_t numKVHeads);
  const FlowParams &flowParams() const { return params; }

  /// Throws Error when a budget expression of the index stage is NaN or
  /// negative with the current params at one of limits::budgetSampleBlocks
  /// (checked on construction and by setParam, which then keeps the old
  /// value).
  void checkBudgets() const;
  /// The same at one sequence's length (FlowParams::checkBudgetsAt).
  void checkBudgetsAt(int64_t contextLen) const;

private:
  int64_t resolve(int64_t size, int64_t numBlocks) const;
  int64_t elements(const CpuTensorSpec &spec, int64_t numBlocks) const;

  CpuFlowInfo flowInfo;
  int64_t dim = 0, groupSize = 0;
  std::unique_ptr<HostJit> library;
  FlowParams params;
  std::vector<std::vector<float>> constValues;
  std::vector<const float *> constPtrs;
  VflowCacheFn cacheFn = nullptr;
  VflowIndexFn indexFn = nullptr;
};

} // namespace rt
} // namespace vflow

#endif // VFLOW_RUNTIME_CPUFLOW_H
