//===- GgufTest.cpp - GGUF files: types, names, permutation, metadata -----===//

#include "ModelTestUtil.h"

#include "vflow/Model/Weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

using namespace vflow;
using namespace vflow::model;
using namespace vflow::model::test;
using vflow::rt::Json;

namespace {

/// Each tensor's values, as a model file's writer expects them to decode.
using Values = std::map<std::string, std::vector<float>>;

void expectTensors(const ModelWeights &w, const Values &expected) {
  EXPECT_EQ(w.names().size(), expected.size());
  for (const auto &[name, values] : expected) {
    ASSERT_TRUE(w.has(name)) << name;
    EXPECT_EQ(w.toFloat(name), values) << name;
    std::vector<uint16_t> bf16(values.size());
    w.toBF16(name, bf16.data());
    for (size_t i = 0; i < values.size(); ++i)
      ASSERT_EQ(bf16[i], rt::floatToBF16(values[i])) << name << " " << i;
  }
}

/// tinyConfig("llama") stored all F32; `expected` gets its values.
GgufWriter f32Llama(Values &expected) {
  return ggufModel(tinyConfig("llama"), storedAs(TF32), expected);
}

} // namespace

TEST(Gguf, DequantizesEveryType) {
  TempDir dir;
  ModelConfig c = tinyConfig("qwen2");
  const uint32_t types[] = {TF32, TF16, TBF16, TQ8_0, TQ4_0, TQ4_1};
  std::map<std::string, uint32_t> typeOf;
  int i = 0;
  Values expected;
  GgufWriter w = ggufModel(
      c,
      [&](const std::string &name) {
        // Biases and norms are 1-D: F32 as llama.cpp writes them.
        bool vector = name.find("norm") != std::string::npos ||
                      name.find("bias") != std::string::npos;
        return typeOf[name] = vector ? uint32_t(TF32) : types[i++ % 6];
      },
      expected);
  std::string path = dir.path("tiny.gguf");
  writeFile(path, w.build());
  ModelWeights m = ModelWeights::open(path);
  EXPECT_EQ(m.format(), ModelWeights::Format::GGUF);
  EXPECT_EQ(m.config().arch, "qwen2");
  EXPECT_TRUE(m.config().attentionBias);
  EXPECT_FALSE(m.config().tieEmbeddings);
  expectTensors(m, expected);
  EXPECT_EQ(m.storageType("model.layers.0.self_attn.v_proj.weight"), "Q8_0");
  EXPECT_EQ(m.storageType("model.layers.0.self_attn.o_proj.weight"), "Q4_0");
  EXPECT_EQ(m.storageType("model.layers.0.mlp.gate_proj.weight"), "Q4_1");
  EXPECT_EQ(m.shape("model.layers.0.mlp.down_proj.weight"),
            std::vector<int64_t>({32, 64}));

  // Spot-check the block formats against values worked out by hand. Q8_0's
  // first block: d = 0.5, q[0] = (seed % 255) - 127.
  unsigned seed = unsigned(
      std::string("model.layers.0.self_attn.v_proj.weight").size() * 13);
  EXPECT_EQ(m.toFloat("model.layers.0.self_attn.v_proj.weight")[0],
            float(int(seed % 255) - 127) * 0.5f);
}

