//===- Artifact.cpp - Planned vt IR to an artifact ------------------------===//
//
// Builds on the backends (CppEmitter, CudaEmitter), the budgets and the
// reference interpreter; nothing below calls back into it. The compile API
// (Compile.h, Emit.cpp) builds on it.
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/Artifact.h"
#include "vflow/Compiler/ASTToVT.h"
#include "vflow/Compiler/Budgets.h"
#include "vflow/Compiler/CppEmitter.h"
#include "vflow/Compiler/CudaEmitter.h"
#include "vflow/Compiler/Interpreter.h"
#include "vflow/Compiler/ParamSpec.h"
#include "vflow/Compiler/Passes.h"
#include "vflow/Compiler/StorageDType.h"
#include "vflow/Runtime/Limits.h"

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/raw_ostream.h"

using namespace vflow;

const char *vflow::compilerVersion() { return "vflowc 0.1 (vt dialect v1)"; }

namespace {

rt::ArtifactTensor tensorOf(llvm::StringRef name, vt::TensorType type) {
  rt::ArtifactTensor t;
  t.name = name.str();
  t.dtype = storageDType(type.getElementType());
  for (vt::AxisAttr a : type.getAxes())
    t.axes.push_back({a.getName().str(), a.getSize()});
  return t;
}

rt::FlowArtifact flowArtifact(vt::FlowOp flow, const FlowInfo *info,
                              const SourceBuffer &buffer) {
  rt::FlowArtifact f;
  f.name = flow.getSymName().str();
  for (auto param : flow.getBody()->getOps<vt::ParamOp>()) {
    rt::ArtifactParam p = paramSpecOf(param);
    if (p.name == "block_size")
      f.blockSize = static_cast<int64_t>(p.value);
    else if (p.name == "keep_first")
      f.keepFirst = static_cast<int64_t>(p.value);
    else if (p.name == "keep_last")
      f.keepLast = static_cast<int64_t>(p.value);
    else if (p.name == "head_dim")
      f.headDim = static_cast<int64_t>(p.value);
    f.params.push_back(p);
  }
  for (auto c : flow.getBody()->getOps<vt::ConstOp>())
    f.consts.push_back(tensorOf(c.getSymName(), c.getTensorType()));
  for (auto field : flow.getBody()->getOps<vt::CacheFieldOp>())
    f.fields.push_back(tensorOf(field.getSymName(), field.getTensorType()));
  for (auto state : flow.getBody()->getOps<vt::StateOp>()) {
    rt::ArtifactTensor t = tensorOf(state.getSymName(), state.getTensorType());
    t.perBlock = state.getTensorType().hasAxis("block");
    t.init = state.getInit().convertToFloat();
    f.states.push_back(t);
  }
  std::set<std::string> inputs;
  flow.getIndexStage().walk([&](vt::InputOp in) {
    inputs.insert(vt::stringifyInputKind(in.getKind()).str());
  });
  f.indexInputs.assign(inputs.begin(), inputs.end());
  if (info && info->selection)
    f.selection = buffer.getRangeText(info->selection->range);
  for (const char *role : {"consts", "cache", "index"})
    f.entryPoints[role] = "vflow_" + f.name + "_" + role;
  return f;
}

/// The consts' values for every head dimension a GPU session may use, by
/// the reference interpreter (so the GPU needs no host compiler for them).
bool computeConstValues(vt::FlowOp flow, rt::FlowArtifact &f,
                        std::string &error) {
  if (f.consts.empty())
    return true;
  std::vector<int64_t> dims(std::begin(limits::kConstValueHeadDims),
                            std::end(limits::kConstValueHeadDims));
  if (f.headDim > 0)
    dims = {f.headDim};
  for (int64_t d : dims) {
    std::string why;
    auto fi = interp::FlowInterpreter::create(flow, d, /*group=*/1, {}, why);
    if (!fi) {
      error = "flow '" + f.name + "': cannot compute its consts for head dim " +
              std::to_string(d) + ": " + why;
      return false;
    }
    rt::FlowArtifact::ConstValues entry;
    entry.headDim = d;
    for (const rt::ArtifactTensor &c : f.consts) {
      const interp::Tensor &t = fi->getConsts().at(c.name);
      std::vector<std::string> axes;
      for (const rt::ArtifactAxis &a : c.axes)
        axes.push_back(a.name);
      if (t.names != axes) {
        error = "flow '" + f.name + "': const '" + c.name +
                "' is laid out as " + t.shapeString() +
                ", not in its declared axis order";
        return false;
      }
      entry.values.push_back(t.data);
    }
    f.constValues.push_back(std::move(entry));
  }
  return true;
}

} // namespace

bool vflow::buildArtifact(Compilation &c, rt::Artifact &artifact,
                          std::string &error) {
  mlir::MLIRContext *context = c.vt->getContext();
  mlir::PassManager pm(context);
  buildCompilerPipeline(pm);
  std::string messages;
  {
    mlir::ScopedDiagnosticHandler handler(context, [&](mlir::Diagnostic &d) {
      messages += d.str() + "; ";
      return mlir::success();
    });
    if (mlir::failed(pm.run(*c.vt))) {
      error = "the pass pipeline failed: " + messages;
      return false;
    }
  }
  artifact = rt::Artifact();
  artifact.compiler = compilerVersion();
  for (auto flow : c.vt->getBody()->getOps<vt::FlowOp>()) {
    const FlowInfo *info = nullptr;
    for (const FlowInfo &fi : c.checked.flows)
      if (fi.name == flow.getSymName())
        info = &fi;
    rt::FlowArtifact f = flowArtifact(flow, info, *c.buffer);
    std::string emitError;
    FlowBudgets budgets;
    if (!describeBudgets(flow, budgets, emitError)) {
      error = "flow '" + f.name + "': " + emitError;
      return false;
    }
    f.budgets = std::move(budgets.budgets);
    f.selectionBudget = std::move(budgets.selection);
    f.retainBudget = budgets.retainBudget;
    auto ret = llvm::cast<vt::ReturnOp>(
        flow.getIndexStage().getBody().front().getTerminator());
    if (auto combine = ret.getCombine()) {
      f.retainCombine = combine->str();
      f.retainTokens =
          llvm::cast<vt::TensorType>(ret.getRetainScore().getType())
              .hasAxis("token");
      if (info && info->retainScore)
        f.retainScore = c.buffer->getRangeText(info->retainScore->range);
    }
    std::string source = emitCpp(flow, emitError);
    if (source.empty()) {
      error = "cannot generate C++ for flow '" + f.name + "': " + emitError;
      return false;
    }
    f.sources.push_back({f.name + ".cpp", "c++", source});
    if (!emitCuda(flow, f.gpu, emitError)) {
      error = emitError;
      return false;
    }
    if (!computeConstValues(flow, f, error))
      return false;
    // The metadata is final: the code carries its signature from here on.
    rt::stampSignature(f);
    artifact.flows.push_back(std::move(f));
  }
  return true;
}

bool vflow::buildArtifact(Compilation &c, rt::Artifact &artifact) {
  std::string error;
  if (buildArtifact(c, artifact, error))
    return true;
  c.diags.error(DiagCode::Internal, SourceRange(), "internal error: " + error);
  return false;
}
