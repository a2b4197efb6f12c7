//===- LoaderFuzz.cpp - Mutated model files through the loaders and a model
//===//
//
//   vflow-fuzz-loader [--seconds S] [--seed N] [--iterations N]
//                     [--memory-gib G] [--case-seconds T] [--keep DIR]
//   vflow-fuzz-loader --case N [--keep DIR]     (write and run case N here)
//   vflow-fuzz-loader --replay PATH [--open-only]
//
// Each case is a small valid model the fuzzer writes itself, then mutates:
//   - a GGUF file (llama, qwen2 or qwen3; F32, F16, BF16, Q8_0, Q4_0 and
//     Q4_1 tensors; tokenizer-like metadata arrays: tokens, token types,
//     scores, merges, a u8 charsmap), mutated in its structure (tensor
//     entries duplicated or removed, data moved to overlap, dims inflated,
//     types changed, config keys set to extremes or removed) and in its bytes
//     (bit flips, boundary values -- 0, 0xff, 2^31, 2^63, 2^64-1 -- over
//     bytes or over the counts, lengths, dims and offsets, truncation,
//     extension, splicing);
//   - a Hugging Face directory (config.json and one to three safetensors
//     shards, with or without model.safetensors.index.json), mutated in its
//     JSON (values replaced by extremes or by values of the wrong type, keys
//     deleted or added, a byte-order mark or a 0xff byte) and in its
//     safetensors files (the header's JSON as above, header length, bytes).
//
// Each mutant is loaded in a child process with a memory limit (RLIMIT_AS)
// and a time limit through ModelWeights::open and, when it opens, a CPU
// ModelRunner with a tiny KV pool and a prefill and a decode step. A case
// passes when the child finishes or throws rt::Error / std::runtime_error;
// it fails when the child dies from a signal, runs out of memory
// (std::bad_alloc: sizes must be bounded before allocating), passes the
// time limit or throws anything else, and when a seed left as it is (one
// case in ten) is refused. The first failing case is written to
// DIR/fuzz-loader-failure.gguf or DIR/fuzz-loader-failure/ with a note
// (DIR/fuzz-loader-failure.txt) for --replay. Deterministic for a seed and
// iteration count; --seconds bounds the wall time.
//
// --replay loads a file or directory in this process (--open-only: only
// ModelWeights::open and the metadata's JSON text, as `vflow` does for a
// GGUF's tokenizer), for reproducing a failure or measuring peak memory.
//
//===----------------------------------------------------------------------===//

#include "../common/FuzzDriver.h"
#include "../model/ModelFiles.h"

#include "vflow/Model/Runner.h"
#include "vflow/Model/Weights.h"
#include "vflow/Runtime/Error.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

using namespace vflow;
using namespace vflow::model;
using namespace vflow::model::test;
using vflow::rt::Json;
namespace fs = std::filesystem;

