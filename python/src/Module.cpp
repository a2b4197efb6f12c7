//===- Module.cpp - vflow._vflow: the compiler and runtime for Python -----===//
//
// The extension under the `vflow` package (python/vflow): the compile API
// (Compile.h) on strings, artifacts, and sessions of the one session API
// (Session.h) on DLPack tensors. The Python layer shapes the user API; this
// file checks every tensor against what the session expects and says which
// argument is wrong and why (ValueError).
//
//===----------------------------------------------------------------------===//

#include "Args.h"
#include "DLPack.h"
#include "EngineBindings.h"
#include "ModelInfo.h"

#ifdef VFLOW_HAS_COMPILER
#include "vflow/Compiler/Compile.h"
#endif
#include "vflow/Compiler/Workload.h"
#include "vflow/Runtime/Artifact.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Params.h"
#include "vflow/Runtime/Session.h"
#ifdef VFLOW_HAS_CUDA_JIT
#include "CudaFlow.h"
#include "vflow/Runtime/cuda/Jit.h"
#endif

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace py = pybind11;
using namespace vflow;
namespace dl = vflow::python::dlpack;

namespace {

//===----------------------------------------------------------------------===//
// Compile
//===----------------------------------------------------------------------===//

#ifdef VFLOW_HAS_COMPILER

CompileOptions
compileOptions(const std::vector<std::pair<std::string, std::string>> &params,
               const std::string &baseDir) {
  CompileOptions options;
  options.params = params;
  options.baseDir = baseDir.empty() ? "." : baseDir;
  return options;
}

/// (ok, artifact or None, diagnostics text, diagnostics JSON)
py::tuple
compile(const std::string &source, const std::string &name,
        const std::vector<std::pair<std::string, std::string>> &params,
        const std::string &baseDir) {
  CompileResult r;
  {
    py::gil_scoped_release release;
    r = compileProgram(source, name, compileOptions(params, baseDir));
  }
  py::object artifact = py::none();
  if (r.ok)
    artifact = py::cast(std::move(r.artifact));
  return py::make_tuple(r.ok, artifact, r.diagnosticsText, r.diagnosticsJSON);
}

/// (ok, text, diagnostics text, diagnostics JSON)
py::tuple emit(const std::string &source, const std::string &name,
               const std::string &stageName,
               const std::vector<std::pair<std::string, std::string>> &params,
               const std::string &baseDir) {
  EmitStage stage;
  if (!parseEmitStage(stageName, stage))
    throw py::value_error(
        "stage: unknown stage '" + stageName +
        "' (expected ast, vt, kernels, cpp, cuda or summary)");
  EmitResult r;
  {
    py::gil_scoped_release release;
    r = emitProgram(source, name, stage, compileOptions(params, baseDir));
  }
  return py::make_tuple(r.ok, r.text, r.diagnosticsText, r.diagnosticsJSON);
}

/// (ok, report JSON, diagnostics text); `sweeps`: (name, values) pairs run
/// at every point of their product, `baseline`: a flow every row is
/// compared with (vflowc run's -p lists and --baseline).
py::tuple
run(const std::string &source, const std::string &name,
    const std::vector<std::pair<std::string, std::string>> &params,
    const std::string &baseDir, const eval::WorkloadSpec &spec,
    const std::vector<std::pair<std::string, std::vector<std::string>>> &sweeps,
    const std::string &baseline) {
  std::vector<eval::Sweep> points;
  for (const auto &[param, values] : sweeps)
    points.push_back({param, values});
  EmitResult r;
  {
    py::gil_scoped_release release;
    r = runProgram(source, name, spec, compileOptions(params, baseDir), points,
                   baseline);
  }
  return py::make_tuple(r.ok, r.text, r.diagnosticsText);
}

#endif // VFLOW_HAS_COMPILER

std::string ptx(rt::Artifact &artifact, const std::string &flow,
                const std::string &arch, int group, int headDim,
                const std::string &kvDType) {
#ifdef VFLOW_HAS_CUDA_JIT
  for (rt::FlowArtifact &f : artifact.flows)
    if (f.name == flow) {
      py::gil_scoped_release release;
      std::optional<rt::DType> kv = rt::parseDType(kvDType);
      if (!kv || !rt::isGpuKVDType(*kv))
        throw py::value_error("kv_dtype: '" + kvDType +
                              "' is not a GPU KV dtype (" +
                              rt::gpuKVDTypeList() + ")");
      return rt::cuda::addPtx(f, arch, group, headDim, *kv).ptx;
    }
  throw py::value_error("flow: no flow named '" + flow + "'");
#else
  throw rt::Error("this build of vflow has no NVRTC (built without the CUDA "
                  "toolkit)");
#endif
}

//===----------------------------------------------------------------------===//
// Tensors by DLPack
//===----------------------------------------------------------------------===//

/// A dtype as numpy and torch name it.
const char *tensorTypeName(rt::DType d) {
  switch (d) {
  case rt::DType::F32:
    return "float32";
  case rt::DType::F16:
    return "float16";
  case rt::DType::BF16:
    return "bfloat16";
  default:
    return rt::dtypeName(d);
  }
}

/// A tensor taken from a DLPack capsule for the length of one call.
class Borrowed {
public:
  Borrowed(py::object capsule, const std::string &what) : what(what) {
    PyObject *c = capsule.ptr();
    if (!PyCapsule_IsValid(c, "dltensor"))
      throw py::value_error(what + ": not a DLPack tensor (its __dlpack__() "
                                   "gave no unused 'dltensor' capsule)");
    managed =
        static_cast<dl::ManagedTensor *>(PyCapsule_GetPointer(c, "dltensor"));
    // Consumed: the capsule no longer frees it; we do.
    PyCapsule_SetName(c, "used_dltensor");
    PyCapsule_SetDestructor(c, nullptr);
  }
  ~Borrowed() {
    if (managed && managed->deleter)
      managed->deleter(managed);
  }
  Borrowed(const Borrowed &) = delete;
  Borrowed &operator=(const Borrowed &) = delete;

