//===- PagedKVCache.cpp - Paged KV cache with fields and states -----------===//

#include "vflow/Runtime/PagedKVCache.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/NumericRules.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <set>

#include <unistd.h>

using namespace vflow::rt;
namespace rules = vflow::rules;

namespace {

std::string str(int64_t value) { return std::to_string(value); }

/// a * b, or an Error naming `what` when it does not fit in size_t.
size_t checkedMul(size_t a, size_t b, const std::string &what) {
  if (a != 0 && b > std::numeric_limits<size_t>::max() / a)
    throw Error("KV cache config: " + what + " overflows the address space");
  return a * b;
}

std::vector<unsigned char> allocateZeroed(size_t bytes,
                                          const std::string &what) {
  try {
    return std::vector<unsigned char>(bytes, 0);
  } catch (const std::exception &) { // bad_alloc, or length_error
    throw Error("KV cache: cannot allocate " + std::to_string(bytes) +
                " bytes for " + what);
  }
}

/// Keeps a flag set while a hook runs, also when it throws.
class FlagGuard {
public:
  explicit FlagGuard(bool &flag) : flag(flag) { flag = true; }
  ~FlagGuard() { flag = false; }

private:
  bool &flag;
};

size_t kvPoolBytes(const CacheConfig &cfg) {
  size_t blockBytes =
      checkedMul(checkedMul(cfg.pageSize, cfg.headDim, "a K/V block"),
                 bytesPerElement(cfg.kvDType), "a K/V block");
  return checkedMul(checkedMul(blockBytes, cfg.numKVHeads, "a K/V pool"),
                    static_cast<size_t>(cfg.numPages), "a K/V pool");
}

/// Floats of one layer's K (or V) scale pool: one per (page, kv head,
/// slot) for a scaled KV dtype, else 0.
size_t kvScaleCount(const CacheConfig &cfg) {
  if (!isScaledKVDType(cfg.kvDType))
    return 0;
  return checkedMul(checkedMul(size_t(cfg.pageSize), size_t(cfg.numKVHeads),
                               "a K/V scale pool"),
                    static_cast<size_t>(cfg.numPages), "a K/V scale pool");
}

size_t fieldPoolBytes(const CacheConfig &cfg, const FieldSpec &field) {
  std::string what = "the pool of cache field " + field.name;
  size_t entryBytes = checkedMul(static_cast<size_t>(field.elementsPerBlock),
                                 bytesPerElement(field.dtype), what);
  return checkedMul(checkedMul(entryBytes, cfg.numKVHeads, what),
                    static_cast<size_t>(cfg.numPages), what);
}

/// Cache fields' or states' specs (`kind` names one in the Errors): named,
/// each name once, a positive elementsPerBlock.
template <typename Spec>
void checkSpecs(const std::vector<Spec> &specs, const std::string &kind) {
  std::set<std::string> names;
  for (const Spec &spec : specs) {
    if (spec.name.empty())
      throw Error("KV cache config: a " + kind + " has an empty name");
    if (!names.insert(spec.name).second)
      throw Error("KV cache config: " + kind + " '" + spec.name +
                  "' is declared twice");
    if (spec.elementsPerBlock <= 0)
      throw Error("KV cache config: " + kind + " '" + spec.name +
                  "' must have a positive elementsPerBlock, got " +
                  str(spec.elementsPerBlock));
  }
}

/// Checks every field of `cfg` and returns it; throws Error naming the first
/// bad one.
CacheConfig validated(CacheConfig cfg) {
  auto positive = [](const char *name, int64_t value) {
    if (value <= 0)
      throw Error(std::string("KV cache config: ") + name +
                  " must be positive, got " + str(value));
  };
  positive("numLayers", cfg.numLayers);
  positive("numKVHeads", cfg.numKVHeads);
  positive("headDim", cfg.headDim);
  positive("pageSize", cfg.pageSize);
  positive("numPages", cfg.numPages);
  if (cfg.numPages > std::numeric_limits<PageId>::max())
    throw Error("KV cache config: numPages must be at most " +
                str(std::numeric_limits<PageId>::max()) + ", got " +
                str(cfg.numPages));
  if (!isHostKVDType(cfg.kvDType))
    throw Error(std::string("KV cache config: kvDType ") +
                dtypeName(cfg.kvDType) +
                " is not supported on the host; use f32, bf16, f16, int8, "
                "fp8e4m3 or fp8e5m2");

  checkSpecs(cfg.fields, "cache field");
  checkSpecs(cfg.states, "state");

  // Sizes that overflow are rejected before anything is allocated, and so
  // is a cache larger than the machine's memory: zeroing it would touch
  // every page, and an overcommitting kernel kills the process for that
  // instead of failing the allocation.
  const std::string layers =
      str(cfg.numLayers) + (cfg.numLayers == 1 ? " layer" : " layers");
  size_t perLayer = kvPoolBytes(cfg);
  const size_t scaleBytes =
      checkedMul(kvScaleCount(cfg), sizeof(float), "a K/V scale pool");
  if (scaleBytes > std::numeric_limits<size_t>::max() - perLayer)
    throw Error("KV cache: its pools do not fit in memory");
  size_t total =
      checkedMul(checkedMul(perLayer + scaleBytes, 2, "the K/V pools"),
                 static_cast<size_t>(cfg.numLayers), layers);
  for (const FieldSpec &field : cfg.fields) {
    size_t bytes = checkedMul(fieldPoolBytes(cfg, field),
                              static_cast<size_t>(cfg.numLayers), layers);
    if (bytes > std::numeric_limits<size_t>::max() - total)
      throw Error("KV cache: its pools do not fit in memory");
    total += bytes;
  }
  const long pages = sysconf(_SC_PHYS_PAGES), pageBytes = sysconf(_SC_PAGESIZE);
  if (pages > 0 && pageBytes > 0 && total / size_t(pageBytes) >= size_t(pages))
    throw Error("KV cache: " + str(cfg.numPages) + " pages of " +
                str(cfg.pageSize) + " tokens x " + layers + " x " +
                str(cfg.numKVHeads) + " KV heads x head dim " +
                str(cfg.headDim) + " need " + str(int64_t(total >> 20)) +
                " MiB, more than this machine's " +
                str(int64_t((size_t(pages) * size_t(pageBytes)) >> 20)) +
                " MiB of memory (fewer pages, or a smaller KV dtype)");
  return cfg;
}

} // namespace

