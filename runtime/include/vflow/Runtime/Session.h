//===- Session.h - A compiled flow attached to a paged KV cache -*- C++ -*-===//
//
// The runtime's one session API, for every backend: load an artifact
// (Artifact.h), open a Session for one of its flows on a device, add
// sequences, append their K/V (the flow's cache stage fills its fields as
// blocks complete), and run decode steps: per layer, the index stage
// selects blocks per (sequence, KV head), sparse attention runs over them
// (plus the kept first and last blocks and the partial last block), and
// the per-block attention mass is kept for the next step.
//
//   rt::Artifact a = rt::loadArtifact("quest.vfa");
//   rt::SessionConfig cfg;
//   cfg.device = rt::Device::Cpu;      // or Device::Cuda
//   cfg.numLayers = 2; cfg.numKVHeads = 8; cfg.group = 4; cfg.headDim = 128;
//   cfg.numPages = 4096;
//   auto s = rt::openSession(*a.findFlow("quest"), cfg);
//   rt::SeqId seq = s->addSequence();
//   s->append(seq, promptLen, k, v);  // f32 [n, layers, kvHeads, headDim]
//   // each decode step: the new token's K/V, then every layer in order
//   s->append(seq, 1, kNew, vNew);
//   for (int l = 0; l < 2; ++l)
//     s->decode(l, {seq}, q, out);    // f32 [1, kvHeads * group, headDim]
//   // or layer by layer as a model runs (tensors on the session's device)
//   for (int l = 0; l < 2; ++l) {
//     s->append(l, {seq}, {1}, kl, vl); // [1, kvHeads, headDim]
//     s->decode(l, {seq}, ql, outl);
//   }
//
// Contract: decode(layer, seqs, ...) computes attention for each
// sequence's newest token; a decode step calls it for layers 0, 1, ... in
// order after the step's append. Sequences may join (addSequence, fork) and
// leave (release) between any two steps. The CPU backend (HostSession)
// runs the flow's generated C++ on a host PagedKVCache; the CUDA backend
// (rt::cuda::CudaSession, through openSession) runs its CUDA kernels on
// device pools. openSession lives in the VFlowSessions library, which links
// the GPU runtime when the build has it.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_SESSION_H
#define VFLOW_RUNTIME_SESSION_H

#include "vflow/Runtime/Artifact.h"
#include "vflow/Runtime/Attention.h"
#include "vflow/Runtime/CpuFlow.h"
#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/PagedKVCache.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace vflow::rt {

enum class Device { Cpu, Cuda };

/// Memory the caller owns that a session reads or writes in place: dense,
/// row-major, of element type `dtype`, on `device` (the shape is implied by
/// the call). The CPU backend takes host f32, bf16 or f16; the CUDA backend
/// takes device bf16 (zero copy, on the caller's stream) or host f32.
struct Tensor {
  void *data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::Cpu;

  static Tensor host(const float *data) {
    return {const_cast<float *>(data), DType::F32, Device::Cpu};
  }
};

/// How the CUDA backend launches a flow's kernels; the defaults are the
/// measured rules (docs/gpu.md). Set for measurements and tests (the bench
/// and the profiling tools read them from the environment at their edge).
struct GpuLaunchOptions {
  /// The first index kernel's appending twin (the step's append folded into
  /// it): Auto where its grid runs in one wave, Never (the append kernel on
  /// its own, e.g. for per-kernel profiles), Always where the twin exists.
  enum class Fuse { Auto, Never, Always } fusedAppend = Fuse::Auto;
  /// Tile kernels' CTAs take TILE / tileSplit blocks: 0 for the rule (split
  /// while the grid, doubled, still runs in one wave), n to force n.
  int tileSplit = 0;
};