  const dl::Tensor &t() const { return managed->tensor; }

  /// Checks the shape (-1: any extent), that it is dense row-major, and
  /// returns it as a session tensor of one of `dtypes` on `device`.
  rt::Tensor require(const std::vector<int64_t> &shape,
                     const std::vector<rt::DType> &dtypes,
                     rt::Device device) const {
    const dl::Tensor &x = t();
    if (x.ndim != int(shape.size()))
      fail("has " + std::to_string(x.ndim) + " dimensions, expected " +
           describe(shape));
    bool matches = true;
    for (int i = 0; i < x.ndim; ++i)
      matches = matches && (shape[i] < 0 || x.shape[i] == shape[i]);
    for (int i = 0; i < x.ndim; ++i)
      if (x.shape[i] == 0)
        fail("is empty (shape " + shapeText() + ")" +
             (matches ? std::string(": there is nothing to compute")
                      : ", expected " + describe(shape)));
    if (!matches)
      fail("has shape " + shapeText() + ", expected " + describe(shape));
    int64_t stride = 1;
    for (int i = x.ndim - 1; i >= 0; --i) {
      if (x.strides && x.shape[i] > 1 && x.strides[i] != stride)
        fail("is not contiguous (strides do not match a dense row-major "
             "layout); pass a contiguous copy");
      stride *= x.shape[i];
    }
    rt::DType dtype = dtypeOf();
    bool ok = false;
    for (rt::DType d : dtypes)
      ok = ok || d == dtype;
    if (!ok) {
      std::string names;
      for (rt::DType d : dtypes)
        names += std::string(names.empty() ? "" : " or ") + tensorTypeName(d);
      fail("is " + dtypeText() + ", expected " + names);
    }
    rt::Device on = deviceOf();
    if (on != device)
      fail(std::string("is on the ") + (on == rt::Device::Cpu ? "CPU" : "GPU") +
           ", but the session runs on the " +
           (device == rt::Device::Cpu ? "CPU" : "GPU"));
    return {static_cast<char *>(x.data) + x.byteOffset, dtype, on};
  }

