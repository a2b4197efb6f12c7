//===- Weights.cpp - Opening a model and handing out its tensors ----------===//

#include "vflow/Model/Weights.h"

#include "Internal.h"

#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Files.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_set>

#include <sys/stat.h>

using namespace vflow;
using namespace vflow::model;
using namespace vflow::model::detail;
using vflow::rt::Error;
using vflow::rt::Json;

struct ModelWeights::Impl {
  std::string path;
  Format format = Format::Safetensors;
  ModelConfig config;
  Json metadata;
  /// By canonical name.
  std::map<std::string, Tensor> tensors;

  const Tensor &get(const std::string &name) const {
    auto it = tensors.find(name);
    if (it == tensors.end())
      throw Error(path + ": no tensor '" + name + "'");
    return it->second;
  }
};

namespace {

/// GGUF's names for the parts of a block, and Hugging Face's.
const std::pair<const char *, const char *> blockParts[] = {
    {"attn_q", "self_attn.q_proj"},
    {"attn_k", "self_attn.k_proj"},
    {"attn_v", "self_attn.v_proj"},
    {"attn_output", "self_attn.o_proj"},
    {"attn_q_norm", "self_attn.q_norm"},
    {"attn_k_norm", "self_attn.k_norm"},
    {"ffn_gate", "mlp.gate_proj"},
    {"ffn_up", "mlp.up_proj"},
    {"ffn_down", "mlp.down_proj"},
    {"attn_norm", "input_layernorm"},
    {"ffn_norm", "post_attention_layernorm"},
};
/// Gemma 2/3's four norms a block (ModelConfig::sandwichNorms): ffn_norm
/// is the MLP's input norm there, and two more normalize the outputs.
const std::pair<const char *, const char *> sandwichParts[] = {
    {"attn_norm", "input_layernorm"},
    {"post_attention_norm", "post_attention_layernorm"},
    {"ffn_norm", "pre_feedforward_layernorm"},
    {"post_ffw_norm", "post_feedforward_layernorm"},
};
const std::pair<const char *, const char *> globalNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

bool startsWith(const std::string &s, const std::string &prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Maps a name between GGUF's and Hugging Face's spellings (`toHF` says
/// which way; `sandwich`: a model with ModelConfig::sandwichNorms); names of
/// neither kind come back unchanged.
std::string mapName(const std::string &name, bool toHF, bool sandwich) {
  for (const auto &[gguf, hf] : globalNames)
    if (name == (toHF ? gguf : hf))
      return toHF ? hf : gguf;
  std::string from = toHF ? "blk." : "model.layers.";
  std::string to = toHF ? "model.layers." : "blk.";
  if (!startsWith(name, from))
    return name;
  size_t dot = name.find('.', from.size());
  size_t last = name.rfind('.');
  if (dot == std::string::npos || last <= dot)
    return name;
  std::string layer = name.substr(from.size(), dot - from.size());
  std::string part = name.substr(dot + 1, last - dot - 1);
  if (sandwich)
    for (const auto &[gguf, hf] : sandwichParts)
      if (part == (toHF ? gguf : hf))
        return to + layer + "." + (toHF ? hf : gguf) + name.substr(last);
  for (const auto &[gguf, hf] : blockParts)
    if (part == (toHF ? gguf : hf))
      return to + layer + "." + (toHF ? hf : gguf) + name.substr(last);
  return name;
}

/// "FILE: tensor 'name'", with the stored name when it differs.
std::string describe(const std::string &name, const Tensor &t) {
  std::string s = t.file->path() + ": tensor '" + name + "'";
  if (t.storedName != name)
    s += " (stored as '" + t.storedName + "')";
  return s;
}

/// Which stored row holds Hugging Face row `row` of a Q/K weight that
/// llama.cpp's converter permuted. The converter (LlamaModel.permute) does
///   w.reshape(heads, 2, d/2, ...).swapaxes(1, 2).reshape(w.shape)
/// so stored row h*d + 2i + j holds HF row h*d + j*d/2 + i (j in {0, 1}).
int64_t storedRow(int64_t row, int64_t rows, int64_t heads) {
  int64_t d = rows / heads, half = d / 2;
  int64_t h = row / d, w = row % d;
  return h * d + 2 * (w % half) + w / half;
}

/// Decodes `t` in Hugging Face order, handing `sink(firstElement, values,
/// count)` a row at a time (all of it at once for 1-D tensors).
template <typename Sink> void decodeRows(const Tensor &t, Sink &&sink) {
  int64_t n = numElements(t.shape);
  if (t.shape.size() < 2 || t.shape[0] == 0 || n == 0) {
    std::vector<float> all(static_cast<size_t>(n));
    decodeElements(t, 0, n, all.data());
    if (t.permutedHeads > 0) {
      std::vector<float> permuted(all.size());
      for (int64_t r = 0; r < n; ++r)
        permuted[size_t(r)] = all[size_t(storedRow(r, n, t.permutedHeads))];
      all.swap(permuted);
    }
    sink(0, all.data(), n);
    return;
  }
  int64_t rows = t.shape[0], cols = n / rows;
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    int64_t src = t.permutedHeads > 0 ? storedRow(r, rows, t.permutedHeads) : r;
    decodeElements(t, src * cols, cols, row.data());
    sink(r * cols, row.data(), cols);
  }
}

/// The longest config.json or model.safetensors.index.json read (the
/// largest real index, of ~100K tensors, is about 10 MB): parsed, JSON
/// takes up to 20 times its bytes.
constexpr uint64_t kMaxJsonFileBytes = 32 << 20;

std::string readText(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error("cannot open " + path + ": " + rt::errnoText(errno));
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 &&
      uint64_t(st.st_size) > kMaxJsonFileBytes)
    throw Error(path + " is " + std::to_string(st.st_size) +
                " bytes, more than the " + std::to_string(kMaxJsonFileBytes) +
                " a model's JSON file may take");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad())
    throw Error("cannot read " + path);
  return text.str();
}

