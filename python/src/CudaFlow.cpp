//===- CudaFlow.cpp - vflow._vflow.CudaFlow: a flow's kernels for torch ---===//
//
// A flow's generated kernels opened on the current device for one
// specialization (rt::cuda::FlowKernels), handed to the torch ops
// (python/csrc/vflow_ops.cpp, built apart against the installed torch) as
// the address of a VflowFlowOps (FlowOpsAbi.h). The engine that calls the
// ops owns every buffer; this object describes the ones the flow needs
// (fields, states, workspace) so that the Python layer can allocate them.
//
//===----------------------------------------------------------------------===//

#include "CudaFlow.h"

#include "vflow/Runtime/Artifact.h"
#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/cuda/FlowOpsAbi.h"

#include "FlowOps.h"

#include <pybind11/stl.h>

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

namespace py = pybind11;
using namespace vflow;

namespace {

class CudaFlow {
public:
  CudaFlow(const rt::Artifact &artifact, const std::string &flowName, int group,
           int headDim, const std::string &kvDType, bool quiet)
      : flow(requireFlow(artifact, flowName)) {
    if (group < 1 || headDim < 1)
      throw py::value_error("group and head_dim must be >= 1");
    std::optional<rt::DType> kv = rt::parseDType(kvDType);
    if (!kv || !rt::isGpuKVDType(*kv))
      throw py::value_error("kv_dtype: '" + kvDType +
                            "' is not a GPU KV dtype (" + rt::gpuKVDTypeList() +
                            ")");
    // The torch ops read the caller's pools, which have no token scales.
    if (*kv == rt::DType::INT8)
      throw py::value_error(
          "kv_dtype: int8 K/V need a scale per stored row, which only "
          "vflow's own GPU session keeps; the torch ops take bf16, f16 or "
          "fp8e4m3 caches");
    if (flow.headDim != 0 && flow.headDim != headDim)
      throw py::value_error("head_dim: flow '" + flow.name + "' runs with " +
                            std::to_string(flow.headDim) + ", not " +
                            std::to_string(headDim));
    // The torch ops (and the vLLM backend on them) run a flow's stages on
    // the caller's cache; a retain block would need them to evict from it.
    if (flow.retains())
      throw rt::Error("flow '" + flow.name +
                      "' has a retain block: eviction runs in vflow's own "
                      "sessions and engine (CPU and GPU), not in the torch "
                      "ops or the vLLM backend (remove the retain block to "
                      "run its selection)");
    ops = std::make_unique<rt::cuda::FlowOps>(flow, group, headDim, *kv, quiet,
                                              "", nullptr);
  }

  CudaFlow(const CudaFlow &) = delete;
  CudaFlow &operator=(const CudaFlow &) = delete;

  uintptr_t handle() const {
    return reinterpret_cast<uintptr_t>(&ops->table());
  }

  /// {name, dtype, elements} of a field or state at this shape.
  py::dict tensorInfo(const rt::ArtifactTensor &t) const {
    py::dict d;
    d["name"] = t.name;
    d["dtype"] = rt::dtypeName(t.dtype);
    d["elements"] = t.elements(headDim(), group());
    return d;
  }

  /// [{name, dtype, elements}] per field, in the kernels' order.
  py::list fields() const {
    py::list out;
    for (const rt::ArtifactTensor &f : flow.fields)
      out.append(tensorInfo(f));
    return out;
  }

  /// [{name, dtype, elements, per_block, init}] per state (stored as f32,
  /// `init` rounded to the state's dtype).
  py::list states() const {
    py::list out;
    for (const rt::ArtifactTensor &s : flow.states) {
      py::dict d = tensorInfo(s);
      d["per_block"] = s.perBlock;
      d["init"] = rt::roundToDType(s.dtype, s.init);
      out.append(d);
    }
    return out;
  }

  bool readsMass() const { return ops->table().readsMass != 0; }
  /// Whether the index stage reads `layer` / `kv_head` (then each launch
  /// must say which layer and first KV head it runs for).
  bool readsLayer() const { return flow.readsInput("layer"); }
  bool readsKVHead() const { return flow.readsInput("kv_head"); }
  void setBudgetScope(int64_t firstLayer, int64_t numLayers,
                      int64_t firstKVHead, int64_t numKVHeads) {
    ops->kernels().setBudgetScope(firstLayer, numLayers, firstKVHead,
                                  numKVHeads);
  }
  int group() const { return ops->table().group; }
  int headDim() const { return ops->table().headDim; }
  int64_t maxEntries(int64_t length) const {
    if (length < 0)
      throw py::value_error("length must be >= 0");
    return ops->kernels().params().maxEntries(length);
  }
  int64_t workspaceFloats(int64_t maxBlocks) const {
    return ops->workspaceFloats(maxBlocks);
  }
  void setParam(const std::string &name, double value) {
    ops->kernels().setParam(name, value);
  }
  double param(const std::string &name) const {
    return ops->kernels().params().get(name);
  }

  const rt::FlowArtifact flow;

private:
  static const rt::FlowArtifact &requireFlow(const rt::Artifact &a,
                                             const std::string &name) {
    const rt::FlowArtifact *f = a.findFlow(name);
    if (!f)
      throw py::value_error("flow: no flow named '" + name + "'");
    return *f;
  }

  std::unique_ptr<rt::cuda::FlowOps> ops;
};

} // namespace

void vflow::python::bindCudaFlow(py::module_ &m) {
  py::class_<CudaFlow>(m, "CudaFlow")
      .def(py::init<const rt::Artifact &, const std::string &, int, int,
                    const std::string &, bool>(),
           py::arg("artifact"), py::arg("flow"), py::arg("group"),
           py::arg("head_dim"), py::arg("kv_dtype"), py::arg("quiet"))
      .def_property_readonly("handle", &CudaFlow::handle)
      .def_property_readonly("fields", &CudaFlow::fields)
      .def_property_readonly("states", &CudaFlow::states)
      .def_property_readonly("reads_mass", &CudaFlow::readsMass)
      .def_property_readonly("reads_layer", &CudaFlow::readsLayer)
      .def_property_readonly("reads_kv_head", &CudaFlow::readsKVHead)
      .def("set_budget_scope", &CudaFlow::setBudgetScope,
           py::arg("first_layer"), py::arg("num_layers"),
           py::arg("first_kv_head"), py::arg("num_kv_heads"))
      .def_property_readonly("block_size",
                             [](const CudaFlow &f) { return f.flow.blockSize; })
      .def("max_entries", &CudaFlow::maxEntries, py::arg("length"))
      .def("workspace_floats", &CudaFlow::workspaceFloats,
           py::arg("max_blocks"))
      .def("set_param", &CudaFlow::setParam)
      .def("param", &CudaFlow::param);
}
