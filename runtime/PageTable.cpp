//===- PageTable.cpp - Sequences' pages over a block manager --------------===//

#include "vflow/Runtime/PageTable.h"
#include "vflow/Runtime/Error.h"

#include <algorithm>
#include <utility>

using namespace vflow::rt;

PageTable::PageTable(int64_t numPages, int64_t pageSize, int numLayers)
    : pages(numPages), tokensPerPage(pageSize), layers(numLayers) {
  if (pageSize < 1)
    throw Error("page table: the page size must be positive");
  if (numLayers < 1)
    throw Error("page table: the number of layers must be positive");
}

SeqId PageTable::add() {
  SeqId id = nextId++;
  Sequence s;
  s.written.assign(size_t(layers), 0);
  seqs.emplace(id, std::move(s));
  return id;
}

int64_t PageTable::written(SeqId seq, int layer) const {
  const Sequence &s = at(seq);
  if (layer < 0 || layer >= layers)
    throw Error("layer " + std::to_string(layer) + " is out of range [0, " +
                std::to_string(layers) + ")");
  return s.written[size_t(layer)];
}

int64_t PageTable::growthFor(SeqId seq, int layer, int64_t n) const {
  return std::max<int64_t>(0, written(seq, layer) + n - at(seq).length);
}

int64_t PageTable::markWritten(SeqId seq, int layer, int64_t n) {
  Sequence &s = at(seq);
  if (layer == -1) {
    int64_t first = s.written[0];
    for (int l = 0; l < layers; ++l)
      markWritten(seq, l, n);
    return first;
  }
  int64_t first = written(seq, layer);
  if (n < 0 || first + n > s.length)
    throw Error("page table: writing " + std::to_string(n) +
                " tokens at layer " + std::to_string(layer) + " of sequence " +
                std::to_string(seq) + " past its length " +
                std::to_string(s.length));
  s.written[size_t(layer)] = first + n;
  return first;
}

SeqId PageTable::fork(SeqId parent) {
  Sequence child = at(parent);
  for (PageId page : child.pages)
    pages.retain(page);
  SeqId id = nextId++;
  seqs.emplace(id, std::move(child));
  return id;
}

SeqId PageTable::forkPrefix(SeqId parent, int64_t tokens,
                            const std::string &what) {
  const Sequence &from = at(parent);
  if (from.evictedTokens > 0)
    throw Error(what + ": sequence " + std::to_string(parent) + " evicted " +
                std::to_string(from.evictedTokens) +
                " tokens, so its pages are no longer a prefix of its tokens");
  if (tokens < 0 || tokens > from.length)
    throw Error(what + ": a prefix of " + std::to_string(tokens) +
                " tokens of sequence " + std::to_string(parent) +
                ", which has " + std::to_string(from.length));
  if (tokens != from.length && tokens % tokensPerPage != 0)
    throw Error(what + ": a prefix of " + std::to_string(tokens) +
                " tokens is not a whole number of blocks of " +
                std::to_string(tokensPerPage) + " (nor the whole sequence, " +
                std::to_string(from.length) + " tokens)");
  for (int l = 0; l < layers; ++l)
    if (from.written[size_t(l)] < tokens)
      throw Error(what + ": layer " + std::to_string(l) + " of sequence " +
                  std::to_string(parent) + " holds only " +
                  std::to_string(from.written[size_t(l)]) + " of the " +
                  std::to_string(tokens) + " tokens");
  Sequence child;
  child.length = tokens;
  child.written.assign(size_t(layers), tokens);
  child.pages.assign(from.pages.begin(),
                     from.pages.begin() +
                         (tokens + tokensPerPage - 1) / tokensPerPage);
  for (PageId page : child.pages)
    pages.retain(page);
  SeqId id = nextId++;
  seqs.emplace(id, std::move(child));
  return id;
}

void PageTable::release(SeqId seq) {
  for (PageId page : at(seq).pages)
    pages.release(page);
  seqs.erase(seq);
}

std::vector<SeqId> PageTable::ids() const {
  std::vector<SeqId> out;
  for (const auto &entry : seqs)
    out.push_back(entry.first);
  return out;
}

bool PageTable::tailShared(SeqId seq) const {
  const Sequence &s = at(seq);
  return s.length % tokensPerPage != 0 && pages.refCount(s.pages.back()) > 1;
}

