//===- PrefixCache.h - Full blocks of finished requests, kept ---*- C++ -*-===//
//
// The engine's prefix cache: a finished request's sequence is kept (a
// holder) with its full blocks' tokens, and so is a running request's
// prompt once it is computed (a sequence sharing its full blocks); each block
// is known by the hash of its tokens chained to its predecessors' (so equal
// hashes mean equal prefixes, which a hit re-checks token by token). A new
// request shares the longest cached prefix (Session::sharePrefix: pages and
// cache fields shared, states fresh: exact). Holders are evicted least recently
// used first, when the pool needs their pages or the session its sequence
// slots.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_ENGINE_PREFIXCACHE_H
#define VFLOW_RUNTIME_ENGINE_PREFIXCACHE_H

#include "vflow/Runtime/Session.h"

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

namespace vflow::model::engine {

class PrefixCache {
public:
  /// At most `capacity` holders (sequence slots the running requests do
  /// not need); `enabled` false: it keeps nothing.
  PrefixCache(rt::Session &session, int64_t blockSize, int64_t capacity,
              bool enabled);

  struct Hit {
    rt::SeqId seq;  ///< a new sequence holding the shared prefix
    int64_t tokens; ///< its length (whole blocks)
  };
  /// The longest cached prefix of `tokens` of at most `maxBlocks` full
  /// blocks, as a new sequence of the session; none on a miss. A hit makes
  /// its holder the most recently used.
  std::optional<Hit> share(const std::vector<int32_t> &tokens,
                           int64_t maxBlocks);
  /// Takes `seq` (the sequence of a finished request whose first `blocks`
  /// full blocks are `tokens`'): keeps it as a holder, or releases it when
  /// those blocks are cached already (or caching is off).
  void keep(rt::SeqId seq, const std::vector<int32_t> &tokens, int64_t blocks);
  /// The same for a running request whose prompt was just computed: its
  /// first `blocks` full blocks (of `tokens`) are kept through a new
  /// sequence sharing them (Session::sharePrefix), so that requests with
  /// the same prompt (a request's other samples) hit while it runs.
  void keepPrefix(rt::SeqId running, const std::vector<int32_t> &tokens,
                  int64_t blocks);
  /// Releases the least recently used holder; false when there is none.
  bool evictOne();
  void clear();
  bool enabled() const { return on; }

private:
  struct Holder {
    rt::SeqId seq = 0;
    std::vector<int32_t> tokens; ///< its full blocks' tokens
    std::vector<uint64_t> hashes;
  };
  std::vector<uint64_t> blockHashes(const std::vector<int32_t> &tokens,
                                    int64_t blocks) const;

  rt::Session &session;
  int64_t blockSize, capacity;
  bool on;
  /// Least recently used first.
  std::list<Holder> holders;
  /// Each cached block's chain hash -> (its holder, blocks up to it).
  std::unordered_map<uint64_t, std::pair<std::list<Holder>::iterator, int64_t>>
      cached;
};

} // namespace vflow::model::engine

#endif // VFLOW_RUNTIME_ENGINE_PREFIXCACHE_H
