//===- Summary.cpp - Per-program summaries of checked flows ---------------===//
//
// What the main job prints for each program: params (with their value and
// whether kernels are specialized on them), cache fields (dtype, shape and
// bytes per block next to the block's KV bytes: the indexer's byte floor),
// states, the selection with its budget at a sample context length, and the
// op counts of the vt IR per stage.
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/Driver.h"
#include "vflow/Dialect/VT/VTOps.h"
#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Json.h"

#include <cmath>
#include <cstdio>

using namespace vflow;
using namespace vflow::ast;

namespace {

/// The head dimension used to report bytes when the flow does not fix it.
constexpr int64_t kSampleHeadDim = 128;
/// The context length at which budgets are shown.
constexpr int64_t kSampleContext = 32768;
/// The group (query heads per KV head) of budgets that read `group`.
constexpr int64_t kSampleGroup = 4;

int64_t bytesOf(DType dtype) {
  return static_cast<int64_t>(rt::bytesPerElement(dtype));
}

int64_t elements(const Shape &shape, int64_t headDim) {
  int64_t n = 1;
  for (const Axis &a : shape.getAxes())
    n *= a.size == kSizeHeadDim ? headDim : a.size > 0 ? a.size : 1;
  return n;
}

/// Fields or states (name, storage dtype, shape) as the text summary lists
/// them: "kmax: bf16 [dim:D], ..." or "-".
template <typename Stored>
std::string storedText(const std::vector<Stored> &all) {
  std::string out;
  for (const Stored &v : all)
    out += (out.empty() ? "" : ", ") + v.name + ": " + dtypeName(v.dtype) +
           " " + v.shape.str();
  return out.empty() ? "-" : out;
}

/// A field or state as the JSON summary lists it: name, dtype, shape.
template <typename Stored> rt::Json storedJSON(const Stored &v) {
  rt::Json j = rt::Json::object();
  j.set("name", v.name);
  j.set("dtype", dtypeName(v.dtype));
  j.set("shape", v.shape.str());
  return j;
}

std::string formatValue(const ParamInfo &p) {
  char buf[64];
  if (p.type == ParamType::Bool)
    return p.value != 0 ? "true" : "false";
  if (p.type == ParamType::Int)
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(p.value));
  else
    std::snprintf(buf, sizeof(buf), "%g", p.value);
  return buf;
}

/// The budget (k or max) of the returned selection at a sample length, as
/// the host rounds it; unbounded for a threshold or topp without max (up to
/// every block). NaN cannot reach here from a checked program (the checker
/// samples this length), but is shown as such, never as unbounded.
struct SampleBudget {
  enum Kind { Blocks, Unbounded, NaN } kind = Unbounded;
  int64_t blocks = 0;
};

SampleBudget sampleBudget(const Expr *sel, const FlowInfo &flow, int64_t blocks,
                          int64_t group, int64_t layer = 0,
                          int64_t kvHead = 0) {
  SampleBudget out;
  // A let-bound selection (`let recent = topk(...)`) is its binding.
  while (auto *name = sel ? dyn_cast<NameExpr>(sel) : nullptr) {
    if (name->ref != NameRef::Let || !name->binding)
      return out;
    sel = name->binding;
  }
  auto *call = sel ? dyn_cast<CallExpr>(sel) : nullptr;
  if (!call)
    return out;
  // topk(..., per = head) takes up to k blocks per query head.
  const double per = call->namedArg("per") ? double(group) : 1.0;
  auto evaluate = [&](const Expr &k) {
    std::optional<double> v = evaluateBudgetValue(
        k, flow, blocks, kSampleContext, group, layer, kvHead);
    if (v)
      *v *= per;
    if (!v)
      return out; // Not computable on the host: not a checked program.
    SampleBudget b;
    b.kind = std::isnan(*v) ? SampleBudget::NaN : SampleBudget::Blocks;
    b.blocks = std::min(roundBudget(*v), blocks);
    return b;
  };
  switch (call->builtin) {
  case Builtin::TopK:
  case Builtin::ApproxTopK:
    return evaluate(*call->args[1].value);
  case Builtin::Threshold:
  case Builtin::TopP:
    if (const CallArg *max = call->namedArg("max"))
      return evaluate(*max->value);
    out.kind = SampleBudget::Blocks;
    out.blocks = blocks;
    return out;
  case Builtin::Union: {
    SampleBudget total;
    total.kind = SampleBudget::Blocks;
    for (const CallArg &a : call->args) {
      SampleBudget k =
          sampleBudget(a.value.get(), flow, blocks, group, layer, kvHead);
      if (k.kind != SampleBudget::Blocks && total.kind != SampleBudget::NaN)
        total.kind = k.kind;
      total.blocks += k.blocks;
    }
    total.blocks = std::min(total.blocks, blocks);
    return total;
  }
  default:
    return out;
  }
}

