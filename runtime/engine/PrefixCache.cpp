//===- PrefixCache.cpp - Full blocks of finished requests, kept -----------===//

#include "PrefixCache.h"

#include <algorithm>

using namespace vflow;
using namespace vflow::model::engine;

namespace {

uint64_t mix(uint64_t h, uint64_t x) {
  h ^= x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ULL;
  return h ^ (h >> 29);
}

} // namespace

PrefixCache::PrefixCache(rt::Session &session, int64_t blockSize,
                         int64_t capacity, bool enabled)
    : session(session), blockSize(blockSize),
      capacity(std::max<int64_t>(0, capacity)), on(enabled) {}

std::vector<uint64_t>
PrefixCache::blockHashes(const std::vector<int32_t> &tokens,
                         int64_t blocks) const {
  std::vector<uint64_t> out;
  uint64_t h = 0x6a09e667f3bcc908ULL;
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t t = b * blockSize; t < (b + 1) * blockSize; ++t)
      h = mix(h, uint64_t(uint32_t(tokens[size_t(t)])));
    out.push_back(h);
  }
  return out;
}

std::optional<PrefixCache::Hit>
PrefixCache::share(const std::vector<int32_t> &tokens, int64_t maxBlocks) {
  if (!on || maxBlocks <= 0)
    return std::nullopt;
  const std::vector<uint64_t> hashes = blockHashes(tokens, maxBlocks);
  for (int64_t b = maxBlocks; b > 0; --b) {
    auto found = cached.find(hashes[size_t(b - 1)]);
    if (found == cached.end())
      continue;
    Holder &h = *found->second.first;
    // Equal chain hashes: check the tokens (a collision is a miss).
    if (!std::equal(tokens.begin(), tokens.begin() + b * blockSize,
                    h.tokens.begin()))
      return std::nullopt;
    holders.splice(holders.end(), holders, found->second.first);
    return Hit{session.sharePrefix(h.seq, b * blockSize), b * blockSize};
  }
  return std::nullopt;
}

void PrefixCache::keep(rt::SeqId seq, const std::vector<int32_t> &tokens,
                       int64_t blocks) {
  std::vector<uint64_t> hashes;
  // A sequence that evicted blocks (a flow's retain block) no longer holds
  // its tokens' prefix in order: nothing to share.
  if (on && blocks > 0 && session.position(seq) == session.length(seq))
    hashes = blockHashes(tokens, blocks);
  if (hashes.empty() || cached.count(hashes.back())) {
    session.release(seq); // nothing new to keep
    return;
  }
  Holder h;
  h.seq = seq;
  h.tokens.assign(tokens.begin(), tokens.begin() + blocks * blockSize);
  h.hashes = hashes;
  holders.push_back(std::move(h));
  auto it = std::prev(holders.end());
  for (int64_t b = 0; b < blocks; ++b)
    cached.emplace(hashes[size_t(b)], std::make_pair(it, b + 1));
  while (int64_t(holders.size()) > capacity)
    evictOne();
}

void PrefixCache::keepPrefix(rt::SeqId running,
                             const std::vector<int32_t> &tokens,
                             int64_t blocks) {
  if (!on || blocks <= 0 || capacity <= 0 ||
      cached.count(blockHashes(tokens, blocks).back()))
    return; // off, nothing whole, or cached already
  if (int64_t(holders.size()) >= capacity)
    evictOne(); // its slot for the new holder
  keep(session.sharePrefix(running, blocks * blockSize), tokens, blocks);
}

bool PrefixCache::evictOne() {
  if (holders.empty())
    return false;
  auto it = holders.begin();
  for (uint64_t h : it->hashes) {
    auto found = cached.find(h);
    if (found != cached.end() && found->second.first == it)
      cached.erase(found);
  }
  session.release(it->seq);
  holders.erase(it);
  return true;
}

void PrefixCache::clear() {
  while (evictOne()) {
  }
}
