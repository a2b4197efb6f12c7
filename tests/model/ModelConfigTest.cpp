//===- ModelConfigTest.cpp - Configs from HF config.json and GGUF ---------===//

#include "ModelTestUtil.h"

#include "vflow/Model/ModelConfig.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace vflow;
using namespace vflow::model;
using namespace vflow::model::test;
using vflow::rt::Json;

namespace {

Json parse(const std::string &text) { return Json::parse(text, "test"); }

// SmolLM2-135M-Instruct's config.json (abridged).
const char *smolConfig = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 576, "intermediate_size": 1536,
  "max_position_embeddings": 8192, "num_attention_heads": 9,
  "num_hidden_layers": 30, "num_key_value_heads": 3,
  "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 100000,
  "tie_word_embeddings": true, "vocab_size": 49152,
  "attention_bias": false, "mlp_bias": false})";

} // namespace

TEST(ModelConfig, LlamaFromHF) {
  ModelConfig c = configFromHF(parse(smolConfig), "config.json");
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.vocabSize, 49152);
  EXPECT_EQ(c.hiddenSize, 576);
  EXPECT_EQ(c.intermediateSize, 1536);
  EXPECT_EQ(c.numLayers, 30);
  EXPECT_EQ(c.numHeads, 9);
  EXPECT_EQ(c.numKVHeads, 3);
  EXPECT_EQ(c.headDim, 64);
  EXPECT_DOUBLE_EQ(c.rmsNormEps, 1e-5);
  EXPECT_DOUBLE_EQ(c.ropeTheta, 100000);
  EXPECT_EQ(c.ropeScaling.type, RopeScaling::Type::None);
  EXPECT_EQ(c.maxPositions, 8192);
  EXPECT_TRUE(c.tieEmbeddings);
  EXPECT_FALSE(c.attentionBias);
  EXPECT_FALSE(c.qkNorm);
  EXPECT_EQ(c.bosTokenId, 1);
  EXPECT_EQ(c.eosTokenIds, std::vector<int64_t>({2}));
  EXPECT_EQ(c.toJson().find("numKVHeads")->asInt(""), 3);
}

TEST(ModelConfig, MistralMapsToLlamaAndDefaults) {
  ModelConfig c =
      configFromHF(parse(R"({"model_type": "mistral", "vocab_size": 32000,
        "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "max_position_embeddings": 32768,
        "sliding_window": null, "rope_theta": 1000000.0})"),
                   "config.json");
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.headDim, 128);
  EXPECT_DOUBLE_EQ(c.rmsNormEps, 1e-6);
  EXPECT_FALSE(c.tieEmbeddings);
  EXPECT_EQ(c.bosTokenId, -1);
  EXPECT_TRUE(c.eosTokenIds.empty());
}

TEST(ModelConfig, Qwen2HasBiasesAndEosLists) {
  ModelConfig c =
      configFromHF(parse(R"({"model_type": "qwen2", "vocab_size": 151936,
        "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "sliding_window": 32768, "use_sliding_window": false,
        "tie_word_embeddings": true, "bos_token_id": 151643,
        "eos_token_id": [151645, 151643]})"),
                   "config.json");
  EXPECT_EQ(c.arch, "qwen2");
  EXPECT_TRUE(c.attentionBias);
  EXPECT_FALSE(c.qkNorm);
  EXPECT_EQ(c.headDim, 64);
  EXPECT_EQ(c.eosTokenIds, std::vector<int64_t>({151645, 151643}));
}

TEST(ModelConfig, Qwen3HasExplicitHeadDimAndQKNorm) {
  ModelConfig c =
      configFromHF(parse(R"({"model_type": "qwen3", "vocab_size": 151936,
        "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128,
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000, "attention_bias": false,
        "tie_word_embeddings": true, "eos_token_id": 151645})"),
                   "config.json");
  EXPECT_EQ(c.arch, "qwen3");
  EXPECT_EQ(c.headDim, 128);
  EXPECT_TRUE(c.qkNorm);
  EXPECT_FALSE(c.attentionBias);
}