std::string budgetText(const SampleBudget &b) {
  switch (b.kind) {
  case SampleBudget::Blocks:
    return std::to_string(b.blocks);
  case SampleBudget::Unbounded:
    return "unbounded";
  case SampleBudget::NaN:
    return "NaN (selects nothing)";
  }
  return "";
}

struct FlowFacts {
  int64_t headDim, blockSize, fieldBytes, kvBytes, blocks;
  SampleBudget budget;
  /// Whether the budget depends on the group, the layer or the KV head
  /// (then the text says at which it is shown: group 4, layer 0, KV head 0).
  bool readsGroup = false, readsLayer = false, readsKVHead = false;
};

FlowFacts facts(const FlowInfo &flow) {
  FlowFacts f;
  f.headDim = flow.findAxis("dim")->size > 0 ? flow.findAxis("dim")->size
                                             : kSampleHeadDim;
  f.blockSize = flow.blockSize();
  f.fieldBytes = 0;
  for (const FieldInfo &field : flow.fields)
    f.fieldBytes += elements(field.shape, f.headDim) * bytesOf(field.dtype);
  f.kvBytes = 2 * f.blockSize * f.headDim * 2; // K and V in bf16.
  f.blocks = (kSampleContext + f.blockSize - 1) / f.blockSize;
  f.budget = sampleBudget(flow.selection, flow, f.blocks, kSampleGroup);
  // Whether the budget depends on the group (then the text says which).
  auto differs = [&](const SampleBudget &other) {
    return other.kind != f.budget.kind || other.blocks != f.budget.blocks;
  };
  f.readsGroup = differs(sampleBudget(flow.selection, flow, f.blocks, 1));
  for (int64_t i : {1, 3, 7, 15, 31}) {
    f.readsLayer |= differs(
        sampleBudget(flow.selection, flow, f.blocks, kSampleGroup, i, 0));
    f.readsKVHead |= differs(
        sampleBudget(flow.selection, flow, f.blocks, kSampleGroup, 0, i));
  }
  return f;
}

/// The retain block's capacity in blocks (it reads params, literals and
/// group only), or -1 without one.
int64_t retainCapacity(const FlowInfo &flow) {
  if (!flow.retainCapacity)
    return -1;
  std::optional<double> v = evaluateBudgetValue(
      *flow.retainCapacity, flow, 0, kSampleContext, kSampleGroup, 0, 0);
  return v && !std::isnan(*v) ? roundBudget(*v) : -1;
}

std::string retainText(const Compilation &c, const FlowInfo &flow) {
  return collapseWhitespace(c.buffer->getRangeText(flow.retainScore->range)) +
         ", keeping " + std::to_string(retainCapacity(flow)) +
         (flow.retainTokens ? " tokens" : " blocks") + " (combine " +
         flow.retainCombine + ")";
}

std::string selectionText(const Compilation &c, const FlowInfo &flow) {
  return collapseWhitespace(c.buffer->getRangeText(flow.selection->range));
}

/// Every flow op of the vt module by name, found in one pass (a walk per
/// flow would make the summary quadratic in the number of flows).
std::map<std::string, mlir::Operation *> flowOps(const Compilation &c) {
  std::map<std::string, mlir::Operation *> ops;
  if (!c.vt)
    return ops;
  mlir::ModuleOp module = const_cast<Compilation &>(c).vt.get();
  for (vt::FlowOp op : module.getBody()->getOps<vt::FlowOp>())
    ops[op.getSymName().str()] = op;
  return ops;
}

mlir::Operation *findFlowOp(const std::map<std::string, mlir::Operation *> &ops,
                            const std::string &name) {
  auto it = ops.find(name);
  return it == ops.end() ? nullptr : it->second;
}

std::string opCountsText(const std::map<std::string, unsigned> &counts) {
  unsigned total = 0;
  std::string parts;
  for (const auto &entry : counts) {
    total += entry.second;
    std::string name = entry.first;
    if (name.rfind("vt.", 0) == 0)
      name = name.substr(3);
    parts +=
        (parts.empty() ? "" : ", ") + name + " " + std::to_string(entry.second);
  }
  return std::to_string(total) + " ops (" + parts + ")";
}

} // namespace