struct SessionConfig {
  Device device = Device::Cpu;
  int numLayers = 1;
  int numKVHeads = 0;
  /// Query heads per KV head.
  int group = 0;
  int headDim = 0;
  /// Pages in the KV cache, per layer (each holds the flow's block_size
  /// tokens).
  int64_t numPages = 0;
  /// K/V storage: f32, bf16, f16, int8, fp8e4m3 or fp8e5m2 on the CPU;
  /// bf16, f16, fp8e4m3 or int8 on the GPU. The 8-bit ones keep a scale per
  /// stored (token, KV head) row (NumericRules' scaled 8-bit KV), the same
  /// on both.
  DType kvDType = DType::BF16;
  /// The softmax scale; 0 means 1/sqrt(headDim).
  float scale = 0;
  /// V is K: the cache keeps one row a token that attention reads as both
  /// (multi-head latent attention's latent rows); appends' v is not read.
  /// On the GPU: bf16, one KV head, rows of at most 1024, any group, no
  /// windows and no flows that evict (the latent kernels, LatentAttention.cu).
  bool valuesAreKeys = false;
  /// The model's index of the session's first KV head: a tensor-parallel
  /// rank holds KV heads [firstKVHead, firstKVHead + numKVHeads) of the
  /// model (the input `kv_head` of a flow is the model's index).
  int firstKVHead = 0;
  /// The GPU's fixed buffers: live sequences, rows of one decode step and
  /// blocks one sequence may reach (0: 64, 64, numPages).
  int maxSequences = 0, maxBatch = 0;
  int64_t maxBlocksPerSeq = 0;
  /// Where JIT-compiled code is cached (empty: the default, HostJit.h), and
  /// no "compiling ..." messages.
  std::string cacheDir;
  bool quiet = false;
  /// Keep the selection and count the blocks attended (stats()). On the
  /// GPU this costs two small copies and a small kernel per decode; a
  /// benchmark of the bare step turns it off.
  bool telemetry = true;
  /// Measure how much of dense attention's softmax mass each sparse
  /// layer's decode attends (stats().massRecallSum): per sequence and
  /// query head, the dense mass of the attended tokens. It runs dense
  /// attention a second time at every sparse layer (for evaluation, not
  /// serving).
  bool massRecall = false;
  /// SnapKV's observation window: after a prefill, a flow's `mass` at the
  /// first decode step is the mean over the prompt's last observeTokens
  /// rows (of that prefill call, at most all of them) of the softmax mass
  /// each query head paid to each block; 0: nothing (mass starts at 0).
  int observeTokens = 0;
  /// CUDA: size every decode's launches for maxBlocksPerSeq, so that a
  /// captured decode (CUDA graph) replays at any length; and time each
  /// kernel of the last decode (lastProfile()).
  bool graphSafe = false, profile = false;
  /// Layers [0, denseLayers) attend every block at decode (no index stage:
  /// the early layers a sparse model keeps dense). With denseLayers >=
  /// numLayers the session is dense everywhere and the flow's code is not
  /// compiled (denseFlow() is the flow of such a session).
  int denseLayers = 0;
  /// Per layer, a sliding window (tokens a decode or prefill row attends,
  /// its own included; 0 or absent: every token), as Mistral's and Gemma's
  /// local layers have. A windowed layer attends its window densely (the
  /// flow does not run there). CPU backend only for now.
  std::vector<int64_t> slidingWindow;
  /// The CPU backend's host compiler and flags (HostJit.h).
  HostJitOptions jit;
  /// The CUDA backend's launch choices (measurements and tests).
  GpuLaunchOptions launch;
};

/// The flow of a session without a selection: `blockSize` tokens per
/// block, no fields or states, nothing kept; open it with denseLayers >=
/// numLayers (the dense baseline of the same runtime).
FlowArtifact denseFlow(int64_t blockSize);

/// What a session of `numLayers` layers keeps of `flow`: all of it, or,
/// when every layer is dense (denseLayers >= numLayers: nothing of the flow
/// runs), its block size and kept blocks without fields or states. Every
/// backend builds its cache from this.
FlowArtifact sessionFlow(const FlowArtifact &flow, int denseLayers,
                         int numLayers);