namespace {

using Rng = std::mt19937_64;

uint64_t pick(Rng &rng, uint64_t n) { return n ? rng() % n : 0; }
template <typename T, size_t N> const T &pick(Rng &rng, const T (&xs)[N]) {
  return xs[pick(rng, N)];
}

/// Little-endian boundary values a mutation writes over 1, 2, 4 or 8 bytes.
const uint64_t kBoundaries[] = {0,
                                1,
                                0xff,
                                0x7f,
                                0x80,
                                0xffff,
                                0x7fffffff,
                                0x80000000,
                                0xffffffff,
                                0x100000000,
                                uint64_t(1) << 40,
                                0x7fffffffffffffff,
                                0x8000000000000000,
                                0xffffffffffffffff,
                                1000000};

/// A case: what to write and a log of what was done to it.
struct Case {
  uint64_t seed = 0;
  bool gguf = true;
  /// The GGUF file's bytes, or the directory's files by name.
  std::string file;
  std::vector<std::pair<std::string, std::string>> files;
  std::vector<std::string> log;
  /// Not mutated: it must load and run.
  bool valid = false;
};

// ---------------------------------------------------------------------------
// Seeds
// ---------------------------------------------------------------------------

ModelConfig randomConfig(Rng &rng) {
  const char *const archs[] = {"llama", "qwen2", "qwen3"};
  ModelConfig c = tinyConfig(pick(rng, archs));
  const int64_t hidden[] = {32, 64};
  c.hiddenSize = pick(rng, hidden);
  c.intermediateSize = pick(rng, hidden);
  c.numLayers = 1 + int64_t(pick(rng, 2));
  const int64_t kv[] = {1, 2, 4};
  c.numKVHeads = pick(rng, kv);
  const int64_t dims[] = {8, 16};
  c.headDim = pick(rng, dims);
  const int64_t vocab[] = {16, 40, 64};
  c.vocabSize = pick(rng, vocab);
  c.tieEmbeddings = pick(rng, 2) == 0;
  c.bosTokenId = 1;
  c.eosTokenIds = {2};
  return c;
}

/// Tokenizer-like metadata: what llama.cpp writes for a BPE vocabulary.
void writeTokenizer(GgufWriter &w, const ModelConfig &c, Rng &rng) {
  std::vector<std::string> tokens, merges;
  std::vector<int32_t> types;
  std::vector<float> scores;
  for (int64_t i = 0; i < c.vocabSize; ++i) {
    tokens.push_back(i < 3 ? std::string(i == 0   ? "<unk>"
                                         : i == 1 ? "<s>"
                                                  : "</s>")
                           : "t" + std::to_string(i));
    types.push_back(i < 3 ? 3 : 1);
    scores.push_back(-float(i));
    if (i > 4)
      merges.push_back("t" + std::to_string(i - 1) + " t" + std::to_string(i));
  }
  w.kvString("tokenizer.ggml.model", "gpt2");
  w.kvString("tokenizer.ggml.pre", "default");
  w.kvStrings("tokenizer.ggml.tokens", tokens);
  w.kvInts("tokenizer.ggml.token_type", types);
  if (pick(rng, 2))
    w.kvFloats("tokenizer.ggml.scores", scores);
  w.kvStrings("tokenizer.ggml.merges", merges);
  w.kvU32("tokenizer.ggml.bos_token_id", 1);
  w.kvU32("tokenizer.ggml.eos_token_id", 2);
  if (pick(rng, 2))
    w.kvBytes("tokenizer.ggml.precompiled_charsmap", 1 + pick(rng, 300));
  w.kvString("tokenizer.chat_template", "{{ messages }}");
}

/// Every tensor of `c` in a random supported type (a float type where the
/// row length is not a multiple of 32).
GgufWriter ggufSeed(const ModelConfig &c, Rng &rng) {
  GgufWriter w;
  writeConfig(w, c);
  writeTokenizer(w, c, rng);
  const uint32_t types[] = {TF32, TF16, TBF16, TQ8_0, TQ4_0, TQ4_1};
  for (const TensorSpec &t : modelTensors(c)) {
    uint32_t type = pick(rng, types);
    if (t.shape.back() % 32 != 0)
      type = pick(rng, 3) == 0 ? TF32 : pick(rng, 2) ? TF16 : TBF16;
    Stored s = stored(t.name, count(t.shape), type);
    w.tensor(ggufName(t.name), t.shape, type, s.bytes);
  }
  if (c.arch == "llama" && pick(rng, 4) == 0)
    w.tensor(
        "rope_freqs.weight", {c.headDim / 2}, TF32,
        encodeFloats(std::vector<float>(size_t(c.headDim / 2), 1.0f), "F32"));
  return w;
}

/// config.json and shards (named for an index when there are several).
struct HFSeed {
  Json config;
  std::vector<std::pair<std::string, SafetensorsWriter>> shards;
  bool index = false;
};

HFSeed hfSeed(const ModelConfig &c, Rng &rng) {
  HFSeed s;
  s.config = hfConfig(c);
  s.config.set("hidden_act", "silu");
  if (pick(rng, 3) == 0) {
    s.config.set("rope_scaling",
                 Json::parse(R"({"rope_type": "llama3", "factor": 8.0,
                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 64})",
                             "rope_scaling"));
  }
  size_t shards = 1 + pick(rng, 3);
  s.index = shards > 1 || pick(rng, 4) == 0;
  for (size_t i = 0; i < shards; ++i)
    s.shards.emplace_back(shards == 1 && !s.index
                              ? "model.safetensors"
                              : "model-0000" + std::to_string(i + 1) +
                                    "-of-0000" + std::to_string(shards) +
                                    ".safetensors",
                          SafetensorsWriter());
  const char *const dtypes[] = {"F32", "F16", "BF16"};
  for (const TensorSpec &t : modelTensors(c))
    s.shards[pick(rng, shards)].second.addFloats(
        t.name, pick(rng, dtypes), t.shape, pattern(t.name, count(t.shape)));
  return s;
}

// ---------------------------------------------------------------------------
// Mutations
// ---------------------------------------------------------------------------

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", (unsigned long long)v);
  return buf;
}