  int64_t extent(int i) const { return t().shape[i]; }

private:
  [[noreturn]] void fail(const std::string &why) const {
    throw py::value_error(what + " " + why);
  }
  static std::string describe(const std::vector<int64_t> &shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i)
      s += (i ? ", " : "") +
           (shape[i] < 0 ? std::string("*") : std::to_string(shape[i]));
    return s + "]";
  }
  std::string shapeText() const {
    std::vector<int64_t> s(t().shape, t().shape + t().ndim);
    return describe(s);
  }
  rt::DType dtypeOf() const {
    const dl::DataType &d = t().dtype;
    if (d.lanes == 1 && d.code == dl::kFloat && d.bits == 32)
      return rt::DType::F32;
    if (d.lanes == 1 && d.code == dl::kFloat && d.bits == 16)
      return rt::DType::F16;
    if (d.lanes == 1 && d.code == dl::kBfloat && d.bits == 16)
      return rt::DType::BF16;
    fail("is " + dtypeText() +
         ", expected a float32, float16 or bfloat16 "
         "tensor");
  }
  std::string dtypeText() const {
    const dl::DataType &d = t().dtype;
    const char *kind = d.code == dl::kFloat    ? "float"
                       : d.code == dl::kBfloat ? "bfloat"
                       : d.code == dl::kInt    ? "int"
                       : d.code == dl::kUInt   ? "uint"
                       : d.code == dl::kBool   ? "bool"
                                               : "an unsupported type of ";
    return std::string(kind) + std::to_string(d.bits);
  }
  rt::Device deviceOf() const {
    int32_t type = t().device.deviceType;
    if (type == dl::kCPU || type == dl::kCUDAHost)
      return rt::Device::Cpu;
    if (type == dl::kCUDA || type == dl::kCUDAManaged)
      return rt::Device::Cuda;
    fail("is on a device vflow does not run on (DLPack device type " +
         std::to_string(type) + ")");
  }

  std::string what;
  dl::ManagedTensor *managed = nullptr;
};

//===----------------------------------------------------------------------===//
// Sessions
//===----------------------------------------------------------------------===//

/// vflow.Session: a rt::Session (which one thread at a time may use) made
/// safe to share between threads: every call releases the GIL, then takes
/// the session's lock (a thread holding the lock never waits for the GIL, so
/// none can deadlock). Calls from several threads run one at a time.
class PySession {
  /// Runs `f` on the session without the GIL, under the session's lock
  /// (defined before its uses: its return type is deduced).
  template <typename F> auto locked(F &&f) const {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu);
    return f();
  }

