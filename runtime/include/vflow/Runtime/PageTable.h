//===- PageTable.h - Sequences' pages over a block manager ------*- C++ -*-===//
//
// The one implementation of what a paged KV cache does with pages, shared by
// the host cache (PagedKVCache) and the GPU session: each sequence's block
// table and length, fork (the child shares every page, refcounted by the
// BlockManager), release, how many free pages a growth needs, and
// copy-on-write of a partial tail page shared with a fork before it is
// written, and how far each layer's K/V has been written. Where the bytes
// of a page live is the caller's business: a callback copies one page to
// another.
//
// Lengths: a sequence's length is the tokens it has room for (grow());
// each layer has written the K/V of a prefix of them (markWritten()). A
// model appends layer by layer: the first layer to write past the length
// grows the sequence (growthFor()), the others fill the same positions,
// and a decode at a layer needs that layer written up to the length.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_PAGETABLE_H
#define VFLOW_RUNTIME_PAGETABLE_H

#include "vflow/Runtime/BlockManager.h"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace vflow::rt {

using SeqId = int64_t;

class PageTable {
public:
  PageTable(int64_t numPages, int64_t pageSize, int numLayers = 1);

  const BlockManager &blockManager() const { return pages; }
  int64_t pageSize() const { return tokensPerPage; }

  /// A new, empty sequence.
  SeqId add();
  /// A new sequence sharing every page of `parent` (and its length).
  SeqId fork(SeqId parent);
  /// A new sequence sharing the pages of `parent`'s first `tokens` tokens:
  /// a whole number of pages, or all of `parent` (then as fork). Throws
  /// Error naming `what` for any other count, and when `parent` evicted
  /// blocks (its pages no longer hold a prefix of its tokens).
  SeqId forkPrefix(SeqId parent, int64_t tokens, const std::string &what);
  /// Gives `seq`'s pages back (a shared page stays until its last user).
  void release(SeqId seq);
  bool contains(SeqId seq) const { return seqs.count(seq) != 0; }
  size_t size() const { return seqs.size(); }
  /// The id the next add() or fork() returns (ids are never reused).
  SeqId nextSeqId() const { return nextId; }
  std::vector<SeqId> ids() const;

  int64_t length(SeqId seq) const { return at(seq).length; }
  /// Tokens of `seq` whose K/V layer `layer` holds (at most length()).
  int64_t written(SeqId seq, int layer) const;
  /// How many tokens `seq` must grow by before `n` more can be written at
  /// `layer`.
  int64_t growthFor(SeqId seq, int layer, int64_t n) const;
  /// Records `n` more tokens written at `layer` (all layers when `layer` is
  /// -1); returns the position of the first. Throws past length().
  int64_t markWritten(SeqId seq, int layer, int64_t n);
  /// Logical block -> physical page.
  const std::vector<PageId> &blocks(SeqId seq) const { return at(seq).pages; }

  /// Free pages that growing `seq` by `n` tokens takes: new pages and a copy
  /// of its partial tail when a fork shares it.
  int64_t pagesNeeded(SeqId seq, int64_t n) const;
  /// Whether the partial tail page of `seq` is shared with a fork (it must
  /// be copied before `seq` writes into it).
  bool tailShared(SeqId seq) const;

  /// Grows `seq` by `n` tokens: copies a shared partial tail (copyPage(from,
  /// to)) and allocates the pages the new tokens need (newPage(page) for
  /// each, e.g. to zero it). The caller checked pagesNeeded() against the
  /// free pages; returns each new token's (page, slot in the page).
  std::vector<std::pair<PageId, int64_t>>
  grow(SeqId seq, int64_t n,
       const std::function<void(PageId from, PageId to)> &copyPage,
       const std::function<void(PageId page)> &newPage = nullptr);

  /// Evicts whole blocks of `seq`: `blocks` are logical ids, strictly
  /// increasing, each a complete block every layer has written. Their
  /// entries leave the block table (later blocks move down, so logical ids
  /// stay dense), each page's reference is released (a page a fork or a
  /// prefix sharer still holds stays for it), and the length and every
  /// layer's written count drop by a block each. Nothing moves in memory.
  /// Throws Error naming `what`, changing nothing, for bad ids.
  void evict(SeqId seq, const std::vector<int64_t> &blocks,
             const std::string &what);
  /// Where a kept token moves in a token-grain eviction (evictTokens).
  struct TokenMove {
    PageId fromPage;
    int64_t fromSlot;
    PageId toPage;
    int64_t toSlot;
  };
  /// Evicts single tokens of `seq` and repacks the rest: `tokens` are
  /// logical token indices, strictly increasing, each in a complete block,
  /// and every layer must hold every token (not mid-step). The kept tokens
  /// from the first affected block on move down in order into the fewest
  /// blocks: each destination block keeps its page where only `seq` holds
  /// it and gets a fresh page where another sequence shares it (copy on
  /// write; the free pages are checked first). `move` gets every kept
  /// token's move once and must read all of them before it writes any
  /// (a page may be both); only after it returns are the pages left over,
  /// and the shared pages replaced, released. Returns the first block it
  /// rewrote. Throws Error naming `what`, changing nothing, for bad input.
  int64_t
  evictTokens(SeqId seq, const std::vector<int64_t> &tokens,
              const std::string &what,
              const std::function<void(const std::vector<TokenMove> &)> &move);
  /// Tokens `seq` evicted so far: its next token's position in the
  /// sequence as the model sees it is length() + evictedTokens().
  int64_t evictedTokens(SeqId seq) const { return at(seq).evictedTokens; }
  /// The block's index before any eviction: the original block of its
  /// first token (a block evictTokens rewrote may hold tokens of several).
  int64_t originalBlock(SeqId seq, int64_t block) const;
  /// The position token `token` (a logical index) had before any eviction.
  int64_t originalPosition(SeqId seq, int64_t token) const;

  /// Throws Error("<what>: no sequence <seq>") when it does not exist.
  void require(SeqId seq, const std::string &what) const;

private:
  struct Sequence {
    std::vector<PageId> pages;
    int64_t length = 0;
    std::vector<int64_t> written; ///< per layer
    /// Tokens evicted, and each block's index before any eviction (empty
    /// while nothing was evicted: the identity); once evictTokens ran, each
    /// token's original position instead (a block's tokens need not be
    /// consecutive then) and `origin` is unused.
    int64_t evictedTokens = 0;
    std::vector<int64_t> origin;
    std::vector<int64_t> tokenOrigin;
  };
  /// The original position of `s`'s token `token` (a logical index), and
  /// of each of its tokens (materialized).
  int64_t originOf(const Sequence &s, int64_t token) const;
  std::vector<int64_t> tokenOrigins(const Sequence &s) const;
  const Sequence &at(SeqId seq) const;
  Sequence &at(SeqId seq);

  BlockManager pages;
  int64_t tokensPerPage;
  int layers;
  std::map<SeqId, Sequence> seqs;
  SeqId nextId = 0;
};

} // namespace vflow::rt

#endif // VFLOW_RUNTIME_PAGETABLE_H