std::string vflow::summarizeText(const Compilation &c) {
  std::string out = c.buffer->getName() + "\n";
  std::map<std::string, mlir::Operation *> ops = flowOps(c);
  for (const FlowInfo &flow : c.checked.flows) {
    FlowFacts f = facts(flow);
    out += "  flow " + flow.name + "\n";
    std::string params;
    for (const ParamInfo &p : flow.params) {
      if (p.reserved && !p.declared && !p.overridden)
        continue;
      params += (params.empty() ? "" : ", ") + p.name + " = " + formatValue(p) +
                (p.compileTime ? " (compile-time)" : "");
    }
    out += "    params     " + (params.empty() ? "-" : params) + "\n";
    out += "    fields     " + storedText(flow.fields) + "\n";
    char bytes[160];
    std::snprintf(bytes, sizeof(bytes),
                  "%lld B per block and KV head at D=%lld, P=%lld (KV: %lld "
                  "B, ratio %.3f)",
                  (long long)f.fieldBytes, (long long)f.headDim,
                  (long long)f.blockSize, (long long)f.kvBytes,
                  double(f.fieldBytes) / double(f.kvBytes));
    out += "    field size " + std::string(bytes) + "\n";
    out += "    states     " + storedText(flow.states) + "\n";
    std::string consts;
    for (const ConstInfo &k : flow.consts)
      consts += (consts.empty() ? "" : ", ") + k.name + " " + k.shape.str();
    if (!consts.empty())
      out += "    consts     " + consts + "\n";
    out += "    selection  " + selectionText(c, flow) + "\n";
    out += "    budget     " + budgetText(f.budget) + " of " +
           std::to_string(f.blocks) + " blocks at " +
           std::to_string(kSampleContext) + " tokens" +
           (f.readsGroup ? " and group " + std::to_string(kSampleGroup) : "") +
           (f.readsLayer ? " and layer 0" : "") +
           (f.readsKVHead ? " and kv_head 0" : "") + ", plus keep_first " +
           formatValue(*flow.findParam("keep_first")) + " and keep_last " +
           formatValue(*flow.findParam("keep_last")) + "\n";
    if (flow.retainScore)
      out += "    retain     " + retainText(c, flow) + "\n";
    if (mlir::Operation *op = findFlowOp(ops, flow.name)) {
      auto counts = countOps(op);
      for (const char *region : {"const", "cache_stage", "index_stage"})
        if (counts.count(region))
          out += std::string("    vt ") + region +
                 std::string(12 - std::string(region).size(), ' ') +
                 opCountsText(counts[region]) + "\n";
    }
  }
  return out;
}

std::string vflow::summarizeJSON(const Compilation &c) {
  using rt::Json;
  std::map<std::string, mlir::Operation *> ops = flowOps(c);
  Json flows = Json::array();
  for (const FlowInfo &flow : c.checked.flows) {
    FlowFacts f = facts(flow);
    Json out = Json::object();
    out.set("name", flow.name);
    Json params = Json::array();
    for (const ParamInfo &p : flow.params) {
      Json param = Json::object();
      param.set("name", p.name);
      param.set("type", paramTypeName(p.type));
      param.set("value",
                p.type == ParamType::Bool ? Json(p.value != 0) : Json(p.value));
      param.set("compile_time", p.compileTime);
      param.set("reserved", p.reserved);
      param.set("overridden", p.overridden);
      params.push(std::move(param));
    }
    out.set("params", std::move(params));
    Json fields = Json::array();
    for (const FieldInfo &field : flow.fields)
      fields.push(storedJSON(field));
    out.set("fields", std::move(fields));
    Json states = Json::array();
    for (const StateInfo &s : flow.states) {
      Json j = storedJSON(s);
      j.set("per_block", s.perBlock());
      states.push(std::move(j));
    }
    out.set("states", std::move(states));
    out.set("selection", selectionText(c, flow));
    out.set("field_bytes_per_block", f.fieldBytes);
    out.set("kv_bytes_per_block", f.kvBytes);
    out.set("sample_context", kSampleContext);
    out.set("sample_blocks", f.blocks);
    if (f.readsGroup)
      out.set("sample_group", kSampleGroup);
    if (f.readsLayer)
      out.set("sample_layer", 0);
    if (f.readsKVHead)
      out.set("sample_kv_head", 0);
    out.set("sample_budget", f.budget.kind == SampleBudget::Blocks
                                 ? Json(f.budget.blocks)
                                 : Json());
    if (f.budget.kind == SampleBudget::NaN)
      out.set("sample_budget_nan", true);
    if (flow.retainScore) {
      Json retain = Json::object();
      retain.set("score", collapseWhitespace(
                              c.buffer->getRangeText(flow.retainScore->range)));
      retain.set("capacity", retainCapacity(flow));
      retain.set("combine", flow.retainCombine);
      retain.set("grain", flow.retainTokens ? "token" : "block");
      out.set("retain", std::move(retain));
    }
    Json vtOps = Json::object();
    if (mlir::Operation *op = findFlowOp(ops, flow.name))
      for (const auto &region : countOps(op)) {
        Json counts = Json::object();
        for (const auto &entry : region.second)
          counts.set(entry.first, entry.second);
        vtOps.set(region.first, std::move(counts));
      }
    out.set("vt_ops", std::move(vtOps));
    flows.push(std::move(out));
  }
  Json doc = Json::object();
  doc.set("file", c.buffer->getName());
  doc.set("flows", std::move(flows));
  return doc.dump();
}