bool vflow::rt::isHostKVDType(DType type) {
  return type == DType::F32 || type == DType::BF16 || type == DType::F16 ||
         isScaledKVDType(type);
}

PagedKVCache::PagedKVCache(CacheConfig config)
    : cfg(validated(std::move(config))),
      table(cfg.numPages, cfg.pageSize, cfg.numLayers) {
  size_t poolBytes = kvPoolBytes(cfg);
  for (int layer = 0; layer < cfg.numLayers; ++layer) {
    kPools.push_back(allocateZeroed(poolBytes, "the K pool of a layer"));
    if (!cfg.valuesAreKeys)
      vPools.push_back(allocateZeroed(poolBytes, "the V pool of a layer"));
  }
  if (const size_t scales = kvScaleCount(cfg))
    for (int layer = 0; layer < cfg.numLayers; ++layer) {
      kScalePools.emplace_back(scales, 0.0f);
      if (!cfg.valuesAreKeys)
        vScalePools.emplace_back(scales, 0.0f);
    }
  for (const FieldSpec &field : cfg.fields) {
    size_t bytes = fieldPoolBytes(cfg, field);
    std::vector<std::vector<unsigned char>> perLayer;
    for (int layer = 0; layer < cfg.numLayers; ++layer)
      perLayer.push_back(
          allocateZeroed(bytes, "the pool of cache field " + field.name));
    fieldPools.push_back(std::move(perLayer));
  }
  for (const StateSpec &state : cfg.states) {
    std::vector<unsigned char> init(bytesPerElement(state.dtype));
    convertFromF32(state.dtype, &state.init, init.data(), 1);
    stateInitBytes.push_back(std::move(init));
  }
}

int64_t PagedKVCache::tokenElements() const {
  return static_cast<int64_t>(cfg.numLayers) * cfg.numKVHeads * cfg.headDim;
}

int64_t PagedKVCache::blockElements() const {
  return static_cast<int64_t>(cfg.pageSize) * cfg.headDim;
}

//===----------------------------------------------------------------------===//
// Argument checks
//===----------------------------------------------------------------------===//

const PagedKVCache::Sequence &
PagedKVCache::lookup(SeqId seq, const char *operation) const {
  auto it = sequences.find(seq);
  if (it != sequences.end())
    return it->second;
  if (seq >= 0 && seq < table.nextSeqId())
    throw Error(std::string(operation) + ": sequence " + str(seq) +
                " was freed");
  throw Error(std::string(operation) + ": sequence " + str(seq) +
              " does not exist (ids so far are 0.." +
              str(table.nextSeqId() - 1) + ")");
}

PagedKVCache::Sequence &PagedKVCache::lookup(SeqId seq, const char *operation) {
  return const_cast<Sequence &>(
      static_cast<const PagedKVCache *>(this)->lookup(seq, operation));
}

void PagedKVCache::checkBlockAddress(int layer, PageId page, int kvHead,
                                     const char *operation) const {
  if (layer < 0 || layer >= cfg.numLayers)
    throw Error(std::string(operation) + ": layer " + str(layer) +
                " is out of range: the cache has " + str(cfg.numLayers) +
                " layers");
  if (page < 0 || page >= numPages())
    throw Error(std::string(operation) + ": page " + str(page) +
                " is out of range: the cache has " + str(numPages()) +
                " pages");
  if (kvHead < 0 || kvHead >= cfg.numKVHeads)
    throw Error(std::string(operation) + ": kv head " + str(kvHead) +
                " is out of range: the cache has " + str(cfg.numKVHeads) +
                " kv heads");
}

