//===- AttentionBench.cu - Paged decode attention benchmark -----*- C++ -*-===//
//
// Timing: ../common/BackToBack.cuh (launches queued behind a spin kernel,
// an event between each two: device time, not host launch overhead).
//
//===----------------------------------------------------------------------===//

#include "../common/BackToBack.cuh"
#include "../common/RandomLists.h"
#include "AttentionBench.h"
#ifdef VFLOW_BENCH_FLASHINFER
#include "FlashInferPeer.h"
#endif

#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Json.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <utility>

namespace vflow {
namespace bench {
namespace {

using rt::Error;
using rt::cuda::KVType;

void check(cudaError_t status, const char *what) {
  if (status != cudaSuccess)
    throw Error(std::string("attention bench: ") + what + ": " +
                cudaGetErrorString(status));
}

/// An owned device allocation.
class Buffer {
public:
  explicit Buffer(size_t bytes) : bytes_(bytes) {
    if (bytes)
      check(cudaMalloc(&data_, bytes), "cudaMalloc");
  }
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;
  Buffer(Buffer &&other) noexcept : data_(other.data_), bytes_(other.bytes_) {
    other.data_ = nullptr;
  }
  ~Buffer() { cudaFree(data_); }
  template <typename T> T *as() const { return static_cast<T *>(data_); }
  size_t bytes() const { return bytes_; }

