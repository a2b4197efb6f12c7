//===- FlowSelect.cuh - Device selections for generated flows ----*- CUDA
//-*-===//
//
// The selection half of FlowDevice.cuh, which includes this file at its end
// (include FlowDevice.cuh, not this): the exact top-k by radix select on the
// rank key (ties to the lower index), its approximate form, top-p's count,
// the k-th largest of a line, and the writer of a list of the sparse block
// table. They build on FlowDevice.cuh's CTA primitives (CtaScratch, the
// warp and CTA reductions and scans) and follow NumericRules.h's rank order.
// It is embedded for NVRTC beside FlowDevice.cuh (runtime/cuda/jit).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_FLOWSELECT_CUH
#define VFLOW_RUNTIME_CUDA_FLOWSELECT_CUH

#ifdef __CUDACC__

namespace vd {

/// The order-preserving key of a score (rules::rankKey): larger scores get
/// larger keys, -0 equals +0, NaN is below every number (key 0).
__device__ __forceinline__ u32 scoreKey(float x) {
  return vflow::rules::rankKey(x);
}

/// This thread's contiguous part [lo, hi) of n elements (index order runs
/// across threads, so one scan of per-thread counts ranks every element).
struct Segment {
  int lo, hi;
  __device__ explicit Segment(int n) {
    int per = (n + int(blockDim.x) - 1) / int(blockDim.x);
    lo = min(n, int(threadIdx.x) * per);
    hi = min(n, lo + per);
  }
};

/// The bucket of the k-th largest candidate's key: the candidates with
/// (key & mask) > prefix are among the k best, and `remaining` of those
/// with (key & mask) == prefix complete them.
struct KthBucket {
  u32 prefix, mask;
  int remaining;
};

/// The rank keys of this thread's Segment of n elements, the first
/// kCachedKeys of them in registers (read once; the rest are recomputed),
/// with a bit per cached element that is a candidate.
constexpr int kCachedKeys = 4;
struct SegmentKeys {
  Segment seg;
  u32 keys[kCachedKeys];
  u32 candidates = 0;
  template <class KeyFn, class CandFn>
  __device__ SegmentKeys(int n, KeyFn key, CandFn candidate) : seg(n) {
#pragma unroll
    for (int i = 0; i < kCachedKeys; ++i) {
      const int j = seg.lo + i;
      keys[i] = 0;
      if (j < seg.hi && candidate(j)) {
        keys[i] = key(j);
        candidates |= 1u << i;
      }
    }
  }
  /// visit(j, key) for each candidate of the segment, in index order.
  template <class KeyFn, class CandFn, class Visit>
  __device__ __forceinline__ void forEach(KeyFn key, CandFn candidate,
                                          Visit visit) const {
#pragma unroll
    for (int i = 0; i < kCachedKeys; ++i)
      if ((candidates >> i) & 1)
        visit(seg.lo + i, keys[i]);
    for (int j = seg.lo + kCachedKeys; j < seg.hi; ++j)
      if (candidate(j))
        visit(j, key(j));
  }
};

/// counts[digit] += 1 for each lane that passes `on`: when every passing
/// lane of the warp has the same digit (a radix pass's common case: the
/// leading digits of scores of one magnitude) one lane adds them all.
__device__ __forceinline__ void warpCount(int *counts, bool on, u32 digit) {
  const unsigned active = __activemask();
  const unsigned passing = __ballot_sync(active, on);
  if (!passing)
    return;
  const u32 lo = __reduce_min_sync(active, on ? digit : 0xffffffffu);
  const u32 hi = __reduce_max_sync(active, on ? digit : 0u);
  if (lo == hi) {
    if ((threadIdx.x & 31) == u32(__ffs(passing) - 1))
      atomicAdd(&counts[lo], __popc(passing));
  } else if (on) {
    atomicAdd(&counts[digit], 1);
  }
}

/// How many candidates there are, and the AND and OR of their keys (the
/// leading bits where the two agree are every key's). The fields it writes
/// are rewritten only behind a barrier, so it needs no trailing one.
struct KeyStats {
  int count;
  u32 keyAnd, keyOr;
};
template <class KeyFn, class CandFn>
__device__ KeyStats ctaKeyStats(const SegmentKeys &ks, KeyFn key,
                                CandFn candidate, CtaScratch &s) {
  int count = 0;
  u32 keyAnd = ~0u, keyOr = 0u;
  ks.forEach(key, candidate, [&](int, u32 kj) {
    ++count;
    keyAnd &= kj;
    keyOr |= kj;
  });
  if (threadIdx.x == 0) {
    s.total = 0;
    s.keyAnd = ~0u;
    s.keyOr = 0u;
  }
  __syncthreads();
  count = int(__reduce_add_sync(0xffffffffu, unsigned(count)));
  keyAnd = __reduce_and_sync(0xffffffffu, keyAnd);
  keyOr = __reduce_or_sync(0xffffffffu, keyOr);
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&s.total, count);
    atomicAnd(&s.keyAnd, keyAnd);
    atomicOr(&s.keyOr, keyOr);
  }
  __syncthreads();
  return {s.total, s.keyAnd, s.keyOr};
}

