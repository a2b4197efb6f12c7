//===- PagedDecodeTest.cpp - GPU paged decode attention vs float64 --------===//
//
// pagedDecodeAttention on random paged caches against a float64 host
// reference: dense and sparse lists, every supported type, partial and
// empty blocks, several split counts, the mass epilogue, and CUDA graph
// replay after the device-side lists change.
//
//===----------------------------------------------------------------------===//

#include "AttentionTestUtil.h"

#include <cstdio>

using namespace vflow::rt;
using namespace vflow::rt::cuda;
using namespace vflow::rt::cuda::test;

namespace {

struct DecodeCase : CacheCase {
  bool dense;           ///< one list per sequence (listsPerSequence)
  int selected = 0;     ///< sparse: blocks per list (capped at the sequence's)
  int extraEntries = 0; ///< maxEntries = the longest list + this
  bool mass = false;
  bool emptyFirstList = false; ///< sparse: list 0 gets count 0
  bool shuffled = false;       ///< sparse: entries in random order
  int window = 0;              ///< a sliding window (0: none)
};

/// `c` with a sliding window of `window` tokens.
DecodeCase windowed(DecodeCase c, int window) {
  c.window = window;
  return c;
}

/// Block lists in the kernel's format, plus their host view.
struct Lists {
  std::vector<int32_t> indptr, count, pages, blocks;
  std::vector<std::vector<int>> logical; ///< [list] logical blocks
  int maxEntries = 0;
};

Lists makeLists(std::mt19937 &rng, const PagedCache &cache,
                const DecodeCase &c) {
  Lists lists;
  const int batch = static_cast<int>(cache.lengths.size());
  const int numLists = c.dense ? batch : batch * c.numKVHeads;
  std::uniform_int_distribution<int> slack(0, 2);
  lists.indptr.push_back(0);
  int longest = 0;
  for (int r = 0; r < numLists; ++r) {
    const int b = c.dense ? r : r / c.numKVHeads;
    std::vector<int> chosen(cache.numBlocks(b));
    std::iota(chosen.begin(), chosen.end(), 0);
    if (!c.dense) {
      std::shuffle(chosen.begin(), chosen.end(), rng);
      chosen.resize(std::min<size_t>(chosen.size(), c.selected));
      if (!c.shuffled)
        std::sort(chosen.begin(), chosen.end());
      if (c.emptyFirstList && r == 0)
        chosen.clear();
    }
    for (int block : chosen) {
      lists.pages.push_back(cache.pageOf[b][block]);
      lists.blocks.push_back(block);
    }
    // Capacity beyond the count holds junk the kernel must not read.
    const int spare = slack(rng);
    for (int i = 0; i < spare; ++i) {
      lists.pages.push_back(-7);
      lists.blocks.push_back(1 << 20);
    }
    lists.count.push_back(static_cast<int32_t>(chosen.size()));
    lists.indptr.push_back(static_cast<int32_t>(lists.pages.size()));
    lists.logical.push_back(chosen);
    longest = std::max<int>(longest, chosen.size());
  }
  lists.maxEntries = longest + c.extraEntries;
  return lists;
}

struct Reference {
  std::vector<double> out;  ///< [B, Hkv * G, D]
  std::vector<double> mass; ///< [B * Hkv, massStride, G]
};

Reference reference(const PagedCache &cache, const Lists &lists,
                    const std::vector<uint16_t> &q, const DecodeCase &c,
                    float scale, int massStride) {
  const int batch = static_cast<int>(cache.lengths.size());
  const int G = c.group, D = c.headDim, P = c.pageSize, H = c.numKVHeads;
  Reference ref;
  ref.out.assign(static_cast<size_t>(batch) * H * G * D, 0.0);
  ref.mass.assign(static_cast<size_t>(batch) * H * massStride * G, 0.0);
  for (int b = 0; b < batch; ++b)
    for (int kvh = 0; kvh < H; ++kvh) {
      const std::vector<int> &blocks = lists.logical[c.dense ? b : b * H + kvh];
      for (int g = 0; g < G; ++g) {
        const size_t qRow = (static_cast<size_t>(b) * H * G + kvh * G + g) * D;
        std::vector<double> scores;
        std::vector<std::pair<int, int>> tokens; // (entry, token in block)
        for (size_t e = 0; e < blocks.size(); ++e) {
          const int valid = std::min(P, cache.lengths[b] - blocks[e] * P);
          // A sliding window: positions before len - window are out.
          const int lo = c.window > 0 ? cache.lengths[b] - c.window : 0;
          for (int t = std::max(0, lo - blocks[e] * P); t < valid; ++t) {
            double dot = 0;
            for (int d = 0; d < D; ++d)
              dot += static_cast<double>(bf16ToFloat(q[qRow + d])) *
                     cache.kAt(b, blocks[e], kvh, t, d);
            scores.push_back(dot * scale);
            tokens.push_back({static_cast<int>(e), t});
          }
        }
        if (scores.empty())
          continue;
        const double top = *std::max_element(scores.begin(), scores.end());
        double sum = 0;
        for (double &s : scores)
          sum += (s = std::exp(s - top));
        for (size_t i = 0; i < scores.size(); ++i) {
          const double p = scores[i] / sum;
          const int block = blocks[tokens[i].first];
          for (int d = 0; d < D; ++d)
            ref.out[qRow + d] +=
                p * cache.vAt(b, block, kvh, tokens[i].second, d);
          ref.mass[((static_cast<size_t>(b) * H + kvh) * massStride + block) *
                       G +
                   g] += p;
        }
      }
    }
  return ref;
}

/// The device side of one problem: pools, q, lists, outputs, workspace.
struct DeviceProblem {
  DeviceCache pools;
  DeviceArray<float> mass;
  DeviceArray<uint16_t> q, out;
  DeviceArray<int32_t> indptr, count, pages, blocks, seqLen;
  DeviceArray<uint8_t> workspace;
  PagedAttentionArgs args;