  template <typename T> static Buffer of(const std::vector<T> &host) {
    Buffer buffer(host.size() * sizeof(T));
    check(cudaMemcpy(buffer.data_, host.data(), buffer.bytes_,
                     cudaMemcpyHostToDevice),
          "upload");
    return buffer;
  }

private:
  void *data_ = nullptr;
  size_t bytes_ = 0;
};

__device__ uint64_t mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Random values, never zeros: 16-bit types uniform in [-2, 2) (bf16 or
/// f16 bits), fp8 e4m3 random codes without the NaN pattern.
__global__ void fillRandom(uint8_t *out, size_t n, int bytes, bool isF16,
                           uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint64_t x = mix(seed + 0x9E3779B97F4A7C15ull * (i + 1));
    if (bytes == 1) {
      uint32_t code = x & 0xFFu;
      if ((code & 0x7Fu) == 0x7Fu)
        code ^= 1u;
      out[i] = static_cast<uint8_t>(code);
      continue;
    }
    const float f = static_cast<float>(x >> 40) / 16777216.0f * 4.0f - 2.0f;
    reinterpret_cast<uint16_t *>(out)[i] =
        isF16 ? __half_as_ushort(__float2half_rn(f))
              : __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
}

void fill(void *data, size_t elements, KVType type, uint64_t seed) {
  fillRandom<<<1024, 256>>>(static_cast<uint8_t *>(data), elements,
                            static_cast<int>(rt::cuda::kvTypeBytes(type)),
                            type == KVType::F16, seed);
  check(cudaGetLastError(), "fillRandom launch");
}

/// Times `run(i)` for warm-up + iterations launches, back to back behind a
/// spin kernel; returns the per-launch device times in milliseconds.
template <typename Run>
std::vector<double> timeRuns(const BenchOptions &options, Run &&run) {
  return backToBackMs(options.warmup, options.iterations, run);
}

void summarize(BenchRow &row, std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  row.ms = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
  row.minMs = ms.front();
  row.gbps = row.bytes / row.ms / 1e6;
}

size_t budgetBytes(const BenchOptions &options) {
  if (options.memoryBudget)
    return options.memoryBudget;
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free / 100 * 85;
}

/// One rotated input set: pools, q, out, and the page table of its own.
struct InputSet {
  Buffer k, v, q, out, denseIndptr, densePages, denseBlocks, sparseIndptr,
      sparseCount, sparsePages, sparseBlocks;
  /// The sparse lists' page ids as FlashInfer numbers them (the peer;
  /// empty without it).
  Buffer peerSparsePages;
};

#ifdef VFLOW_BENCH_FLASHINFER
std::vector<float> downloadBf16(const Buffer &buffer, size_t elements) {
  std::vector<__nv_bfloat16> bits(elements);
  check(cudaMemcpy(bits.data(), buffer.as<void>(), elements * 2,
                   cudaMemcpyDeviceToHost),
        "download");
  std::vector<float> out(elements);
  for (size_t i = 0; i < elements; ++i)
    out[i] = __bfloat162float(bits[i]);
  return out;
}
#endif

/// Each KV type the bench runs, by the name its rows and --dtypes use: the
/// one list that benchTypeName and parseBenchType read.
const std::pair<KVType, const char *> kBenchTypes[] = {
    {KVType::BF16, "bf16"}, {KVType::F16, "f16"}, {KVType::FP8E4M3, "fp8"}};

} // namespace

const char *benchTypeName(KVType type) {
  for (const auto &[t, name] : kBenchTypes)
    if (t == type)
      return name;
  return "?";
}

std::optional<KVType> parseBenchType(const std::string &name) {
  for (const auto &[t, n] : kBenchTypes)
    if (name == n)
      return t;
  return std::nullopt;
}

std::string BenchRow::json() const {
  rt::Json row = rt::Json::object();
  row.set("source", source);
  row.set("what", what);
  if (what != "copy") {
    row.set("B", shape.batch);
    row.set("L", shape.length);
    row.set("Hkv", shape.numKVHeads);
    row.set("G", shape.group);
    row.set("D", shape.headDim);
    row.set("P", shape.pageSize);
    if (what == "sparse_attention" || what == "flashinfer_sparse")
      row.set("k", shape.selected);
    row.set("dtype", benchTypeName(shape.type));
  }
  if (what != "skipped") {
    row.set("ms", ms);
    row.set("min_ms", minMs);
    row.set("bytes", static_cast<long long>(bytes));
    row.set("gbps", gbps);
  }
  if (splits) {
    row.set("splits", splits);
    row.set("sets", inputSets);
  }
  if (!note.empty())
    row.set(what == "skipped" ? "skipped" : "note", note);
  return row.dump();
}

BenchRow benchCopy(size_t bytes, const BenchOptions &options) {
  Buffer src(bytes), dst(bytes);
  fill(src.as<void>(), bytes, KVType::FP8E4M3, 1);
  BenchRow row;
  row.what = "copy";
  row.bytes = 2.0 * static_cast<double>(bytes);
  summarize(row, timeRuns(options, [&](int) {
              check(cudaMemcpyAsync(dst.as<void>(), src.as<void>(), bytes,
                                    cudaMemcpyDeviceToDevice),
                    "cudaMemcpyAsync");
            }));
  return row;
}

#ifdef VFLOW_BENCH_FLASHINFER
/// FlashInfer's batch decode on the pools and lists of vflow's `row`
/// (dense or sparse), timed the same way; its output on input set 0 is
/// checked against vflow's (`want`): the note has the largest difference
/// relative to vflow's largest output, and CHECK FAILED above 2e-2.
BenchRow flashInferRow(const BenchRow &vflowRow, bool dense,
                       const BenchOptions &options, int sets,
                       const std::vector<InputSet> &inputs,
                       const std::vector<float> &want,
                       const std::vector<int32_t> &indptr) {
  const AttentionShape &shape = vflowRow.shape;
  BenchRow row = vflowRow;
  row.source = "peer";
  row.what = dense ? "flashinfer_dense" : "flashinfer_sparse";
  row.splits = 0;
  if (shape.length % shape.pageSize) {
    row.what = "skipped";
    row.note = std::string(dense ? "flashinfer_dense" : "flashinfer_sparse") +
               ": lengths that are not a whole number of pages are not "
               "wired (the last page's length differs per list)";
    return row;
  }
  const bool fp8 = shape.type == KVType::FP8E4M3;
  // The bench's fp8 scales are 1/64 for every head: FlashInfer takes the K
  // scale in the softmax scale; its output is V-unscaled (times 64).
  const float kvScale = fp8 ? 1.0f / 64 : 1.0f;
  FlashInferProblem problem;
  problem.shape = shape;
  problem.perHeadLists = !dense;
  problem.indptr = indptr;
  problem.lastPageLen.assign(indptr.size() - 1, shape.pageSize);
  problem.scale = kvScale / std::sqrt(static_cast<float>(shape.headDim));
  try {
    FlashInferPeer peer(problem);
    auto run = [&](int i) {
      const InputSet &in = inputs[i % sets];
      peer.run(in.k.as<void>(), in.v.as<void>(),
               (dense ? in.densePages : in.peerSparsePages).as<int32_t>(),
               in.q.as<void>(), in.out.as<void>(), nullptr);
    };
    run(0);
    check(cudaDeviceSynchronize(), "FlashInfer's output");
    const std::vector<float> got = downloadBf16(inputs[0].out, want.size());
    double worst = 0, top = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::fabs(double(got[i]) * kvScale - want[i]));
      top = std::max(top, std::fabs(double(want[i])));
    }
    const double rel = top > 0 ? worst / top : worst;
    summarize(row, timeRuns(options, run));
    char note[160];
    std::snprintf(note, sizeof note,
                  "FlashInfer batch decode (CUDA cores, its planner); "
                  "max diff vs vflow %.2e of its largest output%s",
                  rel, rel > 2e-2 ? " CHECK FAILED" : "");
    row.note = note;
  } catch (const Error &e) {
    row.what = "skipped";
    row.note = e.what();
  }
  return row;
}
#endif

std::vector<BenchRow> benchDecodeAttention(const AttentionShape &shape,
                                           const BenchOptions &options) {
  using namespace rt::cuda;
  const int B = shape.batch, H = shape.numKVHeads, G = shape.group,
            D = shape.headDim, P = shape.pageSize;
  const size_t s = kvTypeBytes(shape.type);
  const int blocksPerSeq = (shape.length + P - 1) / P;
  const int selected = std::min(shape.selected, blocksPerSeq);
  const size_t numPages = static_cast<size_t>(B) * blocksPerSeq;
  const size_t poolElems = numPages * H * P * D;
  const size_t qElems = static_cast<size_t>(B) * H * G * D;
  const size_t denseWs = pagedDecodeWorkspaceBytes(B, H, G, D, blocksPerSeq);
  const size_t sparseWs = pagedDecodeWorkspaceBytes(B, H, G, D, selected);
  const size_t setBytes =
      2 * poolElems * s + 4 * qElems +
      8 * (numPages + static_cast<size_t>(B) * H * selected);
  const size_t budget = budgetBytes(options);
  const size_t fixed = std::max(denseWs, sparseWs) + (64u << 20);
  const int sets = budget > fixed + setBytes
                       ? static_cast<int>(std::min<size_t>(
                             options.inputSets, (budget - fixed) / setBytes))
                       : 0;
  if (sets == 0) {
    BenchRow row;
    row.what = "skipped";
    row.shape = shape;
    row.note = "one input set needs " + std::to_string(setBytes >> 20) +
               " MiB, the budget is " + std::to_string(budget >> 20) + " MiB";
    return {row};
  }

  std::mt19937 rng(1234 + B * 7 + shape.length);
  std::vector<InputSet> inputs;
  std::vector<int32_t> denseIndptrHost, sparseIndptrHost; // the same per set
  for (int set = 0; set < sets; ++set) {
    // A random page table (sequence b's block j is page perm[b * N + j]);
    // sparse: `selected` random distinct blocks per (sequence, kv head).
    const RandomLists random = randomLists(rng, B, H, blocksPerSeq, selected);
    const std::vector<int32_t> &perm = random.perm;
    std::vector<int32_t> dIndptr(B + 1), dPages(numPages), dBlocks(numPages);
    for (int b = 0; b <= B; ++b)
      dIndptr[b] = b * blocksPerSeq;
    for (size_t i = 0; i < numPages; ++i) {
      dPages[i] = perm[i];
      dBlocks[i] = static_cast<int32_t>(i % blocksPerSeq);
    }
    const std::vector<int32_t> &sIndptr = random.indptr, &sPages = random.pages,
                               &sBlocks = random.blocks;
    const std::vector<int32_t> sCount(B * H, selected);
    denseIndptrHost = dIndptr;
    sparseIndptrHost = sIndptr;
    // The sparse lists as FlashInfer numbers their pages (the peer).
#ifdef VFLOW_BENCH_FLASHINFER
    const std::vector<int32_t> peerPages =
        FlashInferPeer::perHeadPageIds(sIndptr, sPages, H);
#else
    const std::vector<int32_t> peerPages;
#endif
    InputSet in{
        Buffer(poolElems * s), Buffer(poolElems * s), Buffer(qElems * 2),
        Buffer(qElems * 2),    Buffer::of(dIndptr),   Buffer::of(dPages),
        Buffer::of(dBlocks),   Buffer::of(sIndptr),   Buffer::of(sCount),
        Buffer::of(sPages),    Buffer::of(sBlocks),   Buffer::of(peerPages)};
    fill(in.k.as<void>(), poolElems, shape.type, 10 * set + 1);
    fill(in.v.as<void>(), poolElems, shape.type, 10 * set + 2);
    fill(in.q.as<void>(), qElems, KVType::BF16, 10 * set + 3);
    inputs.push_back(std::move(in));
  }
  const Buffer seqLen = Buffer::of(std::vector<int32_t>(B, shape.length));
  // fp8 values reach 448: scale them to about [-7, 7].
  const Buffer scales = Buffer::of(std::vector<float>(H, 1.0f / 64));
  Buffer workspace(std::max(denseWs, sparseWs));
  check(cudaDeviceSynchronize(), "filling the inputs");

  std::vector<BenchRow> rows;
  for (bool dense : {true, false}) {
    PagedAttentionArgs args;
    args.kvType = shape.type;
    args.kScale = scales.as<float>();
    args.vScale = scales.as<float>();
    args.batch = B;
    args.numKVHeads = H;
    args.group = G;
    args.headDim = D;
    args.pageSize = P;
    args.numPages = static_cast<int>(numPages);
    args.scale = 1.0f / std::sqrt(static_cast<float>(D));
    args.seqLen = seqLen.as<int32_t>();
    args.listsPerSequence = dense;
    args.maxEntries = dense ? blocksPerSeq : selected;
    args.workspace = workspace.as<void>();
    args.workspaceBytes = workspace.bytes();
    auto run = [&](int i) {
      const InputSet &in = inputs[i % sets];
      args.kPool = in.k.as<void>();
      args.vPool = in.v.as<void>();
      args.q = in.q.as<void>();
      args.out = in.out.as<void>();
      args.indptr = (dense ? in.denseIndptr : in.sparseIndptr).as<int32_t>();
      args.count = dense ? nullptr : in.sparseCount.as<int32_t>();
      args.pages = (dense ? in.densePages : in.sparsePages).as<int32_t>();
      args.blocks = (dense ? in.denseBlocks : in.sparseBlocks).as<int32_t>();
      pagedDecodeAttention(args, nullptr);
    };
    BenchRow row;
    row.what = dense ? "dense_attention" : "sparse_attention";
    row.shape = shape;
    row.shape.selected = selected;
    // K and V of the attended tokens of every kv head, q and out, the lists
    // (page + block ids, indptr, counts), lengths, fp8 scales.
    const double kvTokens =
        static_cast<double>(B) * H * (dense ? shape.length : selected * P);
    const double lists = dense ? B : static_cast<double>(B) * H;
    const double entries = dense ? static_cast<double>(numPages)
                                 : static_cast<double>(B) * H * selected;
    row.bytes = 2.0 * kvTokens * D * s + 4.0 * qElems + 8.0 * entries +
                4.0 * (2 * lists + 1) + 4.0 * B +
                (shape.type == KVType::FP8E4M3 ? 8.0 * H : 0.0);
    row.splits = pagedDecodeSplits(B, H, G, D, shape.type, args.maxEntries);
    row.inputSets = sets;
    summarize(row, timeRuns(options, run));
    rows.push_back(row);
#ifdef VFLOW_BENCH_FLASHINFER
    rows.push_back(flashInferRow(
        row, dense, options, sets, inputs,
        [&] {
          run(0); // input set 0: the output the peer's is checked against
          check(cudaDeviceSynchronize(), "vflow's output");
          return downloadBf16(inputs[0].out, qElems);
        }(),
        dense ? denseIndptrHost : sparseIndptrHost));
#endif
  }
  return rows;
}

} // namespace bench
} // namespace vflow