/// Ranks a bucket of at most 32 keys exactly (one warp, one key a lane;
/// by key, then index): the remaining-th of them is the k-th largest. Its
/// key, the candidates still to take among equal keys and their count go
/// to s.prefix, s.remaining, s.bucket (warp 0 writes them; every thread
/// reads them after the caller's barrier).
template <class KeyFn, class CandFn>
__device__ __forceinline__ void
rankSmallBucket(const SegmentKeys &ks, KeyFn key, CandFn candidate, u32 mask,
                u32 prefix, int remaining, CtaScratch &s) {
  ks.forEach(key, candidate, [&](int j, u32 kj) {
    if ((kj & mask) == prefix) {
      const int at = atomicAdd(&s.listSize, 1);
      s.listKeys[at] = kj;
      s.listIndex[at] = j;
    }
  });
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, size = s.listSize;
    const bool in = lane < size;
    const u32 mine = in ? s.listKeys[lane] : 0u;
    const int index = in ? s.listIndex[lane] : 0x7fffffff;
    int rank = 0; // bucket members ranked before this one
    for (int o = 0; o < size; ++o) {
      const u32 other = __shfl_sync(0xffffffffu, mine, o);
      const int at = __shfl_sync(0xffffffffu, index, o);
      rank += other > mine || (other == mine && at < index);
    }
    const unsigned hit =
        __ballot_sync(0xffffffffu, in && rank == remaining - 1);
    const u32 kth = __shfl_sync(0xffffffffu, mine, __ffs(hit) - 1);
    const int above = __popc(__ballot_sync(0xffffffffu, in && mine > kth));
    const int same = __popc(__ballot_sync(0xffffffffu, in && mine == kth));
    if (lane == 0) {
      s.prefix = kth;
      s.remaining = remaining - above;
      s.bucket = same;
    }
  }
}

/// The digit (of `bits` at `shift`) holding the remaining-th largest key:
/// warp 0 scans the 256 counts from the top, 8 digits per lane, and writes
/// the narrowed bucket to s.prefix, s.remaining, s.bucket.
__device__ __forceinline__ void pickDigit(const int *counts, u32 prefix,
                                          int shift, int remaining,
                                          CtaScratch &s) {
  if (threadIdx.x >= 32)
    return;
  const int lane = threadIdx.x, high = 255 - 8 * lane;
  int c[8], sum = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    c[i] = counts[high - i];
    sum += c[i];
  }
  int inclusive = sum;
  for (int o = 1; o < 32; o <<= 1) {
    int y = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o)
      inclusive += y;
  }
  const int exclusive = inclusive - sum;
  const unsigned hit = __ballot_sync(0xffffffffu, exclusive < remaining &&
                                                      inclusive >= remaining);
  if (lane == __ffs(hit) - 1) {
    int run = exclusive, digit = high - 7, inDigit = c[7];
    bool found = false;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (found)
        continue;
      if (run + c[i] >= remaining) {
        found = true;
        digit = high - i;
        inDigit = c[i];
      } else {
        run += c[i];
      }
    }
    s.prefix = prefix | (u32(digit) << shift);
    s.remaining = remaining - run;
    s.bucket = inDigit;
  }
}