  DeviceProblem(const PagedCache &cache, const Lists &lists,
                const std::vector<uint16_t> &qHost, const DecodeCase &c,
                float scale, int massStride)
      : pools(cache), q(qHost), out(qHost.size()), indptr(lists.indptr),
        count(lists.count), pages(lists.pages), blocks(lists.blocks),
        seqLen(cache.lengths), args{kvArgs(cache, pools, c.group, q.get(),
                                           out.get(), scale)} {
    const int batch = static_cast<int>(cache.lengths.size());
    args.indptr = indptr.get();
    args.count = count.get();
    args.pages = pages.get();
    args.blocks = blocks.get();
    args.seqLen = seqLen.get();
    args.listsPerSequence = c.dense;
    args.maxEntries = lists.maxEntries;
    args.window = c.window;
    if (c.mass) {
      mass.resize(static_cast<size_t>(batch) * c.numKVHeads * massStride *
                  c.group);
      args.mass = mass.get();
      args.massStride = massStride;
    }
    workspace.resize(pagedDecodeWorkspaceBytes(batch, c.numKVHeads, c.group,
                                               c.headDim, lists.maxEntries));
    args.workspace = workspace.get();
    args.workspaceBytes = workspace.size();
  }

  /// Poisons out and the workspace (NaN), zeroes mass.
  void reset() {
    out.fill(0xFF);
    workspace.fill(0xFF);
    if (mass.size())
      mass.fill(0);
  }
};

/// Output and mass against the reference; every output element must have
/// been written (the buffer starts as NaN).
void compare(const DeviceProblem &dev, const Reference &ref,
             const DecodeCase &c, const std::string &what) {
  const std::vector<float> out = bf16Vector(dev.out.download());
  const double total = relativeError(out, ref.out);
  std::printf("  %-28s %-8s rel.err %.2e\n", what.c_str(), kvTypeName(c.type),
              total);
  EXPECT_LE(total, 1e-2) << what;
  // Per query head, so one bad head cannot hide in the total.
  const size_t D = c.headDim;
  for (size_t row = 0; row < out.size() / D; ++row) {
    double norm = 0;
    for (size_t d = 0; d < D; ++d)
      norm += ref.out[row * D + d] * ref.out[row * D + d];
    if (norm == 0) {
      for (size_t d = 0; d < D; ++d)
        ASSERT_EQ(out[row * D + d], 0.0f)
            << what << ": row " << row << " attends nothing: zeros";
      continue;
    }
    const double err = relativeError(out, ref.out, row * D, (row + 1) * D);
    ASSERT_LE(err, 2e-2) << what << ": query row " << row;
  }
  if (!c.mass)
    return;
  const std::vector<float> mass = dev.mass.download();
  double worst = 0;
  for (size_t i = 0; i < mass.size(); ++i) {
    ASSERT_TRUE(std::isfinite(mass[i])) << what << ": mass " << i;
    worst = std::max(worst, std::abs(mass[i] - ref.mass[i]));
  }
  std::printf("  %-28s mass max abs err %.2e\n", what.c_str(), worst);
  EXPECT_LE(worst, 1e-4) << what << ": mass";
}

/// Builds the case's problem, runs it eagerly, checks it.
void runCase(const DecodeCase &c) {
  std::mt19937 &rng = testRng();
  const PagedCache cache = makeCache(rng, c);
  const Lists lists = makeLists(rng, cache, c);
  const int batch = static_cast<int>(c.lengths.size());
  const std::vector<uint16_t> q = randomBF16(
      rng, static_cast<size_t>(batch) * c.numKVHeads * c.group * c.headDim,
      2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.headDim));
  int massStride = 1;
  for (int b = 0; b < batch; ++b)
    massStride = std::max(massStride, cache.numBlocks(b));
  const Reference ref = reference(cache, lists, q, c, scale, massStride);
  DeviceProblem dev(cache, lists, q, c, scale, massStride);
  dev.reset();
  pagedDecodeAttention(dev.args, nullptr);
  VFLOW_CUDA_OK(cudaDeviceSynchronize());
  compare(dev, ref, c,
          std::string(c.name) + " splits=" +
              std::to_string(pagedDecodeSplits(batch, c.numKVHeads, c.group,
                                               c.headDim, c.type,
                                               lists.maxEntries)));
}

