//===- EngineBindings.cpp - vflow._vflow.Engine: the serving engine -------===//
//
// The C++ engine (vflow/Engine/Engine.h) for vflow.LLM (python/vflow/_llm.py),
// which shapes the user API: prompts as token ids in, outputs as dicts.
// Errors in the engine are vflow._vflow.RuntimeError; bad sampling params
// a ValueError naming the field.
//
//===----------------------------------------------------------------------===//

#include "EngineBindings.h"
#include "Args.h"

#include "vflow/Engine/Engine.h"
#include "vflow/Runtime/Artifact.h"
#include "vflow/Runtime/Error.h"

#include <pybind11/stl.h>

#ifdef VFLOW_HAS_CUDA_JIT
#include <cuda_runtime_api.h>
#endif

#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;
using namespace vflow;
using namespace vflow::python;

namespace {

/// A dict's member `key`; `missing` when it is absent or None.
py::object member(const py::dict &d, const char *key) {
  return d.contains(key) ? py::reinterpret_borrow<py::object>(d[key])
                         : py::object(py::none());
}

/// vflow.SamplingParams (as its dict): one rule for Python and the C++
/// engine; a bad field is a TypeError or ValueError naming it.
model::SamplingParams samplingParams(const py::dict &d) {
  model::SamplingParams p;
  p.maxTokens = intArg<int64_t>(d["max_tokens"], "max_tokens", 1);
  p.temperature = floatArg(d["temperature"], "temperature");
  p.topP = floatArg(d["top_p"], "top_p");
  p.topK = intArg<int64_t>(d["top_k"], "top_k", 0);
  if (!member(d, "seed").is_none())
    p.seed = intArg<uint64_t>(d["seed"], "seed");
  p.ignoreEos = boolArg(d["ignore_eos"], "ignore_eos");
  if (!member(d, "logprobs").is_none())
    p.logprobs =
        intArg<int64_t>(d["logprobs"], "logprobs", 0, model::kMaxLogprobs);
  try {
    p.validate();
  } catch (const rt::Error &e) {
    throw py::value_error(e.what());
  }
  return p;
}

/// Log-probabilities as Python sees them: per token (its log-probability,
/// [(id, log-probability) of the most likely tokens]).
py::list logprobsList(const std::vector<model::TokenLogprobs> &lps) {
  py::list out;
  for (const model::TokenLogprobs &lp : lps) {
    py::list top;
    for (size_t i = 0; i < lp.topIds.size(); ++i)
      top.append(py::make_tuple(lp.topIds[i], lp.topLogprobs[i]));
    out.append(py::make_tuple(lp.logprob, top));
  }
  return out;
}

py::dict outputDict(const model::RequestOutput &o) {
  py::dict d;
  d["id"] = o.id;
  d["prompt_token_ids"] = o.promptTokens;
  d["token_ids"] = o.tokens;
  d["finish_reason"] = o.finishReason;
  d["error"] = o.error.empty() ? py::object(py::none()) : py::str(o.error);
  d["logprobs"] = logprobsList(o.logprobs);
  d["blocks_attended"] = o.blocksAttended;
  d["blocks_available"] = o.blocksAvailable;
  d["blocks_evicted"] = o.blocksEvicted;
  d["tokens_evicted"] = o.tokensEvicted;
  return d;
}

class PyEngine {
public:
  PyEngine(const std::string &path, const rt::Artifact *artifact,
           const std::string &flowName, const model::EngineConfig &config) {
    model::EngineConfig cfg = config;
    const rt::FlowArtifact *flow = nullptr;
    if (artifact) {
      flow = artifact->findFlow(flowName);
      if (!flow)
        throw py::value_error("flow: no flow named '" + flowName + "'");
    }
    try {
      cfg.validate(); // the one check (Engine runs it too): ValueError here
    } catch (const rt::Error &e) {
      throw py::value_error(e.what());
    }
    py::gil_scoped_release release;
    model::ModelWeights weights = model::ModelWeights::open(path);
    engine = std::make_unique<model::Engine>(weights, flow, cfg);
  }

