//===- ModelConfigTest.cpp - Configs from HF config.json and GGUF ---------===//

#include "ModelTestUtil.h"

#include "vflow/Model/ModelConfig.h"

#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

using namespace vflow;
using namespace vflow::model;
using namespace vflow::model::test;
using vflow::rt::Json;

namespace {

Json parse(const std::string &text) { return Json::parse(text, "test"); }

/// A real model's config.json (abridged) from tests/model/configs: SmolLM2
/// 135M Instruct, Mistral 7B, Qwen2 0.5B, Qwen3 0.6B, Llama 3.2 1B.
ModelConfig realConfig(const std::string &name) {
  std::string path = std::string(VFLOW_MODEL_CONFIGS_DIR) + "/" + name;
  std::string text = readFile(path);
  if (text.empty())
    throw std::runtime_error("cannot read " + path);
  return configFromHF(Json::parse(text, path), "config.json");
}

} // namespace

TEST(ModelConfig, LlamaFromHF) {
  ModelConfig c = realConfig("smollm2-135m-instruct.json");
  EXPECT_EQ(c.arch, "llama");
  expectShape(c, kSmolLM2Shape);
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
  ModelConfig c = realConfig("mistral.json");
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.headDim, 128);
  EXPECT_DOUBLE_EQ(c.rmsNormEps, 1e-6);
  EXPECT_FALSE(c.tieEmbeddings);
  EXPECT_EQ(c.bosTokenId, -1);
  EXPECT_TRUE(c.eosTokenIds.empty());
}

TEST(ModelConfig, Qwen2HasBiasesAndEosLists) {
  ModelConfig c = realConfig("qwen2.json");
  EXPECT_EQ(c.arch, "qwen2");
  EXPECT_TRUE(c.attentionBias);
  EXPECT_FALSE(c.qkNorm);
  EXPECT_EQ(c.headDim, 64);
  EXPECT_EQ(c.eosTokenIds, std::vector<int64_t>({151645, 151643}));
}

TEST(ModelConfig, Qwen3HasExplicitHeadDimAndQKNorm) {
  ModelConfig c = realConfig("qwen3.json");
  EXPECT_EQ(c.arch, "qwen3");
  EXPECT_EQ(c.headDim, 128);
  EXPECT_TRUE(c.qkNorm);
  EXPECT_FALSE(c.attentionBias);
}

TEST(ModelConfig, MixturesOfExperts) {
  ModelConfig q = realConfig("qwen3-30b-a3b.json");
  EXPECT_EQ(q.arch, "qwen3_moe");
  EXPECT_TRUE(q.qkNorm);
  EXPECT_EQ(q.numExperts, 128);
  EXPECT_EQ(q.expertsPerToken, 8);
  EXPECT_EQ(q.expertIntermediateSize, 768);
  EXPECT_TRUE(q.normTopKProb);
  EXPECT_TRUE(q.denseMlpLayers.empty());
  EXPECT_TRUE(q.moeLayer(0) && q.moeLayer(47));
  EXPECT_EQ(q.toJson().find("numExperts")->asInt(""), 128);

  ModelConfig m = realConfig("mixtral-8x7b.json");
  EXPECT_EQ(m.arch, "mixtral");
  EXPECT_FALSE(m.qkNorm);
  EXPECT_EQ(m.numExperts, 8);
  EXPECT_EQ(m.expertsPerToken, 2);
  EXPECT_EQ(m.expertIntermediateSize, 14336);
  EXPECT_TRUE(m.normTopKProb);

  // decoder_sparse_step 2 and mlp_only_layers: layers 0, 2 and 3 dense.
  std::string text =
      readFile(std::string(VFLOW_MODEL_CONFIGS_DIR) + "/qwen3-30b-a3b.json");
  Json j = Json::parse(text, "qwen3");
  j.set("num_hidden_layers", 6);
  j.set("decoder_sparse_step", 2);
  Json only = Json::array();
  only.push(Json(3));
  j.set("mlp_only_layers", std::move(only));
  ModelConfig s = configFromHF(j, "config.json");
  EXPECT_EQ(s.denseMlpLayers, (std::vector<int64_t>{0, 2, 3, 4}));
  EXPECT_TRUE(s.moeLayer(1) && s.moeLayer(5) && !s.moeLayer(3));
  j.set("num_experts_per_tok", 200);
  EXPECT_THROW(configFromHF(j, "config.json"), vflow::rt::Error);
}

