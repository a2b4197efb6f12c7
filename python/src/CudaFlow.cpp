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

#include "FlowKernels.h"

#include <pybind11/stl.h>

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

namespace py = pybind11;
using namespace vflow;

namespace {

/// The message of the last failed launch on this thread.
thread_local std::string lastError;

template <typename Body> const char *guarded(Body body) {
  try {
    body();
    return nullptr;
  } catch (const std::exception &e) {
    lastError = e.what();
    return lastError.c_str();
  }
}

class CudaFlow {
public:
  CudaFlow(const rt::Artifact &artifact, const std::string &flowName, int group,
           int headDim, const std::string &kvDType, bool quiet)
      : flow(requireFlow(artifact, flowName)) {
    if (group < 1 || headDim < 1)
      throw py::value_error("group and head_dim must be >= 1");
    if (kvDType != "bf16" && kvDType != "f16" && kvDType != "fp8_e4m3")
      throw py::value_error("kv_dtype: '" + kvDType +
                            "' is not a KV dtype (bf16, f16 or fp8_e4m3)");
    if (flow.headDim != 0 && flow.headDim != headDim)
      throw py::value_error("head_dim: flow '" + flow.name + "' runs with " +
                            std::to_string(flow.headDim) + ", not " +
                            std::to_string(headDim));
    int device = 0;
    rt::cuda::checkCuda(cudaGetDevice(&device), "finding the current device");
    kernels = std::make_unique<rt::cuda::FlowKernels>(
        flow, group, headDim, kvDType, "", quiet, "", nullptr);
    dtype = kvDType;
    ops.magic = kVflowFlowOpsMagic;
    ops.version = kVflowFlowOpsVersion;
    ops.group = group;
    ops.headDim = headDim;
    ops.device = device;
    ops.kvDType = dtype.c_str();
    ops.pageSize = int(flow.blockSize);
    ops.numFields = int(flow.fields.size());
    ops.numStates = int(flow.states.size());
    ops.hasFields = kernels->hasFields();
    ops.readsMass = flow.readsInput("mass");
    for (const rt::ArtifactTensor &f : flow.fields) {
      fieldDTypes.push_back(rt::dtypeName(f.dtype));
      fieldElements.push_back(f.elements(headDim, group));
    }
    for (const rt::ArtifactTensor &s : flow.states) {
      stateElements.push_back(s.elements(headDim, group));
      statePerBlock.push_back(s.perBlock ? 1 : 0);
    }
    ops.fieldDTypes = fieldDTypes.data();
    ops.fieldElements = fieldElements.data();
    ops.stateElements = stateElements.data();
    ops.statePerBlock = statePerBlock.data();
    ops.self = this;
    ops.workspaceFloats = [](void *self, int64_t maxBlocks) {
      const CudaFlow &f = *static_cast<CudaFlow *>(self);
      int64_t perBlock = 0, fixed = 0;
      rt::gpuWorkspaceShape(f.kernels->info(), f.ops.group, f.ops.headDim,
                            perBlock, fixed);
      return perBlock * maxBlocks + fixed;
    };
    ops.launchFields = [](void *self, VflowGpuArgs *a, int numPages,
                          void *stream) {
      return guarded([&] {
        const CudaFlow &f = *static_cast<CudaFlow *>(self);
        f.kernels->bind(*a);
        f.kernels->launchFields(*a, numPages, a->numKVHeads,
                                static_cast<cudaStream_t>(stream));
      });
    };
    ops.launchIndex = [](void *self, VflowGpuArgs *a, int64_t gridBlocks,
                         int withAppend, void *stream) {
      return guarded([&] {
        const CudaFlow &f = *static_cast<CudaFlow *>(self);
        f.kernels->bind(*a);
        f.kernels->launchIndex(*a, a->numKVHeads, gridBlocks, withAppend != 0,
                               static_cast<cudaStream_t>(stream), nullptr);
      });
    };
  }

  CudaFlow(const CudaFlow &) = delete;
  CudaFlow &operator=(const CudaFlow &) = delete;

  uintptr_t handle() const { return reinterpret_cast<uintptr_t>(&ops); }

  /// [{name, dtype, elements}] per field, in the kernels' order.
  py::list fields() const {
    py::list out;
    for (const rt::ArtifactTensor &f : flow.fields) {
      py::dict d;
      d["name"] = f.name;
      d["dtype"] = rt::dtypeName(f.dtype);
      d["elements"] = f.elements(ops.headDim, ops.group);
      out.append(d);
    }
    return out;
  }

  /// [{name, dtype, elements, per_block, init}] per state (stored as f32,
  /// `init` rounded to the state's dtype).
  py::list states() const {
    py::list out;
    for (const rt::ArtifactTensor &s : flow.states) {
      py::dict d;
      d["name"] = s.name;
      d["dtype"] = rt::dtypeName(s.dtype);
      d["elements"] = s.elements(ops.headDim, ops.group);
      d["per_block"] = s.perBlock;
      d["init"] = rt::roundToDType(s.dtype, s.init);
      out.append(d);
    }
    return out;
  }

  bool readsMass() const { return ops.readsMass != 0; }
  int64_t maxEntries(int64_t length) const {
    if (length < 0)
      throw py::value_error("length must be >= 0");
    return kernels->params().maxEntries(length);
  }
  int64_t workspaceFloats(int64_t maxBlocks) const {
    return ops.workspaceFloats(const_cast<CudaFlow *>(this), maxBlocks);
  }
  void setParam(const std::string &name, double value) {
    kernels->setParam(name, value);
  }
  double param(const std::string &name) const {
    return kernels->params().get(name);
  }

  const rt::FlowArtifact flow;
  std::string dtype;

private:
  static const rt::FlowArtifact &requireFlow(const rt::Artifact &a,
                                             const std::string &name) {
    const rt::FlowArtifact *f = a.findFlow(name);
    if (!f)
      throw py::value_error("flow: no flow named '" + name + "'");
    return *f;
  }

  std::unique_ptr<rt::cuda::FlowKernels> kernels;
  std::vector<const char *> fieldDTypes;
  std::vector<int64_t> fieldElements, stateElements;
  std::vector<int> statePerBlock;
  VflowFlowOps ops{};
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
      .def_property_readonly("block_size",
                             [](const CudaFlow &f) { return f.flow.blockSize; })
      .def("max_entries", &CudaFlow::maxEntries, py::arg("length"))
      .def("workspace_floats", &CudaFlow::workspaceFloats,
           py::arg("max_blocks"))
      .def("set_param", &CudaFlow::setParam)
      .def("param", &CudaFlow::param);
}