/// What a decode step captured in a CUDA graph depends on besides device
/// memory (Session::beginStep): every launch of the step is sized from it,
/// so a graph captured after a beginStep that returned an equal key
/// replays correctly. With SessionConfig::graphSafe it changes only with
/// the rows, when the selection starts or stops taking every block, and
/// when the longest list passes a power of two.
struct StepKey {
  int64_t rows = 0;         ///< the step's rows, padding included
  int64_t gridBlocks = 0;   ///< blocks the index stage's grids cover
  int64_t maxEntries = 0;   ///< the longest list attention is planned for
  int64_t denseEntries = 0; ///< the longest list of a dense layer
  bool everyBlock = false;  ///< the selection takes every block (no scores)

  bool operator==(const StepKey &o) const {
    return rows == o.rows && gridBlocks == o.gridBlocks &&
           maxEntries == o.maxEntries && denseEntries == o.denseEntries &&
           everyBlock == o.everyBlock;
  }
  bool operator!=(const StepKey &o) const { return !(*this == o); }
};

struct StepKeyHash {
  size_t operator()(const StepKey &k) const {
    size_t h = 0;
    for (int64_t v : {k.rows, k.gridBlocks, k.maxEntries, k.denseEntries,
                      int64_t(k.everyBlock)})
      h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};

/// What the session did so far (the decode steps since it was opened).
struct SessionStats {
  int64_t decodes = 0;         ///< decode() calls
  int64_t listsAttended = 0;   ///< (sequence, KV head) block lists
  int64_t blocksAttended = 0;  ///< blocks those lists attended
  int64_t blocksAvailable = 0; ///< blocks the sequences had then
  /// Bytes the indexer and attention read (fields of every complete
  /// block, K and V of the attended blocks), as the byte model of
  /// lab/records/perf counts them.
  double bytesRead = 0;
  /// Host milliseconds: the cache stage (fields of completed blocks), the
  /// index stage and attention. The GPU backend reports its step time as
  /// attention time.
  double cacheStageMs = 0, indexMs = 0, attendMs = 0;
  /// With SessionConfig::massRecall, per layer and query head
  /// ([numLayers][numKVHeads * group], query head h reads KV head h /
  /// group): the sum over sparse decodes of the share of dense attention's
  /// softmax mass on the tokens the decode attended; and per layer how many
  /// (sequence, decode) samples the sums hold (0 for dense layers). Mean
  /// recall = sum / count. Empty without massRecall.
  std::vector<double> massRecallSum;
  std::vector<int64_t> massRecallCount;
  /// A flow's retain block: complete blocks it evicted, and the pages that
  /// returned to the pool then (a page another sequence shares stays).
  int64_t blocksEvicted = 0, pagesReclaimed = 0;
  /// Tokens evicted from the session's sequences in all (retain blocks,
  /// evict and evictTokens): what position() counts beyond length().
  int64_t tokensEvicted = 0;
};

/// What the decodes of one sequence attended (SessionStats' counts, for it
/// alone, since it was added), and the complete blocks its flow's retain
/// block evicted (counted with or without telemetry).
struct SequenceStats {
  int64_t listsAttended = 0, blocksAttended = 0, blocksAvailable = 0;
  int64_t blocksEvicted = 0, tokensEvicted = 0;
};

class Session {
public:
  virtual ~Session();

  virtual const FlowArtifact &flow() const = 0;
  virtual const SessionConfig &config() const = 0;

