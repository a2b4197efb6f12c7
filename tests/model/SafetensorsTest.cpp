//===- SafetensorsTest.cpp - Hugging Face directories of safetensors ------===//

#include "ModelTestUtil.h"

#include "vflow/Model/Weights.h"

#include <gtest/gtest.h>

#include <chrono>

using namespace vflow;
using namespace vflow::model;
using namespace vflow::model::test;
using vflow::rt::Json;

namespace {

/// Every tensor of `c`, stored as F32, BF16 and F16 in turn.
SafetensorsWriter modelFile(const ModelConfig &c) {
  SafetensorsWriter w;
  const char *dtypes[] = {"F32", "BF16", "F16"};
  int i = 0;
  for (const TensorSpec &t : modelTensors(c))
    w.addFloats(t.name, dtypes[i++ % 3], t.shape,
                pattern(t.name, count(t.shape)));
  return w;
}

/// Writes config.json and model.safetensors for `c` into `dir`.
void writeModel(const TempDir &dir, const ModelConfig &c) {
  writeFile(dir.path("config.json"), hfConfig(c).dump());
  writeFile(dir.path("model.safetensors"), modelFile(c).build());
}

void expectModel(const ModelWeights &w, const ModelConfig &c) {
  EXPECT_EQ(w.config().toJson().dump(), [&] {
    ModelConfig want = c;
    want.bosTokenId = 1;
    want.eosTokenIds = {2};
    return want.toJson().dump();
  }());
  std::vector<TensorSpec> specs = modelTensors(c);
  EXPECT_EQ(w.names().size(), specs.size());
  for (const TensorSpec &t : specs) {
    ASSERT_TRUE(w.has(t.name)) << t.name;
    EXPECT_EQ(w.shape(t.name), t.shape) << t.name;
    std::vector<float> want = pattern(t.name, count(t.shape));
    EXPECT_EQ(w.toFloat(t.name), want) << t.name;
    std::vector<uint16_t> bf16(want.size());
    w.toBF16(t.name, bf16.data());
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(bf16[i], rt::floatToBF16(want[i])) << t.name << " " << i;
  }
}

/// A tiny llama's directory for the tests of bad files: its config `c`,
/// the paths of its config.json and model.safetensors (nothing written
/// yet), and open() of the directory.
class SafetensorsFiles : public ::testing::Test {
protected:
  TempDir dir;
  ModelConfig c = tinyConfig("llama");
  const std::string config = dir.path("config.json");
  const std::string file = dir.path("model.safetensors");
  const std::function<void()> open = [this] { ModelWeights::open(dir.str()); };
};

} // namespace

TEST(Safetensors, LoadsATinyLlama) {
  TempDir dir;
  ModelConfig c = tinyConfig("llama");
  writeModel(dir, c);
  ModelWeights w = ModelWeights::open(dir.str());
  EXPECT_EQ(w.format(), ModelWeights::Format::Safetensors);
  EXPECT_TRUE(w.ggufMetadata().isNull());
  expectModel(w, c);
  EXPECT_EQ(w.storageType("model.embed_tokens.weight"), "F32");
  EXPECT_EQ(w.storageType("model.layers.0.self_attn.q_proj.weight"), "BF16");
  EXPECT_EQ(w.storageType("model.layers.0.self_attn.k_proj.weight"), "F16");
  EXPECT_FALSE(w.has("model.layers.0.self_attn.q_proj.bias"));
  expectError([&] { w.toFloat("nope"); }, "no tensor 'nope'");

  // Moving keeps the mappings alive.
  ModelWeights moved = std::move(w);
  EXPECT_EQ(moved.toFloat("model.norm.weight"),
            pattern("model.norm.weight", 32));
}

TEST(Safetensors, LoadsQwen2AndQwen3Variants) {
  for (const char *arch : {"qwen2", "qwen3"}) {
    TempDir dir;
    ModelConfig c = tinyConfig(arch);
    c.tieEmbeddings = true;
    if (c.arch == "qwen3")
      c.headDim = 16; // q is [64, 32]: wider than the hidden size
    writeModel(dir, c);
    ModelWeights w = ModelWeights::open(dir.str());
    expectModel(w, c);
    EXPECT_FALSE(w.has("lm_head.weight"));
  }
}