void PagedKVCache::checkField(int field, const char *operation) const {
  if (field < 0 || field >= numFields())
    throw Error(std::string(operation) + ": field index " + str(field) +
                " is out of range: the cache has " + str(numFields()) +
                " cache fields");
}

void PagedKVCache::checkState(int state, const char *operation) const {
  if (state < 0 || state >= numStates())
    throw Error(std::string(operation) + ": state index " + str(state) +
                " is out of range: the cache has " + str(numStates()) +
                " states");
}

void PagedKVCache::checkNotInHook(const char *operation) const {
  if (inHook)
    throw Error(std::string(operation) +
                ": not allowed inside the page-full hook (the hook may read "
                "K/V and write fields only)");
}

size_t PagedKVCache::kvOffset(int layer, PageId page, int kvHead) const {
  return tokenSlot(page, kvHead, 0) * size_t(cfg.headDim) *
         bytesPerElement(cfg.kvDType);
}

template <typename Fn> void PagedKVCache::forEachTokenPool(Fn &&fn) {
  const size_t rowBytes = size_t(cfg.headDim) * bytesPerElement(cfg.kvDType);
  for (int l = 0; l < cfg.numLayers; ++l) {
    fn(kPools[size_t(l)].data(), rowBytes);
    if (!vPools.empty())
      fn(vPools[size_t(l)].data(), rowBytes);
    if (!kScalePools.empty())
      fn(reinterpret_cast<unsigned char *>(kScalePools[size_t(l)].data()),
         sizeof(float));
    if (!vScalePools.empty())
      fn(reinterpret_cast<unsigned char *>(vScalePools[size_t(l)].data()),
         sizeof(float));
  }
}

size_t PagedKVCache::tokenSlot(PageId page, int kvHead, int64_t slot) const {
  return (size_t(page) * cfg.numKVHeads + size_t(kvHead)) * cfg.pageSize +
         size_t(slot);
}

size_t PagedKVCache::fieldOffset(int field, PageId page, int kvHead) const {
  const FieldSpec &spec = cfg.fields[field];
  size_t entry = static_cast<size_t>(page) * cfg.numKVHeads + kvHead;
  return entry * static_cast<size_t>(spec.elementsPerBlock) *
         bytesPerElement(spec.dtype);
}

size_t PagedKVCache::stateSlot(int layer, int kvHead) const {
  return static_cast<size_t>(layer) * cfg.numKVHeads + kvHead;
}

//===----------------------------------------------------------------------===//
// Sequences
//===----------------------------------------------------------------------===//

SeqId PagedKVCache::addSequence() {
  checkNotInHook("addSequence");
  SeqId id = table.add();
  sequences.emplace(id, freshSequence());
  return id;
}

SeqId PagedKVCache::sharePrefix(SeqId parent, int64_t tokens) {
  checkNotInHook("sharePrefix");
  lookup(parent, "sharePrefix");
  Sequence child = freshSequence();
  SeqId id = table.forkPrefix(parent, tokens, "sharePrefix");
  for (int64_t b = 0; b < tokens / cfg.pageSize; ++b)
    addBlockStates(child);
  sequences.emplace(id, std::move(child));
  return id;
}

PagedKVCache::Sequence PagedKVCache::freshSequence() const {
  Sequence sequence;
  size_t slots = static_cast<size_t>(cfg.numLayers) * cfg.numKVHeads;
  for (int state = 0; state < numStates(); ++state) {
    const StateSpec &spec = cfg.states[state];
    std::vector<std::vector<unsigned char>> entries(slots);
    if (!spec.perBlock) {
      std::vector<unsigned char> entry;
      for (int64_t i = 0; i < spec.elementsPerBlock; ++i)
        entry.insert(entry.end(), stateInitBytes[state].begin(),
                     stateInitBytes[state].end());
      std::fill(entries.begin(), entries.end(), entry);
    }
    sequence.states.insert(sequence.states.end(), entries.begin(),
                           entries.end());
  }
  return sequence;
}

SeqId PagedKVCache::fork(SeqId parent) {
  checkNotInHook("fork");
  Sequence child = lookup(parent, "fork");
  SeqId id = table.fork(parent);
  sequences.emplace(id, std::move(child));
  return id;
}

void PagedKVCache::freeSequence(SeqId seq) {
  checkNotInHook("freeSequence");
  lookup(seq, "freeSequence");
  table.release(seq);
  sequences.erase(seq);
}

