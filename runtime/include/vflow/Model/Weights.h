//===- Weights.h - A model's weights from safetensors or GGUF ---*- C++ -*-===//
//
// ModelWeights opens a model once and hands out its tensors by their
// canonical Hugging Face names, converted to f32 or bf16 on request:
//   model.embed_tokens.weight                        [vocab, hidden]
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight [out, in]
//   model.layers.{i}.self_attn.{q,k,v}_proj.bias     (attentionBias)
//   model.layers.{i}.self_attn.{q,k}_norm.weight     [headDim] (qkNorm)
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight  [out, in]
//   model.layers.{i}.{input,post_attention}_layernorm.weight [hidden]
//   model.norm.weight                                [hidden]
//   lm_head.weight                                   (unless tied)
//
// Sources:
//   - a Hugging Face directory: config.json plus model.safetensors, or the
//     shards model.safetensors.index.json lists, or else every *.safetensors
//     file there. Files are memory mapped read-only for the object's life;
//     dtypes F32, F16, BF16.
//   - a .gguf file (v2 or v3), memory mapped; tensor types F32, F16, BF16,
//     Q8_0, Q4_0, Q4_1 (dequantized on access). GGUF names (token_embd,
//     blk.{i}.attn_q, ...) map to the names above, dims to row-major
//     [rows, cols], and the Q/K rows of arch "llama", which llama.cpp's
//     converter permutes into GGML's interleaved RoPE order, are put back
//     in Hugging Face's rotate-half order.
//
// open() checks everything up front: the files' structure and bounds
// (every tensor's data inside its file, no two tensors' data overlapping),
// the config, that every tensor the config implies is there with its shape
// and that there is no tensor the model would silently ignore. So what a
// model built from the weights allocates for them is bounded by the files'
// sizes (f32 copies at most 128/18 times the bytes, Q4_0's expansion), and
// what open() itself allocates is bounded before it allocates it (a GGUF's
// metadata at most 64 MiB plus 10 bytes per byte of metadata; a
// safetensors header at most 100,000,000 bytes; config.json and the index
// at most 32 MiB): docs/engine.md, "Model files". Every problem is
// a vflow::rt::Error naming the file, where (byte offset, tensor, key) and
// why. Accessors are const and safe to call from several threads. The
// files must not change while the object lives (they stay mapped).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_MODEL_WEIGHTS_H
#define VFLOW_MODEL_WEIGHTS_H

#include "vflow/Model/ModelConfig.h"
#include "vflow/Runtime/Json.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace vflow::model {

class ModelWeights {
public:
  enum class Format { Safetensors, GGUF };

  /// Opens a Hugging Face model directory or a .gguf file.
  static ModelWeights open(const std::string &path);

  ModelWeights(ModelWeights &&other) noexcept;
  ModelWeights &operator=(ModelWeights &&other) noexcept;
  ModelWeights(const ModelWeights &) = delete;
  ModelWeights &operator=(const ModelWeights &) = delete;
  ~ModelWeights();

  const ModelConfig &config() const;
  Format format() const;
  /// The path open() was given.
  const std::string &path() const;

  /// Every tensor's canonical name, sorted. Tensors other than the model's
  /// (GGUF's rope_freqs.weight, a checkpoint's rotary_emb.inv_freq) keep
  /// their stored names.
  std::vector<std::string> names() const;
  bool has(const std::string &name) const;
  /// Row-major dims, outermost first ([out_features, in_features]).
  std::vector<int64_t> shape(const std::string &name) const;
  int64_t numElements(const std::string &name) const;
  /// How it is stored: "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1".
  std::string storageType(const std::string &name) const;

  /// The tensor in f32, row-major in the Hugging Face layout.
  std::vector<float> toFloat(const std::string &name) const;
  /// The same into `dst` (numElements(name) floats).
  void toFloat(const std::string &name, float *dst) const;
  /// The tensor in bf16 (f32 values rounded to nearest even) into `dst`
  /// (numElements(name) elements).
  void toBF16(const std::string &name, uint16_t *dst) const;

  /// A GGUF file's key/value metadata as an object in file order: numbers,
  /// bools, strings and (nested) arrays of them (tokenizer.ggml.tokens,
  /// merges, token_type, bos/eos ids, tokenizer.chat_template, ...). Null
  /// for safetensors models.
  const rt::Json &ggufMetadata() const;

  struct Impl;

private:
  explicit ModelWeights(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl;
};

} // namespace vflow::model

#endif // VFLOW_MODEL_WEIGHTS_H
