//===- PagedKVCache.h - Paged KV cache with fields and states ---*- C++ -*-===//
//
// The host-side paged KV cache. Per layer, a K pool and a V pool laid out
// [numPages, numKVHeads, pageSize, headDim] in the storage dtype, so one
// (page, kv head) block of pageSize x headDim elements is contiguous.
//
// A sequence owns a block table (logical block -> physical page) and a length
// in tokens. fork() shares every page of a sequence by refcount (prefix
// sharing); the first append into a shared, partly filled tail page copies it
// first (copy-on-write). Full pages are immutable, so shared full pages stay
// shared until freed.
//
// Cache fields (per-block statistics of K/V computed by a flow's cache stage)
// live in pools indexed by the same page id, [numPages, numKVHeads,
// elementsPerBlock] per field and layer: a shared page shares its fields.
// States (per-step persistent values of a flow's index stage) belong to a
// sequence, per (layer, kv head); fork copies them. Like the index stage
// (docs/language.md), per-block states cover the sequence's complete blocks:
// when append() fills a page, every per-block state grows by one block of
// init values (before the page-full hook runs).
//
// Storage slots past a sequence's length read as zero: pages are zeroed when
// allocated and a copy-on-write copies the whole page.
//
// Not thread-safe: one thread owns a cache and calls into it at a time.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_PAGEDKVCACHE_H
#define VFLOW_RUNTIME_PAGEDKVCACHE_H