class PagedDecode : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(PagedDecode, MatchesFloat64Reference) {
  VFLOW_REQUIRE_GPU();
  runCase(GetParam());
}

using KT = KVType;
const DecodeCase kCases[] = {
    // Sliding windows: starting inside a block, at a block's start, inside
    // a later 16-token chunk of a 64-token page (its first chunks wholly
    // masked), longer than the sequence; 8-bit pools; many splits.
    windowed({"window_g4_d128", KT::BF16, 2, 4, 128, 16, {1, 37, 1000}, true},
             100),
    windowed({"window_block_start", KT::BF16, 2, 4, 128, 16, {300, 64}, true},
             44),
    windowed({"window_p64_chunks_d64", KT::BF16, 2, 8, 64, 64, {500, 70}, true},
             21),
    windowed(
        {"window_past_start_int8", KT::INT8, 2, 4, 128, 16, {30, 513}, true},
        512),
    windowed({"window_fp8_rowscale_g12",
              KT::FP8E4M3,
              1,
              12,
              256,
              32,
              {3000, 9},
              true},
             512),
    // name, type, Hkv, G, D, P, lengths, dense, selected, extra, mass, ...
    {"dense_g4_d128", KT::BF16, 2, 4, 128, 16, {1, 37, 1000}, true},
    {"dense_g1_d64", KT::BF16, 3, 1, 64, 16, {15, 16, 17, 300}, true},
    {"dense_g5_d128_p32", KT::BF16, 2, 5, 128, 32, {70, 5, 2049}, true},
    {"dense_f16_g4", KT::F16, 2, 4, 128, 16, {640, 3}, true},
    {"dense_fp8_g4", KT::FP8E4M3, 2, 4, 128, 16, {777, 16, 2}, true},
    {"dense_fp8_g8_d64_p64", KT::FP8E4M3, 2, 8, 64, 64, {500, 64}, true},
    {"dense_g16_d256", KT::BF16, 1, 16, 256, 16, {300, 31}, true},
    {"dense_fp8_g12_d256", KT::FP8E4M3, 2, 12, 256, 32, {257, 90}, true},
    {"dense_f16_g4_d64_p64", KT::F16, 1, 4, 64, 64, {1000}, true},
    {"dense_empty_sequence", KT::BF16, 2, 4, 128, 16, {0, 50}, true},
    {"sparse_g4_d128", KT::BF16, 4, 4, 128, 16, {1000, 300, 33}, false, 9},
    {"sparse_g5_shuffled",
     KT::BF16,
     2,
     5,
     128,
     16,
     {600, 7},
     false,
     13,
     0,
     false,
     false,
     true},
    {"sparse_g1_d64", KT::BF16, 2, 1, 64, 16, {2000, 100}, false, 31},
    {"sparse_g4_d64_p32", KT::BF16, 2, 4, 64, 32, {1500, 70}, false, 6},
    {"sparse_fp8_g4", KT::FP8E4M3, 2, 4, 128, 16, {3000, 20}, false, 64},
    {"sparse_fp8_g5_d64", KT::FP8E4M3, 3, 5, 64, 16, {999}, false, 40},
    {"sparse_f16_g8", KT::F16, 2, 8, 128, 16, {1200, 500}, false, 17},
    // A scale per stored row (int8 always; fp8 "rowscale"): each row its
    // own magnitude, over about 400x.
    {"dense_int8_g4", KT::INT8, 2, 4, 128, 16, {777, 16, 2}, true},
    {"dense_int8_g8_d64_p64", KT::INT8, 2, 8, 64, 64, {500, 64}, true},
    {"dense_int8_g12_d256", KT::INT8, 2, 12, 256, 32, {257, 90}, true},
    {"sparse_int8_g5_d64", KT::INT8, 3, 5, 64, 16, {999}, false, 40},
    {"dense_fp8_rowscale_g4", KT::FP8E4M3, 2, 4, 128, 16, {700, 33}, true},
    {"sparse_fp8_rowscale_g16", KT::FP8E4M3, 1, 16, 128, 16, {1500}, false, 30},
    {"mass_sparse_int8_g4",
     KT::INT8,
     2,
     4,
     128,
     16,
     {2000, 300},
     false,
     24,
     3,
     true,
     true,
     true},
    {"sparse_empty_list",
     KT::BF16,
     2,
     4,
     128,
     16,
     {400, 400},
     false,
     5,
     0,
     false,
     true},
    {"mass_sparse_g5",
     KT::BF16,
     2,
     5,
     128,
     16,
     {900, 41},
     false,
     12,
     0,
     true,
     true,
     true},
    {"mass_dense_g4_one_split",
     KT::BF16,
     1,
     4,
     128,
     16,
     {45},
     true,
     0,
     0,
     true},
    {"mass_dense_fp8_g4",
     KT::FP8E4M3,
     2,
     4,
     128,
     16,
     {3333, 17},
     true,
     0,
     0,
     true},
    {"mass_sparse_g16_d256",
     KT::BF16,
     2,
     16,
     256,
     16,
     {700},
     false,
     20,
     0,
     true},
    // The benchmark's sparse shape at B = 8 (a few splits), with mass.
    {"mass_sparse_b8_k64",
     KT::BF16,
     8,
     4,
     128,
     16,
     {4096, 2000, 1500, 1100, 1025, 3000, 2048, 999},
     false,
     64,
     0,
     true},
    // maxEntries far above the counts: more splits, most of them empty.
    {"splits_slack_40", KT::BF16, 2, 4, 128, 16, {500, 90}, false, 8, 40},
    {"splits_slack_3000",
     KT::BF16,
     2,
     4,
     128,
     16,
     {500, 90},
     false,
     8,
     3000,
     true},
};