public:
  PySession(const rt::Artifact &artifact, const std::string &flow,
            const rt::SessionConfig &config)
      : artifact(artifact) {
    const rt::FlowArtifact *f = this->artifact.findFlow(flow);
    if (!f)
      throw py::value_error("flow: the program has no flow named '" + flow +
                            "'");
    py::gil_scoped_release release;
    session = rt::openSession(*f, config);
  }

  rt::SeqId addSequence() {
    return locked([&] { return session->addSequence(); });
  }
  rt::SeqId fork(rt::SeqId seq) {
    return locked([&] { return session->fork(seq); });
  }
  rt::SeqId sharePrefix(rt::SeqId seq, int64_t tokens) {
    return locked([&] { return session->sharePrefix(seq, tokens); });
  }
  void release(rt::SeqId seq) {
    locked([&] { session->release(seq); });
  }
  int64_t length(rt::SeqId seq) const {
    return locked([&] { return session->length(seq); });
  }
  void evict(rt::SeqId seq, const std::vector<int64_t> &blocks) {
    locked([&] { session->evict(seq, blocks); });
  }
  void evictTokens(rt::SeqId seq, const std::vector<int64_t> &tokens) {
    locked([&] { session->evictTokens(seq, tokens); });
  }
  int64_t originalBlock(rt::SeqId seq, int64_t block) const {
    return locked([&] { return session->originalBlock(seq, block); });
  }
  int64_t originalPosition(rt::SeqId seq, int64_t token) const {
    return locked([&] { return session->originalPosition(seq, token); });
  }
  int64_t freePages() const {
    return locked([&] { return session->freePages(); });
  }
  int64_t retainedBlocks() const {
    return locked([&] { return session->retainedBlocks(); });
  }
  int64_t position(rt::SeqId seq) const {
    return locked([&] { return session->position(seq); });
  }

  void append(int layer, const std::vector<rt::SeqId> &seqs,
              const std::vector<int64_t> &counts, py::object k, py::object v,
              uintptr_t stream) {
    const rt::SessionConfig &c = session->config();
    int64_t total = 0;
    for (int64_t n : counts)
      total += n;
    Borrowed kb(std::move(k), "k"), vb(std::move(v), "v");
    std::vector<int64_t> shape = {total, c.numKVHeads, c.headDim};
    rt::Tensor kt = kb.require(shape, inputTypes(), c.device);
    rt::Tensor vt = vb.require(shape, inputTypes(), c.device);
    locked([&] {
      session->append(layer, seqs, counts, kt, vt, streamOf(stream));
    });
  }

  void decode(int layer, const std::vector<rt::SeqId> &seqs, py::object q,
              py::object out, uintptr_t stream) {
    const rt::SessionConfig &c = session->config();
    Borrowed qb(std::move(q), "q"), ob(std::move(out), "out");
    std::vector<int64_t> shape = {int64_t(seqs.size()),
                                  int64_t(c.numKVHeads) * c.group, c.headDim};
    rt::Tensor qt = qb.require(shape, inputTypes(), c.device);
    rt::Tensor ot = ob.require(shape, inputTypes(), c.device);
    if (qt.dtype != ot.dtype)
      throw py::value_error(std::string("out is ") + tensorTypeName(ot.dtype) +
                            ", expected the dtype of q (" +
                            tensorTypeName(qt.dtype) + ")");
    locked([&] { session->decode(layer, seqs, qt, ot, streamOf(stream)); });
  }

  std::vector<rt::BlockLists> selection(int layer) const {
    return locked([&] { return session->selection(layer); });
  }
  void setParam(const std::string &name, double value) {
    locked([&] { session->setParam(name, value); });
  }
  double param(const std::string &name) const {
    return locked([&] { return session->param(name); });
  }
  int64_t budget(rt::SeqId seq) const {
    return locked([&] { return session->budget(seq); });
  }
  py::dict stats() const {
    rt::SessionStats s = locked([&] { return session->stats(); });
    py::dict d;
    d["decodes"] = s.decodes;
    d["lists_attended"] = s.listsAttended;
    d["blocks_attended"] = s.blocksAttended;
    d["blocks_available"] = s.blocksAvailable;
    d["bytes_read"] = s.bytesRead;
    d["cache_stage_ms"] = s.cacheStageMs;
    d["index_ms"] = s.indexMs;
    d["attend_ms"] = s.attendMs;
    d["blocks_evicted"] = s.blocksEvicted;
    d["pages_reclaimed"] = s.pagesReclaimed;
    d["tokens_evicted"] = s.tokensEvicted;
    return d;
  }

private:
  std::vector<rt::DType> inputTypes() const {
    if (session->config().device == rt::Device::Cuda)
      return {rt::DType::BF16};
    return {rt::DType::F32, rt::DType::BF16, rt::DType::F16};
  }
  static void *streamOf(uintptr_t stream) {
    return reinterpret_cast<void *>(stream);
  }

  rt::Artifact artifact;
  std::unique_ptr<rt::Session> session;
  mutable std::mutex mu;
};

} // namespace