int64_t PageTable::pagesNeeded(SeqId seq, int64_t n) const {
  if (n <= 0)
    return 0;
  const Sequence &s = at(seq);
  int64_t blocks = (s.length + n + tokensPerPage - 1) / tokensPerPage;
  return blocks - int64_t(s.pages.size()) + (tailShared(seq) ? 1 : 0);
}

std::vector<std::pair<PageId, int64_t>>
PageTable::grow(SeqId seq, int64_t n,
                const std::function<void(PageId, PageId)> &copyPage,
                const std::function<void(PageId)> &newPage) {
  std::vector<std::pair<PageId, int64_t>> at;
  if (n <= 0)
    return at;
  if (pagesNeeded(seq, n) > pages.numFree())
    throw Error("page table: growing sequence " + std::to_string(seq) +
                " needs more pages than are free");
  Sequence &s = this->at(seq);
  if (tailShared(seq)) {
    PageId shared = s.pages.back();
    PageId copy = pages.allocate();
    copyPage(shared, copy);
    pages.release(shared);
    s.pages.back() = copy;
  }
  for (int64_t t = s.length; t < s.length + n; ++t) {
    if (!s.tokenOrigin.empty())
      s.tokenOrigin.push_back(t + s.evictedTokens);
    if (t % tokensPerPage == 0) {
      PageId page = pages.allocate();
      if (newPage)
        newPage(page);
      s.pages.push_back(page);
      // A block appended after evictions: its original index counts them.
      if (!s.origin.empty())
        s.origin.push_back(int64_t(s.pages.size()) - 1 +
                           s.evictedTokens / tokensPerPage);
    }
    at.push_back({s.pages[size_t(t / tokensPerPage)], t % tokensPerPage});
  }
  s.length += n;
  return at;
}

void PageTable::evict(SeqId seq, const std::vector<int64_t> &blocks,
                      const std::string &what) {
  Sequence &s = at(seq);
  int64_t complete = s.length / tokensPerPage;
  for (int64_t w : s.written)
    complete = std::min(complete, w / tokensPerPage);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int64_t b = blocks[i];
    if (i > 0 && b <= blocks[i - 1])
      throw Error(what + ": the blocks to evict must be strictly increasing (" +
                  std::to_string(blocks[i - 1]) + " then " + std::to_string(b) +
                  ")");
    if (b < 0 || b >= complete)
      throw Error(what + ": block " + std::to_string(b) + " of sequence " +
                  std::to_string(seq) +
                  " is not a complete block every layer holds (there are " +
                  std::to_string(complete) + ")");
  }
  if (blocks.empty())
    return;
  if (s.origin.empty())
    for (size_t b = 0; b < s.pages.size(); ++b)
      s.origin.push_back(int64_t(b));
  std::vector<PageId> keptPages;
  std::vector<int64_t> keptOrigin, keptTokens;
  size_t next = 0;
  for (size_t b = 0; b < s.pages.size(); ++b) {
    if (next < blocks.size() && blocks[next] == int64_t(b)) {
      pages.release(s.pages[b]);
      ++next;
      continue;
    }
    keptPages.push_back(s.pages[b]);
    keptOrigin.push_back(s.origin[b]);
    const int64_t from = int64_t(b) * tokensPerPage;
    for (int64_t t = from;
         !s.tokenOrigin.empty() && t < std::min(from + tokensPerPage, s.length);
         ++t)
      keptTokens.push_back(s.tokenOrigin[size_t(t)]);
  }
  if (!s.tokenOrigin.empty())
    s.tokenOrigin = std::move(keptTokens);
  const int64_t tokens = int64_t(blocks.size()) * tokensPerPage;
  s.pages = std::move(keptPages);
  s.origin = std::move(keptOrigin);
  s.length -= tokens;
  for (int64_t &w : s.written)
    w -= tokens;
  s.evictedTokens += tokens;
}

int64_t PageTable::originalBlock(SeqId seq, int64_t block) const {
  const Sequence &s = at(seq);
  if (block < 0 || block >= int64_t(s.pages.size()))
    throw Error("sequence " + std::to_string(seq) + " has no block " +
                std::to_string(block));
  if (!s.tokenOrigin.empty())
    return s.tokenOrigin[size_t(block * tokensPerPage)] / tokensPerPage;
  return s.origin.empty() ? block : s.origin[size_t(block)];
}

int64_t PageTable::originalPosition(SeqId seq, int64_t token) const {
  const Sequence &s = at(seq);
  if (token < 0 || token >= s.length)
    throw Error("sequence " + std::to_string(seq) + " has no token " +
                std::to_string(token));
  return originOf(s, token);
}