/// Finds the k-th largest candidate's bucket (1 <= k <= stats.count) by
/// radix select on the keys `ks` holds: from the first bit where the keys
/// differ (the bits above are every key's), 8 bits at a time, until the
/// bucket holds at most 32 keys, which one warp then ranks exactly (by key,
/// then index). It stops at the first digit where taking any `remaining`
/// candidates of the bucket misses at most `slack` of the k best: of a
/// bucket of c keys, `remaining` arbitrary ones hold at least
/// 2 * remaining - c of the best, so at most min(remaining, c - remaining)
/// are missed. Slack 0 stops only when the whole bucket is taken (the answer
/// is exact); a negative slack never stops early (the bucket is one key: the
/// k-th largest itself). `bucket` gets the candidates with the bucket's key
/// prefix.
template <class KeyFn, class CandFn>
__device__ KthBucket ctaKthBucket(int n, int k, int slack,
                                  const SegmentKeys &ks, KeyFn key,
                                  CandFn candidate, const KeyStats &stats,
                                  CtaScratch &s, int *bucketOut = nullptr) {
  const int per = (n + int(blockDim.x) - 1) / int(blockDim.x);
  const u32 differ = stats.keyAnd ^ stats.keyOr;
  int top = differ ? 32 - __clz(differ) : 0; // bits [0, top) may differ
  u32 mask = top >= 32 ? 0u : ~0u << top;
  u32 prefix = stats.keyAnd & mask;
  int remaining = k, bucket = stats.count;
  int *counts = s.counts, *next = s.nextCounts;
  // The bucket one thread found (s.prefix, s.remaining, s.bucket): every
  // thread takes it after the barrier.
  auto adopt = [&] {
    __syncthreads();
    prefix = s.prefix;
    remaining = s.remaining;
    bucket = s.bucket;
  };
  for (int i = threadIdx.x; i < 256; i += blockDim.x)
    counts[i] = 0;
  if (threadIdx.x == 0)
    s.listSize = 0;
  __syncthreads();
  for (bool first = true; top > 0; first = false) {
    if (!first && slack >= 0 && min(remaining, bucket - remaining) <= slack)
      break;
    if (bucket <= 32) {
      // One warp ranks the bucket's keys (at most 32, one per lane).
      rankSmallBucket(ks, key, candidate, mask, prefix, remaining, s);
      adopt();
      mask = ~0u;
      break;
    }
    const int bits = min(8, top), shift = top - bits;
    const u32 digitMask = (1u << bits) - 1;
    // The next pass's counts are cleared while this one's are gathered.
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
      next[i] = 0;
    }
    // The cached keys: every thread takes the same iterations (a segment
    // holds at most `per` elements), so the counts are gathered per warp.
#pragma unroll
    for (int i = 0; i < kCachedKeys; ++i) {
      if (i >= per)
        break;
      const u32 kj = ks.keys[i];
      const bool on = ((ks.candidates >> i) & 1) && (kj & mask) == prefix;
      warpCount(counts, on, (kj >> shift) & digitMask);
    }
    for (int j = ks.seg.lo + kCachedKeys; j < ks.seg.hi; ++j) {
      if (!candidate(j))
        continue;
      u32 kj = key(j);
      if ((kj & mask) == prefix)
        atomicAdd(&counts[(kj >> shift) & digitMask], 1);
    }
    __syncthreads();
    // The digit holding the remaining-th largest.
    pickDigit(counts, prefix, shift, remaining, s);
    adopt();
    mask |= digitMask << shift;
    top = shift;
    int *used = counts;
    counts = next;
    next = used;
  }
  if (bucketOut)
    *bucketOut = bucket;
  return {prefix, mask, remaining};
}

