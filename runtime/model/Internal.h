//===- Internal.h - What the weight loaders share ---------------*- C++ -*-===//
//
// Private to VFlowModel: memory-mapped files, one stored tensor's location
// and encoding, the safetensors and GGUF readers (which check structure and
// bounds and return the tensors under their stored names) and decoding of
// stored elements to f32.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_MODEL_INTERNAL_H
#define VFLOW_MODEL_INTERNAL_H

#include "vflow/Runtime/Json.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace vflow::model::detail {

/// The Hugging Face tensor names of layer `layer`'s mixture of experts
/// (`arch` qwen3_moe: mlp.gate, mlp.experts.E.{gate,up,down}_proj;
/// mixtral: block_sparse_moe.gate, block_sparse_moe.experts.E.{w1,w3,w2}).
struct ExpertNames {
  std::string router;
  /// Expert `e`'s gate, up and down projections.
  std::string gate(int64_t e) const { return expert(e) + gateName; }
  std::string up(int64_t e) const { return expert(e) + upName; }
  std::string down(int64_t e) const { return expert(e) + downName; }

  ExpertNames(const std::string &arch, int64_t layer) {
    const bool mixtral = arch == "mixtral";
    prefix = "model.layers." + std::to_string(layer) +
             (mixtral ? ".block_sparse_moe." : ".mlp.");
    router = prefix + "gate.weight";
    gateName = mixtral ? ".w1.weight" : ".gate_proj.weight";
    upName = mixtral ? ".w3.weight" : ".up_proj.weight";
    downName = mixtral ? ".w2.weight" : ".down_proj.weight";
  }

private:
  std::string expert(int64_t e) const {
    return prefix + "experts." + std::to_string(e);
  }
  std::string prefix, gateName, upName, downName;
};

/// A whole file mapped read-only; unmapped when the last owner goes.
class MappedFile {
public:
  /// Throws Error naming `path` and the reason.
  static std::shared_ptr<MappedFile> open(const std::string &path);
  MappedFile(const MappedFile &) = delete;
  MappedFile &operator=(const MappedFile &) = delete;
  ~MappedFile();

  const uint8_t *data() const { return bytes; }
  uint64_t size() const { return length; }
  const std::string &path() const { return name; }

private:
  MappedFile() = default;
  const uint8_t *bytes = nullptr;
  uint64_t length = 0;
  std::string name;
};

/// How a tensor's elements are stored.
enum class Storage {
  F32,
  F16,
  BF16,
  Q8_0,
  Q4_0,
  Q4_1,
  Q5_0,
  Q5_1,
  Q2_K,
  Q3_K,
  Q4_K,
  Q5_K,
  Q6_K
};

const char *storageName(Storage storage);
/// Elements per block (1 for the float types) and bytes per block.
int64_t blockElements(Storage storage);
int64_t blockBytes(Storage storage);

/// One stored tensor.
struct Tensor {
  /// The name in the file (GGUF's own names for GGUF).
  std::string storedName;
  std::shared_ptr<MappedFile> file;
  /// Absolute byte offset of the data in the file, and its size; checked to
  /// lie inside the file.
  uint64_t offset = 0;
  uint64_t bytes = 0;
  Storage storage = Storage::F32;
  /// Row-major dims, outermost first.
  std::vector<int64_t> shape;
  /// Nonzero for a llama GGUF's Q/K weight or bias: the rows are in
  /// llama.cpp's permuted order over this many heads.
  int64_t permutedHeads = 0;
};

int64_t numElements(const std::vector<int64_t> &shape);
/// "[a, b]".
std::string shapeText(const std::vector<int64_t> &shape);

/// A tensor's data as bytes [begin, end) of a file's data section.
struct DataRange {
  uint64_t begin = 0, end = 0;
  /// The tensor's stored name.
  std::string name;
};

/// Throws Error ("FILE: tensors 'a' [b, e) and 'c' [b, e) overlap <where>")
/// when two non-empty ranges overlap: both readers call it, so that the
/// tensors' data take no more than the file holds. O(n log n).
void refuseOverlaps(std::vector<DataRange> ranges, const std::string &path,
                    const std::string &where);

/// The tensors of one safetensors file, in header order.
std::vector<Tensor> readSafetensors(const std::shared_ptr<MappedFile> &file);

struct GgufContents {
  unsigned version = 0;
  rt::Json metadata;
  /// In file order, with GGUF names.
  std::vector<Tensor> tensors;
};

/// Parses a GGUF file's header, metadata and tensor infos.
GgufContents readGguf(const std::shared_ptr<MappedFile> &file);

/// Decodes `count` elements starting at element `first` of `t` (both
/// multiples of the block size) to f32, without any permutation.
void decodeElements(const Tensor &t, int64_t first, int64_t count, float *out);

} // namespace vflow::model::detail

#endif // VFLOW_MODEL_INTERNAL_H
