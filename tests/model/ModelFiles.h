//===- ModelFiles.h - Writing tiny model files byte by byte -----*- C++ -*-===//
//
// A safetensors writer, a GGUF writer (with ggml's Q8_0, Q4_0 and Q4_1
// blocks built by hand, so every element's value is known), config.json and
// GGUF metadata for a config, and the list of tensors a tiny model of a
// given config has. Shared by the model tests (ModelTestUtil.h adds their
// gtest helpers) and the loader fuzzer (tests/fuzz/LoaderFuzz.cpp); no
// gtest here.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_TESTS_MODEL_MODELFILES_H
#define VFLOW_TESTS_MODEL_MODELFILES_H

#include "vflow/Model/ModelConfig.h"
#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Json.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace vflow::model::test {

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
    if (c.sandwichNorms) {
      t.push_back({p + "pre_feedforward_layernorm.weight", {h}});
      t.push_back({p + "post_feedforward_layernorm.weight", {h}});
    }
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
  TIQ2_XXS = 16,
  TBF16 = 30,
};

/// A GGUF file built key by key and tensor by tensor. The key/value pairs
/// and tensor entries are public, for tests and the fuzzer to edit.
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
  /// An array of GGUF element type `type`: each of `xs` written by `put`.
  template <typename T, typename Put>
  void kvArray(const std::string &key, uint32_t type, const std::vector<T> &xs,
               Put put) {
    std::string v;
    append(v, type);
    append(v, uint64_t(xs.size()));
    for (const T &x : xs)
      put(v, x);
    kvRaw(key, GArray, v);
  }
  void kvStrings(const std::string &key, const std::vector<std::string> &xs) {
    kvArray(key, GString, xs, str);
  }
  void kvInts(const std::string &key, const std::vector<int32_t> &xs) {
    kvArray(key, GI32, xs, append<int32_t>);
  }
  void kvFloats(const std::string &key, const std::vector<float> &xs) {
    kvArray(key, GF32, xs, append<float>);
  }
  /// An array of `n` uint8 values `fill` (as llama.cpp's
  /// tokenizer.ggml.precompiled_charsmap).
  void kvBytes(const std::string &key, uint64_t n, uint8_t fill = 1) {
    std::string v;
    append(v, uint32_t(GU8));
    append(v, n);
    v.append(size_t(n), char(fill));
    kvRaw(key, GArray, v);
  }

  /// `shape` row-major (Hugging Face order); written innermost first.
  void tensor(const std::string &name, const std::vector<int64_t> &shape,
              uint32_t type, const std::string &bytes) {
    tensors.push_back({name, shape, type, bytes, ~uint64_t(0), -1});
  }
  /// Overrides a tensor's offset (for bad-input tests).
  void setOffset(size_t index, uint64_t offset) {
    tensors[index].offset = offset;
  }
  /// Points a tensor's offset at another's data (an overlap).
  void shareData(size_t index, size_t with) {
    tensors[index].sameAs = int64_t(with);
  }

  std::string build() const {
    std::string out = "GGUF";
    append(out, version);
    append(out, uint64_t(tensors.size()));
    append(out, uint64_t(kvs.size()));
    for (const std::string &kv : kvs)
      out += kv;
    // Each tensor's data at the next multiple of 32, unless overridden.
    std::vector<uint64_t> offsets;
    std::string data;
    for (const Tensor &t : tensors) {
      offsets.push_back(data.size());
      data += t.bytes;
      while (data.size() % 32)
        data += '\0';
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor &t = tensors[i];
      str(out, t.name);
      append(out, uint32_t(t.shape.size()));
      for (size_t d = t.shape.size(); d-- > 0;)
        append(out, uint64_t(t.shape[d]));
      append(out, t.type);
      uint64_t offset = offsets[i];
      if (t.sameAs >= 0)
        offset = offsets[size_t(t.sameAs)];
      else if (t.offset != ~uint64_t(0))
        offset = t.offset;
      append(out, offset);
    }
    while (out.size() % 32)
      out += '\0';
    return out + data;
  }

  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    uint32_t type;
    std::string bytes;
    /// ~0: where build() lays it out.
    uint64_t offset;
    /// >= 0: the data offset of that tensor instead.
    int64_t sameAs;
  };
  /// Each key/value pair as written: key, value type, value.
  std::vector<std::string> kvs;
  std::vector<Tensor> tensors;
};

