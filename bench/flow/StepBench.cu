//===- StepBench.cu - Whole decode steps of stock programs on the GPU -----===//
//
// vflow-bench-step --artifacts DIR [--programs quest,block_topk,h2o,eps]
//   [--batches 1,8,64] [--lengths 4096,32768,131072] [--dtypes bf16,fp8e4m3]
//   [--out rows.jsonl]
//
// For each program, KV dtype, batch and context length: a CUDA session of
// the one session API (rt::openSession; Llama-3.1-8B heads: 8 KV heads,
// group 4, head dim 128; one layer) is filled with random K/V on the
// device, decode steps (beginStep, stepLayer, endStep on device bf16
// tensors on one stream) are timed eagerly, and one step's layer (the
// token's fused append, index, attention) is captured in a CUDA graph and
// its replays timed with CUDA events (warm-up, median of 30). Rows are JSON
// lines (bench/README.md): decode_step with the bytes the step must move
// (PERFORMANCE.md: every block's fields plus the K/V of the attended blocks
// plus q/out), graph vs eager, and the NVRTC compile times of the session's
// kernels.
//
//===----------------------------------------------------------------------===//

#include "vflow/Runtime/Artifact.h"
#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Json.h"
#include "vflow/Runtime/Session.h"
#include "vflow/Runtime/cuda/Driver.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

using namespace vflow;
using namespace vflow::rt;

namespace {

/// The measurement knobs, read here at the bench's edge (the runtime takes
/// them as options): VFLOW_FUSED_APPEND=0|1 (the appending twin never or
/// wherever it exists), VFLOW_TILE_SPLIT=n (force the tile split),
/// VFLOW_PROGRAMMATIC_LAUNCH=0 (plain stream order, for per-kernel times).
GpuLaunchOptions launchFromEnvironment() {
  GpuLaunchOptions launch;
  if (const char *fuse = std::getenv("VFLOW_FUSED_APPEND"))
    launch.fusedAppend =
        std::string(fuse) == "0"   ? GpuLaunchOptions::Fuse::Never
        : std::string(fuse) == "1" ? GpuLaunchOptions::Fuse::Always
                                   : GpuLaunchOptions::Fuse::Auto;
  if (const char *split = std::getenv("VFLOW_TILE_SPLIT"))
    launch.tileSplit = std::max(0, std::atoi(split));
  if (const char *p = std::getenv("VFLOW_PROGRAMMATIC_LAUNCH"))
    vflow::rt::cuda::setProgrammaticLaunches(std::string(p) != "0");
  return launch;
}

#define CHECK(x)                                                               \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess)                                                     \
      throw Error(std::string(#x) + ": " + cudaGetErrorString(e_));            \
  } while (0)

/// Uniform-ish random bf16 in [-2, 2) from a counter hash (never zeros).
__global__ void fillRandom(unsigned short *out, long long n,
                           unsigned long long seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    unsigned long long x = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    float f = (float(x >> 40) / float(1ull << 24)) * 4.0f - 2.0f;
    unsigned int bits = __float_as_uint(f);
    out[i] = (unsigned short)((bits + 0x7FFFu + ((bits >> 16) & 1)) >> 16);
  }
}

void random(void *p, long long n, unsigned long long seed) {
  fillRandom<<<1024, 256>>>(static_cast<unsigned short *>(p), n, seed);
  CHECK(cudaGetLastError());
}

std::vector<std::string> split(const std::string &s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty())
      out.push_back(item);
  return out;
}