namespace {

/// vflow's artifacts (Program._artifact): load, save, sources, params.
void bindArtifacts(py::module_ &m) {
  py::class_<rt::Artifact>(m, "Artifact")
      .def_property_readonly("flows",
                             [](const rt::Artifact &a) {
                               std::vector<std::string> names;
                               for (const rt::FlowArtifact &f : a.flows)
                                 names.push_back(f.name);
                               return names;
                             })
      .def("serialize",
           [](const rt::Artifact &a) {
             return py::bytes(rt::serializeArtifact(a));
           })
      .def("source",
           [](const rt::Artifact &a, const std::string &flow,
              const std::string &language) {
             const rt::FlowArtifact *f = a.findFlow(flow);
             if (!f)
               throw py::value_error("flow: no flow named '" + flow + "'");
             if (language == "cuda")
               return f->gpu.source;
             std::string text;
             for (const rt::ArtifactSource &s : f->sources)
               text += s.text;
             return text;
           })
      .def("params", [](const rt::Artifact &a, const std::string &flow) {
        const rt::FlowArtifact *f = a.findFlow(flow);
        if (!f)
          throw py::value_error("flow: no flow named '" + flow + "'");
        py::dict d;
        for (const rt::ArtifactParam &p : f->params)
          d[py::str(p.name)] = py::make_tuple(p.type, p.value, p.compileTime);
        return d;
      });
  m.def(
      "load_artifact",
      [](const std::string &path) {
        vflow::python::checkPath(path, "artifact path");
        return rt::loadArtifact(path);
      },
      py::arg("path"));
  m.def(
      "save_artifact",
      [](const rt::Artifact &artifact, const std::string &path) {
        vflow::python::checkPath(path, "artifact path");
        rt::saveArtifact(artifact, path);
      },
      py::arg("artifact"), py::arg("path"));
}

/// The -p syntax and the compiler (when this build has it).
void bindCompiler(py::module_ &m) {
  // The one NAME=VALUE syntax of -p (runtime/Params.h), for the vflow CLI.
  m.def(
      "split_param_spec",
      [](const std::string &text) {
        std::string name, value, why;
        if (!rt::splitParamSpec(text, name, value, why))
          throw py::value_error(why);
        return py::make_tuple(name, value);
      },
      py::arg("text"),
      "(NAME, VALUE) of 'NAME=VALUE', blanks around each removed");
  m.def(
      "parse_param_value",
      [](const std::string &text) -> py::object {
        rt::ParamValue v;
        std::string why;
        if (!rt::parseParamValue(text, v, why))
          throw py::value_error(why);
        switch (v.kind) {
        case rt::ParamValue::Kind::Bool:
          return py::bool_(v.value != 0);
        case rt::ParamValue::Kind::Int:
          return py::int_(int64_t(v.value));
        case rt::ParamValue::Kind::Float:
          break;
        }
        return py::float_(v.value);
      },
      py::arg("text"), "a param value's text as a bool, int or float");
#ifdef VFLOW_HAS_COMPILER
  m.attr("HAS_COMPILER") = true;
  m.def("compile", &compile, py::arg("source"), py::arg("name"),
        py::arg("params"), py::arg("base_dir"));
  m.def("emit", &emit, py::arg("source"), py::arg("name"), py::arg("stage"),
        py::arg("params"), py::arg("base_dir"));

  m.def("run", &run, py::arg("source"), py::arg("name"), py::arg("params"),
        py::arg("base_dir"), py::arg("workload"),
        py::arg("sweeps") =
            std::vector<std::pair<std::string, std::vector<std::string>>>(),
        py::arg("baseline") = std::string());
#else
  m.attr("HAS_COMPILER") = false;
#endif
  py::class_<eval::WorkloadSpec>(m, "Workload")
      .def(py::init<>())
      .def_readwrite("seed", &eval::WorkloadSpec::seed)
      .def_readwrite("seeds", &eval::WorkloadSpec::seeds)
      .def_readwrite("distractors", &eval::WorkloadSpec::distractors)
      .def_readwrite("head_spread", &eval::WorkloadSpec::headSpread)
      .def_readwrite("lengths", &eval::WorkloadSpec::lengths)
      .def_readwrite("kv_heads", &eval::WorkloadSpec::numKVHeads)
      .def_readwrite("group", &eval::WorkloadSpec::group)
      .def_readwrite("head_dim", &eval::WorkloadSpec::headDim)
      .def_readwrite("steps", &eval::WorkloadSpec::steps)
      .def_readwrite("needles", &eval::WorkloadSpec::needles)
      .def_readwrite("outlier", &eval::WorkloadSpec::outlier)
      .def_readwrite("max_memory", &eval::WorkloadSpec::maxMemoryGiB)
      .def_readwrite("max_work", &eval::WorkloadSpec::maxWork)
      .def_property(
          "backend",
          [](const eval::WorkloadSpec &s) {
            return s.backend == eval::WorkloadSpec::Backend::Cuda ? "cuda"
                                                                  : "cpu";
          },
          [](eval::WorkloadSpec &s, const std::string &b) {
            s.backend = python::isCuda(b, "backend")
                            ? eval::WorkloadSpec::Backend::Cuda
                            : eval::WorkloadSpec::Backend::Cpu;
          });

  m.def("ptx", &ptx, py::arg("artifact"), py::arg("flow"), py::arg("arch"),
        py::arg("group"), py::arg("head_dim"), py::arg("kv_dtype"));
}

/// vflow.Session's config and the session (PySession).
void bindSessions(py::module_ &m) {
  py::class_<rt::SessionConfig>(m, "SessionConfig")
      .def(py::init<>())
      .def_property(
          "device",
          [](const rt::SessionConfig &c) {
            return c.device == rt::Device::Cuda ? "cuda" : "cpu";
          },
          [](rt::SessionConfig &c, const std::string &d) {
            c.device = python::isCuda(d, "device") ? rt::Device::Cuda
                                                   : rt::Device::Cpu;
          })
      .def_readwrite("layers", &rt::SessionConfig::numLayers)
      .def_readwrite("kv_heads", &rt::SessionConfig::numKVHeads)
      .def_readwrite("group", &rt::SessionConfig::group)
      .def_readwrite("head_dim", &rt::SessionConfig::headDim)
      .def_readwrite("max_pages", &rt::SessionConfig::numPages)
      .def_property(
          "kv_dtype",
          [](const rt::SessionConfig &c) {
            return std::string(rt::dtypeName(c.kvDType));
          },
          [](rt::SessionConfig &c, const py::handle &v) {
            c.kvDType = python::dtypeArg(v, "kv_dtype");
          })
      .def_readwrite("scale", &rt::SessionConfig::scale)
      .def_readwrite("max_sequences", &rt::SessionConfig::maxSequences)
      .def_readwrite("max_batch", &rt::SessionConfig::maxBatch)
      .def_readwrite("max_blocks_per_seq", &rt::SessionConfig::maxBlocksPerSeq)
      .def_readwrite("quiet", &rt::SessionConfig::quiet)
      .def_readwrite("telemetry", &rt::SessionConfig::telemetry)
      .def_readwrite("graph_safe", &rt::SessionConfig::graphSafe);

  py::class_<PySession>(m, "Session")
      .def(py::init<const rt::Artifact &, const std::string &,
                    const rt::SessionConfig &>(),
           py::arg("artifact"), py::arg("flow"), py::arg("config"))
      .def("add_sequence", &PySession::addSequence)
      .def("fork", &PySession::fork)
      .def("share_prefix", &PySession::sharePrefix)
      .def("release", &PySession::release)
      .def("length", &PySession::length)
      .def("evict", &PySession::evict)
      .def("evict_tokens", &PySession::evictTokens)
      .def("position", &PySession::position)
      .def_property_readonly("retained_blocks", &PySession::retainedBlocks)
      .def("original_block", &PySession::originalBlock)
      .def("original_position", &PySession::originalPosition)
      .def("free_pages", &PySession::freePages)
      .def("append", &PySession::append)
      .def("decode", &PySession::decode)
      .def("selection", &PySession::selection)
      .def("set_param", &PySession::setParam)
      .def("param", &PySession::param)
      .def("budget", &PySession::budget)
      .def("stats", &PySession::stats);
}

} // namespace

PYBIND11_MODULE(_vflow, m) {
  m.doc() = "vflow's compiler and runtime (use the vflow package)";
  py::register_exception<rt::Error>(m, "RuntimeError", PyExc_RuntimeError);
  vflow::python::bindModelInfo(m);
  vflow::python::bindEngine(m);
  bindArtifacts(m);
  bindCompiler(m);
  bindSessions(m);
#ifdef VFLOW_HAS_CUDA_JIT
  vflow::python::bindCudaFlow(m);
#endif
}