/// Marks in `flags` (0/1 floats over n blocks) the k best candidates by
/// score (rules::ranksBefore: larger first, NaN last, ties to the lower
/// index, by rankKey and then the lowest indices of the k-th key); the others
/// get 0. With slack > 0 (approximate top-k) up to `slack` of the k may be
/// other candidates of nearly the same score (see ctaKthBucket); exactly k
/// are marked either way.
template <class ScoreFn, class CandFn>
__device__ void ctaTopK(int n, long long k, long long slack, ScoreFn score,
                        CandFn candidate, float *flags, CtaScratch &s) {
  auto key = [&](int j) { return scoreKey(score(j)); };
  const SegmentKeys ks(n, key, candidate);
  const Segment &seg = ks.seg;
  const KeyStats stats = ctaKeyStats(ks, key, candidate, s);
  const int total = stats.count;
  if (k >= total || k <= 0) {
    for (int j = threadIdx.x; j < n; j += blockDim.x)
      flags[j] = (k > 0 && candidate(j)) ? 1.0f : 0.0f;
    __syncthreads();
    return;
  }
  int bucket = 0;
  const KthBucket kth = ctaKthBucket(n, int(k),
                                     int(slack < 0   ? 0
                                         : slack < k ? slack
                                                     : k),
                                     ks, key, candidate, stats, s, &bucket);
  // Candidates above the bucket all pass (k - remaining of them); of those
  // in it, the lowest indices fill the rest: all of them when the bucket is
  // taken whole, else by rank in index order.
  int rank = 0;
  if (kth.remaining < bucket) {
    int ties = 0, tiesTotal = 0;
    ks.forEach(key, candidate,
               [&](int, u32 kj) { ties += (kj & kth.mask) == kth.prefix; });
    rank = ctaExclusiveScan(ties, tiesTotal, s);
  }
  const int wanted = kth.remaining;
  for (int j = seg.lo; j < seg.hi; ++j)
    flags[j] = 0.0f;
  ks.forEach(key, candidate, [&](int j, u32 kj) {
    kj &= kth.mask;
    if (kj > kth.prefix || (kj == kth.prefix && rank++ < wanted))
      flags[j] = 1.0f;
  });
  __syncthreads();
}

/// How many of the best candidates topp keeps before its max
/// (rules::toppCount): a radix select on the rank key, 8 bits at a time
/// from the top, that weighs each key by rules::toppWeight instead of
/// counting it, down to the key of the candidate whose weight reaches the
/// target; of the candidates with that key (one score, one weight), as
/// many as the rest of the target needs. Fixed-point weights make the sums
/// exact, so the count does not depend on the order of the atomics.
template <class ScoreFn, class CandFn>
__device__ long long ctaTopPCount(int n, float p, ScoreFn score,
                                  CandFn candidate, CtaScratch &s) {
  using u64 = unsigned long long;
  __shared__ u64 mass[256];
  __shared__ u64 needed;
  auto key = [&](int j) { return scoreKey(score(j)); };
  // The top score: the largest key (0: every candidate is NaN).
  u32 best = 0;
  for (int j = threadIdx.x; j < n; j += blockDim.x)
    if (candidate(j))
      best = max(best, key(j));
  best = u32(ctaReduce<Max>(double(best), s));
  if (best == 0)
    return 0;
  const float top =
      __uint_as_float((best & 0x80000000u) ? (best & 0x7FFFFFFFu) : ~best);
  u32 prefix = 0, mask = 0;
  long long above = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
      mass[i] = 0;
      s.counts[i] = 0;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      if (!candidate(j))
        continue;
      const u32 kj = key(j);
      if ((kj & mask) == prefix) {
        atomicAdd(&mass[(kj >> shift) & 255],
                  vflow::rules::toppWeight(score(j), top));
        atomicAdd(&s.counts[(kj >> shift) & 255], 1);
      }
    }
    __syncthreads();
    // The digit whose weight completes what is still needed (the
    // candidates of the digits above it are all kept): warp 0 scans the
    // 256 weights from the top, 8 digits per lane.
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x, topDigit = 255 - 8 * lane;
      u64 sum = 0;
      int count = 0;
      for (int i = 0; i < 8; ++i) {
        sum += mass[topDigit - i];
        count += s.counts[topDigit - i];
      }
      u64 inclusive = sum;
      int countInclusive = count;
      for (int o = 1; o < 32; o <<= 1) {
        const u64 y = __shfl_up_sync(0xffffffffu, inclusive, o);
        const int c = __shfl_up_sync(0xffffffffu, countInclusive, o);
        if (lane >= o) {
          inclusive += y;
          countInclusive += c;
        }
      }
      u64 want = needed;
      if (shift == 24) // The first pass weighs every candidate.
        want = vflow::rules::toppTarget(
            p, __shfl_sync(0xffffffffu, inclusive, 31));
      const u64 exclusive = inclusive - sum;
      const unsigned hit =
          __ballot_sync(0xffffffffu, exclusive < want && inclusive >= want);
      if (want == 0) {
        if (lane == 0)
          needed = 0;
      } else if (lane == __ffs(hit) - 1) {
        u64 run = exclusive;
        int kept = countInclusive - count, digit = topDigit - 7;
        for (int i = 0; i < 8; ++i) {
          if (run + mass[topDigit - i] >= want) {
            digit = topDigit - i;
            break;
          }
          run += mass[topDigit - i];
          kept += s.counts[topDigit - i];
        }
        needed = want - run;
        s.prefix = prefix | (u32(digit) << shift);
        s.total = kept;
      }
    }
    __syncthreads();
    if (needed == 0) // p <= 0 or no weight: nothing is kept.
      return 0;
    prefix = s.prefix;
    above += s.total;
    mask |= 255u << shift;
    __syncthreads();
  }
  // Every candidate with key `prefix` has the same weight w (> 0: the
  // bucket holds what is still needed).
  const float cut = __uint_as_float(
      (prefix & 0x80000000u) ? (prefix & 0x7FFFFFFFu) : ~prefix);
  const u64 w = vflow::rules::toppWeight(cut, top);
  const long long out = above + (long long)((needed + w - 1) / w);
  __syncthreads();
  return out;
}