struct Device {
  void *p = nullptr;
  explicit Device(size_t bytes) { CHECK(cudaMalloc(&p, bytes)); }
  ~Device() { cudaFree(p); }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Options {
  std::string artifacts = "gpu-artifacts", out;
  std::vector<std::string> programs = {"quest", "block_topk", "h2o", "eps",
                                       "dense"};
  std::vector<DType> dtypes = {DType::BF16, DType::FP8E4M3};
  std::vector<int> batches = {1, 8, 64};
  std::vector<int64_t> lengths = {4096, 32768, 131072};
};

FILE *rowsOut = nullptr;

/// `v` rounded to `decimals` places: rows keep the precision that means
/// something (the JSON writer prints the shortest text of the result).
double rounded(double v, int decimals) {
  double scale = std::pow(10.0, decimals);
  return std::round(v * scale) / scale;
}

/// A row of bench/README.md's schema: source, what and program first, then
/// `members` in their order.
Json row(const std::string &what, const std::string &program,
         std::initializer_list<std::pair<const char *, Json>> members = {}) {
  Json r = Json::object();
  r.set("source", "vflow");
  r.set("what", what);
  r.set("program", program);
  for (const auto &[key, value] : members)
    r.set(key, value);
  return r;
}

/// Prints a row as one JSON line (and writes it to --out).
void emit(const Json &row) {
  std::string line = row.dump();
  std::printf("%s\n", line.c_str());
  if (rowsOut)
    std::fprintf(rowsOut, "%s\n", line.c_str());
  std::fflush(stdout);
}

/// A quiet CUDA session of one layer of H KV heads with G query heads each
/// and head dim D: `numPages` pages, `rows` sequences decoded together, up
/// to `maxBlocksPerSeq` blocks each; no telemetry (it would be timed too).
SessionConfig sessionConfig(int H, int G, int D, int64_t numPages, int rows,
                            int64_t maxBlocksPerSeq) {
  SessionConfig cfg;
  cfg.device = rt::Device::Cuda;
  cfg.numLayers = 1;
  cfg.numKVHeads = H;
  cfg.group = G;
  cfg.headDim = D;
  cfg.numPages = numPages;
  cfg.maxSequences = cfg.maxBatch = rows;
  cfg.maxBlocksPerSeq = maxBlocksPerSeq;
  cfg.quiet = true;
  cfg.telemetry = false;
  return cfg;
}

/// A device bf16 tensor for the session API.
Tensor onDevice(void *p) { return {p, DType::BF16, rt::Device::Cuda}; }

/// Milliseconds of each of `iterations` runs of `launch` on `stream`
/// (timed with the events `start` and `stop`), the first `warmup` dropped.
template <typename Launch>
std::vector<double> timeLaunches(cudaStream_t stream, cudaEvent_t start,
                                 cudaEvent_t stop, int iterations, int warmup,
                                 Launch launch) {
  std::vector<double> times;
  for (int i = 0; i < iterations; ++i) {
    CHECK(cudaEventRecord(start, stream));
    launch();
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i >= warmup)
      times.push_back(ms);
  }
  return times;
}

/// The name of a KV dtype in the rows (bench/README.md): bf16, f16 or fp8.
const char *rowDType(DType kv) {
  return kv == DType::FP8E4M3 ? "fp8" : dtypeName(kv);
}