/// DeepSeek-V2-Lite (the MLA shape of issue 33's throughput row): the
/// latent cache row, YaRN and its softmax scale, DeepSeek's experts; and
/// what DeepSeek-V3's router asks for is refused with the field.
TEST(ModelConfig, DeepseekV2LatentAttention) {
  ModelConfig c = realConfig("deepseek-v2-lite.json");
  EXPECT_EQ(c.arch, "deepseek_v2");
  EXPECT_TRUE(c.mla());
  EXPECT_EQ(c.numKVHeads, 1);
  EXPECT_EQ(c.headDim, 512 + 64);
  EXPECT_EQ(c.ropeDim(), 64);
  EXPECT_EQ(c.qLoraRank, 0);
  EXPECT_TRUE(c.ropeInterleaved);
  EXPECT_EQ(c.ropeScaling.type, RopeScaling::Type::Yarn);
  // mscale == mscale_all_dim: cos and sin unscaled; the softmax scale is
  // 192^-1/2 times (0.1 * 0.707 * ln 40 + 1)^2.
  EXPECT_DOUBLE_EQ(ropeAttentionFactor(c), 1.0);
  const double m = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.attentionScale, m * m / std::sqrt(192.0), 1e-12);
  EXPECT_EQ(c.numExperts, 64);
  EXPECT_EQ(c.expertsPerToken, 6);
  EXPECT_EQ(c.expertIntermediateSize, 1408);
  EXPECT_EQ(c.numSharedExperts, 2);
  EXPECT_FALSE(c.normTopKProb);
  EXPECT_EQ(c.denseMlpLayers, std::vector<int64_t>{0});
  EXPECT_TRUE(!c.moeLayer(0) && c.moeLayer(1) && c.moeLayer(26));
  // YaRN's frequencies: the fastest dimension keeps theta^0, the slowest
  // is divided by the factor.
  std::vector<float> inv = ropeInverseFrequencies(c);
  ASSERT_EQ(inv.size(), 32u);
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv[31], std::pow(10000.0, -62.0 / 64.0) / 40.0, 1e-12);
  EXPECT_EQ(c.toJson().find("kvLoraRank")->asInt(""), 512);

  std::string text =
      readFile(std::string(VFLOW_MODEL_CONFIGS_DIR) + "/deepseek-v2-lite.json");
  for (auto [key, value, field] :
       std::vector<std::tuple<std::string, Json, std::string>>{
           {"scoring_func", Json("sigmoid"), "scoring_func"},
           {"topk_method", Json("noaux_tc"), "topk_method"},
           {"norm_topk_prob", Json(true), "norm_topk_prob"},
           {"moe_layer_freq", Json(2), "moe_layer_freq"},
           {"qk_rope_head_dim", Json(7), "qkRopeHeadDim"}}) {
    Json j = Json::parse(text, "deepseek");
    j.set(key, value);
    try {
      configFromHF(j, "config.json");
      ADD_FAILURE() << key << " was accepted";
    } catch (const vflow::rt::Error &e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos)
          << e.what();
    }
  }
}

/// DeepSeek-V3's published config: V3's router (sigmoid, groups), a
/// low-rank query, one multi-token prediction layer (skipped at load).
TEST(ModelConfig, DeepseekV3Router) {
  ModelConfig c = realConfig("deepseek-v3.json");
  EXPECT_EQ(c.arch, "deepseek_v3");
  EXPECT_EQ(c.headDim, 576);
  EXPECT_EQ(c.qLoraRank, 1536);
  EXPECT_TRUE(c.sigmoidRouter && c.normTopKProb);
  EXPECT_EQ(c.expertGroups, 8);
  EXPECT_EQ(c.topkGroups, 4);
  EXPECT_DOUBLE_EQ(c.routedScalingFactor, 2.5);
  EXPECT_EQ(c.numSharedExperts, 1);
  EXPECT_EQ(c.mtpLayers, 1);
  EXPECT_EQ(c.denseMlpLayers, (std::vector<int64_t>{0, 1, 2}));
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.attentionScale, m * m / std::sqrt(192.0), 1e-12);
  std::string text =
      readFile(std::string(VFLOW_MODEL_CONFIGS_DIR) + "/deepseek-v3.json");
  for (auto [key, value] : std::vector<std::pair<std::string, Json>>{
           {"scoring_func", Json("softmax")},
           {"topk_method", Json("greedy")},
           {"n_group", Json(3)}}) {
    Json j = Json::parse(text, "deepseek-v3");
    j.set(key, value);
    EXPECT_THROW(configFromHF(j, "config.json"), vflow::rt::Error) << key;
  }
}

TEST(ModelConfig, Llama3RopeScaling) {
  ModelConfig c = realConfig("llama3-rope-scaling.json");
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
  // YaRN without mscales: cos and sin times 0.1 ln(factor) + 1.
  c = configFromHF(parse(base + R"("rope_scaling": {"rope_type": "yarn",
      "factor": 4.0, "original_max_position_embeddings": 32}})"),
                   "config.json");
  EXPECT_EQ(c.ropeScaling.type, RopeScaling::Type::Yarn);
  EXPECT_DOUBLE_EQ(ropeAttentionFactor(c), 0.1 * std::log(4.0) + 1.0);
  expectError(
      [&] {
        configFromHF(parse(base + R"("rope_scaling": {"rope_type": "yarn",
            "factor": 4.0}})"),
                     "config.json");
      },
      "config.json", "original_max_position_embeddings");
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
  ModelShape shape = kSmolLM2Shape;
  shape.vocabSize = 100; // the tokenizer's tokens
  expectShape(c, shape);
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
  // One key changed at a time: each refused, the message naming what.
  const struct {
    const char *key;
    Json value;
    const char *where, *why;
  } bad[] = {
      {"llama.rope.scaling.type", "yarn", "m.gguf",
       "rope scaling 'yarn' is not supported"},
      {"llama.rope.dimension_count", 32, "llama.rope.dimension_count",
       "partial rotary"},
      {"llama.block_count", Json(), "m.gguf", "llama.block_count"},
      {"general.architecture", "gpt2", "m.gguf",
       "general.architecture 'gpt2' is not supported"},
      {"llama.attention.head_count_kv", 4, "m.gguf",
       "numKVHeads (4) must divide numHeads (9)"},
  };
  for (const auto &b : bad) {
    SCOPED_TRACE(b.key);
    Json edited = m;
    edited.set(b.key, b.value);
    expectError([&] { configFromGGUF(edited, "m.gguf", 0, true); }, b.where,
                b.why);
  }
}