bool isFile(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void addTensor(ModelWeights::Impl &m, const std::string &name, Tensor t) {
  auto it = m.tensors.find(name);
  if (it != m.tensors.end())
    throw Error(m.path + ": tensor '" + name + "' is stored twice, in " +
                it->second.file->path() + " and in " + t.file->path());
  m.tensors.emplace(name, std::move(t));
}

void openSafetensors(ModelWeights::Impl &m) {
  const std::string &dir = m.path;
  std::string configPath = dir + "/config.json";
  if (!isFile(configPath))
    throw Error(dir + ": no config.json (a Hugging Face model directory "
                      "needs one)");
  m.config =
      configFromHF(Json::parse(readText(configPath), configPath), configPath);

  std::string indexPath = dir + "/model.safetensors.index.json";
  std::vector<std::string> files;
  std::unordered_set<std::string> listed;
  std::vector<std::pair<std::string, std::string>> weightMap;
  if (isFile(indexPath)) {
    Json index = Json::parse(readText(indexPath), indexPath);
    const Json &map = index.at("weight_map", indexPath);
    if (map.getKind() != Json::Kind::Object)
      throw Error(indexPath + ": 'weight_map' must be an object");
    for (const auto &[name, file] : map.members()) {
      const std::string &f =
          file.asString(indexPath + ": weight_map['" + name + "']");
      if (f.empty() || f.find('/') != std::string::npos || f == "." ||
          f == "..")
        throw Error(indexPath + ": weight_map['" + name + "'] names '" + f +
                    "', which is not a file name in the directory");
      weightMap.emplace_back(name, f);
      if (listed.insert(f).second) // linear: an index may list many files
        files.push_back(f);
    }
  } else if (isFile(dir + "/model.safetensors")) {
    files.push_back("model.safetensors");
  } else {
    std::error_code ec;
    for (const auto &entry : std::filesystem::directory_iterator(dir, ec)) {
      std::string f = entry.path().filename().string();
      if (endsWith(f, ".safetensors") && isFile(dir + "/" + f))
        files.push_back(f);
    }
    if (ec)
      throw Error("cannot list " + dir + ": " + ec.message());
    std::sort(files.begin(), files.end());
  }
  if (files.empty())
    throw Error(dir + ": no model.safetensors, model.safetensors.index.json "
                      "or *.safetensors file");

  for (const std::string &f : files) {
    auto file = MappedFile::open(dir + "/" + f);
    for (Tensor &t : readSafetensors(file)) {
      std::string name = t.storedName;
      addTensor(m, name, std::move(t));
    }
  }
  for (const auto &[name, f] : weightMap) {
    auto it = m.tensors.find(name);
    if (it == m.tensors.end() || it->second.file->path() != dir + "/" + f)
      throw Error(indexPath + ": weight_map puts tensor '" + name + "' in " +
                  f + ", but " + f + " has no such tensor");
  }
}

void openGguf(ModelWeights::Impl &m) {
  auto file = MappedFile::open(m.path);
  GgufContents contents = readGguf(file);
  int64_t embedRows = 0;
  bool hasOutput = false;
  for (const Tensor &t : contents.tensors) {
    if (t.storedName == "token_embd.weight" && t.shape.size() == 2)
      embedRows = t.shape[0];
    hasOutput |= t.storedName == "output.weight";
  }
  m.metadata = std::move(contents.metadata);
  if (const Json *split = m.metadata.find("split.count"))
    if (split->getKind() != Json::Kind::Number || split->asNumber("") != 1)
      throw Error(m.path + ": metadata key 'split.count' is " + split->dump() +
                  ": GGUF files split in parts are not supported (merge them "
                  "with llama-gguf-split --merge)");
  m.config = configFromGGUF(m.metadata, m.path, embedRows, hasOutput);
  const ModelConfig &c = m.config;
  for (Tensor &t : contents.tensors) {
    std::string name = mapName(t.storedName, /*toHF=*/true, c.sandwichNorms);
    if (c.arch == "llama" && startsWith(t.storedName, "blk.")) {
      if (endsWith(name, ".q_proj.weight") || endsWith(name, ".q_proj.bias"))
        t.permutedHeads = c.numHeads;
      else if (endsWith(name, ".k_proj.weight") ||
               endsWith(name, ".k_proj.bias"))
        t.permutedHeads = c.numKVHeads;
    }
    addTensor(m, name, std::move(t));
  }

  // Llama 3's scaling, as llama.cpp keeps it: a divisor per frequency.
  auto freqs = m.tensors.find("rope_freqs.weight");
  if (freqs != m.tensors.end()) {
    const Tensor &t = freqs->second;
    if (m.config.ropeScaling.type != RopeScaling::Type::None)
      throw Error(m.path + ": both rope_freqs.weight and " +
                  ropeScalingName(m.config.ropeScaling.type) +
                  " rope scaling in the metadata");
    if (t.shape != std::vector<int64_t>{c.headDim / 2})
      throw Error(m.path + ": rope_freqs.weight has shape " +
                  shapeText(t.shape) + ", expected [" +
                  std::to_string(c.headDim / 2) + "] (headDim / 2)");
    RopeScaling &s = m.config.ropeScaling;
    s.type = RopeScaling::Type::FreqFactors;
    s.freqFactors.resize(size_t(c.headDim / 2));
    decodeElements(t, 0, c.headDim / 2, s.freqFactors.data());
    try {
      m.config.validate();
    } catch (const Error &e) {
      throw Error(m.path + ": rope_freqs.weight: " + e.what());
    }
  }
}

/// MLA's attention tensors (prefix `a`: a layer's self_attn.) by `expect`.
template <typename Expect>
void expectLatent(const ModelConfig &c, const std::string &a, Expect &expect) {
  const int64_t h = c.hiddenSize, H = c.numHeads;
  const int64_t q = H * (c.qkNopeHeadDim + c.qkRopeHeadDim);
  if (c.qLoraRank > 0) {
    expect(a + "q_a_proj.weight", {c.qLoraRank, h});
    expect(a + "q_a_layernorm.weight", {c.qLoraRank});
    expect(a + "q_b_proj.weight", {q, c.qLoraRank});
  } else {
    expect(a + "q_proj.weight", {q, h});
  }
  expect(a + "kv_a_proj_with_mqa.weight", {c.kvLoraRank + c.qkRopeHeadDim, h});
  expect(a + "kv_a_layernorm.weight", {c.kvLoraRank});
  expect(a + "kv_b_proj.weight",
         {H * (c.qkNopeHeadDim + c.vHeadDim), c.kvLoraRank});
  expect(a + "o_proj.weight", {h, H * c.vHeadDim});
}

/// Whether `name` belongs to a multi-token prediction layer (DeepSeek-V3
/// stores them as model.layers.N.. after the model's N), which is skipped.
bool mtpTensor(const ModelConfig &c, const std::string &name) {
  const std::string prefix = "model.layers.";
  if (c.mtpLayers == 0 || name.compare(0, prefix.size(), prefix) != 0)
    return false;
  const size_t dot = name.find('.', prefix.size());
  const std::string index = name.substr(prefix.size(), dot - prefix.size());
  if (index.empty() || index.size() > 9 ||
      index.find_first_not_of("0123456789") != std::string::npos)
    return false;
  const int64_t layer = std::stoll(index);
  return layer >= c.numLayers && layer < c.numLayers + c.mtpLayers;
}

/// Checks that the tensors are exactly the ones the config implies, each
/// with its shape.
void checkTensors(const ModelWeights::Impl &m) {
  const ModelConfig &c = m.config;
  int64_t h = c.hiddenSize, q = c.numHeads * c.headDim,
          kv = c.numKVHeads * c.headDim, ffn = c.intermediateSize;
  std::vector<std::string> missing;
  std::unordered_set<std::string> known;
  bool gguf = m.format == ModelWeights::Format::GGUF;
  auto expect = [&](const std::string &name, std::vector<int64_t> shape) {
    known.insert(name);
    auto it = m.tensors.find(name);
    if (it == m.tensors.end()) {
      std::string stored = mapName(name, /*toHF=*/false, c.sandwichNorms);
      missing.push_back(gguf ? stored + " (" + name + ")" : name);
    } else if (it->second.shape != shape) {
      throw Error(describe(name, it->second) + " has shape " +
                  shapeText(it->second.shape) + ", but the config implies " +
                  shapeText(shape));
    }
  };
  auto reportMissing = [&](bool all) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 8; ++i)
      list += (i ? ", " : "") + missing[i];
    if (!all || missing.size() > 8)
      list += ", ...";
    throw Error(m.path + ": missing tensors: " + list);
  };

  expect("model.embed_tokens.weight", {c.vocabSize, h});
  for (int64_t i = 0; i < c.numLayers; ++i) {
    // A config with far more layers than the file has stops here early.
    if (missing.size() >= 8)
      reportMissing(false);
    std::string p = "model.layers." + std::to_string(i) + ".";
    if (c.mla()) {
      expectLatent(c, p + "self_attn.", expect);
    } else {
      expect(p + "self_attn.q_proj.weight", {q, h});
      expect(p + "self_attn.k_proj.weight", {kv, h});
      expect(p + "self_attn.v_proj.weight", {kv, h});
      expect(p + "self_attn.o_proj.weight", {h, q});
    }
    if (c.attentionBias) {
      expect(p + "self_attn.q_proj.bias", {q});
      expect(p + "self_attn.k_proj.bias", {kv});
      expect(p + "self_attn.v_proj.bias", {kv});
    }
    if (c.qkNorm) {
      expect(p + "self_attn.q_norm.weight", {c.headDim});
      expect(p + "self_attn.k_norm.weight", {c.headDim});
    }
    if (c.moeLayer(i)) {
      const detail::ExpertNames moe(c.arch, i);
      const int64_t ffe = c.expertIntermediateSize;
      expect(moe.router, {c.numExperts, h});
      for (int64_t e = 0; e < c.numExperts; ++e) {
        expect(moe.gate(e), {ffe, h});
        expect(moe.up(e), {ffe, h});
        expect(moe.down(e), {h, ffe});
      }
      if (c.sigmoidRouter)
        expect(p + "mlp.gate.e_score_correction_bias", {c.numExperts});
      if (c.numSharedExperts > 0) {
        const int64_t ffs = c.numSharedExperts * ffe;
        expect(p + "mlp.shared_experts.gate_proj.weight", {ffs, h});
        expect(p + "mlp.shared_experts.up_proj.weight", {ffs, h});
        expect(p + "mlp.shared_experts.down_proj.weight", {h, ffs});
      }
    } else {
      expect(p + "mlp.gate_proj.weight", {ffn, h});
      expect(p + "mlp.up_proj.weight", {ffn, h});
      expect(p + "mlp.down_proj.weight", {h, ffn});
    }
    expect(p + "input_layernorm.weight", {h});
    expect(p + "post_attention_layernorm.weight", {h});
    if (c.sandwichNorms) {
      expect(p + "pre_feedforward_layernorm.weight", {h});
      expect(p + "post_feedforward_layernorm.weight", {h});
    }
  }
  expect("model.norm.weight", {h});
  // A tied model may still store lm_head; it must have the right shape.
  if (!c.tieEmbeddings || m.tensors.count("lm_head.weight"))
    expect("lm_head.weight", {c.vocabSize, h});
  if (!missing.empty())
    reportMissing(true);

  for (const auto &[name, t] : m.tensors)
    if (!known.count(name) && name != "rope_freqs.weight" &&
        !endsWith(name, "rotary_emb.inv_freq") && !mtpTensor(c, name))
      throw Error(describe(name, t) + " is unexpected: a " + c.arch +
                  " model with this config (attentionBias " +
                  (c.attentionBias ? "true" : "false") + ", qkNorm " +
                  (c.qkNorm ? "true" : "false") +
                  ") has no such tensor, and ignoring it would be wrong");
}

} // namespace