void benchOne(const FlowArtifact &flow, DType dtype, int B, int64_t L) {
  const int H = 8, G = 4, D = 128;
  const int64_t P = flow.blockSize;
  const int64_t blocks = (L + 64 + P - 1) / P;
  const size_t kvElem = bytesPerElement(dtype);
  double kvGB = double(B) * blocks * P * H * D * 2 * kvElem / 1e9;
  if (kvGB > 60) {
    std::fprintf(stderr, "skip %s %s B=%d L=%lld: %.0f GB of KV\n",
                 flow.name.c_str(), dtypeName(dtype), B, (long long)L, kvGB);
    return;
  }
  SessionConfig cfg = sessionConfig(H, G, D, B * blocks, B, blocks);
  cfg.kvDType = dtype;
  cfg.graphSafe = true;
  cfg.profile = std::getenv("VFLOW_PROFILE") != nullptr;
  cfg.launch = launchFromEnvironment();
  std::unique_ptr<Session> s = openSession(flow, cfg);
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Prefill L - 20 random tokens per sequence, in chunks: the timed steps'
  // tokens then land mid-block (a typical step; the fields of a block are
  // computed once every P steps, when its last token arrives).
  const int64_t chunk = 8192, prompt = L - 20;
  Device k(size_t(chunk) * H * D * 2), v(size_t(chunk) * H * D * 2);
  std::vector<SeqId> seqs;
  unsigned long long seed = 1;
  for (int b = 0; b < B; ++b) {
    seqs.push_back(s->addSequence());
    for (int64_t done = 0; done < prompt; done += chunk) {
      int64_t n = std::min(chunk, prompt - done);
      random(k.p, n * H * D, seed++ * 1000003);
      random(v.p, n * H * D, seed++ * 1000003);
      s->append(0, {seqs.back()}, {n}, onDevice(k.p), onDevice(v.p), stream);
      CHECK(cudaStreamSynchronize(stream)); // k and v are drawn again
    }
  }
  const size_t qElems = size_t(B) * H * G * D, kvElems = size_t(B) * H * D;
  Device q(qElems * 2), out(qElems * 2), out2(qElems * 2), kn(kvElems * 2),
      vn(kvElems * 2);
  random(q.p, qElems, 77);
  random(kn.p, kvElems, 78);
  random(vn.p, kvElems, 79);
  auto layer = [&](void *o) {
    s->stepLayer(0, onDevice(q.p), onDevice(kn.p), onDevice(vn.p), onDevice(o),
                 stream);
  };
  auto decodeStep = [&](void *o) {
    s->beginStep(seqs, 0, stream);
    layer(o);
    s->endStep();
  };

  // Eager steps (host work included), then one step's layer captured and
  // replayed.
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<double> eager =
      timeLaunches(stream, start, stop, 13, 3, [&] { decodeStep(out.p); });
  auto attended = s->selection(0);
  if (cfg.profile) {
    std::string line = "profile " + flow.name + " B=" + std::to_string(B) +
                       " L=" + std::to_string(L) + " " + dtypeName(dtype) + ":";
    char buf[96];
    for (const auto &[name, ms] : s->lastProfile()) {
      std::snprintf(buf, sizeof(buf), " %s %.4f", name.c_str(), ms);
      line += buf;
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  // The captured step: beginStep grows the sequences and uploads the plan;
  // the layer (fused append, index, attention) is what the graph holds.
  s->beginStep(seqs, 0, stream);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  layer(out2.p);
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<double> replay = timeLaunches(stream, start, stop, 35, 5, [&] {
    CHECK(cudaGraphLaunch(exec, stream));
  });
  // The same layer run eagerly in the same step: the same outputs, but for
  // flows whose states move on every run (H2O's accumulated mass).
  layer(out.p);
  s->endStep();
  CHECK(cudaStreamSynchronize(stream));
  std::vector<unsigned short> a(qElems), b2(qElems);
  CHECK(cudaMemcpy(a.data(), out.p, qElems * 2, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(b2.data(), out2.p, qElems * 2, cudaMemcpyDeviceToHost));
  bool identical = a == b2;
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaStreamDestroy(stream));

  // Bytes: every complete block's fields, the attended K/V, q and out.
  double fieldBytes = 0;
  for (const ArtifactTensor &f : flow.fields)
    fieldBytes += double(f.elements(D, G)) * bytesPerElement(f.dtype);
  double bytes = 0, attendedBlocks = 0;
  for (int b = 0; b < B; ++b) {
    bytes += double(L / P) * H * fieldBytes;
    for (int h = 0; h < H; ++h)
      attendedBlocks += attended[b][h].size();
  }
  bytes += attendedBlocks * P * D * 2 * kvElem;
  // Flows with history: the index reads last step's mass, attention writes
  // this step's, and it moves to the sequence's slot (read, write, zero);
  // per-block states are read, written, and committed (read + write).
  const double lists = double(B) * H, blocksPerList = double(L / P);
  if (flow.readsInput("mass"))
    bytes += lists * blocksPerList * G * 4 * 4 + attendedBlocks * G * 4;
  for (const ArtifactTensor &st : flow.states)
    bytes +=
        lists * (st.perBlock ? blocksPerList : 1) * st.elements(D, G) * 4 * 4;
  bytes += double(qElems) * 2 * 2;
  double ms = median(replay);
  const char *kvName = rowDType(dtype);
  emit(row(
      "decode_step", flow.name,
      {{"B", B},
       {"L", L},
       {"Hkv", H},
       {"G", G},
       {"D", D},
       {"P", P},
       {"k", s->budget(seqs[0])},
       {"dtype", kvName},
       {"ms", rounded(ms, 5)},
       {"bytes", rounded(bytes, 0)},
       {"gbps", rounded(bytes / ms / 1e6, 1)},
       {"attended_blocks_per_list", rounded(attendedBlocks / (B * H), 1)}}));
  emit(row("graph_replay", flow.name,
           {{"B", B},
            {"L", L},
            {"dtype", kvName},
            {"ms", rounded(ms, 5)},
            {"eager_ms", rounded(median(eager), 5)},
            {"identical", identical}}));
}

void compileTimes(const FlowArtifact &flow) {
  std::string dir = "/tmp/vflow-bench-compile";
  std::filesystem::remove_all(dir);
  SessionConfig cfg = sessionConfig(8, 4, 128, 64, 1, 64);
  cfg.cacheDir = dir;
  for (const char *what : {"compile_cold", "compile_hit"}) {
    auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<Session> s = openSession(flow, cfg);
    double ms = std::chrono::duration<double, std::milli>(
                    std::chrono::steady_clock::now() - t0)
                    .count();
    emit(row(what, flow.name,
             {{"ms", rounded(ms, 2)},
              {"note", "session setup: NVRTC + module load + pools"}}));
  }
}

} // namespace

int main(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "vflow-bench-step: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--artifacts")
      o.artifacts = value();
    else if (a == "--programs")
      o.programs = split(value());
    else if (a == "--dtypes") {
      o.dtypes.clear();
      for (const std::string &x : split(value())) {
        std::optional<DType> t = parseDType(x);
        if (!t) {
          std::fprintf(stderr,
                       "vflow-bench-step: --dtypes: '%s' is not a "
                       "dtype (bf16, f16, fp8e4m3)\n",
                       x.c_str());
          return 2;
        }
        o.dtypes.push_back(*t);
      }
    } else if (a == "--out")
      o.out = value();
    else if (a == "--batches") {
      o.batches.clear();
      for (const std::string &x : split(value()))
        o.batches.push_back(std::stoi(x));
    } else if (a == "--lengths") {
      o.lengths.clear();
      for (const std::string &x : split(value()))
        o.lengths.push_back(std::stoll(x));
    } else {
      std::fprintf(stderr,
                   "usage: vflow-bench-step --artifacts DIR [--programs a,b] "
                   "[--batches 1,8] [--lengths 4096] [--dtypes bf16,fp8e4m3] "
                   "[--out rows.jsonl]\n");
      return 2;
    }
  }
  if (!o.out.empty())
    rowsOut = std::fopen(o.out.c_str(), "w");
  try {
    for (const std::string &name : o.programs) {
      Artifact artifact = loadArtifact(o.artifacts + "/" + name + ".vfa");
      const FlowArtifact &flow = artifact.flows.at(0);
      if (name == o.programs.front())
        compileTimes(flow);
      for (DType dtype : o.dtypes)
        for (int B : o.batches)
          for (int64_t L : o.lengths) {
            try {
              benchOne(flow, dtype, B, L);
            } catch (const std::exception &e) {
              std::fprintf(stderr, "%s %s B=%d L=%lld: %s\n", name.c_str(),
                           dtypeName(dtype), B, (long long)L, e.what());
              emit(row("decode_step", name,
                       {{"B", B},
                        {"L", L},
                        {"dtype", rowDType(dtype)},
                        {"error", "failed"}}));
            }
          }
    }
  } catch (const std::exception &e) {
    std::fprintf(stderr, "vflow-bench-step: %s\n", e.what());
    return 1;
  }
  if (rowsOut)
    std::fclose(rowsOut);
  return 0;
}
