//===- ModelTestUtil.h - Writing tiny models for the tests ------*- C++ -*-===//
//
// Temporary directories, a safetensors writer, a GGUF writer and the list of
// tensors a tiny model of a given config has, so the tests build every file
// they load byte by byte.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_TESTS_MODEL_MODELTESTUTIL_H
#define VFLOW_TESTS_MODEL_MODELTESTUTIL_H

#include "vflow/Model/ModelConfig.h"
#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Json.h"

#include "../runtime/TestUtil.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace vflow::model::test {

/// The runtime tests' check of an rt::Error's message.
using vflow::rt::test::expectError;

/// A fresh directory under gtest's temp dir, removed at the end.
class TempDir {
public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "/vflow-model-XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data()))
      throw std::runtime_error("mkdtemp failed");
    dir = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string path(const std::string &name) const { return dir + "/" + name; }
  const std::string &str() const { return dir; }

private:
  std::string dir;
};

inline void writeFile(const std::string &path, const std::string &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

template <typename T> void append(std::string &out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

/// f32 values stored as F32, F16 or BF16 bytes (the values must be exact in
/// the narrow type for the tests' equality checks).
inline std::string encodeFloats(const std::vector<float> &values,
                                const std::string &dtype) {
  std::string out;
  for (float v : values) {
    if (dtype == "F32")
      append(out, v);
    else if (dtype == "F16")
      append(out, rt::floatToF16(v));
    else
      append(out, rt::floatToBF16(v));
  }
  return out;
}

/// One tensor for the writers: a Hugging Face name and row-major shape.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

/// config.json for `c` as Hugging Face writes it (end-of-sequence id `eos`).
inline rt::Json hfConfig(const ModelConfig &c, int64_t eos = 2) {
  rt::Json j = rt::Json::object();
  j.set("model_type", c.arch);
  j.set("vocab_size", c.vocabSize);
  j.set("hidden_size", c.hiddenSize);
  j.set("intermediate_size", c.intermediateSize);
  j.set("num_hidden_layers", c.numLayers);
  j.set("num_attention_heads", c.numHeads);
  j.set("num_key_value_heads", c.numKVHeads);
  j.set("head_dim", c.headDim);
  j.set("max_position_embeddings", c.maxPositions);
  j.set("rms_norm_eps", c.rmsNormEps);
  j.set("rope_theta", c.ropeTheta);
  j.set("tie_word_embeddings", c.tieEmbeddings);
  j.set("bos_token_id", 1);
  j.set("eos_token_id", eos);
  return j;
}

inline int64_t count(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

/// The tensors a model with config `c` has (lm_head unless tied).
inline std::vector<TensorSpec> modelTensors(const ModelConfig &c) {
  int64_t h = c.hiddenSize, q = c.numHeads * c.headDim,
          kv = c.numKVHeads * c.headDim, f = c.intermediateSize;
  std::vector<TensorSpec> t = {{"model.embed_tokens.weight", {c.vocabSize, h}}};
  for (int64_t i = 0; i < c.numLayers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back({p + "self_attn.q_proj.weight", {q, h}});
    t.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    t.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    t.push_back({p + "self_attn.o_proj.weight", {h, q}});
    if (c.attentionBias) {
      t.push_back({p + "self_attn.q_proj.bias", {q}});
      t.push_back({p + "self_attn.k_proj.bias", {kv}});
      t.push_back({p + "self_attn.v_proj.bias", {kv}});
    }
    if (c.qkNorm) {
      t.push_back({p + "self_attn.q_norm.weight", {c.headDim}});
      t.push_back({p + "self_attn.k_norm.weight", {c.headDim}});
    }
    t.push_back({p + "mlp.gate_proj.weight", {f, h}});
    t.push_back({p + "mlp.up_proj.weight", {f, h}});
    t.push_back({p + "mlp.down_proj.weight", {h, f}});
    t.push_back({p + "input_layernorm.weight", {h}});
    t.push_back({p + "post_attention_layernorm.weight", {h}});
  }
  t.push_back({"model.norm.weight", {h}});
  if (!c.tieEmbeddings)
    t.push_back({"lm_head.weight", {c.vocabSize, h}});
  return t;
}

/// Deterministic values exact in f16 and bf16 (multiples of 1/16 in
/// [-1, 1)), different for each tensor and from row to row.
inline std::vector<float> pattern(const std::string &name, int64_t n) {
  unsigned seed = 0;
  for (char ch : name)
    seed = seed * 31 + unsigned(char(ch));
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] =
        float(int((seed + unsigned(i) * 7u + unsigned(i) / 32u * 3u) % 32u) -
              16) /
        16.0f;
  return v;
}

/// A safetensors file: tensors in order, each with its dtype and bytes.
struct SafetensorsWriter {
  struct Entry {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::vector<Entry> entries;

  void add(const std::string &name, const std::string &dtype,
           const std::vector<int64_t> &shape, std::string bytes) {
    entries.push_back({name, dtype, shape, std::move(bytes)});
  }
  void addFloats(const std::string &name, const std::string &dtype,
                 const std::vector<int64_t> &shape,
                 const std::vector<float> &values) {
    add(name, dtype, shape, encodeFloats(values, dtype));
  }
  std::string build() const {
    rt::Json header = rt::Json::object();
    rt::Json meta = rt::Json::object();
    meta.set("format", "pt");
    header.set("__metadata__", std::move(meta));
    std::string data;
    for (const Entry &e : entries) {
      rt::Json info = rt::Json::object();
      info.set("dtype", e.dtype);
      rt::Json shape = rt::Json::array();
      for (int64_t d : e.shape)
        shape.push(d);
      info.set("shape", std::move(shape));
      rt::Json offsets = rt::Json::array();
      offsets.push(int64_t(data.size()));
      offsets.push(int64_t(data.size() + e.bytes.size()));
      info.set("data_offsets", std::move(offsets));
      header.set(e.name, std::move(info));
      data += e.bytes;
    }
    std::string text = header.dump();
    while (text.size() % 8)
      text += ' ';
    std::string out;
    append(out, uint64_t(text.size()));
    return out + text + data;
  }
};

/// GGUF value types and ggml tensor types the tests use.
enum GgufValue : uint32_t {
  GU8 = 0,
  GI32 = 5,
  GU32 = 4,
  GF32 = 6,
  GBool = 7,
  GString = 8,
  GArray = 9,
};
enum GgmlType : uint32_t {
  TF32 = 0,
  TF16 = 1,
  TQ4_0 = 2,
  TQ4_1 = 3,
  TQ8_0 = 8,
  TQ4_K = 12,
  TBF16 = 30,
};

/// A GGUF file built key by key and tensor by tensor.
class GgufWriter {
public:
  uint32_t version = 3;

  static void str(std::string &out, const std::string &s) {
    append(out, uint64_t(s.size()));
    out += s;
  }
  void kvRaw(const std::string &key, uint32_t type, const std::string &value) {
    std::string kv;
    str(kv, key);
    append(kv, type);
    kvs.push_back(kv + value);
  }
  void kvString(const std::string &key, const std::string &value) {
    std::string v;
    str(v, value);
    kvRaw(key, GString, v);
  }
  void kvU32(const std::string &key, uint32_t value) {
    std::string v;
    append(v, value);
    kvRaw(key, GU32, v);
  }
  void kvF32(const std::string &key, float value) {
    std::string v;
    append(v, value);
    kvRaw(key, GF32, v);
  }
  void kvBool(const std::string &key, bool value) {
    kvRaw(key, GBool, std::string(1, char(value)));
  }
  void kvStrings(const std::string &key, const std::vector<std::string> &xs) {
    std::string v;
    append(v, uint32_t(GString));
    append(v, uint64_t(xs.size()));
    for (const std::string &x : xs)
      str(v, x);
    kvRaw(key, GArray, v);
  }
  void kvInts(const std::string &key, const std::vector<int32_t> &xs) {
    std::string v;
    append(v, uint32_t(GI32));
    append(v, uint64_t(xs.size()));
    for (int32_t x : xs)
      append(v, x);
    kvRaw(key, GArray, v);
  }
  void kvFloats(const std::string &key, const std::vector<float> &xs) {
    std::string v;
    append(v, uint32_t(GF32));
    append(v, uint64_t(xs.size()));
    for (float x : xs)
      append(v, x);
    kvRaw(key, GArray, v);
  }

  /// `shape` row-major (Hugging Face order); written innermost first.
  void tensor(const std::string &name, const std::vector<int64_t> &shape,
              uint32_t type, const std::string &bytes) {
    tensors.push_back({name, shape, type, bytes, ~uint64_t(0)});
  }
  /// Overrides the next-written tensor's offset (for bad-input tests).
  void setOffset(size_t index, uint64_t offset) {
    tensors[index].offset = offset;
  }

  std::string build() const {
    std::string out = "GGUF";
    append(out, version);
    append(out, uint64_t(tensors.size()));
    append(out, uint64_t(kvs.size()));
    for (const std::string &kv : kvs)
      out += kv;
    std::string data;
    for (const Tensor &t : tensors) {
      str(out, t.name);
      append(out, uint32_t(t.shape.size()));
      for (size_t d = t.shape.size(); d-- > 0;)
        append(out, uint64_t(t.shape[d]));
      append(out, t.type);
      append(out, t.offset != ~uint64_t(0) ? t.offset : uint64_t(data.size()));
      data += t.bytes;
      while (data.size() % 32)
        data += '\0';
    }
    while (out.size() % 32)
      out += '\0';
    return out + data;
  }

private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    uint32_t type;
    std::string bytes;
    uint64_t offset;
  };
  std::vector<std::string> kvs;
  std::vector<Tensor> tensors;
};

/// GGUF's name for a Hugging Face tensor name.
inline std::string ggufName(const std::string &hf) {
  static const std::pair<const char *, const char *> parts[] = {
      {"self_attn.q_proj", "attn_q"},
      {"self_attn.k_proj", "attn_k"},
      {"self_attn.v_proj", "attn_v"},
      {"self_attn.o_proj", "attn_output"},
      {"self_attn.q_norm", "attn_q_norm"},
      {"self_attn.k_norm", "attn_k_norm"},
      {"mlp.gate_proj", "ffn_gate"},
      {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"},
      {"input_layernorm", "attn_norm"},
      {"post_attention_layernorm", "ffn_norm"}};
  if (hf == "model.embed_tokens.weight")
    return "token_embd.weight";
  if (hf == "model.norm.weight")
    return "output_norm.weight";
  if (hf == "lm_head.weight")
    return "output.weight";
  std::string prefix = "model.layers.";
  size_t dot = hf.find('.', prefix.size());
  std::string layer = hf.substr(prefix.size(), dot - prefix.size());
  size_t last = hf.rfind('.');
  std::string part = hf.substr(dot + 1, last - dot - 1);
  for (const auto &[from, to] : parts)
    if (part == from)
      return "blk." + layer + "." + to + hf.substr(last);
  return hf;
}

/// The metadata a GGUF of config `c` carries.
inline void writeConfig(GgufWriter &w, const ModelConfig &c) {
  std::string a = c.arch + ".";
  w.kvString("general.architecture", c.arch);
  w.kvU32(a + "block_count", uint32_t(c.numLayers));
  w.kvU32(a + "context_length", uint32_t(c.maxPositions));
  w.kvU32(a + "embedding_length", uint32_t(c.hiddenSize));
  w.kvU32(a + "feed_forward_length", uint32_t(c.intermediateSize));
  w.kvU32(a + "attention.head_count", uint32_t(c.numHeads));
  w.kvU32(a + "attention.head_count_kv", uint32_t(c.numKVHeads));
  w.kvU32(a + "attention.key_length", uint32_t(c.headDim));
  w.kvF32(a + "attention.layer_norm_rms_epsilon", float(c.rmsNormEps));
  w.kvF32(a + "rope.freq_base", float(c.ropeTheta));
  w.kvU32(a + "vocab_size", uint32_t(c.vocabSize));
}

/// A small valid config of `arch` (row lengths multiples of 32, so every
/// weight can be block quantized).
inline ModelConfig tinyConfig(const std::string &arch) {
  ModelConfig c;
  c.arch = arch;
  c.vocabSize = 16;
  c.hiddenSize = 32;
  c.intermediateSize = 64;
  c.numLayers = 2;
  c.numHeads = 4;
  c.numKVHeads = 2;
  c.headDim = 8;
  c.rmsNormEps = 1e-5;
  c.ropeTheta = 10000;
  c.maxPositions = 128;
  c.attentionBias = arch == "qwen2";
  c.qkNorm = arch == "qwen3";
  return c;
}

} // namespace vflow::model::test

#endif // VFLOW_TESTS_MODEL_MODELTESTUTIL_H
