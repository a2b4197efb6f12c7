//===- ModelInfo.cpp - vflow._vflow.model_info ----------------------------===//
//
// model_info(path) -> (config JSON, GGUF metadata JSON or "null"): opens a
// Hugging Face model directory or a .gguf file with ModelWeights::open
// (which checks the files, the config and every tensor; its errors are
// vflow::rt::Error, i.e. vflow._vflow.RuntimeError, naming the file and
// why) and hands back the model's ModelConfig::toJson() and, for a GGUF
// file, every metadata key (tokenizer.ggml.*, tokenizer.chat_template, ...).
//
//===----------------------------------------------------------------------===//

#include "ModelInfo.h"

#include "vflow/Model/Weights.h"

#include <string>
#include <utility>

namespace py = pybind11;

namespace {

std::pair<std::string, std::string> modelInfo(const std::string &path) {
  std::pair<std::string, std::string> info;
  {
    py::gil_scoped_release release;
    vflow::model::ModelWeights weights = vflow::model::ModelWeights::open(path);
    info.first = weights.config().toJson().dump();
    info.second = weights.ggufMetadata().dump();
  }
  return info;
}

} // namespace

void vflow::python::bindModelInfo(py::module_ &m) {
  m.def(
      "model_info",
      [](const std::string &path) {
        std::pair<std::string, std::string> info = modelInfo(path);
        return py::make_tuple(std::move(info.first), std::move(info.second));
      },
      py::arg("path"),
      "(config JSON, GGUF metadata JSON or \"null\") of a Hugging Face model "
      "directory or a .gguf file");
}