TEST(Safetensors, RoundsToBF16NearestEven) {
  TempDir dir;
  ModelConfig c = tinyConfig("llama");
  SafetensorsWriter w;
  std::vector<float> norm(32, 1.0f);
  norm[0] = 1.0f + 1.0f / 256;                // halfway, even below: 1.0
  norm[1] = 1.0f + 3.0f / 256;                // halfway, even above: 1 + 1/64
  norm[2] = 1.0f + 1.0f / 256 + 1.0f / 65536; // past halfway: up
  for (const TensorSpec &t : modelTensors(c))
    if (t.name == "model.norm.weight")
      w.addFloats(t.name, "F32", t.shape, norm);
    else
      w.addFloats(t.name, "F32", t.shape, pattern(t.name, count(t.shape)));
  writeFile(dir.path("config.json"), hfConfig(c).dump());
  writeFile(dir.path("model.safetensors"), w.build());
  ModelWeights m = ModelWeights::open(dir.str());
  std::vector<uint16_t> bf16(32);
  m.toBF16("model.norm.weight", bf16.data());
  EXPECT_EQ(bf16[0], 0x3F80);
  EXPECT_EQ(bf16[1], 0x3F82);
  EXPECT_EQ(bf16[2], 0x3F81);
  EXPECT_EQ(bf16[3], 0x3F80);
}

TEST(Safetensors, LoadsShardsByIndexOrByListing) {
  ModelConfig c = tinyConfig("llama");
  std::vector<TensorSpec> specs = modelTensors(c);
  SafetensorsWriter a, b;
  Json map = Json::object();
  for (size_t i = 0; i < specs.size(); ++i) {
    SafetensorsWriter &shard = i < specs.size() / 2 ? a : b;
    shard.addFloats(specs[i].name, "BF16", specs[i].shape,
                    pattern(specs[i].name, count(specs[i].shape)));
    map.set(specs[i].name, i < specs.size() / 2
                               ? "model-00001-of-00002.safetensors"
                               : "model-00002-of-00002.safetensors");
  }
  Json index = Json::object();
  index.set("metadata", Json::object());
  index.set("weight_map", map);
  {
    TempDir dir;
    writeFile(dir.path("config.json"), hfConfig(c).dump());
    writeFile(dir.path("model-00001-of-00002.safetensors"), a.build());
    writeFile(dir.path("model-00002-of-00002.safetensors"), b.build());
    writeFile(dir.path("model.safetensors.index.json"), index.dump());
    expectModel(ModelWeights::open(dir.str()), c);

    // An index that disagrees with the shards.
    Json wrong = index;
    Json wrongMap = map;
    wrongMap.set("model.norm.weight", "model-00001-of-00002.safetensors");
    wrong.set("weight_map", wrongMap);
    writeFile(dir.path("model.safetensors.index.json"), wrong.dump());
    expectError([&] { ModelWeights::open(dir.str()); },
                "model.safetensors.index.json", "model.norm.weight",
                "model-00001-of-00002.safetensors");
    wrongMap.set("model.norm.weight", "../elsewhere.safetensors");
    wrong.set("weight_map", wrongMap);
    writeFile(dir.path("model.safetensors.index.json"), wrong.dump());
    expectError([&] { ModelWeights::open(dir.str()); },
                "not a file name in the directory");
  }
  {
    TempDir dir; // no index: every *.safetensors file
    writeFile(dir.path("config.json"), hfConfig(c).dump());
    writeFile(dir.path("first.safetensors"), a.build());
    writeFile(dir.path("second.safetensors"), b.build());
    expectModel(ModelWeights::open(dir.str()), c);
    // The same tensor in two files.
    writeFile(dir.path("third.safetensors"), b.build());
    expectError([&] { ModelWeights::open(dir.str()); }, "stored twice",
                "second.safetensors", "third.safetensors");
  }
}