void PagedKVCache::evict(SeqId seq, const std::vector<int64_t> &blocks) {
  checkNotInHook("evict");
  Sequence &sequence = lookup(seq, "evict");
  const int64_t before = table.length(seq) / cfg.pageSize;
  table.evict(seq, blocks, "evict");
  if (blocks.empty())
    return;
  // Per-block state rows of the kept blocks, in order.
  const size_t slots = static_cast<size_t>(cfg.numLayers) * cfg.numKVHeads;
  for (int state = 0; state < numStates(); ++state) {
    const StateSpec &spec = cfg.states[state];
    if (!spec.perBlock)
      continue;
    const size_t row =
        size_t(spec.elementsPerBlock) * stateInitBytes[state].size();
    for (size_t slot = 0; slot < slots; ++slot) {
      std::vector<unsigned char> &entry = sequence.states[state * slots + slot];
      std::vector<unsigned char> kept;
      kept.reserve(entry.size() - blocks.size() * row);
      size_t next = 0;
      for (int64_t b = 0; b < before; ++b) {
        if (next < blocks.size() && blocks[next] == b) {
          ++next;
          continue;
        }
        kept.insert(kept.end(), entry.begin() + b * row,
                    entry.begin() + (b + 1) * row);
      }
      entry = std::move(kept);
    }
  }
}

int64_t PagedKVCache::evictTokens(SeqId seq,
                                  const std::vector<int64_t> &tokens) {
  checkNotInHook("evictTokens");
  Sequence &sequence = lookup(seq, "evictTokens");
  const int heads = cfg.numKVHeads;
  auto move = [&](const std::vector<PageTable::TokenMove> &moves) {
    // Every source read before any destination is written (K, V and their
    // scales alike).
    std::vector<unsigned char> staged;
    forEachTokenPool([&](unsigned char *base, size_t slotBytes) {
      for (const PageTable::TokenMove &m : moves)
        for (int h = 0; h < heads; ++h) {
          const unsigned char *from =
              base + tokenSlot(m.fromPage, h, m.fromSlot) * slotBytes;
          staged.insert(staged.end(), from, from + slotBytes);
        }
    });
    const unsigned char *cursor = staged.data();
    forEachTokenPool([&](unsigned char *base, size_t slotBytes) {
      for (const PageTable::TokenMove &m : moves)
        for (int h = 0; h < heads; ++h, cursor += slotBytes)
          std::memcpy(base + tokenSlot(m.toPage, h, m.toSlot) * slotBytes,
                      cursor, slotBytes);
    });
  };
  const int64_t first = table.evictTokens(seq, tokens, "evictTokens", move);
  const int64_t length = table.length(seq), complete = length / cfg.pageSize;
  // Slots past the length read as zero (the rewritten tail is this
  // sequence's own page).
  if (length % cfg.pageSize != 0 && complete >= first) {
    const PageId tail = table.blocks(seq)[size_t(complete)];
    const int64_t from = length % cfg.pageSize;
    forEachTokenPool([&](unsigned char *base, size_t slotBytes) {
      for (int h = 0; h < heads; ++h)
        std::memset(base + tokenSlot(tail, h, from) * slotBytes, 0,
                    size_t(cfg.pageSize - from) * slotBytes);
    });
  }
  // Per-block state rows: the blocks before `first` keep theirs, the
  // rewritten ones start over.
  const size_t slots = size_t(cfg.numLayers) * cfg.numKVHeads;
  for (int state = 0; state < numStates(); ++state) {
    const StateSpec &spec = cfg.states[state];
    if (!spec.perBlock)
      continue;
    const std::vector<unsigned char> &init = stateInitBytes[state];
    const size_t row = size_t(spec.elementsPerBlock) * init.size();
    for (size_t slot = 0; slot < slots; ++slot) {
      std::vector<unsigned char> &entry = sequence.states[state * slots + slot];
      entry.resize(std::min(entry.size(), size_t(first) * row));
      while (entry.size() < size_t(complete) * row)
        entry.insert(entry.end(), init.begin(), init.end());
    }
  }
  // Fields of the rewritten complete blocks, as when they filled.
  if (pageFullHook) {
    FlagGuard guard(inHook);
    for (int64_t b = first; b < complete; ++b)
      for (int l = 0; l < cfg.numLayers; ++l)
        for (int h = 0; h < cfg.numKVHeads; ++h)
          pageFullHook(l, table.blocks(seq)[size_t(b)], h);
  }
  return first;
}

std::vector<SeqId> PagedKVCache::sequenceIds() const {
  std::vector<SeqId> ids;
  ids.reserve(sequences.size());
  for (const auto &entry : sequences)
    ids.push_back(entry.first);
  std::sort(ids.begin(), ids.end());
  return ids;
}

int64_t PagedKVCache::length(SeqId seq) const {
  lookup(seq, "length");
  return table.length(seq);
}

int64_t PagedKVCache::numCompleteBlocks(SeqId seq) const {
  lookup(seq, "numCompleteBlocks");
  return table.length(seq) / cfg.pageSize;
}

int64_t PagedKVCache::numBlocks(SeqId seq) const {
  lookup(seq, "numBlocks");
  return static_cast<int64_t>(table.blocks(seq).size());
}

const std::vector<PageId> &PagedKVCache::blockTable(SeqId seq) const {
  lookup(seq, "blockTable");
  return table.blocks(seq);
}