TEST(ModelConfig, Llama3RopeScaling) {
  ModelConfig c =
      configFromHF(parse(R"({"model_type": "llama", "vocab_size": 128256,
        "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "max_position_embeddings": 131072,
        "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
          "low_freq_factor": 1.0, "original_max_position_embeddings": 8192,
          "rope_type": "llama3"},
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]})"),
                   "config.json");
  const RopeScaling &s = c.ropeScaling;
  EXPECT_EQ(s.type, RopeScaling::Type::Llama3);
  EXPECT_DOUBLE_EQ(s.factor, 32);
  EXPECT_DOUBLE_EQ(s.lowFreqFactor, 1);
  EXPECT_DOUBLE_EQ(s.highFreqFactor, 4);
  EXPECT_EQ(s.originalMaxPositions, 8192);

  // Hugging Face's rule, frequency by frequency: high frequencies (short
  // wavelengths) unchanged, low ones divided by the factor, the band in
  // between interpolated.
  std::vector<float> inv = ropeInverseFrequencies(c);
  ASSERT_EQ(inv.size(), 32u);
  const double pi = 3.14159265358979323846;
  int high = 0, low = 0, mid = 0;
  for (size_t i = 0; i < inv.size(); ++i) {
    double base = 1.0 / std::pow(500000.0, double(2 * i) / 64.0);
    double wavelen = 2 * pi / base;
    double want;
    if (wavelen < 8192.0 / 4) {
      want = base, ++high;
    } else if (wavelen > 8192.0 / 1) {
      want = base / 32, ++low;
    } else {
      double smooth = (8192.0 / wavelen - 1) / (4 - 1);
      want = (1 - smooth) * base / 32 + smooth * base, ++mid;
    }
    EXPECT_NEAR(inv[i], want, 1e-6 * want) << i;
  }
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(mid, 0);
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
}

TEST(ModelConfig, LinearAndUnsupportedRopeScaling) {
  std::string base = R"({"model_type": "llama", "vocab_size": 10,
      "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
      "num_attention_heads": 2, "max_position_embeddings": 64,)";
  ModelConfig c = configFromHF(
      parse(base + R"("rope_scaling": {"type": "linear", "factor": 2.0}})"),
      "config.json");
  EXPECT_EQ(c.ropeScaling.type, RopeScaling::Type::Linear);
  EXPECT_FLOAT_EQ(ropeInverseFrequencies(c)[1], 0.01f / 2);
  expectError(
      [&] {
        configFromHF(parse(base + R"("rope_scaling": {"rope_type": "yarn",
            "factor": 4.0, "original_max_position_embeddings": 32768}})"),
                     "config.json");
      },
      "config.json", "rope scaling 'yarn' is not supported");
  expectError(
      [&] {
        configFromHF(
            parse(base +
                  R"("rope_scaling": {"type": "dynamic", "factor": 2.0}})"),
            "config.json");
      },
      "rope scaling 'dynamic' is not supported");
  // Transformers 5 spelling.
  c = configFromHF(parse(base + R"("rope_parameters": {"rope_type":
      "default", "rope_theta": 5000.0}})"),
                   "config.json");
  EXPECT_DOUBLE_EQ(c.ropeTheta, 5000);
  EXPECT_EQ(c.ropeScaling.type, RopeScaling::Type::None);
}

TEST(ModelConfig, HFErrorsNameTheProblem) {
  std::string ok = R"("vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 16, "num_hidden_layers": 1,
      "max_position_embeddings": 64)";
  auto load = [&](const std::string &text) {
    configFromHF(parse(text), "cfg.json");
  };
  expectError([&] { load(R"({"model_type": "gpt2", )" + ok + "}"); },
              "cfg.json", "model_type 'gpt2' is not supported", "llama",
              "qwen2", "qwen3");
  expectError([&] { load(R"({"model_type": "llama"})"); }, "cfg.json",
              "missing", "vocab_size");
  expectError(
      [&] {
        load(R"({"model_type": "llama", "num_attention_heads": 3, )" + ok +
             "}");
      },
      "hidden_size (8) is not divisible by num_attention_heads (3)");
  expectError(
      [&] {
        load(R"({"model_type": "llama", "num_attention_heads": 4,
            "num_key_value_heads": 3, )" +
             ok + "}");
      },
      "cfg.json", "numKVHeads (3) must divide numHeads (4)");
  expectError(
      [&] {
        load(R"({"model_type": "llama", "num_attention_heads": 2,
            "head_dim": 0, )" +
             ok + "}");
      },
      "headDim");
  expectError(
      [&] {
        load(R"({"model_type": "llama", "num_attention_heads": 2,
            "attention_bias": true, )" +
             ok + "}");
      },
      "attention_bias");
  expectError(
      [&] {
        load(R"({"model_type": "llama", "num_attention_heads": 2,
            "hidden_act": "gelu", )" +
             ok + "}");
      },
      "hidden_act 'gelu'");
  expectError(
      [&] {
        load(R"({"model_type": "llama", "num_attention_heads": 2,
            "eos_token_id": [2, 99], )" +
             ok + "}");
      },
      "eosTokenIds (99)");
  expectError(
      [&] {
        load(R"({"model_type": "llama", "num_attention_heads": 2,
            "num_hidden_layers": "two", "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": 16, "max_position_embeddings": 64})");
      },
      "num_hidden_layers");
}

