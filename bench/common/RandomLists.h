//===- RandomLists.h - The sparse benches' random page lists ----*- C++ -*-===//
//
// The inputs vflow-bench-attention and vflow-bench-gather draw: a random
// page table, and per (sequence, KV head) a list of distinct random blocks,
// ascending, with the pages that hold them (as the attention reads them).
// Host only.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_BENCH_COMMON_RANDOMLISTS_H
#define VFLOW_BENCH_COMMON_RANDOMLISTS_H

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace vflow {
namespace bench {

struct RandomLists {
  /// The page table: block j of sequence b is page perm[b * blocks + j].
  std::vector<int32_t> perm;
  /// List r (of sequences * heads; r / heads is its sequence) is
  /// blocks[indptr[r] .. indptr[r + 1]), held by the same range of pages.
  std::vector<int32_t> indptr, blocks, pages;
};

/// `sequences` sequences of `blocks` blocks, `heads` lists per sequence of
/// `selected` blocks each (at most `blocks`), drawn from `rng`: the page
/// table first, then each list from a shuffle of the block ids.
inline RandomLists randomLists(std::mt19937 &rng, int sequences, int heads,
                               int blocks, int selected) {
  RandomLists out;
  out.perm.resize(static_cast<size_t>(sequences) * blocks);
  std::iota(out.perm.begin(), out.perm.end(), 0);
  std::shuffle(out.perm.begin(), out.perm.end(), rng);
  const int lists = sequences * heads;
  out.indptr.resize(static_cast<size_t>(lists) + 1);
  std::vector<int32_t> all(static_cast<size_t>(blocks));
  std::iota(all.begin(), all.end(), 0);
  for (int r = 0; r < lists; ++r) {
    out.indptr[r] = r * selected;
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int32_t> pick(all.begin(), all.begin() + selected);
    std::sort(pick.begin(), pick.end());
    for (int32_t block : pick) {
      out.blocks.push_back(block);
      out.pages.push_back(
          out.perm[static_cast<size_t>(r / heads) * blocks + block]);
    }
  }
  out.indptr[lists] = lists * selected;
  return out;
}

} // namespace bench
} // namespace vflow

#endif // VFLOW_BENCH_COMMON_RANDOMLISTS_H