INSTANTIATE_TEST_SUITE_P(Cases, PagedDecode, ::testing::ValuesIn(kCases),
                         CaseName());

TEST(PagedDecodeSplits, FollowTheShapes) {
  VFLOW_REQUIRE_GPU();
  const KVType types[] = {KT::BF16, KT::F16, KT::FP8E4M3, KT::INT8};
  for (KVType type : types) {
    // Few entries: one CTA per (sequence, kv head).
    EXPECT_EQ(pagedDecodeSplits(64, 8, 4, 128, type, 4), 1);
    // One long sequence is spread over the GPU.
    EXPECT_GT(pagedDecodeSplits(1, 8, 4, 128, type, 2048), 8);
    // At most 256 entries per CTA.
    EXPECT_GE(pagedDecodeSplits(64, 8, 4, 128, type, 8192), 32);
  }
  EXPECT_EQ(pagedDecodeWorkspaceBytes(64, 8, 4, 128, 4), 0u);
  // The workspace covers every type's split count.
  const int splits = pagedDecodeSplits(1, 8, 4, 128, KT::FP8E4M3, 2048);
  EXPECT_GE(pagedDecodeWorkspaceBytes(1, 8, 4, 128, 2048),
            static_cast<size_t>(splits) * 8 * 4 * (128 + 2) * sizeof(float));
}