  virtual SeqId addSequence() = 0;
  /// A new sequence sharing `parent`'s tokens (pages and their cache fields
  /// shared, copy on write of a partial tail) with a copy of its states and
  /// attention mass.
  virtual SeqId fork(SeqId parent) = 0;
  /// A new sequence sharing `parent`'s first `tokens` tokens (their pages
  /// and cache fields; a whole number of blocks, or all of `parent`) with
  /// states of its own at their initial values and no attention mass: what
  /// a sequence that appended the same prefix itself would hold (a prefix
  /// cache hit).
  virtual SeqId sharePrefix(SeqId parent, int64_t tokens) = 0;
  /// Releases a sequence: its pages go back to the pool.
  virtual void release(SeqId seq) = 0;
  /// Evicts whole complete blocks of `seq` (logical ids, strictly
  /// increasing; PageTable::evict): their pages return to the pool unless
  /// another sequence (a fork, a prefix sharer) still holds them, the
  /// later blocks move down, and the flow's per-block states and the
  /// attention mass lose the evicted blocks' rows (what the index stage
  /// sees is the kept blocks, in order). K keeps its rotation: a model's
  /// next token is at position(seq). Throws Error, changing nothing, for
  /// bad ids.
  virtual void evict(SeqId seq, const std::vector<int64_t> &blocks) = 0;
  /// Evicts single tokens of `seq` (logical token indices, strictly
  /// increasing, in complete blocks; not mid-step) and compacts the rest:
  /// the kept tokens move down in order into the fewest pages (a page
  /// another sequence shares is copied, never rewritten under it), the
  /// pages left empty return to the pool, the rewritten blocks' fields are
  /// computed again and their per-block states and attention mass start
  /// over; earlier blocks are untouched. Each token keeps its rotation and
  /// original position (originalPosition). Throws Error, changing nothing,
  /// for bad input or too few free pages. On the GPU: a gather and a
  /// scatter kernel per chunk of moves (DeviceKVCache::evictTokens).
  virtual void evictTokens(SeqId seq, const std::vector<int64_t> &tokens) = 0;
  /// The position logical token `token` of `seq` had before any eviction.
  virtual int64_t originalPosition(SeqId seq, int64_t token) const = 0;
  /// The position of `seq`'s next token as the model counts it: its length
  /// plus the tokens it evicted.
  virtual int64_t position(SeqId seq) const = 0;
  virtual int64_t length(SeqId seq) const = 0;
  /// The index block `block` of `seq` had before any eviction (its first
  /// token's original position is that times the block size); a block
  /// list of a decode, read before the next eviction, maps through it.
  virtual int64_t originalBlock(SeqId seq, int64_t block) const = 0;
  /// The complete blocks a sequence keeps at most once its flow's retain
  /// block evicts (its capacity, or the kept first and last blocks when
  /// they are more); -1 when nothing is evicted (no retain block, or every
  /// layer dense).
  virtual int64_t retainedBlocks() const { return -1; }
  /// Pages of the pool (per layer) no sequence holds.
  virtual int64_t freePages() const = 0;
  /// Pages of the pool `seq` takes to grow by `tokens` tokens: new blocks,
  /// and a copy of a partial tail it shares (copy on write).
  virtual int64_t pagesNeeded(SeqId seq, int64_t tokens) const = 0;

  /// Appends `n` tokens to `seq` in every layer: k and v are f32
  /// [n, numLayers, numKVHeads, headDim]. Completed blocks get their fields.
  /// An exhausted pool is an Error that leaves every sequence as it was.
  virtual void append(SeqId seq, int64_t n, const float *k, const float *v) = 0;
  /// The same for several sequences in one call: counts[i] tokens of
  /// seqs[i], concatenated in k and v. The pool is checked for all of them
  /// before any is changed.
  virtual void append(const std::vector<SeqId> &seqs,
                      const std::vector<int64_t> &counts, const float *k,
                      const float *v);
  /// Layer by layer, as a model computes K/V: stores the K/V of `layer` for
  /// the next counts[i] tokens of seqs[i] (k and v [sum(counts),
  /// numKVHeads, headDim], sequences in order). The first layer to write
  /// past a sequence's length grows it (the pool is checked for every
  /// sequence first: an Error changes none); the other layers fill the
  /// same positions. A decode at a layer needs that layer written up to
  /// the length. `stream` is the caller's CUDA stream (nullptr: the
  /// default stream) for device tensors.
  virtual void append(int layer, const std::vector<SeqId> &seqs,
                      const std::vector<int64_t> &counts, const Tensor &k,
                      const Tensor &v, void *stream = nullptr) = 0;