#include "vflow/Runtime/BlockManager.h"
#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/PageTable.h"

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace vflow {
namespace rt {

/// A sequence id; ids are never reused within one cache.

/// One cache field: `elementsPerBlock` values per (page, kv head), e.g.
/// headDim for Quest's kmax.
struct FieldSpec {
  std::string name;
  DType dtype = DType::BF16;
  int64_t elementsPerBlock = 0;
};

/// One state: per (sequence, layer, kv head), `elementsPerBlock` values per
/// complete block of the sequence when `perBlock` (e.g. H2O's acc[block]: 1),
/// else `elementsPerBlock` values in all (e.g. qbar[head, dim]: group *
/// headDim). Values are laid out in the flow's canonical axis order (block
/// first).
struct StateSpec {
  std::string name;
  DType dtype = DType::F32;
  int64_t elementsPerBlock = 0;
  bool perBlock = false;
  /// The value new entries start at (stored in `dtype`).
  float init = 0.0f;
};

/// Whether the host cache stores K/V in `type`: f32, bf16 or f16 as they
/// are, or int8, fp8e4m3 or fp8e5m2 with an f32 scale per (token, KV head)
/// (isScaledKVDType; NumericRules' kvScale).
bool isHostKVDType(DType type);

struct CacheConfig {
  int numLayers = 0;
  int numKVHeads = 0;
  int headDim = 0;
  /// Tokens per page (the language's block_size).
  int pageSize = 16;
  int64_t numPages = 0;
  /// F32, BF16, F16, or INT8, FP8E4M3 or FP8E5M2 with scales on the host.
  DType kvDType = DType::BF16;
  std::vector<FieldSpec> fields;
  std::vector<StateSpec> states;
  /// V is K (multi-head latent attention's cached rows serve as both): no V
  /// pool is kept, V reads return K's, and append()'s v is not read.
  bool valuesAreKeys = false;
};

/// Called by append() once per (layer, kv head) of a page the moment the page
/// becomes full (its last token was written), layer-major. The compiled cache
/// stage computes the page's fields here. The hook may read K/V and write
/// fields; it must not add, append to, fork or free sequences.
using PageFullHook = std::function<void(int layer, PageId page, int kvHead)>;

class PagedKVCache {
public:
  /// Validates `config` and allocates every pool (zeroed). Throws Error for a
  /// bad config or when the pools cannot be allocated.
  explicit PagedKVCache(CacheConfig config);
  PagedKVCache(const PagedKVCache &) = delete;
  PagedKVCache &operator=(const PagedKVCache &) = delete;
  PagedKVCache(PagedKVCache &&) = default;
  PagedKVCache &operator=(PagedKVCache &&) = default;

  const CacheConfig &config() const { return cfg; }
  const BlockManager &blockManager() const { return table.blockManager(); }
  int numLayers() const { return cfg.numLayers; }
  int numKVHeads() const { return cfg.numKVHeads; }
  int headDim() const { return cfg.headDim; }
  int pageSize() const { return cfg.pageSize; }
  int32_t numPages() const { return table.blockManager().numPages(); }
  DType kvDType() const { return cfg.kvDType; }
  /// Floats of one token's K (or V) for all layers: numLayers * numKVHeads *
  /// headDim, the size append() reads from each of k and v.
  int64_t tokenElements() const;

  //===--- Sequences ------------------------------------------------------===//

  /// A new, empty sequence (no pages).
  SeqId addSequence();
  /// A new sequence sharing all of `parent`'s pages (each page's refcount goes
  /// up by one), with its length and a copy of its states.
  SeqId fork(SeqId parent);
  /// A new sequence sharing the pages (and their fields) of `parent`'s first
  /// `tokens` tokens, a whole number of blocks or all of `parent`, with
  /// states of its own at their initial values (per-block states cover the
  /// prefix's complete blocks).
  SeqId sharePrefix(SeqId parent, int64_t tokens);
  /// Releases the sequence's pages and forgets it.
  void freeSequence(SeqId seq);
  /// Evicts whole complete blocks of `seq` (PageTable::evict: logical ids,
  /// strictly increasing): their pages go back to the pool unless another
  /// sequence holds them, later blocks move down, and the rows of the
  /// evicted blocks leave every per-block state. Fields stay with their
  /// pages. Throws Error, changing nothing, for bad ids.
  void evict(SeqId seq, const std::vector<int64_t> &blocks);
  /// Evicts single tokens of `seq` (PageTable::evictTokens: logical token
  /// indices, strictly increasing, in complete blocks, not mid-step) and
  /// repacks the kept ones in order into the fewest pages, K/V of every
  /// layer and KV head moved as stored (copy on write where a page is
  /// shared). The blocks it rewrote get their fields from the page-full
  /// hook again and their per-block state rows at the initial values;
  /// blocks before them are untouched. Returns the first rewritten block.
  /// Throws Error, changing nothing, for bad input or too few free pages.
  int64_t evictTokens(SeqId seq, const std::vector<int64_t> &tokens);

  bool hasSequence(SeqId seq) const { return table.contains(seq); }
  size_t numSequences() const { return table.size(); }
  /// Live sequence ids in increasing order.
  std::vector<SeqId> sequenceIds() const;

  int64_t length(SeqId seq) const;
  /// ceil(length / pageSize): the blocks attention reads.
  int64_t numBlocks(SeqId seq) const;
  /// floor(length / pageSize): the blocks the index stage sees (fields are
  /// computed, per-block states exist).
  int64_t numCompleteBlocks(SeqId seq) const;
  /// Logical block index -> physical page id, numBlocks(seq) entries.
  const std::vector<PageId> &blockTable(SeqId seq) const;
  /// The physical page of logical block `block`; throws Error out of range.
  PageId physicalPage(SeqId seq, int64_t block) const;
  /// Valid tokens in logical block `block`: pageSize except for a partial
  /// last block.
  int tokensInBlock(SeqId seq, int64_t block) const;

  //===--- Appending ------------------------------------------------------===//

  /// Appends one token to every layer: `k` and `v` are f32 [numLayers,
  /// numKVHeads, headDim], stored in kvDType. Allocates a page when the tail
  /// is full (or the sequence is empty) and copies a shared partial tail page
  /// first. Throws Error, changing nothing, when no page is free. Calls the
  /// page-full hook when the token fills its page.
  void append(SeqId seq, const float *k, const float *v);
  /// The free pages appending `numTokens` tokens to `seq` takes (new pages,
  /// and a copy of a shared partial tail).
  int64_t pagesNeeded(SeqId seq, int64_t numTokens) const;
  /// Appends `numTokens` tokens: `k`, `v` are [numTokens, numLayers,
  /// numKVHeads, headDim]. Every page needed is checked to be available
  /// first; throws Error, changing nothing, when not. If the hook throws,
  /// the tokens before and including the one that filled the page stay.
  void appendTokens(SeqId seq, int64_t numTokens, const float *k,
                    const float *v);

  /// Layer by layer, as a model computes K/V: reserve() grows `seq` by
  /// `numTokens` positions in every layer (pages allocated and zeroed, a
  /// shared tail copied, per-block states grown; throws Error, changing
  /// nothing, when no page is free) and writeLayer() stores the next
  /// `numTokens` tokens of one layer (`k`, `v` f32 [numTokens, numKVHeads,
  /// headDim]) after those the layer holds, calling the page-full hook for
  /// each (layer, page, head) it completes. appendTokens() is both, for
  /// every layer, and needs every layer written up to the length.
  void reserve(SeqId seq, int64_t numTokens);
  void writeLayer(int layer, SeqId seq, int64_t numTokens, const float *k,
                  const float *v);
  /// Tokens of `seq` whose K/V layer `layer` holds (at most its length).
  int64_t written(SeqId seq, int layer) const;
  /// The block tables and lengths.
  const PageTable &pageTable() const { return table; }
  /// Replaces the page-full hook; an empty function removes it.
  void setPageFullHook(PageFullHook hook) { pageFullHook = std::move(hook); }

  //===--- K/V storage ----------------------------------------------------===//

  /// Elements of one (layer, page, kv head) block: pageSize * headDim.
  int64_t blockElements() const;
  /// Start of one block in storage (kvDType, [pageSize, headDim]).
  const void *kBlock(int layer, PageId page, int kvHead) const;
  const void *vBlock(int layer, PageId page, int kvHead) const;
  /// The f32 scales of one block's tokens ([pageSize], NumericRules'
  /// kvScale) for a scaled KV dtype, else null: a token's stored row times
  /// its scale is its value.
  const float *kScales(int layer, PageId page, int kvHead) const;
  const float *vScales(int layer, PageId page, int kvHead) const;
  /// Reads one block as f32 [pageSize, headDim] into `out` (scaled back
  /// for a scaled KV dtype).
  void readKBlock(int layer, PageId page, int kvHead, float *out) const;
  void readVBlock(int layer, PageId page, int kvHead, float *out) const;
  std::vector<float> readKBlock(int layer, PageId page, int kvHead) const;
  std::vector<float> readVBlock(int layer, PageId page, int kvHead) const;
  /// The whole K (V) pool of a layer, [numPages, numKVHeads, pageSize,
  /// headDim] in kvDType, for kernels that address pages themselves.
  const void *kPool(int layer) const;
  const void *vPool(int layer) const;

  //===--- Cache fields ---------------------------------------------------===//

  int numFields() const { return static_cast<int>(cfg.fields.size()); }
  const FieldSpec &fieldSpec(int field) const;
  /// The index of the field named `name`; throws Error when there is none.
  int fieldIndex(std::string_view name) const;
  /// Start of one (layer, page, kv head) entry of a field, elementsPerBlock
  /// elements of the field's dtype.
  void *fieldBlock(int field, int layer, PageId page, int kvHead);
  const void *fieldBlock(int field, int layer, PageId page, int kvHead) const;
  /// The field pool of a layer, [numPages, numKVHeads, elementsPerBlock].
  const void *fieldPool(int field, int layer) const;
  void readField(int field, int layer, PageId page, int kvHead,
                 float *out) const;
  std::vector<float> readField(int field, int layer, PageId page,
                               int kvHead) const;
  /// Stores elementsPerBlock f32 values, converted to the field's dtype.
  void writeField(int field, int layer, PageId page, int kvHead,
                  const float *values);
  /// The field over a sequence's complete blocks, as the index stage reads
  /// it: f32 [numCompleteBlocks(seq), elementsPerBlock], in logical order.
  std::vector<float> gatherField(SeqId seq, int field, int layer,
                                 int kvHead) const;

  //===--- States ---------------------------------------------------------===//

  int numStates() const { return static_cast<int>(cfg.states.size()); }
  const StateSpec &stateSpec(int state) const;
  /// The index of the state named `name`; throws Error when there is none.
  int stateIndex(std::string_view name) const;
  /// Elements of one (sequence, layer, kv head) entry: numCompleteBlocks(seq)
  /// * elementsPerBlock for a per-block state, elementsPerBlock otherwise.
  int64_t stateElements(SeqId seq, int state) const;
  /// The entry in storage (the state's dtype); per-block states are laid out
  /// [numCompleteBlocks, elementsPerBlock]. Valid until the sequence
  /// completes a block or is freed.
  void *stateData(SeqId seq, int state, int layer, int kvHead);
  const void *stateData(SeqId seq, int state, int layer, int kvHead) const;
  void readState(SeqId seq, int state, int layer, int kvHead, float *out) const;
  std::vector<float> readState(SeqId seq, int state, int layer,
                               int kvHead) const;
  /// Stores the whole entry; `count` must equal stateElements(seq, state).
  void writeState(SeqId seq, int state, int layer, int kvHead,
                  const float *values, int64_t count);

private:
  /// What the cache keeps per sequence besides its pages (PageTable).
  struct Sequence {
    /// [state][layer * numKVHeads + kvHead] -> bytes in the state's dtype.
    std::vector<std::vector<unsigned char>> states;
  };

  Sequence &lookup(SeqId seq, const char *operation);
  const Sequence &lookup(SeqId seq, const char *operation) const;
  void checkBlockAddress(int layer, PageId page, int kvHead,
                         const char *operation) const;
  void checkField(int field, const char *operation) const;
  void checkState(int state, const char *operation) const;
  void checkNotInHook(const char *operation) const;
  size_t kvOffset(int layer, PageId page, int kvHead) const;
  /// The index of token `slot` of (page, kvHead) in a per-token pool laid
  /// out [page, kvHead, slot] (the K/V rows and their scales).
  size_t tokenSlot(PageId page, int kvHead, int64_t slot) const;
  /// Calls fn(base, slotBytes) for every per-token pool of every layer:
  /// K, V and, for a scaled KV dtype, their scales, each laid out [page,
  /// kvHead, slot] with slotBytes per slot.
  template <typename Fn> void forEachTokenPool(Fn &&fn);
  /// Reads a block as f32, scaled back with `scales` when not null.
  void readBlock(const void *block, const float *scales, float *out) const;
  size_t fieldOffset(int field, PageId page, int kvHead) const;
  size_t stateSlot(int layer, int kvHead) const;
  void zeroPage(PageId page);
  void copyPage(PageId from, PageId to);
  void addBlockStates(Sequence &sequence);
  /// Throws the exhaustion Error when growing `seq` by `numTokens` needs
  /// more pages than are free.
  void checkRoom(SeqId seq, int64_t numTokens) const;
  /// Stores one (token, kv head) row of headDim values in kvDType, and its
  /// scale into `scale` when not null (a scaled KV dtype).
  void writeRow(const float *values, unsigned char *row, float *scale) const;
  void writeTokens(int layer, SeqId seq, int64_t numTokens, const float *k,
                   const float *v, bool runHook);
  /// A sequence's states at their initial values, before any block.
  Sequence freshSequence() const;

  CacheConfig cfg;
  /// Block tables and lengths (shared with the GPU session's logic).
  PageTable table;
  /// Per layer, bytes of the K and V pools.
  std::vector<std::vector<unsigned char>> kPools, vPools;
  /// Per layer, K's and V's scale per (page, kv head, slot) for a scaled
  /// KV dtype; empty otherwise.
  std::vector<std::vector<float>> kScalePools, vScalePools;
  /// [field][layer] -> bytes of the field pool.
  std::vector<std::vector<std::vector<unsigned char>>> fieldPools;
  /// The init value of each state, encoded in the state's dtype.
  std::vector<std::vector<unsigned char>> stateInitBytes;
  std::unordered_map<SeqId, Sequence> sequences;
  PageFullHook pageFullHook;
  bool inHook = false;
};

} // namespace rt
} // namespace vflow

#endif // VFLOW_RUNTIME_PAGEDKVCACHE_H
