//===- EngineBindings.cpp - vflow._vflow.Engine: the serving engine -------===//
//
// The C++ engine (vflow/Model/Engine.h) for vflow.LLM (python/vflow/_llm.py),
// which shapes the user API: prompts as token ids in, outputs as dicts.
// Errors in the engine are vflow._vflow.RuntimeError; bad sampling params
// a ValueError naming the field.
//
//===----------------------------------------------------------------------===//

#include "EngineBindings.h"

#include "vflow/Model/Engine.h"
#include "vflow/Runtime/Artifact.h"
#include "vflow/Runtime/Error.h"

#include <pybind11/stl.h>

#ifdef VFLOW_HAS_CUDA_JIT
#include <cuda_runtime_api.h>
#endif

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;
using namespace vflow;

namespace {

model::SamplingParams samplingParams(const py::dict &d) {
  model::SamplingParams p;
  p.maxTokens = d["max_tokens"].cast<int64_t>();
  p.temperature = d["temperature"].cast<double>();
  p.topP = d["top_p"].cast<double>();
  p.topK = d["top_k"].cast<int64_t>();
  if (!d["seed"].is_none())
    p.seed = d["seed"].cast<uint64_t>();
  p.ignoreEos = d["ignore_eos"].cast<bool>();
  try {
    p.validate();
  } catch (const rt::Error &e) {
    throw py::value_error(e.what());
  }
  return p;
}

py::dict outputDict(const model::RequestOutput &o) {
  py::dict d;
  d["id"] = o.id;
  d["prompt_token_ids"] = o.promptTokens;
  d["token_ids"] = o.tokens;
  d["finish_reason"] = o.finishReason;
  d["error"] = o.error.empty() ? py::object(py::none()) : py::str(o.error);
  return d;
}

class PyEngine {
public:
  PyEngine(const std::string &path, const rt::Artifact *artifact,
           const std::string &flowName, const py::dict &o) {
    model::EngineConfig cfg;
    const std::string device = o["device"].cast<std::string>();
    if (device != "cpu" && device != "cuda")
      throw py::value_error("device: '" + device +
                            "' is not a device (cpu or cuda)");
    cfg.runner.device = device == "cuda" ? rt::Device::Cuda : rt::Device::Cpu;
    cfg.runner.denseLayers = o["dense_layers"].cast<int>();
    cfg.runner.kvDType = o["kv_dtype"].cast<std::string>();
    cfg.runner.blockSize = o["block_size"].cast<int64_t>();
    cfg.maxBatch = o["max_batch"].cast<int>();
    cfg.maxTokensPerStep = o["max_tokens_per_step"].cast<int64_t>();
    cfg.prefixCaching = o["enable_prefix_caching"].cast<bool>();
    cfg.seed = o["seed"].cast<uint64_t>();
    cfg.runner.maxBatch = cfg.maxBatch;
    cfg.runner.maxSequences = 4 * cfg.maxBatch + 64;
    cfg.runner.cacheDir = o["cache_dir"].cast<std::string>();
    cfg.runner.quiet = o["quiet"].cast<bool>();
    cfg.runner.cudaGraphs = o["cuda_graphs"].cast<bool>();
    if (o.contains("mass_recall"))
      cfg.runner.massRecall = o["mass_recall"].cast<bool>();
    if (o.contains("observe_tokens")) {
      cfg.runner.observeTokens = o["observe_tokens"].cast<int>();
      if (cfg.runner.observeTokens < 0)
        throw py::value_error("observe_tokens: must be >= 0, not " +
                              std::to_string(cfg.runner.observeTokens));
    }
    const rt::FlowArtifact *flow = nullptr;
    if (artifact) {
      flow = artifact->findFlow(flowName);
      if (!flow)
        throw py::value_error("flow: no flow named '" + flowName + "'");
      cfg.runner.blockSize = flow->blockSize;
    }
    const int64_t poolTokens = o["kv_pool_tokens"].cast<int64_t>();
    cfg.runner.numPages =
        (poolTokens + cfg.runner.blockSize - 1) / cfg.runner.blockSize;
    py::gil_scoped_release release;
    model::ModelWeights weights = model::ModelWeights::open(path);
    engine = std::make_unique<model::Engine>(weights, flow, cfg);
  }

  py::dict config() const { return py::dict(); }