ModelWeights ModelWeights::open(const std::string &path) {
  auto m = std::make_unique<Impl>();
  m->path = path;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw Error("cannot open " + path + ": " + rt::errnoText(errno));
  if (S_ISDIR(st.st_mode)) {
    m->format = Format::Safetensors;
    openSafetensors(*m);
  } else {
    char magic[4] = {};
    {
      std::ifstream in(path, std::ios::binary);
      in.read(magic, 4);
    }
    if (!endsWith(path, ".gguf") && std::memcmp(magic, "GGUF", 4) != 0)
      throw Error(path + " is neither a Hugging Face model directory nor a "
                         ".gguf file");
    m->format = Format::GGUF;
    openGguf(*m);
  }
  checkTensors(*m);
  return ModelWeights(std::move(m));
}

ModelWeights::ModelWeights(std::unique_ptr<Impl> impl)
    : impl(std::move(impl)) {}
ModelWeights::ModelWeights(ModelWeights &&other) noexcept = default;
ModelWeights &ModelWeights::operator=(ModelWeights &&other) noexcept = default;
ModelWeights::~ModelWeights() = default;

namespace {

const ModelWeights::Impl &self(const std::unique_ptr<ModelWeights::Impl> &p) {
  if (!p)
    throw Error("ModelWeights: used after being moved from");
  return *p;
}

} // namespace