TEST(ModelConfig, ValidateNamesTheField) {
  ModelConfig c = tinyConfig("llama");
  c.validate();
  ModelConfig bad = c;
  bad.hiddenSize = 0;
  expectError([&] { bad.validate(); }, "hiddenSize");
  bad = c;
  bad.numKVHeads = 3;
  expectError([&] { bad.validate(); }, "numKVHeads", "numHeads");
  bad = c;
  bad.headDim = 7;
  expectError([&] { bad.validate(); }, "headDim (7) must be even");
  bad = c;
  bad.rmsNormEps = 0;
  expectError([&] { bad.validate(); }, "rmsNormEps");
  bad = c;
  bad.arch = "gpt2";
  expectError([&] { bad.validate(); }, "arch");
  bad = c;
  bad.ropeScaling.type = RopeScaling::Type::Llama3;
  bad.ropeScaling.factor = 8;
  expectError([&] { bad.validate(); }, "originalMaxPositions");
  bad = c;
  bad.bosTokenId = 16;
  expectError([&] { bad.validate(); }, "bosTokenId");
}

TEST(ModelConfig, FromGGUFMetadata) {
  Json m = Json::object();
  m.set("general.architecture", "llama");
  m.set("llama.block_count", 30);
  m.set("llama.context_length", 8192);
  m.set("llama.embedding_length", 576);
  m.set("llama.feed_forward_length", 1536);
  m.set("llama.attention.head_count", 9);
  m.set("llama.attention.head_count_kv", 3);
  m.set("llama.rope.freq_base", 100000.0);
  m.set("llama.attention.layer_norm_rms_epsilon", 1e-5);
  m.set("llama.rope.dimension_count", 64);
  Json tokens = Json::array();
  for (int i = 0; i < 100; ++i)
    tokens.push("t" + std::to_string(i));
  m.set("tokenizer.ggml.tokens", tokens);
  m.set("tokenizer.ggml.bos_token_id", 1);
  m.set("tokenizer.ggml.eos_token_id", 2);
  m.set("tokenizer.ggml.eot_token_id", 2);

  ModelConfig c = configFromGGUF(m, "m.gguf", 0, false);
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.numLayers, 30);
  EXPECT_EQ(c.hiddenSize, 576);
  EXPECT_EQ(c.numHeads, 9);
  EXPECT_EQ(c.numKVHeads, 3);
  EXPECT_EQ(c.headDim, 64);
  EXPECT_EQ(c.vocabSize, 100); // the tokenizer's tokens
  EXPECT_TRUE(c.tieEmbeddings);
  EXPECT_EQ(c.bosTokenId, 1);
  EXPECT_EQ(c.eosTokenIds, std::vector<int64_t>({2}));

  m.set("llama.vocab_size", 120);
  EXPECT_EQ(configFromGGUF(m, "m.gguf", 0, true).vocabSize, 120);
  EXPECT_FALSE(configFromGGUF(m, "m.gguf", 0, true).tieEmbeddings);

  Json linear = m;
  linear.set("llama.rope.scaling.type", "linear");
  linear.set("llama.rope.scaling.factor", 4.0);
  EXPECT_DOUBLE_EQ(configFromGGUF(linear, "m.gguf", 0, true).ropeScaling.factor,
                   4.0);
  Json yarn = m;
  yarn.set("llama.rope.scaling.type", "yarn");
  expectError([&] { configFromGGUF(yarn, "m.gguf", 0, true); }, "m.gguf",
              "rope scaling 'yarn' is not supported");
  Json partial = m;
  partial.set("llama.rope.dimension_count", 32);
  expectError([&] { configFromGGUF(partial, "m.gguf", 0, true); },
              "llama.rope.dimension_count", "partial rotary");
  Json noLayers = m;
  noLayers.set("llama.block_count", Json());
  expectError([&] { configFromGGUF(noLayers, "m.gguf", 0, true); }, "m.gguf",
              "llama.block_count");
  Json gpt2 = m;
  gpt2.set("general.architecture", "gpt2");
  expectError([&] { configFromGGUF(gpt2, "m.gguf", 0, true); }, "m.gguf",
              "general.architecture 'gpt2' is not supported");
  Json badKV = m;
  badKV.set("llama.attention.head_count_kv", 4);
  expectError([&] { configFromGGUF(badKV, "m.gguf", 0, true); }, "m.gguf",
              "numKVHeads (4) must divide numHeads (9)");
}