/// The byte offsets of every 8-byte count and length of a GGUF file (the
/// tensor and key/value counts, key and string lengths, array counts,
/// dims, data offsets), found by walking it as the reader does; stops at
/// the first thing that does not fit.
std::vector<size_t> ggufFields(const std::string &bytes) {
  std::vector<size_t> fields;
  size_t pos = 4 + 4;
  auto fits = [&](uint64_t n) { return n <= bytes.size() - pos; };
  auto u64 = [&](bool isField) {
    uint64_t v = 0;
    if (!fits(8))
      throw std::out_of_range("end");
    if (isField)
      fields.push_back(pos);
    std::memcpy(&v, bytes.data() + pos, 8);
    pos += 8;
    return v;
  };
  auto u32 = [&] {
    uint32_t v = 0;
    if (!fits(4))
      throw std::out_of_range("end");
    std::memcpy(&v, bytes.data() + pos, 4);
    pos += 4;
    return v;
  };
  auto skip = [&](uint64_t n) {
    if (!fits(n))
      throw std::out_of_range("end");
    pos += size_t(n);
  };
  std::function<void(uint32_t, int)> value = [&](uint32_t type, int depth) {
    const uint64_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == GString) {
      skip(u64(true));
    } else if (type == GArray && depth < 4) {
      uint32_t element = u32();
      uint64_t n = u64(true);
      for (uint64_t i = 0; i < n && pos < bytes.size(); ++i)
        value(element, depth + 1);
    } else if (type < std::size(sizes) && sizes[type]) {
      skip(sizes[type]);
    } else {
      throw std::out_of_range("type");
    }
  };
  try {
    uint64_t tensors = u64(true), kvs = u64(true);
    for (uint64_t i = 0; i < kvs && pos < bytes.size(); ++i) {
      skip(u64(true));
      value(u32(), 0);
    }
    for (uint64_t i = 0; i < tensors && pos < bytes.size(); ++i) {
      skip(u64(true));
      uint32_t dims = u32();
      for (uint32_t d = 0; d < dims && d < 8; ++d)
        u64(true);
      u32();
      u64(true);
    }
  } catch (const std::out_of_range &) {
  }
  return fields;
}

/// Byte-level mutations of `bytes`; `fields` are offsets of 8-byte counts,
/// lengths, dims and offsets (may be empty); `other` is spliced from.
void mutateBytes(std::string &bytes, const std::vector<size_t> &fields,
                 const std::string &other, Rng &rng,
                 std::vector<std::string> &log) {
  if (bytes.empty()) {
    bytes = other.substr(0, pick(rng, other.size() + 1));
    log.push_back("empty file replaced by a prefix of another");
    return;
  }
  switch (pick(rng, 8)) {
  case 0: { // bit flips
    int n = 1 + int(pick(rng, 8));
    for (int i = 0; i < n; ++i) {
      size_t at = pick(rng, bytes.size());
      bytes[at] = char(bytes[at] ^ (1 << pick(rng, 8)));
      log.push_back("bit flip at byte " + std::to_string(at));
    }
    return;
  }
  case 1:
  case 2: { // a boundary value over 1, 2, 4 or 8 bytes, often a field
    const size_t widths[] = {1, 2, 4, 8};
    size_t width = pick(rng, widths);
    size_t at = !fields.empty() && pick(rng, 3) != 0
                    ? fields[pick(rng, fields.size())]
                    : pick(rng, bytes.size());
    if (at + width > bytes.size())
      at = bytes.size() - std::min(width, bytes.size());
    width = std::min(width, bytes.size() - at);
    uint64_t v = pick(rng, kBoundaries);
    if (pick(rng, 4) == 0) // near the old value: a count off by a little
      std::memcpy(&v, bytes.data() + at, width), v += 1 + pick(rng, 64);
    std::memcpy(&bytes[at], &v, width);
    log.push_back("wrote " + hex(v) + " over " + std::to_string(width) +
                  " bytes at byte " + std::to_string(at));
    return;
  }
  case 3: { // truncation
    size_t at = pick(rng, bytes.size());
    bytes.resize(at);
    log.push_back("truncated to " + std::to_string(at) + " bytes");
    return;
  }
  case 4: { // extension
    size_t n = 1 + pick(rng, 4096);
    bytes.append(n, pick(rng, 2) ? '\0' : char(pick(rng, 256)));
    log.push_back("extended by " + std::to_string(n) + " bytes");
    return;
  }
  case 5: { // splicing a chunk of another file over this one
    if (other.empty()) {
      log.push_back("nothing to splice from");
      return;
    }
    size_t from = pick(rng, other.size());
    size_t n = 1 + pick(rng, std::min<size_t>(other.size() - from, 512));
    size_t at = pick(rng, bytes.size());
    bytes.replace(at, std::min(n, bytes.size() - at), other, from, n);
    log.push_back("spliced " + std::to_string(n) + " bytes from byte " +
                  std::to_string(from) + " of another file at byte " +
                  std::to_string(at));
    return;
  }
  case 6: { // a chunk of the file repeated or removed
    size_t at = pick(rng, bytes.size());
    size_t n = 1 + pick(rng, std::min<size_t>(bytes.size() - at, 256));
    if (pick(rng, 2)) {
      bytes.insert(at, bytes.substr(at, n));
      log.push_back("repeated " + std::to_string(n) + " bytes at byte " +
                    std::to_string(at));
    } else {
      bytes.erase(at, n);
      log.push_back("removed " + std::to_string(n) + " bytes at byte " +
                    std::to_string(at));
    }
    return;
  }
  default: { // random bytes
    size_t at = pick(rng, bytes.size());
    size_t n = 1 + pick(rng, 16);
    for (size_t i = at; i < at + n && i < bytes.size(); ++i)
      bytes[i] = char(pick(rng, 256));
    log.push_back("random bytes at byte " + std::to_string(at));
    return;
  }
  }
}