TEST(Gguf, UndoesLlamaCppsQKPermutation) {
  ModelConfig c = tinyConfig("llama");
  Values hf;
  // Known HF weights: q as small integers (exact in Q8_0 with d = 1), k as
  // F32; every row different.
  auto build = [&](const std::string &arch) {
    ModelConfig cc = c;
    cc.arch = arch;
    cc.attentionBias = false;
    GgufWriter w;
    writeConfig(w, cc);
    for (const TensorSpec &t : modelTensors(cc)) {
      std::vector<float> values = pattern(t.name, count(t.shape));
      bool isQ = t.name.find("q_proj") != std::string::npos;
      bool isK = t.name.find("k_proj") != std::string::npos;
      if (isQ)
        for (size_t i = 0; i < values.size(); ++i)
          values[i] = float(int(i / 32 * 3 + i % 32) % 200 - 100);
      hf[t.name] = values;
      std::vector<float> out = values;
      if (arch == "llama" && (isQ || isK))
        out = llamaCppPermute(values, t.shape[0],
                              isQ ? cc.numHeads : cc.numKVHeads);
      if (isQ)
        w.tensor(ggufName(t.name), t.shape, TQ8_0, q8_0Exact(out));
      else
        w.tensor(ggufName(t.name), t.shape, TF32, encodeFloats(out, "F32"));
    }
    return w.build();
  };
  TempDir dir;
  writeFile(dir.path("llama.gguf"), build("llama"));
  ModelWeights m = ModelWeights::open(dir.path("llama.gguf"));
  expectTensors(m, hf);
  // The permutation really moved rows: the stored order differs.
  std::vector<float> k = hf["model.layers.1.self_attn.k_proj.weight"];
  EXPECT_NE(llamaCppPermute(k, 16, 2), k);

  // Qwen GGUFs are not permuted: the same kind of file loads as stored.
  writeFile(dir.path("qwen3.gguf"), [&] {
    c.qkNorm = true;
    return build("qwen3");
  }());
  expectTensors(ModelWeights::open(dir.path("qwen3.gguf")), hf);
}

TEST(Gguf, TiedAndUntiedEmbeddings) {
  TempDir dir;
  for (bool tied : {true, false}) {
    ModelConfig c = tinyConfig("llama");
    c.tieEmbeddings = tied;
    Values expected;
    GgufWriter w = ggufModel(c, storedAs(TF16), expected);
    std::string path = dir.path(tied ? "tied.gguf" : "untied.gguf");
    writeFile(path, w.build());
    ModelWeights m = ModelWeights::open(path);
    EXPECT_EQ(m.config().tieEmbeddings, tied);
    EXPECT_EQ(m.has("lm_head.weight"), !tied);
    expectTensors(m, expected);
  }
}

TEST(Gguf, Gemma3AsLlamaCppWritesIt) {
  // llama.cpp's gemma3 GGUF: the four norms a block under their GGUF
  // names, q/k norms, a sliding window with every sixth layer full; the
  // norms' (1 + w) is in the file (no offset at load), embeddings scale by
  // sqrt(hidden), GeGLU, the scale 1/sqrt(head dim), the local RoPE base
  // 10000.
  TempDir dir;
  ModelConfig c = tinyConfig("gemma3");
  c.numLayers = 7;
  c.slidingWindow = 24;
  Values expected;
  GgufWriter w = ggufModel(c, storedAs(TF32), expected);
  std::string path = dir.path("gemma3.gguf");
  writeFile(path, w.build());
  ModelWeights m = ModelWeights::open(path);
  const ModelConfig &got = m.config();
  EXPECT_EQ(got.arch, "gemma3");
  EXPECT_TRUE(got.qkNorm);
  EXPECT_TRUE(got.sandwichNorms);
  EXPECT_EQ(got.activation, "gelu_tanh");
  EXPECT_EQ(got.normWeightOffset, 0.0);
  EXPECT_DOUBLE_EQ(got.embedScale, std::sqrt(32.0));
  EXPECT_EQ(got.attentionScale, 0.0);
  EXPECT_EQ(got.ropeLocalTheta, 10000.0);
  EXPECT_EQ(got.slidingWindow, 24);
  EXPECT_EQ(got.fullAttentionLayers, (std::vector<int64_t>{5}));
  EXPECT_TRUE(got.slidingLayer(4));
  EXPECT_FALSE(got.slidingLayer(5));
  EXPECT_TRUE(m.has("model.layers.3.pre_feedforward_layernorm.weight"));
  EXPECT_TRUE(m.has("model.layers.3.post_feedforward_layernorm.weight"));
  expectTensors(m, expected);
}