/// The k-th largest of a line (+inf for k < 1, the smallest for k > n).
template <class ValueFn>
__device__ float ctaKthLargest(int n, long long k, ValueFn value,
                               CtaScratch &s) {
  const long long rank = vflow::rules::kthLargestRank(k, n);
  if (rank < 0)
    return inf();
  int kk = int(rank + 1);
  auto key = [&](int j) { return scoreKey(value(j)); };
  auto all = [](int) { return true; };
  const SegmentKeys ks(n, key, all);
  const KeyStats stats = ctaKeyStats(ks, key, all, s);
  const u32 kth = ctaKthBucket(n, kk, -1, ks, key, all, stats, s).prefix;
  // Recover a value with that key (every value with it is the same number,
  // up to the sign of zero and NaN payloads).
  __shared__ float found;
  if (threadIdx.x == 0)
    found = nan();
  __syncthreads();
  for (int j = threadIdx.x; j < n; j += blockDim.x)
    if (key(j) == kth)
      found = value(j);
  __syncthreads();
  float out = found;
  __syncthreads();
  return vflow::rules::kthLargestValue(out);
}

/// Writes list r of the sparse block table: the selected blocks (flags over
/// `complete` blocks), the kept first/last ones (rules::KeptBlocks) and the
/// partial last block, ascending, as physical pages and logical ids.
__device__ void ctaWriteList(const VflowGpuArgs &a, int b, int r,
                             const float *flags, int complete, int numBlocks,
                             long long keepFirst, long long keepLast,
                             CtaScratch &s) {
  const int *table = a.blockTable + (long long)b * a.maxBlocks;
  const int begin = a.tableIndptr[r], capacity = a.tableIndptr[r + 1] - begin;
  const vflow::rules::KeptBlocks kept{complete, keepFirst, keepLast};
  auto take = [&](int j) {
    return j >= complete || (flags && flags[j] != 0) || kept.contains(j);
  };
  const Segment seg(numBlocks);
  // The first kCachedKeys elements of the segment: their pages are read
  // before the scan (its barriers hide the latency), their flags once.
  int pages[kCachedKeys];
  unsigned taken = 0;
  int mine = 0, written = 0;
#pragma unroll
  for (int i = 0; i < kCachedKeys; ++i) {
    const int j = seg.lo + i;
    pages[i] = j < seg.hi ? table[j] : 0;
    if (j < seg.hi && take(j)) {
      taken |= 1u << i;
      ++mine;
    }
  }
  for (int j = seg.lo + kCachedKeys; j < seg.hi; ++j)
    mine += take(j);
  int at = ctaExclusiveScan(mine, written, s);
  auto put = [&](int j, int page) {
    if (at < capacity) {
      a.tablePages[begin + at] = page;
      a.tableBlocks[begin + at] = j;
    }
    ++at;
  };
#pragma unroll
  for (int i = 0; i < kCachedKeys; ++i)
    if ((taken >> i) & 1)
      put(seg.lo + i, pages[i]);
  for (int j = seg.lo + kCachedKeys; j < seg.hi; ++j)
    if (take(j))
      put(j, table[j]);
  if (threadIdx.x == 0)
    a.tableCount[r] = written < capacity ? written : capacity;
  __syncthreads();
}

} // namespace vd

#endif // __CUDACC__

#endif // VFLOW_RUNTIME_CUDA_FLOWSELECT_CUH