PageId PagedKVCache::physicalPage(SeqId seq, int64_t block) const {
  lookup(seq, "physicalPage");
  const std::vector<PageId> &blocks = table.blocks(seq);
  if (block < 0 || block >= static_cast<int64_t>(blocks.size()))
    throw Error("physicalPage: block " + str(block) +
                " is out of range: sequence " + str(seq) + " has " +
                str(blocks.size()) + " blocks");
  return blocks[block];
}

int PagedKVCache::tokensInBlock(SeqId seq, int64_t block) const {
  lookup(seq, "tokensInBlock");
  const std::vector<PageId> &blocks = table.blocks(seq);
  if (block < 0 || block >= static_cast<int64_t>(blocks.size()))
    throw Error("tokensInBlock: block " + str(block) +
                " is out of range: sequence " + str(seq) + " has " +
                str(blocks.size()) + " blocks");
  int64_t rest = table.length(seq) - block * cfg.pageSize;
  return static_cast<int>(std::min<int64_t>(rest, cfg.pageSize));
}

//===----------------------------------------------------------------------===//
// Appending
//===----------------------------------------------------------------------===//

void PagedKVCache::zeroPage(PageId page) {
  const size_t slots = size_t(cfg.pageSize) * cfg.numKVHeads;
  forEachTokenPool([&](unsigned char *base, size_t slotBytes) {
    std::memset(base + size_t(page) * slots * slotBytes, 0, slots * slotBytes);
  });
  for (int field = 0; field < numFields(); ++field) {
    const FieldSpec &spec = cfg.fields[field];
    size_t bytes = static_cast<size_t>(spec.elementsPerBlock) *
                   bytesPerElement(spec.dtype) * cfg.numKVHeads;
    size_t start = fieldOffset(field, page, 0);
    for (int layer = 0; layer < cfg.numLayers; ++layer)
      std::memset(fieldPools[field][layer].data() + start, 0, bytes);
  }
}

void PagedKVCache::copyPage(PageId from, PageId to) {
  const size_t slots = size_t(cfg.pageSize) * cfg.numKVHeads;
  forEachTokenPool([&](unsigned char *base, size_t slotBytes) {
    std::memcpy(base + size_t(to) * slots * slotBytes,
                base + size_t(from) * slots * slotBytes, slots * slotBytes);
  });
  for (int field = 0; field < numFields(); ++field) {
    const FieldSpec &spec = cfg.fields[field];
    size_t bytes = static_cast<size_t>(spec.elementsPerBlock) *
                   bytesPerElement(spec.dtype) * cfg.numKVHeads;
    for (int layer = 0; layer < cfg.numLayers; ++layer) {
      auto &pool = fieldPools[field][layer];
      std::memcpy(pool.data() + fieldOffset(field, to, 0),
                  pool.data() + fieldOffset(field, from, 0), bytes);
    }
  }
}

void PagedKVCache::addBlockStates(Sequence &sequence) {
  size_t slots = static_cast<size_t>(cfg.numLayers) * cfg.numKVHeads;
  for (int state = 0; state < numStates(); ++state) {
    const StateSpec &spec = cfg.states[state];
    if (!spec.perBlock)
      continue;
    const std::vector<unsigned char> &init = stateInitBytes[state];
    for (size_t slot = 0; slot < slots; ++slot) {
      std::vector<unsigned char> &entry = sequence.states[state * slots + slot];
      for (int64_t i = 0; i < spec.elementsPerBlock; ++i)
        entry.insert(entry.end(), init.begin(), init.end());
    }
  }
}

int64_t PagedKVCache::pagesNeeded(SeqId seq, int64_t numTokens) const {
  return table.contains(seq) ? table.pagesNeeded(seq, numTokens) : 0;
}

void PagedKVCache::append(SeqId seq, const float *k, const float *v) {
  appendTokens(seq, 1, k, v);
}

void PagedKVCache::checkRoom(SeqId seq, int64_t numTokens) const {
  const BlockManager &pages = table.blockManager();
  int64_t start = table.length(seq), end = start + numTokens;
  int64_t needed = table.pagesNeeded(seq, numTokens);
  if (needed <= pages.numFree())
    return;
  std::string reason;
  if (numTokens == 1 && table.tailShared(seq))
    reason = "needs one more to copy its shared tail page before writing "
             "its token at position " +
             str(start);
  else if (numTokens == 1)
    reason = "needs one more for its token at position " + str(start);
  else
    reason = "needs " + str(needed) + " more for its tokens at positions " +
             str(start) + ".." + str(end - 1) + ", " + str(pages.numFree()) +
             " are free";
  throw Error("KV cache exhausted: " +
              (pages.numFree() == 0
                   ? "all " + str(numPages()) + " pages are in use"
                   : str(pages.numUsed()) + " of " + str(numPages()) +
                         " pages are in use") +
              " (sequence " + str(seq) + " " + reason + ")");
}