TEST_F(SafetensorsFiles, BadFilesAreErrorsNamingFileAndPlace) {
  writeFile(config, hfConfig(c).dump());
  std::string good = modelFile(c).build();

  writeFile(file, good.substr(0, 5));
  expectError(open, file, "truncated");
  std::string huge = good;
  huge[7] = 0x7f; // the header length
  writeFile(file, huge);
  expectError(open, file, "header length at byte 0");
  uint64_t headerLen;
  std::memcpy(&headerLen, good.data(), 8);
  std::string notJson = good;
  notJson[8] = '[';
  notJson[9] = '}';
  writeFile(file, notJson);
  expectError(open, file, "safetensors header", "invalid JSON at byte");
  // Cut into the data section: the last tensor's offsets pass its end.
  writeFile(file, good.substr(0, good.size() - 4));
  expectError(open, file, "lm_head.weight", "exceed the data section");

  auto withHeader = [&](const std::string &json, size_t dataBytes) {
    std::string out;
    append(out, uint64_t(json.size()));
    writeFile(file, out + json + std::string(dataBytes, '\0'));
  };
  withHeader(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
             12);
  expectError(open, file, "'a' [0, 8)", "'b' [4, 12)", "overlap");
  withHeader(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
             8);
  expectError(open, file, "tensor 'a'", "hold 8 bytes", "takes 12");
  withHeader(R"({"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})",
             8);
  expectError(open, file, "tensor 'a'", "dtype 'I64'", "not supported");
  withHeader(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})",
             8);
  expectError(open, file, "tensor 'a'", "bad data_offsets");
  withHeader(R"([1, 2])", 0);
  expectError(open, file, "must be a JSON object");
  withHeader(R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", 4);
  expectError(open, file, "tensor 'a'", "missing 'dtype'");
}

TEST_F(SafetensorsFiles, TensorsMustMatchTheConfig) {
  writeFile(config, hfConfig(c).dump());

  // Missing tensors are named.
  SafetensorsWriter w = modelFile(c);
  w.entries.erase(w.entries.begin() + 3); // layer 0's v_proj
  w.entries.pop_back();                   // lm_head (untied)
  writeFile(file, w.build());
  expectError(open, "missing tensors", "model.layers.0.self_attn.v_proj.weight",
              "lm_head.weight");

  // A shape the config does not imply.
  w = modelFile(c);
  for (auto &e : w.entries)
    if (e.name == "model.layers.1.self_attn.k_proj.weight") {
      e.shape = {8, 32};
      e.bytes = encodeFloats(std::vector<float>(8 * 32), e.dtype);
    }
  writeFile(file, w.build());
  expectError(open, file, "model.layers.1.self_attn.k_proj.weight",
              "has shape [8, 32]", "implies [16, 32]");

  // A tensor the model would ignore (a llama has no q bias).
  w = modelFile(c);
  w.addFloats("model.layers.0.self_attn.q_proj.bias", "F32", {32},
              std::vector<float>(32));
  writeFile(file, w.build());
  expectError(open, "model.layers.0.self_attn.q_proj.bias", "unexpected");

  // ...but old checkpoints' rotary inv_freq buffers are fine.
  w = modelFile(c);
  w.addFloats("model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {4},
              std::vector<float>(4));
  writeFile(file, w.build());
  EXPECT_NO_THROW(open());
}

TEST(Safetensors, DirectoryProblems) {
  TempDir dir;
  expectError([&] { ModelWeights::open(dir.str()); }, "no config.json");
  writeFile(dir.path("config.json"), hfConfig(tinyConfig("llama")).dump());
  expectError([&] { ModelWeights::open(dir.str()); }, "no model.safetensors");
  writeFile(dir.path("config.json"), "{\"model_type\": ");
  expectError([&] { ModelWeights::open(dir.str()); }, "config.json",
              "invalid JSON");
  expectError([&] { ModelWeights::open(dir.path("absent")); }, "cannot open",
              "absent");
  writeFile(dir.path("notes.txt"), "hello");
  expectError([&] { ModelWeights::open(dir.path("notes.txt")); },
              "neither a Hugging Face model directory nor a .gguf file");
}