/// A value of the wrong kind or at an extreme.
Json extremeValue(Rng &rng) {
  const Json values[] = {Json(0),
                         Json(-1),
                         Json(2147483647.0),
                         Json(2147483648.0),
                         Json(4294967296.0),
                         Json(9007199254740993.0),
                         Json(9.3e18),
                         Json(1e300),
                         Json(-1e300),
                         Json(0.5),
                         Json("x"),
                         Json(true),
                         Json(),
                         Json::array(),
                         Json::object(),
                         Json(1000000)};
  return pick(rng, values);
}

size_t countValues(const Json &v) {
  size_t n = 1;
  if (v.getKind() == Json::Kind::Array)
    for (const Json &x : v.asArray(""))
      n += countValues(x);
  for (const auto &m : v.members())
    n += countValues(m.second);
  return n;
}

/// `v` with value number `target` (pre-order) replaced, deleted or grown.
Json mutateJsonAt(const Json &v, size_t &index, size_t target, Rng &rng,
                  std::string &what, const std::string &path) {
  if (index++ == target) {
    Json x = extremeValue(rng);
    what = path + " = " + x.dump();
    return x;
  }
  if (v.getKind() == Json::Kind::Array) {
    Json out = Json::array();
    const std::vector<Json> &items = v.asArray("");
    for (size_t i = 0; i < items.size(); ++i) {
      size_t before = index;
      Json x = mutateJsonAt(items[i], index, target, rng, what,
                            path + "[" + std::to_string(i) + "]");
      // The target is the element itself: sometimes drop or double it.
      if (before == target && pick(rng, 3) == 0) {
        if (pick(rng, 2)) {
          what = path + "[" + std::to_string(i) + "] removed";
          continue;
        }
        out.push(items[i]);
        what = path + "[" + std::to_string(i) + "] doubled";
        x = items[i];
      }
      out.push(std::move(x));
    }
    return out;
  }
  if (v.getKind() == Json::Kind::Object) {
    Json out = Json::object();
    for (const auto &[key, member] : v.members()) {
      size_t before = index;
      Json x = mutateJsonAt(member, index, target, rng, what, path + "." + key);
      if (before == target && pick(rng, 3) == 0) {
        what = path + "." + key + " deleted";
        continue;
      }
      out.set(key, std::move(x));
    }
    return out;
  }
  return v;
}

/// One mutation of a JSON document: a value replaced, a key deleted or
/// added, or its text broken (a BOM, a 0xff byte, bytes).
std::string mutateJson(const Json &doc, Rng &rng,
                       std::vector<std::string> &log) {
  switch (pick(rng, 8)) {
  case 0: {
    std::string text = doc.dump();
    if (pick(rng, 2)) {
      log.push_back("a UTF-8 byte-order mark before the JSON");
      return "\xEF\xBB\xBF" + text;
    }
    size_t at = pick(rng, text.size());
    text[at] = char(0xff);
    log.push_back("a 0xff byte at byte " + std::to_string(at));
    return text;
  }
  case 1: {
    std::string text = doc.dump();
    mutateBytes(text, {}, "", rng, log);
    return text;
  }
  case 2: {
    if (doc.getKind() != Json::Kind::Object) {
      log.push_back("unchanged (not an object)");
      return doc.dump();
    }
    Json out = doc;
    const char *const keys[] = {"head_dim",        "num_key_value_heads",
                                "sliding_window",  "rope_scaling",
                                "attention_bias",  "tie_word_embeddings",
                                "rope_parameters", "eos_token_id"};
    const char *key = pick(rng, keys);
    Json x = extremeValue(rng);
    log.push_back(std::string("set '") + key + "' = " + x.dump());
    out.set(key, std::move(x));
    return out.dump();
  }
  default: {
    size_t index = 0, target = pick(rng, countValues(doc));
    std::string what;
    Json out = mutateJsonAt(doc, index, target, rng, what, "$");
    log.push_back("JSON " + what);
    return out.dump();
  }
  }
}