TEST(PagedDecode, Sequence128KTokens) {
  VFLOW_REQUIRE_GPU();
  runCase({"dense_128k", KT::BF16, 2, 4, 128, 16, {131072 - 5}, true});
}

TEST(PagedDecode, Sparse128KTokensFP8) {
  VFLOW_REQUIRE_GPU();
  runCase(
      {"sparse_128k_fp8", KT::FP8E4M3, 1, 4, 128, 16, {131072}, false, 512});
}

TEST(PagedDecode, Dense32KTokensInt8) {
  VFLOW_REQUIRE_GPU();
  runCase({"dense_32k_int8", KT::INT8, 2, 4, 128, 16, {32768 - 3}, true});
}

/// A graph captured once, replayed after the device-side lists and counts
/// change, equals an eager run on the new lists.
TEST(PagedDecode, GraphReplayAfterListsChange) {
  VFLOW_REQUIRE_GPU();
  std::mt19937 &rng = testRng();
  DecodeCase c{"graph",         KT::BF16, 2,  4, 128, 16,
               {2000, 800, 50}, false,    24, 8, true};
  const PagedCache cache = makeCache(rng, c);
  const Lists first = makeLists(rng, cache, c);
  const std::vector<uint16_t> q =
      randomBF16(rng, 3 * c.numKVHeads * c.group * c.headDim, 2.0f);
  const float scale = 1.0f / std::sqrt(128.0f);
  const int massStride = cache.numBlocks(0);
  DeviceProblem dev(cache, first, q, c, scale, massStride);
  // Capacity for any later list of up to maxEntries entries.
  const int numLists = 3 * c.numKVHeads;
  std::vector<int32_t> indptr(numLists + 1);
  for (int r = 0; r <= numLists; ++r)
    indptr[r] = r * first.maxEntries;
  auto place = [&](const Lists &lists) {
    std::vector<int32_t> pages(numLists * first.maxEntries, -7);
    std::vector<int32_t> blocks(pages.size(), 1 << 20);
    for (int r = 0; r < numLists; ++r)
      for (int i = 0; i < lists.count[r]; ++i) {
        pages[indptr[r] + i] = lists.pages[lists.indptr[r] + i];
        blocks[indptr[r] + i] = lists.blocks[lists.indptr[r] + i];
      }
    dev.indptr.upload(indptr);
    dev.pages.upload(pages);
    dev.blocks.upload(blocks);
    dev.count.upload(lists.count);
  };
  place(first);
  dev.args.indptr = dev.indptr.get();
  dev.args.pages = dev.pages.get();
  dev.args.blocks = dev.blocks.get();
  dev.args.count = dev.count.get();

  cudaStream_t stream;
  VFLOW_CUDA_OK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  VFLOW_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  pagedDecodeAttention(dev.args, stream);
  VFLOW_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  VFLOW_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  for (int round = 0; round < 3; ++round) {
    DecodeCase next = c;
    next.selected = 4 + 9 * round; // counts change; never above maxEntries
    const Lists lists = makeLists(rng, cache, next);
    ASSERT_LE(*std::max_element(lists.count.begin(), lists.count.end()),
              first.maxEntries);
    place(lists);
    const Reference ref = reference(cache, lists, q, c, scale, massStride);

    dev.reset();
    VFLOW_CUDA_OK(cudaGraphLaunch(exec, stream));
    VFLOW_CUDA_OK(cudaStreamSynchronize(stream));
    const std::vector<uint16_t> replayed = dev.out.download();
    const std::vector<float> replayedMass = dev.mass.download();
    compare(dev, ref, c, "graph round " + std::to_string(round));

    dev.reset();
    pagedDecodeAttention(dev.args, stream);
    VFLOW_CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_EQ(replayed, dev.out.download()) << "round " << round;
    EXPECT_EQ(replayedMass, dev.mass.download()) << "round " << round;
  }
  VFLOW_CUDA_OK(cudaGraphExecDestroy(exec));
  VFLOW_CUDA_OK(cudaGraphDestroy(graph));
  VFLOW_CUDA_OK(cudaStreamDestroy(stream));
}