const ModelConfig &ModelWeights::config() const { return self(impl).config; }

ModelWeights::Format ModelWeights::format() const { return self(impl).format; }

const std::string &ModelWeights::path() const { return self(impl).path; }

std::vector<std::string> ModelWeights::names() const {
  std::vector<std::string> out;
  for (const auto &entry : self(impl).tensors)
    out.push_back(entry.first);
  return out;
}

bool ModelWeights::has(const std::string &name) const {
  return self(impl).tensors.count(name) != 0;
}

std::vector<int64_t> ModelWeights::shape(const std::string &name) const {
  return self(impl).get(name).shape;
}

int64_t ModelWeights::numElements(const std::string &name) const {
  return detail::numElements(self(impl).get(name).shape);
}

std::string ModelWeights::storageType(const std::string &name) const {
  return storageName(self(impl).get(name).storage);
}

std::vector<float> ModelWeights::toFloat(const std::string &name) const {
  std::vector<float> out(static_cast<size_t>(numElements(name)));
  toFloat(name, out.data());
  return out;
}

void ModelWeights::toFloat(const std::string &name, float *dst) const {
  decodeRows(self(impl).get(name),
             [&](int64_t first, const float *values, int64_t count) {
               std::memcpy(dst + first, values, size_t(count) * sizeof(float));
             });
}

void ModelWeights::toBF16(const std::string &name, uint16_t *dst) const {
  decodeRows(self(impl).get(name),
             [&](int64_t first, const float *values, int64_t count) {
               for (int64_t i = 0; i < count; ++i)
                 dst[first + i] = rt::floatToBF16(values[i]);
             });
}

const Json &ModelWeights::ggufMetadata() const { return self(impl).metadata; }