/// A safetensors header whose tensor A is moved onto tensor B's bytes (A's
/// length from B's start): an overlap.
std::string overlapSafetensors(const Json &header, Rng &rng,
                               std::vector<std::string> &log) {
  std::vector<std::string> names;
  for (const auto &[name, info] : header.members())
    if (info.find("data_offsets"))
      names.push_back(name);
  if (names.size() < 2) {
    log.push_back("unchanged (fewer than two tensors)");
    return header.dump();
  }
  const std::string &a = names[pick(rng, names.size())];
  const std::string &b = names[pick(rng, names.size())];
  auto offsets = [&](const std::string &name) {
    const std::vector<Json> &o =
        header.find(name)->find("data_offsets")->asArray("");
    return std::pair<int64_t, int64_t>(o.at(0).asInt(""), o.at(1).asInt(""));
  };
  int64_t aBegin, aEnd, begin;
  try {
    std::tie(aBegin, aEnd) = offsets(a);
    begin = offsets(b).first;
  } catch (const std::exception &) { // an earlier mutation made them bad
    log.push_back("unchanged (bad data_offsets)");
    return header.dump();
  }
  Json out = Json::object();
  for (const auto &[name, info] : header.members()) {
    if (name != a) {
      out.set(name, info);
      continue;
    }
    Json moved = Json::object();
    for (const auto &[key, value] : info.members())
      moved.set(key, value);
    Json range = Json::array();
    range.push(begin);
    range.push(begin + (aEnd - aBegin));
    moved.set("data_offsets", std::move(range));
    out.set(name, std::move(moved));
  }
  log.push_back("tensor '" + a + "' moved onto '" + b + "''s bytes");
  return out.dump();
}

/// Config values (as GGUF metadata) set to extremes; `c` keeps the tensors'.
void mutateGgufConfig(GgufWriter &w, const ModelConfig &c, Rng &rng,
                      std::vector<std::string> &log) {
  ModelConfig meta = c;
  int64_t *fields[] = {&meta.vocabSize,        &meta.hiddenSize,
                       &meta.intermediateSize, &meta.numLayers,
                       &meta.numHeads,         &meta.numKVHeads,
                       &meta.headDim,          &meta.maxPositions};
  const char *const names[] = {"vocab_size",          "embedding_length",
                               "feed_forward_length", "block_count",
                               "head_count",          "head_count_kv",
                               "key_length",          "context_length"};
  const int64_t values[] = {0,
                            1,
                            2,
                            3,
                            1000000,
                            2147483647,
                            4294967295,
                            65536,
                            c.numLayers + 1,
                            c.hiddenSize * 2};
  size_t which = pick(rng, std::size(fields));
  *fields[which] = pick(rng, values);
  log.push_back(std::string("metadata ") + names[which] + " = " +
                std::to_string(*fields[which]));
  GgufWriter fresh;
  writeConfig(fresh, meta);
  // Keep the tokenizer and other keys the seed had after the config's.
  std::vector<std::string> kept;
  if (w.kvs.size() > fresh.kvs.size())
    kept.assign(w.kvs.begin() + long(fresh.kvs.size()), w.kvs.end());
  w.kvs = fresh.kvs;
  w.kvs.insert(w.kvs.end(), kept.begin(), kept.end());
}