TEST(Gguf, MetadataReadsBack) {
  TempDir dir;
  Values expected;
  GgufWriter w = f32Llama(expected);
  std::vector<std::string> tokens;
  for (int i = 0; i < 16; ++i)
    tokens.push_back(i == 3 ? std::string("\xc4\xa0the")
                            : "tok" + std::to_string(i));
  w.kvString("tokenizer.ggml.model", "gpt2");
  w.kvStrings("tokenizer.ggml.tokens", tokens);
  w.kvStrings("tokenizer.ggml.merges", {"\xc4\xa0 t", "h e"});
  w.kvInts("tokenizer.ggml.token_type", std::vector<int32_t>(16, 1));
  w.kvFloats("tokenizer.ggml.scores", {0.5f, -1.25f});
  w.kvU32("tokenizer.ggml.bos_token_id", 1);
  w.kvU32("tokenizer.ggml.eos_token_id", 2);
  w.kvBool("tokenizer.ggml.add_bos_token", false);
  w.kvString("tokenizer.chat_template", "{% for m in messages %}{% endfor %}");
  for (uint32_t version : {3u, 2u}) {
    w.version = version;
    std::string path = dir.path("meta" + std::to_string(version) + ".gguf");
    writeFile(path, w.build());
    ModelWeights m = ModelWeights::open(path);
    const Json &meta = m.ggufMetadata();
    ASSERT_EQ(meta.getKind(), Json::Kind::Object);
    EXPECT_EQ(meta.find("general.architecture")->asString(""), "llama");
    EXPECT_EQ(meta.find("tokenizer.ggml.model")->asString(""), "gpt2");
    const auto &toks = meta.find("tokenizer.ggml.tokens")->asArray("");
    ASSERT_EQ(toks.size(), 16u);
    EXPECT_EQ(toks[3].asString(""), "\xc4\xa0the");
    EXPECT_EQ(meta.find("tokenizer.ggml.merges")->asArray("")[0].asString(""),
              "\xc4\xa0 t");
    EXPECT_EQ(meta.find("tokenizer.ggml.token_type")->asArray("").size(), 16u);
    EXPECT_EQ(meta.find("tokenizer.ggml.scores")->asArray("")[1].asNumber(""),
              -1.25);
    EXPECT_FALSE(meta.find("tokenizer.ggml.add_bos_token")->asBool(""));
    EXPECT_EQ(meta.find("tokenizer.chat_template")->asString(""),
              "{% for m in messages %}{% endfor %}");
    EXPECT_EQ(meta.find("llama.attention.head_count_kv")->asInt(""), 2);
    EXPECT_EQ(m.config().bosTokenId, 1);
    EXPECT_EQ(m.config().eosTokenIds, std::vector<int64_t>({2}));
    expectTensors(m, expected);
  }
}

TEST(Gguf, RopeFreqsBecomeFreqFactors) {
  TempDir dir;
  Values expected;
  GgufWriter w = f32Llama(expected);
  w.tensor("rope_freqs.weight", {4}, TF32,
           encodeFloats({1.0f, 1.0f, 2.0f, 8.0f}, "F32"));
  writeFile(dir.path("m.gguf"), w.build());
  ModelWeights m = ModelWeights::open(dir.path("m.gguf"));
  EXPECT_EQ(m.config().ropeScaling.type, RopeScaling::Type::FreqFactors);
  std::vector<float> inv = ropeInverseFrequencies(m.config());
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_FLOAT_EQ(inv[3], float(1.0 / std::pow(10000.0, 6.0 / 8.0) / 8.0));
  EXPECT_TRUE(m.has("rope_freqs.weight"));
}

