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
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Files.h"

#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

std::pair<std::string, std::string> modelInfo(const std::string &path) {
  vflow::python::checkPath(path, "model path");
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

void vflow::python::checkPath(const std::string &path,
                              const std::string &what) {
  try {
    vflow::rt::checkPathText(path, what);
  } catch (const vflow::rt::Error &e) {
    throw py::value_error(e.what());
  }
}

void vflow::python::bindModelInfo(py::module_ &m) {
  // The model's tensors as the engine reads them (dequantized, Hugging
  // Face names and layouts): for comparisons with other implementations.
  py::class_<vflow::model::ModelWeights>(m, "ModelFile")
      .def(py::init([](const std::string &path) {
             checkPath(path, "model path");
             py::gil_scoped_release release;
             return vflow::model::ModelWeights::open(path);
           }),
           py::arg("path"))
      .def("names", &vflow::model::ModelWeights::names)
      .def("shape", &vflow::model::ModelWeights::shape)
      .def("config",
           [](const vflow::model::ModelWeights &w) {
             return w.config().toJson().dump();
           })
      .def("to_float",
           [](const vflow::model::ModelWeights &w, const std::string &name) {
             std::vector<float> data = w.toFloat(name);
             return py::bytes(reinterpret_cast<const char *>(data.data()),
                              data.size() * sizeof(float));
           });
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