/// Structural mutations of a GGUF before it is written.
void mutateGgufStructure(GgufWriter &w, const ModelConfig &c, Rng &rng,
                         std::vector<std::string> &log) {
  size_t n = w.tensors.size();
  if (n == 0 || w.kvs.empty()) {
    mutateGgufConfig(w, c, rng, log);
    return;
  }
  switch (pick(rng, 10)) {
  case 0: {
    size_t i = pick(rng, n);
    w.tensors.push_back(w.tensors[i]);
    log.push_back("tensor entry '" + w.tensors[i].name + "' duplicated");
    return;
  }
  case 1: {
    size_t i = pick(rng, n);
    log.push_back("tensor entry '" + w.tensors[i].name + "' removed");
    w.tensors.erase(w.tensors.begin() + long(i));
    return;
  }
  case 2:
  case 3: {
    size_t i = pick(rng, n), j = pick(rng, n);
    // Sometimes every tensor on the first one's data (the finding's
    // "125 GiB of weights in a 10 MB file").
    if (pick(rng, 3) == 0) {
      for (size_t k = 1; k < n; ++k)
        w.shareData(k, 0);
      log.push_back("every tensor's data at the first one's");
      return;
    }
    w.shareData(i, j);
    log.push_back("tensor '" + w.tensors[i].name + "' moved onto '" +
                  w.tensors[j].name + "''s data");
    return;
  }
  case 4: {
    size_t i = pick(rng, n);
    std::vector<int64_t> &shape = w.tensors[i].shape;
    size_t d = pick(rng, shape.size());
    const int64_t dims[] = {0,
                            1,
                            2,
                            1 << 20,
                            int64_t(1) << 31,
                            int64_t(1) << 40,
                            shape[d] * 2,
                            shape[d] + 32};
    shape[d] = pick(rng, dims);
    log.push_back("tensor '" + w.tensors[i].name + "' dim " +
                  std::to_string(d) + " = " + std::to_string(shape[d]));
    return;
  }
  case 5: {
    size_t i = pick(rng, n);
    const uint32_t types[] = {TF32,  TF16,  TBF16,    TQ8_0, TQ4_0,
                              TQ4_1, TQ4_K, TIQ2_XXS, 7,     99};
    w.tensors[i].type = pick(rng, types);
    log.push_back("tensor '" + w.tensors[i].name + "' type " +
                  std::to_string(w.tensors[i].type));
    return;
  }
  case 6: {
    size_t i = pick(rng, w.kvs.size());
    log.push_back("metadata entry " + std::to_string(i) + " removed");
    w.kvs.erase(w.kvs.begin() + long(i));
    return;
  }
  case 7: {
    const uint64_t alignments[] = {0, 1, 3, 8, 64, 4096, 1 << 20};
    uint64_t a = pick(rng, alignments);
    w.kvU32("general.alignment", uint32_t(a));
    log.push_back("general.alignment = " + std::to_string(a));
    return;
  }
  case 8: {
    // A key's value of another type: the config's keys come first.
    size_t i = pick(rng, std::min<size_t>(w.kvs.size(), 12));
    uint64_t keyLength;
    std::memcpy(&keyLength, w.kvs[i].data(), 8);
    std::string key = w.kvs[i].substr(8, size_t(keyLength));
    GgufWriter one;
    switch (pick(rng, 7)) {
    case 0:
      one.kvString(key, "x");
      break;
    case 1:
      one.kvF32(key, 1e30f);
      break;
    case 2:
      one.kvBool(key, true);
      break;
    case 3:
      one.kvInts(key, {1, 2});
      break;
    case 4: {
      std::string v;
      append(v, int64_t(-1));
      one.kvRaw(key, 11, v); // int64
      break;
    }
    case 5: {
      std::string v;
      append(v, ~uint64_t(0));
      one.kvRaw(key, 10, v); // uint64
      break;
    }
    default: {
      std::string v;
      append(v, 0.5);
      one.kvRaw(key, 12, v); // float64
      break;
    }
    }
    w.kvs[i] = one.kvs[0];
    log.push_back("metadata '" + key + "' of another type");
    return;
  }
  default:
    mutateGgufConfig(w, c, rng, log);
    return;
  }
}

/// The review's file: a model of a few GB of f32 weights whose tensors all
/// read one Q4_0 tensor's bytes (9 MB), so that only the file's overlapping
/// tensors tell it from a real model.
std::string aliasedBigModel(Rng &rng, std::vector<std::string> &log) {
  ModelConfig c = shapedConfig(
      pick(rng, 2) ? "llama" : "qwen2",
      {/*vocabSize=*/2048, /*hiddenSize=*/2048, /*intermediateSize=*/8192,
       /*numLayers=*/8, /*numHeads=*/16, /*numKVHeads=*/4, /*headDim=*/128});
  c.tieEmbeddings = true;
  GgufWriter w;
  writeConfig(w, c);
  std::vector<TensorSpec> specs = modelTensors(c);
  // The largest tensor holds bytes; every other one points at them.
  size_t largest = 0;
  for (size_t i = 0; i < specs.size(); ++i)
    if (count(specs[i].shape) > count(specs[largest].shape))
      largest = i;
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec &t = specs[i];
    std::string bytes;
    if (i == largest)
      bytes.assign(size_t(count(t.shape) / 32 * 18), '\0');
    w.tensor(ggufName(t.name), t.shape, t.shape.back() % 32 ? TF32 : TQ4_0,
             bytes);
  }
  for (size_t i = 0; i < specs.size(); ++i)
    if (i != largest)
      w.shareData(i, largest);
  log.push_back("every tensor of an 8-layer model of hidden 2048 on the " +
                specs[largest].name + "'s Q4_0 bytes");
  return w.build();
}