  /// One decode step at `layer` for `seqs` (each has at least one token,
  /// written at this layer): q and out are [seqs.size(), numKVHeads *
  /// group, headDim]. On the CUDA backend with device tensors nothing waits
  /// for the device: the work is queued on `stream`.
  virtual void decode(int layer, const std::vector<SeqId> &seqs,
                      const Tensor &q, const Tensor &out,
                      void *stream = nullptr) = 0;
  /// The same on host f32 arrays.
  void decode(int layer, const std::vector<SeqId> &seqs, const float *q,
              float *out) {
    decode(layer, seqs, Tensor::host(q), Tensor::host(out));
  }
  /// Prefill attention at `layer`: each of seqs[i]'s last counts[i]
  /// tokens (written at this layer) attends every token at or before its
  /// own position, densely (causal). q and out are [sum(counts),
  /// numKVHeads * group, headDim], sequences in order; device tensors on
  /// the CUDA backend (nothing waits for the device). The attention mass a
  /// flow reads is not changed (setAttentionMass sets it).
  virtual void prefill(int layer, const std::vector<SeqId> &seqs,
                       const std::vector<int64_t> &counts, const Tensor &q,
                       const Tensor &out, void *stream = nullptr) = 0;

  /// A decode step as one unit: how a model decodes (eagerly, replayed
  /// from a CUDA graph, or beside prefill rows in a mixed step). beginStep
  /// (host work: checks, the step's plan uploaded on `stream`) returns the
  /// step's key (StepKey: a graph captured after a beginStep that returned
  /// an equal key replays correctly). stepLayer, layers in order on the
  /// same stream, appends the step's token (k, v [rows, numKVHeads,
  /// headDim]) at `layer` and attends q -> out: on the CUDA backend device
  /// work only, capturable (with SessionConfig::graphSafe, a capture serves
  /// every length up to maxBlocksPerSeq). endStep closes the step. `rows`
  /// (0: seqs.size()) pads the step to that many rows, at most maxBatch:
  /// q, k, v and out carry `rows` rows, the padding rows (after the
  /// sequences') are neither read nor written into the cache and their
  /// outputs are unspecified. Sequences grow by the step's token at
  /// beginStep on the CUDA backend, at stepLayer(0) on the CPU.
  virtual StepKey beginStep(const std::vector<SeqId> &seqs, int64_t rows,
                            void *stream = nullptr) = 0;
  StepKey beginStep(const std::vector<SeqId> &seqs) {
    return beginStep(seqs, 0);
  }
  virtual void stepLayer(int layer, const Tensor &q, const Tensor &k,
                         const Tensor &v, const Tensor &out,
                         void *stream = nullptr) = 0;
  virtual void endStep() = 0;

  /// What the last decode(layer) attended: per sequence of that call and
  /// KV head, the logical blocks (ascending); and the same blocks as
  /// physical page ids (the sparse block table attention read). On the
  /// CUDA backend this waits for that decode.
  virtual std::vector<BlockLists> selection(int layer) const = 0;
  virtual std::vector<BlockLists> selectedPages(int layer) const = 0;

  /// Sets the attention mass the index stage of `seq` reads at its next
  /// decode at `layer` ([numKVHeads, numBlocks, group], numBlocks at most
  /// the sequence's blocks): e.g. what prefill's last queries paid to each
  /// block. decode() sets it itself from each step's attention.
  virtual void setAttentionMass(SeqId seq, int layer,
                                const std::vector<float> &mass) = 0;

  /// Run-time params (budget, alpha, ...): no recompile (Params.h).
  virtual void setParam(const std::string &name, double value) = 0;
  virtual double param(const std::string &name) const = 0;
  /// The number of blocks the flow selects for `seq` now (kept and partial
  /// blocks excluded), as the host planner computes it.
  virtual int64_t budget(SeqId seq) const = 0;