int64_t PageTable::originOf(const Sequence &s, int64_t token) const {
  if (!s.tokenOrigin.empty())
    return s.tokenOrigin[size_t(token)];
  const int64_t block = token / tokensPerPage;
  return (s.origin.empty() ? block : s.origin[size_t(block)]) * tokensPerPage +
         token % tokensPerPage;
}

std::vector<int64_t> PageTable::tokenOrigins(const Sequence &s) const {
  if (!s.tokenOrigin.empty())
    return s.tokenOrigin;
  std::vector<int64_t> out(size_t(s.length));
  for (int64_t t = 0; t < s.length; ++t)
    out[size_t(t)] = originOf(s, t);
  return out;
}

int64_t PageTable::evictTokens(
    SeqId seq, const std::vector<int64_t> &tokens, const std::string &what,
    const std::function<void(const std::vector<TokenMove> &)> &move) {
  Sequence &s = at(seq);
  for (int64_t w : s.written)
    if (w != s.length)
      throw Error(what + ": sequence " + std::to_string(seq) +
                  " is mid-step (a layer holds " + std::to_string(w) + " of " +
                  std::to_string(s.length) + " tokens)");
  const int64_t P = tokensPerPage, complete = s.length / P * P;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t t = tokens[i];
    if (i > 0 && t <= tokens[i - 1])
      throw Error(what + ": the tokens to evict must be strictly increasing (" +
                  std::to_string(tokens[i - 1]) + " then " + std::to_string(t) +
                  ")");
    if (t < 0 || t >= complete)
      throw Error(what + ": token " + std::to_string(t) + " of sequence " +
                  std::to_string(seq) + " is not in a complete block (there " +
                  "are " + std::to_string(complete) + " such tokens)");
  }
  if (tokens.empty())
    return int64_t(s.pages.size());
  const int64_t first = tokens.front() / P;
  const int64_t length = s.length - int64_t(tokens.size());
  const int64_t blocks = (length + P - 1) / P;
  // Destinations: a block's own page unless another sequence shares it.
  std::vector<PageId> to(s.pages.begin(), s.pages.begin() + blocks);
  int64_t fresh = 0;
  for (int64_t b = first; b < blocks; ++b)
    fresh += pages.refCount(s.pages[size_t(b)]) > 1 ? 1 : 0;
  if (fresh > pages.numFree())
    throw Error(what + ": repacking sequence " + std::to_string(seq) +
                " needs " + std::to_string(fresh) +
                " fresh pages (its blocks are shared) and " +
                std::to_string(pages.numFree()) + " are free");
  for (int64_t b = first; b < blocks; ++b)
    if (pages.refCount(s.pages[size_t(b)]) > 1)
      to[size_t(b)] = pages.allocate();
  std::vector<int64_t> origins = tokenOrigins(s), kept;
  std::vector<TokenMove> moves;
  size_t next = 0;
  for (int64_t t = 0; t < s.length; ++t) {
    if (next < tokens.size() && tokens[next] == t) {
      ++next;
      continue;
    }
    const int64_t d = int64_t(kept.size());
    kept.push_back(origins[size_t(t)]);
    if (t >= first * P)
      moves.push_back(
          {s.pages[size_t(t / P)], t % P, to[size_t(d / P)], d % P});
  }
  move(moves);
  for (int64_t b = first; b < int64_t(s.pages.size()); ++b)
    if (b >= blocks || to[size_t(b)] != s.pages[size_t(b)])
      pages.release(s.pages[size_t(b)]);
  s.pages = std::move(to);
  s.origin.clear();
  s.tokenOrigin = std::move(kept);
  s.length = length;
  for (int64_t &w : s.written)
    w = length;
  s.evictedTokens += int64_t(tokens.size());
  return first;
}

void PageTable::require(SeqId seq, const std::string &what) const {
  if (!seqs.count(seq))
    throw Error(what + ": no sequence " + std::to_string(seq));
}

const PageTable::Sequence &PageTable::at(SeqId seq) const {
  auto it = seqs.find(seq);
  if (it == seqs.end())
    throw Error("no sequence " + std::to_string(seq));
  return it->second;
}

PageTable::Sequence &PageTable::at(SeqId seq) {
  return const_cast<Sequence &>(std::as_const(*this).at(seq));
}