// What a directory's files may make the loader allocate is bounded before
// it is allocated: the header length (the reference implementation's 100 MB),
// config.json's size, and a shape's element count, each refused with the
// file's name.
TEST_F(SafetensorsFiles, SizesAreBoundedBeforeAllocating) {
  writeFile(config, hfConfig(c).dump());

  // A header of 100,000,001 bytes in a (sparse) file that holds them.
  {
    std::string bytes;
    append(bytes, uint64_t(100000001));
    writeFile(file, bytes);
    std::filesystem::resize_file(file, 8 + 100000001);
  }
  expectError(open, file, "header length at byte 0 is 100000001 bytes",
              "more than the 100000000");

  // A shape whose element count overflows names the file and the tensor.
  {
    std::string json = R"({"a": {"dtype": "F32", "shape": [1099511627776,
        1099511627776], "data_offsets": [0, 4]}})";
    std::string bytes;
    append(bytes, uint64_t(json.size()));
    writeFile(file, bytes + json + std::string(4, '\0'));
  }
  expectError(open, file, "tensor 'a'", "too large");

  // config.json past 32 MiB (sparse) is refused before it is read.
  writeFile(file, SafetensorsWriter().build());
  writeFile(config, "{}");
  std::filesystem::resize_file(config, (32 << 20) + 1);
  expectError(open, config, "33554433 bytes", "a model's JSON file");
}

// A config.json whose sizes disagree with the tensors is refused naming the
// tensor, before the sizes are used (the tensors are tiny).
TEST_F(SafetensorsFiles, ConfigMustAgreeWithTheTensors) {
  writeFile(file, modelFile(c).build());
  auto withConfig = [&](const std::string &key, int64_t value) {
    Json j = hfConfig(c);
    j.set(key, value);
    writeFile(config, j.dump());
  };
  withConfig("hidden_size", 2147483647);
  expectError(open, "model.embed_tokens.weight", "has shape [16, 32]",
              "implies [16, 2147483647]");
  withConfig("vocab_size", 1 << 30);
  expectError(open, "model.embed_tokens.weight", "implies [1073741824, 32]");
  withConfig("num_hidden_layers", 1000000);
  expectError(open, "missing tensors", "model.layers.2.self_attn.q_proj.weight",
              ", ...");
  withConfig("intermediate_size", 1 << 30);
  expectError(open, "model.layers.0.mlp.gate_proj.weight",
              "implies [1073741824, 32]");
  withConfig("num_attention_heads", 1 << 20);
  expectError(open, "model.layers.0.self_attn.q_proj.weight",
              "implies [8388608, 32]");
}

// A config.json that starts with a UTF-8 byte-order mark or holds a byte
// that is not UTF-8 is refused by the JSON reader; the error names the file.
TEST_F(SafetensorsFiles, ConfigTextProblemsNameTheFile) {
  writeFile(file, modelFile(c).build());
  std::string text = hfConfig(c).dump();
  writeFile(config, "\xEF\xBB\xBF" + text);
  expectError(open, config, "invalid JSON at byte 0", "byte-order mark");
  // In a value the loader does not otherwise read (dump() would write the
  // byte as U+FFFD: it goes in after).
  Json j = hfConfig(c);
  j.set("torch_dtype", "bfloat16@");
  std::string bad = j.dump();
  bad[bad.find('@')] = char(0xff);
  writeFile(config, bad);
  expectError(open, config, "invalid JSON at byte", "UTF-8");
}

// An index naming many files is read in linear time (the files it lists
// were collected with a scan per entry: 200,000 names took 40 s of CPU).
TEST(Safetensors, LargeIndexReadsInLinearTime) {
  TempDir dir;
  writeFile(dir.path("config.json"), hfConfig(tinyConfig("llama")).dump());
  Json map = Json::object();
  for (int i = 0; i < 200000; ++i)
    map.set("t" + std::to_string(i), "f" + std::to_string(i) + ".safetensors");
  Json index = Json::object();
  index.set("weight_map", std::move(map));
  writeFile(dir.path("model.safetensors.index.json"), index.dump());
  auto start = std::chrono::steady_clock::now();
  expectError([&] { ModelWeights::open(dir.str()); }, "cannot open",
              dir.path("f0.safetensors"));
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_LT(seconds, 10.0);
}