  py::list generate(const std::vector<std::vector<int32_t>> &prompts,
                    const py::dict &params) {
    model::SamplingParams p = samplingParams(params);
    std::vector<model::RequestOutput> outs;
    {
      py::gil_scoped_release release;
      outs = engine->generate(prompts, p);
    }
    py::list l;
    for (const model::RequestOutput &o : outs)
      l.append(outputDict(o));
    return l;
  }

  int64_t addRequest(const std::vector<int32_t> &prompt,
                     const py::dict &params) {
    return engine->addRequest(prompt, samplingParams(params));
  }

  py::list step() {
    std::vector<model::RequestOutput> outs;
    {
      py::gil_scoped_release release;
      outs = engine->step();
    }
    py::list l;
    for (const model::RequestOutput &o : outs)
      l.append(outputDict(o));
    return l;
  }

  /// The logits after `prompt` (a fresh sequence, prefilled at once and
  /// released): for comparisons with other implementations.
  std::vector<float> promptLogits(const std::vector<int32_t> &prompt) {
    py::gil_scoped_release release;
    model::ModelRunner &runner = engine->modelRunner();
    rt::Session &s = runner.session();
    const rt::SeqId seq = s.addSequence();
    try {
      std::vector<float> out = runner.forwardLogits({seq}, {prompt}, {false});
      s.release(seq);
      return out;
    } catch (...) {
      s.release(seq);
      throw;
    }
  }

  py::dict stats() const {
    model::EngineStats s = engine->stats();
    py::dict d;
    d["running"] = s.running;
    d["waiting"] = s.waiting;
    d["pages_used"] = s.pagesUsed;
    d["pages_total"] = s.pagesTotal;
    d["prefix_queries"] = s.prefixQueries;
    d["prefix_hits"] = s.prefixHits;
    d["prefix_hit_tokens"] = s.prefixHitTokens;
    d["steps"] = s.steps;
    d["preemptions"] = s.preemptions;
    d["tokens_computed"] = s.tokensComputed;
    d["lists_attended"] = s.listsAttended;
    d["blocks_attended"] = s.blocksAttended;
    d["blocks_available"] = s.blocksAvailable;
    if (!s.massRecallCount.empty()) {
      // Per layer, the mean recall of each query head (None: no sparse
      // decode at that layer).
      const size_t heads = s.massRecallSum.size() / s.massRecallCount.size();
      py::list layers;
      for (size_t l = 0; l < s.massRecallCount.size(); ++l) {
        if (s.massRecallCount[l] == 0) {
          layers.append(py::none());
          continue;
        }
        py::list perHead;
        for (size_t h = 0; h < heads; ++h)
          perHead.append(s.massRecallSum[l * heads + h] /
                         double(s.massRecallCount[l]));
        layers.append(perHead);
      }
      d["mass_recall"] = layers;
    }
    py::dict ms;
    ms["gemm"] = s.gemmMs;
    ms["attention"] = s.attentionMs;
    ms["other"] = s.otherMs;
    ms["sampling"] = s.samplingMs;
    ms["host"] = s.hostMs;
    ms["graph"] = s.graphMs;
    ms["index"] = s.indexMs;
    d["step_ms"] = ms;
    return d;
  }

  std::unique_ptr<model::Engine> engine;
};

} // namespace

void vflow::python::bindEngine(py::module_ &m) {
  m.def("cuda_devices", [] {
    int n = 0;
#ifdef VFLOW_HAS_CUDA_JIT
    if (cudaGetDeviceCount(&n) != cudaSuccess)
      n = 0;
#endif
    return n;
  });
  py::class_<PyEngine>(m, "Engine")
      .def(py::init<const std::string &, const rt::Artifact *,
                    const std::string &, const py::dict &>(),
           py::arg("path"), py::arg("artifact"), py::arg("flow"),
           py::arg("options"))
      .def("generate", &PyEngine::generate)
      .def("add_request", &PyEngine::addRequest)
      .def("step", &PyEngine::step)
      .def("abort",
           [](PyEngine &e, int64_t id) -> py::object {
             std::optional<model::RequestOutput> o = e.engine->abort(id);
             return o ? py::object(outputDict(*o)) : py::object(py::none());
           })
      .def("has_unfinished",
           [](const PyEngine &e) { return e.engine->hasUnfinished(); })
      .def("stats", &PyEngine::stats)
      .def("prompt_logits", &PyEngine::promptLogits)
      .def("clear_prefix_cache",
           [](PyEngine &e) { e.engine->clearPrefixCache(); })
      .def("model_config", [](const PyEngine &e) {
        return e.engine->modelConfig().toJson().dump();
      });
}