  /// Runs the prompts to the end. Between steps it looks for signals
  /// (Ctrl-C): a pending one aborts this call's requests and is raised.
  py::list generate(const std::vector<std::vector<int32_t>> &prompts,
                    const py::dict &params) {
    model::SamplingParams p = samplingParams(params);
    std::vector<model::RequestOutput> outs;
    try {
      py::gil_scoped_release release;
      outs = engine->generate(prompts, p, [] {
        py::gil_scoped_acquire gil;
        return PyErr_CheckSignals() == 0;
      });
    } catch (const model::Interrupted &) {
      throw py::error_already_set(); // the signal's exception
    }
    py::list l;
    for (const model::RequestOutput &o : outs)
      l.append(outputDict(o));
    return l;
  }

  int64_t addRequest(const std::vector<int32_t> &prompt,
                     const py::dict &params) {
    model::SamplingParams p = samplingParams(params);
    py::gil_scoped_release release;
    return engine->addRequest(prompt, p);
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

  std::vector<float> promptLogits(const std::vector<int32_t> &prompt) {
    py::gil_scoped_release release;
    return engine->promptLogits(prompt);
  }

  py::dict stats() const {
    model::EngineStats s;
    {
      py::gil_scoped_release release;
      s = engine->stats();
    }
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
    d["blocks_evicted"] = s.blocksEvicted;
    d["pages_reclaimed"] = s.pagesReclaimed;
    d["tokens_evicted"] = s.tokensEvicted;
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

/// An option of EngineConfig as a Python property: read as it is, set
/// through `check` (a TypeError or ValueError naming the option).
template <typename T, typename Check>
void option(py::class_<model::EngineConfig> &c, const char *name,
            T model::EngineConfig::*member, Check check) {
  c.def_property(
      name, [member](const model::EngineConfig &cfg) { return cfg.*member; },
      [member, check, name](model::EngineConfig &cfg, const py::handle &v) {
        cfg.*member = check(v, name);
      });
}
template <typename T, typename Check>
void runnerOption(py::class_<model::EngineConfig> &c, const char *name,
                  T model::RunnerConfig::*member, Check check) {
  c.def_property(
      name,
      [member](const model::EngineConfig &cfg) { return cfg.runner.*member; },
      [member, check, name](model::EngineConfig &cfg, const py::handle &v) {
        cfg.runner.*member = check(v, name);
      });
}

/// vflow.EngineConfig: model::EngineConfig with the options vflow.LLM
/// takes, by their Python names. Its defaults are the C++ ones; types are
/// checked when set, ranges by EngineConfig::validate when an engine is
/// built.
void bindEngineConfig(py::module_ &m) {
  py::class_<model::EngineConfig> c(m, "EngineConfig");
  c.def(py::init<>());
  auto integer = [](auto zero) {
    return [](const py::handle &v, const char *name) {
      return intArg<decltype(zero)>(v, name);
    };
  };
  auto boolean = [](const py::handle &v, const char *name) {
    return boolArg(v, name);
  };
  auto text = [](const py::handle &v, const char *name) {
    if (!py::isinstance<py::str>(v))
      throw py::type_error(std::string(name) + ": expected a str, got " +
                           describe(v));
    return v.cast<std::string>();
  };
  c.def_property(
      "device",
      [](const model::EngineConfig &cfg) {
        return std::string(cfg.runner.device == rt::Device::Cuda ? "cuda"
                                                                 : "cpu");
      },
      [text](model::EngineConfig &cfg, const py::handle &v) {
        cfg.runner.device = isCuda(text(v, "device"), "device")
                                ? rt::Device::Cuda
                                : rt::Device::Cpu;
      });
  runnerOption(c, "dense_layers", &model::RunnerConfig::denseLayers,
               integer(int()));
  c.def_property(
      "kv_dtype",
      [](const model::EngineConfig &cfg) {
        return std::string(rt::dtypeName(cfg.runner.kvDType));
      },
      [](model::EngineConfig &cfg, const py::handle &v) {
        cfg.runner.kvDType = dtypeArg(v, "kv_dtype");
      });
  runnerOption(c, "block_size", &model::RunnerConfig::blockSize,
               integer(int64_t()));
  runnerOption(c, "cache_dir", &model::RunnerConfig::cacheDir, text);
  runnerOption(c, "quiet", &model::RunnerConfig::quiet, boolean);
  runnerOption(c, "cuda_graphs", &model::RunnerConfig::cudaGraphs, boolean);
  runnerOption(c, "mass_recall", &model::RunnerConfig::massRecall, boolean);
  runnerOption(c, "observe_tokens", &model::RunnerConfig::observeTokens,
               integer(int()));
  runnerOption(c, "max_model_len", &model::RunnerConfig::maxModelLen,
               integer(int64_t()));
  option(c, "max_batch", &model::EngineConfig::maxBatch, integer(int()));
  option(c, "max_tokens_per_step", &model::EngineConfig::maxTokensPerStep,
         integer(int64_t()));
  option(c, "kv_pool_tokens", &model::EngineConfig::kvPoolTokens,
         integer(int64_t()));
  option(c, "enable_prefix_caching", &model::EngineConfig::prefixCaching,
         boolean);
  option(c, "seed", &model::EngineConfig::seed, integer(uint64_t()));
  c.def("validate", [](const model::EngineConfig &cfg) {
    try {
      cfg.validate();
    } catch (const rt::Error &e) {
      throw py::value_error(e.what());
    }
  });
}

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
  bindEngineConfig(m);
  py::class_<PyEngine>(m, "Engine")
      .def(py::init<const std::string &, const rt::Artifact *,
                    const std::string &, const model::EngineConfig &>(),
           py::arg("path"), py::arg("artifact"), py::arg("flow"),
           py::arg("config"))
      .def("generate", &PyEngine::generate)
      .def("add_request", &PyEngine::addRequest)
      .def("step", &PyEngine::step)
      // Every call into the engine releases the GIL before it takes the
      // engine's lock (a thread holding that lock never waits for the
      // GIL, so none can deadlock).
      .def("abort",
           [](PyEngine &e, const py::handle &id) -> py::object {
             const int64_t n = intArg<int64_t>(id, "request_id");
             std::optional<model::RequestOutput> o;
             {
               py::gil_scoped_release release;
               o = e.engine->abort(n);
             }
             return o ? py::object(outputDict(*o)) : py::object(py::none());
           })
      .def("generated_since",
           [](const PyEngine &e, const py::handle &id,
              const py::handle &from) -> py::object {
             const int64_t n = intArg<int64_t>(id, "request_id");
             const int64_t start = intArg<int64_t>(from, "start", 0);
             std::optional<model::Generated> g;
             {
               py::gil_scoped_release release;
               g = e.engine->generatedSince(n, start);
             }
             if (!g)
               return py::none();
             return py::make_tuple(g->tokens, logprobsList(g->logprobs));
           })
      .def("has_unfinished",
           [](const PyEngine &e) {
             py::gil_scoped_release release;
             return e.engine->hasUnfinished();
           })
      .def("stats", &PyEngine::stats)
      .def("prompt_logits", &PyEngine::promptLogits)
      .def("clear_prefix_cache",
           [](PyEngine &e) {
             py::gil_scoped_release release;
             e.engine->clearPrefixCache();
           })
      .def_static("check_sampling_params",
                  [](const py::dict &d) { samplingParams(d); })
      .def("model_config", [](const PyEngine &e) {
        return e.engine->modelConfig().toJson().dump();
      });
}