/// GGUF's name for a Hugging Face tensor name.
inline std::string ggufName(const std::string &hf, bool sandwich = false) {
  // Gemma's four norms a block (ModelConfig::sandwichNorms).
  static const std::pair<const char *, const char *> sandwichParts[] = {
      {"post_attention_layernorm", "post_attention_norm"},
      {"pre_feedforward_layernorm", "ffn_norm"},
      {"post_feedforward_layernorm", "post_ffw_norm"}};
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
  if (sandwich)
    for (const auto &[from, to] : sandwichParts)
      if (part == from)
        return "blk." + layer + "." + to + hf.substr(last);
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
  if (c.slidingWindow > 0)
    w.kvU32(a + "attention.sliding_window", uint32_t(c.slidingWindow));
}

/// The sizes of a model, for a test that needs a model of its own size (or
/// checks a config's).
struct ModelShape {
  int64_t vocabSize, hiddenSize, intermediateSize, numLayers, numHeads,
      numKVHeads, headDim;
};

/// A small valid config of `arch` of the sizes `shape`: RMS norm 1e-5, RoPE
/// base 10000, 128 positions, a qwen2's biases and a qwen3's Q/K norms.
inline ModelConfig shapedConfig(const std::string &arch,
                                const ModelShape &shape) {
  ModelConfig c;
  c.arch = arch;
  c.vocabSize = shape.vocabSize;
  c.hiddenSize = shape.hiddenSize;
  c.intermediateSize = shape.intermediateSize;
  c.numLayers = shape.numLayers;
  c.numHeads = shape.numHeads;
  c.numKVHeads = shape.numKVHeads;
  c.headDim = shape.headDim;
  c.rmsNormEps = 1e-5;
  c.ropeTheta = 10000;
  c.maxPositions = 128;
  c.attentionBias = arch == "qwen2";
  c.qkNorm = arch == "qwen3" || arch == "gemma3";
  c.sandwichNorms = arch == "gemma3";
  return c;
}

/// A small valid config of `arch` (row lengths multiples of 32, so every
/// weight can be block quantized).
inline ModelConfig tinyConfig(const std::string &arch) {
  return shapedConfig(arch, {/*vocabSize=*/16, /*hiddenSize=*/32,
                             /*intermediateSize=*/64, /*numLayers=*/2,
                             /*numHeads=*/4, /*numKVHeads=*/2, /*headDim=*/8});
}

/// A stored tensor: its bytes and the f32 values they decode to.
struct Stored {
  std::string bytes;
  std::vector<float> values;
};

inline void appendHalf(std::string &out, float v) {
  append(out, rt::floatToF16(v));
}

// Blocks built by hand: per-block scales and integer quants chosen here, so
// each element's value is known exactly.

/// Q8_0: f16 d, then 32 int8 q; value q * d.
inline Stored q8_0(int64_t n, unsigned seed) {
  Stored s;
  for (int64_t b = 0; b < n / 32; ++b) {
    float d = 0.5f * float(1 + b % 3);
    appendHalf(s.bytes, d);
    for (int j = 0; j < 32; ++j) {
      int q = int((seed + unsigned(b * 32 + j) * 37u) % 255u) - 127;
      s.bytes += char(int8_t(q));
      s.values.push_back(float(q) * d);
    }
  }
  return s;
}

/// Q4_0: f16 d, then 16 bytes; element j < 16 is byte j's low nibble,
/// element j + 16 its high nibble; value (q - 8) * d.
inline Stored q4_0(int64_t n, unsigned seed) {
  Stored s;
  for (int64_t b = 0; b < n / 32; ++b) {
    float d = 0.25f * float(1 + b % 4);
    appendHalf(s.bytes, d);
    int q[32];
    for (int j = 0; j < 32; ++j)
      q[j] = int((seed + unsigned(j) * 5u + unsigned(b)) % 16u);
    for (int j = 0; j < 16; ++j)
      s.bytes += char(q[j] | (q[j + 16] << 4));
    for (int j = 0; j < 32; ++j)
      s.values.push_back(float(q[j] - 8) * d);
  }
  return s;
}