TEST(Gguf, BadFilesAreErrorsNamingFileAndPlace) {
  TempDir dir;
  ModelConfig c = tinyConfig("llama");
  Values expected;
  std::string good = ggufModel(c, storedAs(TF32), expected).build();
  std::string path = dir.path("bad.gguf");
  auto open = [&] { ModelWeights::open(path); };
  auto put = [&](const std::string &bytes) { writeFile(path, bytes); };

  put("GGUX" + good.substr(4));
  expectError(open, path, "byte 0", "bad magic 'GGUX'");
  for (uint32_t version : {1u, 4u}) {
    std::string v = good;
    std::memcpy(&v[4], &version, 4);
    put(v);
    expectError(open, path, "byte 4",
                "unsupported GGUF version " + std::to_string(version));
  }
  put("");
  expectError(open, path, "truncated");

  // Every cut is an Error (never a crash or an out-of-bounds read): all of
  // the header, then a sample through the data.
  for (size_t cut = 0; cut < good.size(); cut += cut < 2048 ? 1 : 61) {
    put(good.substr(0, cut));
    try {
      ModelWeights::open(path);
      ADD_FAILURE() << "a file cut at byte " << cut << " opened";
    } catch (const rt::Error &) {
    }
  }

  // Corrupt header bytes: an Error or (for harmless bytes) a model, never
  // anything else.
  for (size_t at = 4; at < 2048 && at < good.size(); at += 3) {
    std::string bad = good;
    bad[at] = char(bad[at] ^ 0xA5);
    put(bad);
    try {
      ModelWeights::open(path);
    } catch (const rt::Error &) {
    } catch (const std::exception &e) {
      ADD_FAILURE() << "byte " << at << ": " << e.what();
    }
  }

  auto withTensors = [&](const std::function<void(GgufWriter &)> &edit) {
    GgufWriter w = ggufModel(c, storedAs(TF32), expected);
    edit(w);
    put(w.build());
  };
  // Tensor data past the end of the file.
  withTensors([](GgufWriter &w) { w.setOffset(0, uint64_t(1) << 40); });
  expectError(open, path, "tensor 'token_embd.weight'", "outside the file");
  withTensors([](GgufWriter &w) { w.setOffset(1, 8); });
  expectError(open, path, "tensor 'blk.0.attn_q.weight'",
              "not a multiple of the alignment 32");
  // Types other than the supported ones are named.
  withTensors([](GgufWriter &w) {
    w.tensor("blk.0.extra.weight", {1, 256}, TIQ2_XXS, std::string(66, '\0'));
  });
  expectError(open, path, "tensor 'blk.0.extra.weight'", "IQ2_XXS",
              "not supported");
  withTensors([](GgufWriter &w) {
    w.tensor("blk.0.extra.weight", {3}, TQ8_0, std::string(34, '\0'));
  });
  expectError(open, path, "blk.0.extra.weight", "row length 3", "block of 32");
  // Tensors the config does not imply.
  withTensors([](GgufWriter &w) {
    w.tensor("blk.0.attn_output.bias", {32}, TF32, std::string(128, '\0'));
  });
  expectError(open, path, "model.layers.0.self_attn.o_proj.bias",
              "blk.0.attn_output.bias", "unexpected");

  // Missing and misshapen tensors, by both names.
  GgufWriter w;
  writeConfig(w, c);
  for (const TensorSpec &t : modelTensors(c))
    if (t.name != "model.layers.1.mlp.up_proj.weight")
      w.tensor(ggufName(t.name),
               t.name == "model.norm.weight" ? std::vector<int64_t>{16}
                                             : t.shape,
               TF32, std::string(size_t(count(t.shape)) * 4, '\0'));
  put(w.build());
  expectError(open, path, "model.norm.weight", "output_norm.weight",
              "has shape [16]", "implies [32]");

  GgufWriter missing;
  writeConfig(missing, c);
  for (const TensorSpec &t : modelTensors(c))
    if (t.name != "model.layers.1.mlp.up_proj.weight")
      missing.tensor(ggufName(t.name), t.shape, TF32,
                     std::string(size_t(count(t.shape)) * 4, '\0'));
  put(missing.build());
  expectError(open, path, "missing tensors", "blk.1.ffn_up.weight",
              "model.layers.1.mlp.up_proj.weight");

  GgufWriter gpt2;
  gpt2.kvString("general.architecture", "gpt2");
  put(gpt2.build());
  expectError(open, path, "general.architecture 'gpt2' is not supported");

  GgufWriter split;
  split.kvU32("split.count", 3);
  put(split.build());
  expectError(open, path, "'split.count' is 3", "not supported");

  GgufWriter dup;
  dup.kvU32("a", 1);
  dup.kvU32("a", 2);
  put(dup.build());
  expectError(open, path, "duplicate metadata key", "'a'");
}