void PagedKVCache::reserve(SeqId seq, int64_t numTokens) {
  checkNotInHook("reserve");
  Sequence &sequence = lookup(seq, "reserve");
  if (numTokens < 0)
    throw Error("reserve: numTokens must not be negative, got " +
                str(numTokens));
  if (numTokens == 0)
    return;
  checkRoom(seq, numTokens);
  const int64_t before = table.length(seq);
  table.grow(
      seq, numTokens, [this](PageId from, PageId to) { copyPage(from, to); },
      [this](PageId page) { zeroPage(page); });
  // Per-block states cover the complete blocks.
  for (int64_t b = before / cfg.pageSize;
       b < (before + numTokens) / cfg.pageSize; ++b)
    addBlockStates(sequence);
}

void PagedKVCache::writeLayer(int layer, SeqId seq, int64_t numTokens,
                              const float *k, const float *v) {
  writeTokens(layer, seq, numTokens, k, v, /*runHook=*/true);
}

void PagedKVCache::writeRow(const float *values, unsigned char *row,
                            float *scale) const {
  if (!scale) {
    convertFromF32(cfg.kvDType, values, row, size_t(cfg.headDim));
    return;
  }
  // NumericRules' scaled 8-bit rule: the row's largest magnitude maps to
  // the format's largest value.
  float absMax = 0.0f;
  for (int i = 0; i < cfg.headDim; ++i)
    absMax = rules::maximum(absMax, std::fabs(values[i]));
  *scale = rules::kvScale(absMax, kvFormatMax(cfg.kvDType));
  // Scaled in chunks, each converted in bulk (8-bit: a byte an element).
  float chunk[64];
  for (int i = 0; i < cfg.headDim; i += 64) {
    const int n = std::min(64, cfg.headDim - i);
    for (int j = 0; j < n; ++j)
      chunk[j] = rules::kvScaled(values[i + j], *scale);
    convertFromF32(cfg.kvDType, chunk, row + i, size_t(n));
  }
}

void PagedKVCache::writeTokens(int layer, SeqId seq, int64_t numTokens,
                               const float *k, const float *v, bool runHook) {
  checkNotInHook("writeLayer");
  lookup(seq, "writeLayer");
  if (layer < 0 || layer >= cfg.numLayers)
    throw Error("writeLayer: layer " + str(layer) + " is out of range [0, " +
                str(cfg.numLayers) + ")");
  if (numTokens < 0 || table.written(seq, layer) + numTokens > length(seq))
    throw Error("writeLayer: " + str(numTokens) + " tokens at layer " +
                str(layer) + " of sequence " + str(seq) + " would pass its " +
                str(length(seq)) + " reserved positions (it holds " +
                str(table.written(seq, layer)) + ")");
  if (numTokens == 0)
    return;
  if (!k || !v)
    throw Error("writeLayer: k and v must not be null");
  const int64_t first = table.markWritten(seq, layer, numTokens);
  const size_t elemBytes = bytesPerElement(cfg.kvDType);
  const std::vector<PageId> &blocks = table.blocks(seq);
  const int64_t row = int64_t(cfg.numKVHeads) * cfg.headDim;
  for (int64_t t = 0; t < numTokens; ++t) {
    const int64_t position = first + t;
    PageId page = blocks[size_t(position / cfg.pageSize)];
    int slot = int(position % cfg.pageSize);
    for (int head = 0; head < cfg.numKVHeads; ++head) {
      size_t offset = kvOffset(layer, page, head) +
                      static_cast<size_t>(slot) * cfg.headDim * elemBytes;
      const size_t at = tokenSlot(page, head, slot);
      writeRow(k + t * row + head * cfg.headDim, kPools[layer].data() + offset,
               kScalePools.empty() ? nullptr : &kScalePools[layer][at]);
      if (!cfg.valuesAreKeys)
        writeRow(v + t * row + head * cfg.headDim,
                 vPools[layer].data() + offset,
                 vScalePools.empty() ? nullptr : &vScalePools[layer][at]);
    }
    if (runHook && slot == cfg.pageSize - 1 && pageFullHook) {
      FlagGuard guard(inHook);
      for (int head = 0; head < cfg.numKVHeads; ++head)
        pageFullHook(layer, page, head);
    }
  }
}

int64_t PagedKVCache::written(SeqId seq, int layer) const {
  lookup(seq, "written");
  return table.written(seq, layer);
}

void PagedKVCache::appendTokens(SeqId seq, int64_t numTokens, const float *k,
                                const float *v) {
  checkNotInHook("append");
  lookup(seq, "append");
  if (numTokens < 0)
    throw Error("append: numTokens must not be negative, got " +
                str(numTokens));
  if (numTokens == 0)
    return;
  if (!k || !v)
    throw Error("append: k and v must not be null");
  for (int layer = 0; layer < cfg.numLayers; ++layer)
    if (table.written(seq, layer) != length(seq))
      throw Error("append: sequence " + str(seq) + " has " + str(length(seq)) +
                  " positions but layer " + str(layer) + " holds " +
                  str(table.written(seq, layer)) +
                  " (finish writing it layer by layer first)");
  checkRoom(seq, numTokens);
  // Token by token, every layer: a page-full hook sees the page complete
  // in every layer (and the per-block states grown) when it runs.
  const int64_t row = int64_t(cfg.numKVHeads) * cfg.headDim;
  const int64_t stride = tokenElements();
  for (int64_t token = 0; token < numTokens; ++token) {
    reserve(seq, 1);
    bool fills = length(seq) % cfg.pageSize == 0;
    PageId page = table.blocks(seq).back();
    for (int layer = 0; layer < cfg.numLayers; ++layer) {
      const float *kt = k + token * stride + layer * row;
      const float *vt = v + token * stride + layer * row;
      // The hook runs below, for every layer at once.
      writeTokens(layer, seq, 1, kt, vt, /*runHook=*/false);
    }
    if (fills && pageFullHook) {
      FlagGuard guard(inHook);
      for (int layer = 0; layer < cfg.numLayers; ++layer)
        for (int head = 0; head < cfg.numKVHeads; ++head)
          pageFullHook(layer, page, head);
    }
  }
}