template <typename Body>
void expectError(Body &&body, const std::string &fragment) {
  try {
    body();
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos)
        << "message '" << error.what() << "' lacks '" << fragment << "'";
    return;
  }
  ADD_FAILURE() << "did not throw vflow::rt::Error (" << fragment << ")";
}

TEST(PagedDecode, RejectsBadArguments) {
  VFLOW_REQUIRE_GPU();
  std::mt19937 &rng = testRng();
  DecodeCase c{"bad", KT::BF16, 2, 4, 128, 16, {100}, true};
  const PagedCache cache = makeCache(rng, c);
  const Lists lists = makeLists(rng, cache, c);
  const std::vector<uint16_t> q = randomBF16(rng, 8 * 128, 1.0f);
  DeviceProblem dev(cache, lists, q, c, 0.1f, 1);
  auto run = [&](auto edit) {
    PagedAttentionArgs args = dev.args;
    edit(args);
    pagedDecodeAttention(args, nullptr);
  };
  expectError([&] { run([](auto &a) { a.headDim = 96; }); }, "headDim");
  expectError([&] { run([](auto &a) { a.group = 17; }); }, "group");
  expectError([&] { run([](auto &a) { a.group = 0; }); }, "group");
  expectError([&] { run([](auto &a) { a.pageSize = 8; }); }, "pageSize");
  expectError([&] { run([](auto &a) { a.kPool = nullptr; }); }, "null");
  expectError([&] { run([](auto &a) { a.seqLen = nullptr; }); }, "null");
  expectError([&] { run([](auto &a) { a.batch = 0; }); }, "batch");
  expectError([&] { run([](auto &a) { a.scale = NAN; }); }, "scale");
  expectError([&] { run([](auto &a) { a.kvType = static_cast<KVType>(9); }); },
              "kvType");
  // Token scales: int8 needs them, 16-bit pools take none, K's and V's
  // come together.
  expectError([&] { run([](auto &a) { a.kvType = KT::INT8; }); },
              "need their token scales");
  float *scales = dev.pools.kScale.get();
  expectError(
      [&] { run([&](auto &a) { a.kTokenScale = a.vTokenScale = scales; }); },
      "token scales are for 8-bit pools");
  expectError(
      [&] {
        run([&](auto &a) {
          a.kvType = KT::FP8E4M3;
          a.kTokenScale = scales;
        });
      },
      "come together");
  expectError(
      [&] {
        run([](auto &a) {
          a.maxEntries = 5000;
          a.workspace = nullptr;
        });
      },
      "workspace");
  expectError(
      [&] {
        run([&](auto &a) {
          a.mass = dev.pools.kScale.get();
          a.massStride = 0;
        });
      },
      "massStride");
}

} // namespace