Case makeCase(uint64_t seed) {
  Rng rng(seed);
  Case k;
  k.seed = seed;
  ModelConfig c = randomConfig(rng);
  // Another model, for splicing.
  ModelConfig otherConfig = randomConfig(rng);
  int mutations = 1 + int(pick(rng, 3));
  if (pick(rng, 10) == 0)
    mutations = 0; // the seed as it is must load and run
  k.valid = mutations == 0;
  k.gguf = pick(rng, 2) == 0;
  if (k.gguf && pick(rng, 64) == 0) {
    k.file = aliasedBigModel(rng, k.log);
    k.valid = false;
    return k;
  }
  if (k.gguf) {
    GgufWriter w = ggufSeed(c, rng);
    std::string other = ggufSeed(otherConfig, rng).build();
    int structural = mutations ? int(pick(rng, size_t(mutations) + 1)) : 0;
    for (int i = 0; i < structural; ++i)
      mutateGgufStructure(w, c, rng, k.log);
    k.file = w.build();
    for (int i = structural; i < mutations; ++i)
      mutateBytes(k.file, ggufFields(k.file), other, rng, k.log);
    return k;
  }
  HFSeed s = hfSeed(c, rng);
  std::string config = s.config.dump();
  std::vector<std::pair<std::string, std::string>> shards;
  Json weightMap = Json::object();
  for (const auto &[name, writer] : s.shards) {
    shards.emplace_back(name, writer.build());
    for (const auto &e : writer.entries)
      weightMap.set(e.name, name);
  }
  Json index = Json::object();
  Json meta = Json::object();
  meta.set("total_size", 0);
  index.set("metadata", std::move(meta));
  index.set("weight_map", std::move(weightMap));
  std::string indexText = index.dump();
  for (int i = 0; i < mutations; ++i) {
    // The config when no shard is left to mutate.
    switch (shards.empty() ? 0 : pick(rng, 6)) {
    case 0:
    case 1:
      config = mutateJson(Json::parse(s.config.dump(), "config"), rng, k.log);
      k.log.back() = "config.json: " + k.log.back();
      break;
    case 2:
      if (s.index) {
        indexText = mutateJson(index, rng, k.log);
        k.log.back() = "index: " + k.log.back();
        break;
      }
      [[fallthrough]];
    case 3: { // a shard's header JSON
      auto &[name, bytes] = shards[pick(rng, shards.size())];
      uint64_t len = ~uint64_t(0);
      if (bytes.size() >= 8)
        std::memcpy(&len, bytes.data(), 8);
      Json header;
      try {
        if (len > bytes.size() - 8)
          break;
        header = Json::parse(bytes.substr(8, len), name);
      } catch (const rt::Error &) {
        break; // an earlier mutation broke it
      }
      std::string text = pick(rng, 3) ? mutateJson(header, rng, k.log)
                                      : overlapSafetensors(header, rng, k.log);
      k.log.back() = name + " header: " + k.log.back();
      while (text.size() % 8)
        text += ' ';
      std::string out;
      append(out, uint64_t(text.size()));
      bytes = out + text + bytes.substr(8 + len);
      break;
    }
    case 4: { // a shard's bytes (the header length a field)
      auto &[name, bytes] = shards[pick(rng, shards.size())];
      std::string other = shards[pick(rng, shards.size())].second;
      mutateBytes(bytes, {0}, other, rng, k.log);
      k.log.back() = name + ": " + k.log.back();
      break;
    }
    default: { // a shard removed or one shard's file twice
      size_t i = pick(rng, shards.size());
      if (pick(rng, 2) || shards.size() == 1) {
        k.log.push_back(shards[i].first + " removed");
        shards.erase(shards.begin() + long(i));
      } else {
        size_t j = (i + 1) % shards.size();
        k.log.push_back(shards[j].first + " holds " + shards[i].first +
                        "'s bytes");
        shards[j].second = shards[i].second;
      }
      break;
    }
    }
  }
  k.files.emplace_back("config.json", config);
  if (s.index)
    k.files.emplace_back("model.safetensors.index.json", indexText);
  for (auto &shard : shards)
    k.files.push_back(std::move(shard));
  return k;
}

// ---------------------------------------------------------------------------
// Running a case
// ---------------------------------------------------------------------------

void writeBytes(const std::string &path, const std::string &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out.good())
    throw std::logic_error("cannot write " + path);
}

/// Writes `k` under `dir` as `name`(.gguf); returns its path.
std::string writeCase(const Case &k, const std::string &dir,
                      const std::string &name) {
  std::error_code ec;
  std::string path = dir + "/" + name + (k.gguf ? ".gguf" : "");
  fs::remove_all(path, ec);
  if (k.gguf) {
    writeBytes(path, k.file);
    return path;
  }
  fs::create_directories(path, ec);
  for (const auto &[file, bytes] : k.files)
    writeBytes(path + "/" + file, bytes);
  return path;
}