//===----------------------------------------------------------------------===//
// K/V storage
//===----------------------------------------------------------------------===//

const void *PagedKVCache::kBlock(int layer, PageId page, int kvHead) const {
  checkBlockAddress(layer, page, kvHead, "kBlock");
  return kPools[layer].data() + kvOffset(layer, page, kvHead);
}

const void *PagedKVCache::vBlock(int layer, PageId page, int kvHead) const {
  checkBlockAddress(layer, page, kvHead, "vBlock");
  if (cfg.valuesAreKeys)
    return kPools[layer].data() + kvOffset(layer, page, kvHead);
  return vPools[layer].data() + kvOffset(layer, page, kvHead);
}

const float *PagedKVCache::kScales(int layer, PageId page, int kvHead) const {
  checkBlockAddress(layer, page, kvHead, "kScales");
  return kScalePools.empty()
             ? nullptr
             : &kScalePools[size_t(layer)][tokenSlot(page, kvHead, 0)];
}

const float *PagedKVCache::vScales(int layer, PageId page, int kvHead) const {
  checkBlockAddress(layer, page, kvHead, "vScales");
  if (cfg.valuesAreKeys)
    return kScales(layer, page, kvHead);
  return vScalePools.empty()
             ? nullptr
             : &vScalePools[size_t(layer)][tokenSlot(page, kvHead, 0)];
}

void PagedKVCache::readBlock(const void *block, const float *scales,
                             float *out) const {
  convertToF32(cfg.kvDType, block, out, static_cast<size_t>(blockElements()));
  if (!scales)
    return;
  for (int t = 0; t < cfg.pageSize; ++t)
    for (int i = 0; i < cfg.headDim; ++i)
      out[size_t(t) * cfg.headDim + i] *= scales[t];
}

void PagedKVCache::readKBlock(int layer, PageId page, int kvHead,
                              float *out) const {
  const void *block = kBlock(layer, page, kvHead); // checks the address
  readBlock(block, kScales(layer, page, kvHead), out);
}

void PagedKVCache::readVBlock(int layer, PageId page, int kvHead,
                              float *out) const {
  const void *block = vBlock(layer, page, kvHead); // checks the address
  readBlock(block, vScales(layer, page, kvHead), out);
}

std::vector<float> PagedKVCache::readKBlock(int layer, PageId page,
                                            int kvHead) const {
  std::vector<float> out(static_cast<size_t>(blockElements()));
  readKBlock(layer, page, kvHead, out.data());
  return out;
}

std::vector<float> PagedKVCache::readVBlock(int layer, PageId page,
                                            int kvHead) const {
  std::vector<float> out(static_cast<size_t>(blockElements()));
  readVBlock(layer, page, kvHead, out.data());
  return out;
}

const void *PagedKVCache::kPool(int layer) const {
  checkBlockAddress(layer, 0, 0, "kPool");
  return kPools[layer].data();
}

const void *PagedKVCache::vPool(int layer) const {
  checkBlockAddress(layer, 0, 0, "vPool");
  return cfg.valuesAreKeys ? kPools[layer].data() : vPools[layer].data();
}

//===----------------------------------------------------------------------===//
// Cache fields
//===----------------------------------------------------------------------===//

const FieldSpec &PagedKVCache::fieldSpec(int field) const {
  checkField(field, "fieldSpec");
  return cfg.fields[field];
}

namespace {

/// The index of the spec named `name` in `specs` (cache fields or
/// states, `kind` in the Error `what` throws when there is none).
template <typename Spec>
int indexByName(const std::vector<Spec> &specs, std::string_view name,
                const char *what, const char *kind, const char *none) {
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].name == name)
      return int(i);
  std::string known;
  for (const Spec &spec : specs)
    known += (known.empty() ? "" : ", ") + spec.name;
  throw Error(std::string(what) + ": the cache has no " + kind + " named '" +
              std::string(name) + "'" +
              (known.empty()
                   ? std::string(" (it has no ") + none + ")"
                   : " (its " + std::string(kind) + "s: " + known + ")"));
}

} // namespace

int PagedKVCache::fieldIndex(std::string_view name) const {
  return indexByName(cfg.fields, name, "fieldIndex", "field", "cache fields");
}