/// Q4_1: f16 d, f16 m, then the nibbles as Q4_0; value q * d + m.
inline Stored q4_1(int64_t n, unsigned seed) {
  Stored s;
  for (int64_t b = 0; b < n / 32; ++b) {
    float d = 0.5f * float(1 + b % 2), m = -1.0f - 0.25f * float(b % 3);
    appendHalf(s.bytes, d);
    appendHalf(s.bytes, m);
    int q[32];
    for (int j = 0; j < 32; ++j)
      q[j] = int((seed + unsigned(j) * 3u + unsigned(b) * 7u) % 16u);
    for (int j = 0; j < 16; ++j)
      s.bytes += char(q[j] | (q[j + 16] << 4));
    for (int j = 0; j < 32; ++j)
      s.values.push_back(float(q[j]) * d + m);
  }
  return s;
}

/// Values that are small integers, stored as Q8_0 with d = 1 (exactly).
inline std::string q8_0Exact(const std::vector<float> &values) {
  std::string out;
  for (size_t b = 0; b < values.size() / 32; ++b) {
    appendHalf(out, 1.0f);
    for (int j = 0; j < 32; ++j)
      out += char(int8_t(values[b * 32 + size_t(j)]));
  }
  return out;
}

inline Stored stored(const std::string &name, int64_t n, uint32_t type) {
  unsigned seed = unsigned(name.size() * 13);
  switch (type) {
  case TQ8_0:
    return q8_0(n, seed);
  case TQ4_0:
    return q4_0(n, seed);
  case TQ4_1:
    return q4_1(n, seed);
  default: {
    std::vector<float> v = pattern(name, n);
    const char *dtype = type == TF32 ? "F32" : type == TF16 ? "F16" : "BF16";
    return {encodeFloats(v, dtype), v};
  }
  }
}

/// llama.cpp's LlamaModel.permute, literally: w.reshape(heads, 2, half,
/// cols).swapaxes(1, 2).reshape(rows, cols).
inline std::vector<float> llamaCppPermute(const std::vector<float> &w,
                                          int64_t rows, int64_t heads) {
  int64_t cols = int64_t(w.size()) / rows, half = rows / heads / 2;
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t a = 0; a < half; ++a)
      for (int64_t b = 0; b < 2; ++b) {
        int64_t src = (h * 2 + b) * half + a; // [h][b][a] before the swap
        int64_t dst = (h * half + a) * 2 + b; // [h][a][b] after it
        for (int64_t c = 0; c < cols; ++c)
          out[size_t(dst * cols + c)] = w[size_t(src * cols + c)];
      }
  return out;
}

/// For ggufModel: every tensor stored as ggml type `type`.
inline std::function<uint32_t(const std::string &)> storedAs(uint32_t type) {
  return [type](const std::string &) { return type; };
}

/// A GGUF of config `c`, each tensor stored as `typeOf(name)`; `expected`
/// gets each tensor's values in Hugging Face order. A llama's Q/K weights
/// (which must then be F32/F16/BF16) are permuted as llama.cpp does.
inline GgufWriter
ggufModel(const ModelConfig &c,
          const std::function<uint32_t(const std::string &)> &typeOf,
          std::map<std::string, std::vector<float>> &expected) {
  GgufWriter w;
  writeConfig(w, c);
  for (const TensorSpec &t : modelTensors(c)) {
    uint32_t type = typeOf(t.name);
    Stored s = stored(t.name, count(t.shape), type);
    expected[t.name] = s.values;
    bool isQ = t.name.find("q_proj") != std::string::npos;
    bool isK = t.name.find("k_proj") != std::string::npos;
    if (c.arch == "llama" && (isQ || isK)) {
      if (type != TF32 && type != TF16 && type != TBF16)
        throw std::logic_error("ggufModel: a llama's Q/K weights must be "
                               "F32, F16 or BF16 to be permuted");
      const char *dtype = type == TF32 ? "F32" : type == TF16 ? "F16" : "BF16";
      s.bytes = encodeFloats(llamaCppPermute(s.values, t.shape[0],
                                             isQ ? c.numHeads : c.numKVHeads),
                             dtype);
    }
    w.tensor(ggufName(t.name, c.sandwichNorms), t.shape, type, s.bytes);
  }
  return w;
}

} // namespace vflow::model::test

#endif // VFLOW_TESTS_MODEL_MODELFILES_H