/// What the child does: open the model, then build a CPU model with a tiny
/// pool and run a prefill and a decode step.
void loadAndRun(const std::string &path, const std::string &jitDir,
                bool openOnly) {
  ModelWeights w = ModelWeights::open(path);
  // What the Python package reads of a GGUF (its tokenizer): the metadata.
  std::string metadata = w.ggufMetadata().dump();
  if (openOnly)
    return;
  RunnerConfig rc;
  rc.device = rt::Device::Cpu;
  rc.blockSize = 16;
  rc.numPages = 8;
  rc.maxSequences = 2;
  rc.maxBatch = 2;
  rc.cacheDir = jitDir;
  rc.quiet = true;
  ModelRunner runner(w, nullptr, rc);
  const int32_t last = int32_t(w.config().vocabSize - 1);
  rt::SeqId seq = runner.session().addSequence();
  std::vector<float> logits =
      runner.forwardLogits({seq}, {{0, last, last / 2}}, {false});
  if (logits.size() != size_t(last) + 1)
    throw std::logic_error("the prefill returned " +
                           std::to_string(logits.size()) + " logits for " +
                           std::to_string(last + 1) + " tokens");
  RowSampling greedy, sampled;
  sampled.temperature = 0.8f;
  sampled.topP = 0.9f;
  sampled.topK = 5;
  sampled.seed = 7;
  rt::SeqId other = runner.session().addSequence();
  runner.forwardLogits({other}, {{last}}, {false});
  std::vector<int32_t> next = runner.forward({seq, other}, {{last}, {0}},
                                             {true, true}, {greedy, sampled});
  for (int32_t t : next)
    if ((t < 0 && t != kNonFiniteLogits) || t > last)
      throw std::logic_error("a decode step drew token " + std::to_string(t) +
                             " outside the vocabulary of " +
                             std::to_string(last + 1));
}

/// Runs `path` in this process and says how it ended.
int runHere(const std::string &path, const std::string &jitDir, bool openOnly) {
  try {
    loadAndRun(path, jitDir, openOnly);
    std::printf("ran\n");
    return 0;
  } catch (const std::runtime_error &e) {
    std::printf("refused: %s\n", e.what());
    return 0;
  } catch (const std::exception &e) {
    std::printf("UNEXPECTED: %s\n", e.what());
    return 1;
  }
}

} // namespace

int main(int argc, char **argv) {
  testing::FuzzOptions opt;
  opt.caseSeconds = 10;
  opt.memoryGiB = 2;
  std::string replay;
  bool openOnly = false;
  if (!testing::parseFuzzArgs(
          argc, argv, "--case-seconds",
          "vflow-fuzz-loader [--seconds S] [--seed N] [--iterations N] "
          "[--memory-gib G] [--case-seconds T] [--keep DIR] [--case N] "
          "[--replay PATH [--open-only]]",
          opt, {{{"--replay", &replay}}, {{"--open-only", &openOnly}}}))
    return 2;
  testing::FuzzWorkDir work("vflow-fuzz-loader");
  if (!work.ok())
    return 2;
  std::string jitDir = work.str() + "/jit";
  std::string keep = opt.keepDir();
  if (!replay.empty())
    return runHere(replay, jitDir, openOnly);
  if (opt.only) {
    Case k = makeCase(opt.only);
    for (const std::string &line : k.log)
      std::printf("// %s\n", line.c_str());
    std::string path = writeCase(k, keep, "fuzz-loader-case");
    std::printf("// written to %s\n", path.c_str());
    return runHere(path, jitDir, openOnly);
  }

  Case k;
  return testing::runFuzzCases(
      opt, "vflow-fuzz-loader", "cases",
      [&](uint64_t seed) {
        k = makeCase(seed);
        std::string path = writeCase(k, work.str(), "case");
        testing::ChildOutcome outcome = testing::runLimited(
            [&] { loadAndRun(path, jitDir, false); }, opt.limits());
        if (k.valid && outcome.kind == testing::ChildOutcome::Kind::Refused) {
          outcome.kind = testing::ChildOutcome::Kind::Failed;
          outcome.message = "a valid seed was refused: " + outcome.message;
        }
        return outcome;
      },
      [&](uint64_t seed, const testing::ChildOutcome &outcome) {
        std::string kept = writeCase(k, keep, "fuzz-loader-failure");
        std::string note = keep + "/fuzz-loader-failure.txt";
        std::ofstream out(note);
        out << "vflow-fuzz-loader case " << seed << ": " << outcome.message
            << "\n";
        for (const std::string &line : k.log)
          out << "  " << line << "\n";
        out << "replay: vflow-fuzz-loader --replay " << kept << "\n";
        std::fprintf(stderr, "vflow-fuzz-loader: case %llu %s\n",
                     (unsigned long long)seed, outcome.message.c_str());
        for (const std::string &line : k.log)
          std::fprintf(stderr, "  %s\n", line.c_str());
        std::fprintf(stderr, "(written to %s; %s)\n", kept.c_str(),
                     note.c_str());
      });
}