// Tensors whose data overlap are refused, naming both and their byte ranges
// in the data section: aliasing let a 10 MB file declare 125 GiB of
// weights, which the CPU engine then tried to build.
TEST(Gguf, OverlappingTensorsAreRefused) {
  TempDir dir;
  ModelConfig c = tinyConfig("llama");
  Values expected;
  std::string path = dir.path("alias.gguf");
  auto open = [&] { ModelWeights::open(path); };

  // token_embd [16, 32] f32 takes [0, 2048); attn_q [32, 32] [2048, 6144).
  GgufWriter w = ggufModel(c, storedAs(TF32), expected);
  ASSERT_EQ(w.tensors[0].name, "token_embd.weight");
  ASSERT_EQ(w.tensors[1].name, "blk.0.attn_q.weight");
  w.setOffset(1, 1024);
  writeFile(path, w.build());
  expectError(open, path, "tensors 'token_embd.weight' [0, 2048)",
              "'blk.0.attn_q.weight' [1024, 5120)", "overlap",
              "in the data section (from byte ");

  // Every tensor on one tensor's bytes: the finding's file, small.
  w = ggufModel(c, storedAs(TF32), expected);
  for (size_t i = 1; i < w.tensors.size(); ++i)
    w.shareData(i, 0);
  writeFile(path, w.build());
  expectError(open, path, "overlap");

  // Adjacent ranges do not overlap: the layout build() writes loads.
  writeFile(path, ggufModel(c, storedAs(TF32), expected).build());
  EXPECT_NO_THROW(open());
}

namespace {

/// A tiny model's GGUF with a tokenizer of `vocab` tokens: tokens, token
/// types and scores, and `merges` merges (the shapes of real ones).
std::string tokenizerModel(int64_t vocab, int64_t merges) {
  ModelConfig c =
      shapedConfig("qwen2", {vocab, /*hiddenSize=*/8, /*intermediateSize=*/8,
                             /*numLayers=*/1, /*numHeads=*/2, /*numKVHeads=*/1,
                             /*headDim=*/4});
  c.tieEmbeddings = true;
  GgufWriter w;
  writeConfig(w, c);
  std::vector<std::string> tokens, merged;
  for (int64_t i = 0; i < vocab; ++i)
    tokens.push_back("\xc4\xa0tok" + std::to_string(i));
  for (int64_t i = 0; i < merges; ++i)
    merged.push_back("\xc4\xa0t ok" + std::to_string(i));
  w.kvString("tokenizer.ggml.model", "gpt2");
  w.kvStrings("tokenizer.ggml.tokens", tokens);
  w.kvInts("tokenizer.ggml.token_type", std::vector<int32_t>(size_t(vocab), 1));
  w.kvFloats("tokenizer.ggml.scores", std::vector<float>(size_t(vocab)));
  if (merges)
    w.kvStrings("tokenizer.ggml.merges", merged);
  for (const TensorSpec &t : modelTensors(c))
    w.tensor(ggufName(t.name), t.shape, TF32,
             std::string(size_t(count(t.shape)) * 4, '\0'));
  return w.build();
}

} // namespace