  virtual SessionStats stats() const = 0;
  /// `seq`'s decodes so far (with SessionConfig::telemetry; zeros
  /// without). On the CUDA backend this waits for the device.
  virtual SequenceStats sequenceStats(SeqId seq) const = 0;
  /// With `profile` on the CUDA backend: each kernel of the last decode and
  /// its milliseconds (waits for it); empty elsewhere.
  virtual std::vector<std::pair<std::string, float>> lastProfile() const {
    return {};
  }
};

/// Throws Error("<what>: ...") when `counts` (if given) does not match
/// `seqs` in size, a count is negative or a sequence appears twice;
/// returns the sum of the counts (0 without them).
int64_t checkStepArgs(const char *what, const std::vector<SeqId> &seqs,
                      const std::vector<int64_t> *counts);
/// Throws Error("<what>: layer L is out of range [0, numLayers)").
void checkLayer(const char *what, int layer, int numLayers);
/// A call's rows checked against its page table the same way on every
/// backend (each Error starts with `what`): checkStepArgs; each sequence
/// known; with `counts`, each at most its sequence's length (query rows of
/// a prefill); `layer` (-1: each of the `numLayers` layers) holding the K/V
/// of all its tokens; with `needTokens`, at least one token. Returns the
/// sum of the counts.
int64_t checkRowsWritten(const char *what, const PageTable &table, int layer,
                         int numLayers, const std::vector<SeqId> &seqs,
                         const std::vector<int64_t> *counts, bool needTokens);
/// The Error for a param of a session dense at every layer (it has none).
Error noParams(const std::string &name);
/// Throws Error for a negative SessionConfig::denseLayers.
void checkDenseLayers(const SessionConfig &cfg);
/// A flow with a retain block is refused beside sliding-window layers (its
/// evictions would take tokens out of their windows): both backends.
void checkRetainWithWindows(const FlowArtifact &flow, const SessionConfig &cfg,
                            bool runsFlow);
/// Where a session's index stage runs (the budgets' scope, Budget.h): its
/// group, its sparse layers [denseLayers, numLayers) and its KV heads from
/// firstKVHead. Throws Error for a negative firstKVHead.
BudgetScope budgetScope(const SessionConfig &cfg);
/// Throws the exhaustion Error ("KV cache exhausted: <what> N sequences
/// needs ...") when `needed` pages are more than `free`.
void checkPool(const char *what, size_t sequences, int64_t needed,
               int64_t free);

/// Opens a session of `flow` on `config.device`. Throws Error when the flow
/// cannot run with this config (a head_dim it is specialized to, a shape
/// the device does not support, a device this build does not have).
std::unique_ptr<Session> openSession(const FlowArtifact &flow,
                                     const SessionConfig &config);

/// What the CPU backend needs to know about a flow, from its artifact.
CpuFlowInfo cpuFlowInfo(const FlowArtifact &flow);

/// The CPU backend: the flow's generated C++ (compiled once by the host
/// compiler and cached) on a host PagedKVCache.
class HostSession : public Session {
public:
  HostSession(const FlowArtifact &flow, const SessionConfig &config);
  ~HostSession() override;
  HostSession(const HostSession &) = delete;
  HostSession &operator=(const HostSession &) = delete;

  const FlowArtifact &flow() const override { return artifact; }
  const SessionConfig &config() const override { return cfg; }
  SeqId addSequence() override;
  SeqId fork(SeqId parent) override;
  SeqId sharePrefix(SeqId parent, int64_t tokens) override;
  void release(SeqId seq) override;
  void evict(SeqId seq, const std::vector<int64_t> &blocks) override;
  void evictTokens(SeqId seq, const std::vector<int64_t> &tokens) override;
  int64_t originalPosition(SeqId seq, int64_t token) const override {
    return kv->pageTable().originalPosition(seq, token);
  }
  int64_t position(SeqId seq) const override {
    return kv->length(seq) + kv->pageTable().evictedTokens(seq);
  }
  int64_t length(SeqId seq) const override { return kv->length(seq); }
  int64_t originalBlock(SeqId seq, int64_t block) const override {
    return kv->pageTable().originalBlock(seq, block);
  }
  int64_t retainedBlocks() const override;
  int64_t freePages() const override { return kv->blockManager().numFree(); }
  int64_t pagesNeeded(SeqId seq, int64_t tokens) const override {
    kv->length(seq); // an unknown sequence is an Error
    return kv->pagesNeeded(seq, tokens);
  }
  void append(SeqId seq, int64_t n, const float *k, const float *v) override;
  void append(const std::vector<SeqId> &seqs,
              const std::vector<int64_t> &counts, const float *k,
              const float *v) override;
  void append(int layer, const std::vector<SeqId> &seqs,
              const std::vector<int64_t> &counts, const Tensor &k,
              const Tensor &v, void *stream = nullptr) override;
  using Session::decode;
  void decode(int layer, const std::vector<SeqId> &seqs, const Tensor &q,
              const Tensor &out, void *stream = nullptr) override;
  void prefill(int layer, const std::vector<SeqId> &seqs,
               const std::vector<int64_t> &counts, const Tensor &q,
               const Tensor &out, void *stream = nullptr) override;
  using Session::beginStep;
  StepKey beginStep(const std::vector<SeqId> &seqs, int64_t rows,
                    void *stream = nullptr) override;
  void stepLayer(int layer, const Tensor &q, const Tensor &k, const Tensor &v,
                 const Tensor &out, void *stream = nullptr) override;
  void endStep() override { stepRows.clear(); }
  std::vector<BlockLists> selection(int layer) const override;
  std::vector<BlockLists> selectedPages(int layer) const override;
  void setAttentionMass(SeqId seq, int layer,
                        const std::vector<float> &mass) override;
  void setParam(const std::string &name, double value) override;
  double param(const std::string &name) const override;
  int64_t budget(SeqId seq) const override;
  SessionStats stats() const override { return counters; }
  SequenceStats sequenceStats(SeqId seq) const override;