const void *PagedKVCache::fieldBlock(int field, int layer, PageId page,
                                     int kvHead) const {
  checkField(field, "fieldBlock");
  checkBlockAddress(layer, page, kvHead, "fieldBlock");
  return fieldPools[field][layer].data() + fieldOffset(field, page, kvHead);
}

void *PagedKVCache::fieldBlock(int field, int layer, PageId page, int kvHead) {
  return const_cast<void *>(static_cast<const PagedKVCache *>(this)->fieldBlock(
      field, layer, page, kvHead));
}

const void *PagedKVCache::fieldPool(int field, int layer) const {
  return fieldBlock(field, layer, 0, 0);
}

void PagedKVCache::readField(int field, int layer, PageId page, int kvHead,
                             float *out) const {
  const void *data = fieldBlock(field, layer, page, kvHead);
  const FieldSpec &spec = cfg.fields[field];
  convertToF32(spec.dtype, data, out,
               static_cast<size_t>(spec.elementsPerBlock));
}

std::vector<float> PagedKVCache::readField(int field, int layer, PageId page,
                                           int kvHead) const {
  checkField(field, "readField");
  std::vector<float> out(
      static_cast<size_t>(cfg.fields[field].elementsPerBlock));
  readField(field, layer, page, kvHead, out.data());
  return out;
}

void PagedKVCache::writeField(int field, int layer, PageId page, int kvHead,
                              const float *values) {
  void *data = fieldBlock(field, layer, page, kvHead);
  if (!values)
    throw Error("writeField: values must not be null");
  const FieldSpec &spec = cfg.fields[field];
  convertFromF32(spec.dtype, values, data,
                 static_cast<size_t>(spec.elementsPerBlock));
}

std::vector<float> PagedKVCache::gatherField(SeqId seq, int field, int layer,
                                             int kvHead) const {
  lookup(seq, "gatherField");
  checkField(field, "gatherField");
  checkBlockAddress(layer, 0, kvHead, "gatherField");
  const size_t entry = static_cast<size_t>(cfg.fields[field].elementsPerBlock);
  const int64_t complete = table.length(seq) / cfg.pageSize;
  const std::vector<PageId> &blocks = table.blocks(seq);
  std::vector<float> out(static_cast<size_t>(complete) * entry);
  for (int64_t block = 0; block < complete; ++block)
    readField(field, layer, blocks[block], kvHead, out.data() + block * entry);
  return out;
}

//===----------------------------------------------------------------------===//
// States
//===----------------------------------------------------------------------===//

const StateSpec &PagedKVCache::stateSpec(int state) const {
  checkState(state, "stateSpec");
  return cfg.states[state];
}

int PagedKVCache::stateIndex(std::string_view name) const {
  return indexByName(cfg.states, name, "stateIndex", "state", "states");
}

int64_t PagedKVCache::stateElements(SeqId seq, int state) const {
  lookup(seq, "stateElements");
  checkState(state, "stateElements");
  const StateSpec &spec = cfg.states[state];
  return spec.perBlock
             ? table.length(seq) / cfg.pageSize * spec.elementsPerBlock
             : spec.elementsPerBlock;
}

const void *PagedKVCache::stateData(SeqId seq, int state, int layer,
                                    int kvHead) const {
  const Sequence &sequence = lookup(seq, "stateData");
  checkState(state, "stateData");
  checkBlockAddress(layer, 0, kvHead, "stateData");
  size_t slots = static_cast<size_t>(cfg.numLayers) * cfg.numKVHeads;
  return sequence.states[state * slots + stateSlot(layer, kvHead)].data();
}

void *PagedKVCache::stateData(SeqId seq, int state, int layer, int kvHead) {
  return const_cast<void *>(static_cast<const PagedKVCache *>(this)->stateData(
      seq, state, layer, kvHead));
}

void PagedKVCache::readState(SeqId seq, int state, int layer, int kvHead,
                             float *out) const {
  const void *data = stateData(seq, state, layer, kvHead);
  convertToF32(cfg.states[state].dtype, data, out,
               static_cast<size_t>(stateElements(seq, state)));
}

std::vector<float> PagedKVCache::readState(SeqId seq, int state, int layer,
                                           int kvHead) const {
  std::vector<float> out(static_cast<size_t>(stateElements(seq, state)));
  readState(seq, state, layer, kvHead, out.data());
  return out;
}

void PagedKVCache::writeState(SeqId seq, int state, int layer, int kvHead,
                              const float *values, int64_t count) {
  void *data = stateData(seq, state, layer, kvHead);
  int64_t expected = stateElements(seq, state);
  if (count != expected)
    throw Error("writeState: state '" + cfg.states[state].name +
                "' of sequence " + str(seq) + " holds " + str(expected) +
                " elements, got " + str(count));
  if (!values && count > 0)
    throw Error("writeState: values must not be null");
  convertFromF32(cfg.states[state].dtype, values, data,
                 static_cast<size_t>(count));
}