// The metadata's values (40 bytes each in memory) may take at most 64 MiB
// plus 10 bytes per byte of metadata: an array past that is refused when its
// count is read, before it is built (a u8 array cost 40 times its bytes: a
// 29 MiB file took 1.3 GB before it was refused). Real tokenizers load.
TEST(Gguf, MetadataMemoryIsBoundedBeforeAllocating) {
  TempDir dir;
  std::string path = dir.path("meta.gguf");
  ModelConfig c = tinyConfig("llama");
  Values expected;

  // 4 MiB of uint8 would take 4M * 80 bytes as charged (twice the Json
  // values, the array's capacity while it grows): over 64 MiB + 40 MiB.
  GgufWriter w = ggufModel(c, storedAs(TF32), expected);
  w.kvBytes("tokenizer.ggml.precompiled_charsmap", 4 << 20);
  writeFile(path, w.build());
  expectError([&] { ModelWeights::open(path); }, path,
              "metadata key 'tokenizer.ggml.precompiled_charsmap'",
              "an array of 4194304 uint8 values",
              "would take 335544320 bytes of memory",
              "64 MiB + 10 per byte of metadata");
  // A real charsmap's size (T5's is 237 KB) loads.
  w = ggufModel(c, storedAs(TF32), expected);
  w.kvBytes("tokenizer.ggml.precompiled_charsmap", 237 << 10);
  writeFile(path, w.build());
  EXPECT_EQ(ModelWeights::open(path)
                .ggufMetadata()
                .find("tokenizer.ggml.precompiled_charsmap")
                ->asArray("")
                .size(),
            size_t(237) << 10);

  // Nested arrays are charged at every level: 8 arrays of 1M int8 each.
  std::string nested;
  append(nested, uint32_t(GArray));
  append(nested, uint64_t(8));
  for (int i = 0; i < 8; ++i) {
    append(nested, uint32_t(1)); // int8
    append(nested, uint64_t(1) << 20);
    nested.append(size_t(1) << 20, '\0');
  }
  w = ggufModel(c, storedAs(TF32), expected);
  w.kvRaw("nested", GArray, nested);
  writeFile(path, w.build());
  expectError([&] { ModelWeights::open(path); }, path,
              "an array of 1048576 int8 values", "metadata key 'nested'");

  // Gemma 3's vocabulary (262,144 tokens, token types and scores) and
  // Qwen2.5's (151,665 tokens and 151,387 merges) load.
  for (auto [vocab, merges] : {std::pair<int64_t, int64_t>{262144, 0},
                               std::pair<int64_t, int64_t>{151665, 151387}}) {
    writeFile(path, tokenizerModel(vocab, merges));
    ModelWeights m = ModelWeights::open(path);
    EXPECT_EQ(m.config().vocabSize, vocab);
    const Json &meta = m.ggufMetadata();
    EXPECT_EQ(meta.find("tokenizer.ggml.tokens")->asArray("").size(),
              size_t(vocab));
    EXPECT_EQ(meta.find("tokenizer.ggml.scores")->asArray("").size(),
              size_t(vocab));
    if (merges) {
      EXPECT_EQ(meta.find("tokenizer.ggml.merges")->asArray("").size(),
                size_t(merges));
    }
  }
}

// Config values must agree with the tensors that are there, checked before
// anything the config sizes is allocated.
TEST(Gguf, ConfigMustAgreeWithTheTensors) {
  TempDir dir;
  ModelConfig c = tinyConfig("llama");
  Values expected;
  std::string path = dir.path("m.gguf");
  auto withMetadata = [&](const ModelConfig &meta) {
    GgufWriter w = ggufModel(c, storedAs(TF32), expected);
    GgufWriter fresh;
    writeConfig(fresh, meta);
    std::copy(fresh.kvs.begin(), fresh.kvs.end(), w.kvs.begin());
    writeFile(path, w.build());
  };
  ModelConfig meta = c;
  meta.numLayers = 1000000;
  withMetadata(meta);
  expectError([&] { ModelWeights::open(path); }, path, "missing tensors",
              "blk.2.attn_q.weight", ", ...");
  meta = c;
  meta.hiddenSize = 2147483647;
  withMetadata(meta);
  expectError([&] { ModelWeights::open(path); }, path, "token_embd.weight",
              "has shape [16, 32]", "implies [16, 2147483647]");
  meta = c;
  meta.vocabSize = 1 << 30;
  withMetadata(meta);
  expectError([&] { ModelWeights::open(path); }, path, "token_embd.weight",
              "implies [1073741824, 32]");
  meta = c;
  meta.intermediateSize = 1 << 30;
  withMetadata(meta);
  expectError([&] { ModelWeights::open(path); }, path, "ffn_gate.weight",
              "implies [1073741824, 32]");
}