  /// The attention mass of `seq`'s last step at `layer`
  /// ([numKVHeads, numBlocks then, group]); empty before the first step.
  std::vector<float> attentionMass(SeqId seq, int layer) const;
  /// Decode steps run for `seq` at `layer`.
  int64_t steps(SeqId seq, int layer) const;
  /// The host cache and the compiled flow, for tests and tools.
  PagedKVCache &cache() { return *kv; }
  const CpuFlow &cpuFlow() const { return *cpu; }

private:
  void computeFields(int layer, PageId page, int kvHead);
  struct LayerHistory;
  /// decode()'s checks of its layer and rows, before anything runs.
  void checkDecodeRows(int layer, const std::vector<SeqId> &seqs) const;
  /// The index stage of `seq` at `layer` for KV head `kh` (q: the row's
  /// queries): the selected complete blocks; states updated.
  std::vector<int64_t> indexHead(SeqId seq, int layer, int kh, const float *q,
                                 LayerHistory &hist,
                                 float *retainScore = nullptr);
  /// The retain block at a flow layer of `seq`'s step: folds the KV
  /// heads' scores (`count` each: the complete blocks, or their tokens)
  /// into the step's (LayerHistory::retain).
  void addRetainScores(LayerHistory &hist, const std::vector<float> &heads,
                       int64_t count);
  /// After the step's last layer: keeps the capacity's best complete
  /// blocks by the combined score and evicts the rest.
  void applyRetain(SeqId seq, LayerHistory &hist);
  /// massRecall: the share of dense attention's mass `blocks` hold.
  void addMassRecall(SeqId seq, int layer, const float *q,
                     const BlockLists &blocks);
  /// Counts `blocks` in the stats; the physical pages they are.
  BlockLists countAttended(SeqId seq, const BlockLists &blocks);

  FlowArtifact artifact;
  SessionConfig cfg;
  std::unique_ptr<CpuFlow> cpu;
  std::unique_ptr<PagedKVCache> kv;
  /// Per sequence and layer: the attention mass of the last step
  /// ([numKVHeads, numBlocks, group]) and the number of steps run.
  struct LayerHistory {
    std::vector<std::vector<float>> mass;
    std::vector<int64_t> steps;
    /// The retain block's score of this step, combined over the KV heads
    /// and flow layers so far (empty: not over capacity).
    std::vector<float> retain;
  };
  std::map<SeqId, LayerHistory> history;
  /// The rows of the step beginStep opened.
  std::vector<SeqId> stepRows;
  /// The last decode per layer: its block lists, logical and physical.
  std::vector<std::vector<BlockLists>> lastBlocks, lastPages;
  std::map<SeqId, SequenceStats> perSequence;
  SessionStats counters;
};

} // namespace vflow::rt

#endif // VFLOW_RUNTIME_SESSION_H
