//===- Artifact.h - Compiled flows on disk (.vfa) ----------------*- C++
//-*-===//
//
// An artifact is everything the runtime needs from the compiler: per flow,
// its params (compile-time and run-time), consts, cache fields and states
// with their dtypes and per-block shapes, the inputs its index stage reads,
// and the generated sources with their entry points (the CUDA source with
// its kernels, each with the grid it is launched over).
// `vflowc -o quest.vfa quest.vflow` writes one; the runtime reads it with no
// compiler in the process.
//
// File format (version 8): one header line
//   vflow-artifact 8 sha256=<64 lowercase hex digits> bytes=<n>\n
// followed by exactly n bytes of JSON (the body). The checksum is SHA-256 of
// the body, so a truncated or damaged file is rejected; it is not a
// signature (anyone can recompute it).
//
// Trust: an artifact is code, like a shared library or a cubin. Its C++
// source is compiled by the host compiler and loaded into the process, its
// CUDA source or PTX is loaded onto the GPU. Load only artifacts from a
// source you trust (docs/runtime.md, "Artifacts are code"). What the runtime
// does guarantee: an artifact whose metadata is inconsistent, out of the
// limits (Limits.h), or does not match the code it carries (each source
// starts with a signature line, the SHA-256 of the flow's metadata) is
// refused before any of its code is compiled or run.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_ARTIFACT_H
#define VFLOW_RUNTIME_ARTIFACT_H

#include "vflow/Runtime/Budget.h"
#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Params.h"
#include "vflow/Runtime/cuda/GpuFlowInfo.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace vflow::rt {

/// The first line of each source of a flow, before the hex signature
/// (flowSignature) of the metadata it was generated for.
constexpr const char *kSignaturePrefix = "// vflow-signature: ";

/// The version this runtime writes and reads.
/// 3: a flow no longer lists its vt.kernels (`kernels`, read by nothing);
/// its CUDA kernels (`cuda.kernels`) carry the launches.
/// 4: the fields lose their unread merge/finalize members.
/// 5: every generated CUDA kernel waits for the grid before it
/// (vd::awaitEarlierGrids), so the runtime launches them as programmatic
/// dependents; a version 4 kernel would read its inputs too early.
/// 6: a top-k's selection node is "topk" (it takes every candidate once
/// its budget reaches their count), not "budget".
/// 7: the first index kernel may do the append (a kernel's "appends"), and
/// the runtime then launches no append kernel before it.
/// 8: tile kernels read VflowGpuArgs::tileSplit (a runtime without it
/// would hand them whatever follows the struct).
/// 9: a PTX binary's kv_dtype is a dtype name of the language (fp8e4m3,
/// no longer fp8_e4m3).
/// 10: a flow may have a retain block ("retain": its capacity's budget and
/// how scores combine; the index entry point writes the score): a runtime
/// without it would keep every block.
/// 11: such a flow's CUDA code has a retain kernel (grid "retain") that
/// writes the score to VflowGpuArgs::retainScore, a new member.
/// 12: a retain block may score tokens ("grain": "token"; capacity in
/// tokens): a runtime without it would read the scores as blocks'.
/// 13: 8-bit K/V on the GPU have a scale per stored row
/// (VflowGpuArgs::kTokenScale, vTokenScale, in place of the per-KV-head
/// kScale, vScale): the CUDA code stores and loads rows with them, and
/// int8 is a GPU KV dtype; a token-grain retain block has a retain kernel
/// too (P scores a block).
constexpr int kArtifactVersion = 13;

/// The largest artifact file loadArtifact reads.
constexpr int64_t kMaxArtifactBytes = int64_t(256) << 20;

/// Axis sizes as in the compiler: > 0 static, -1 blocks (N), -2 query heads
/// per KV head (G), -3 head dimension (D).
struct ArtifactAxis {
  std::string name;
  int64_t size = 0;
};

/// A param: name, type ("int", "float" or "bool"), default value, and
/// whether the code was specialized on it (Params.h).
using ArtifactParam = ParamSpec;

struct ArtifactTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<ArtifactAxis> axes; ///< Canonical order; no `block` for fields.
  /// States: per block, and the initial value.
  bool perBlock = false;
  float init = 0;

  /// Elements per block (fields, per-block states) or in all, with D and G
  /// resolved (the block axis is not counted).
  int64_t elements(int64_t headDim, int64_t group) const;
};

struct ArtifactSource {
  std::string name;
  std::string language; ///< "c++" for the CPU backend
  std::string text;
};

struct FlowArtifact {
  std::string name;
  int64_t blockSize = 16, keepFirst = 1, keepLast = 1;
  /// 0: any head dimension; otherwise the flow only runs with this one.
  int64_t headDim = 0;
  std::vector<ArtifactParam> params; ///< Declaration order (the ABI order).
  std::vector<ArtifactTensor> consts, fields, states;
  /// The inputs the index stage reads: q, mass, position, K, V, ...
  std::vector<std::string> indexInputs;
  std::string selection; ///< The returned expression, as written.
  /// Every budget of the index stage (Budget.h), and how the returned
  /// selection's size bound is made of them: the host evaluates both.
  std::vector<BudgetExpr> budgets;
  std::vector<SelectionNode> selectionBudget;
  /// The retain block: the budget (an index into `budgets`) of its capacity
  /// in blocks (in tokens with retainTokens), -1 without one; how the
  /// scores of KV heads and layers combine ("sum" or "max"); the returned
  /// score, as written; whether it scores tokens ([block, token]).
  int64_t retainBudget = -1;
  std::string retainCombine, retainScore;
  bool retainTokens = false;
  bool retains() const { return retainBudget >= 0; }
  std::vector<ArtifactSource> sources;
  /// Entry points of the generated code by role: consts, cache, index.
  std::map<std::string, std::string> entryPoints;
  /// The CUDA backend's source and kernels (empty source: none).
  GpuFlowInfo gpu;
  /// The consts' values, computed by the compiler for the head dimensions
  /// a GPU session may use (the flow's head_dim, else 64, 128 and 256), so
  /// that the GPU needs no host compiler: per head dimension, one array per
  /// const (declaration order, row-major in the const's axis order). Empty
  /// when the flow has no consts.
  struct ConstValues {
    int64_t headDim = 0;
    std::vector<std::vector<float>> values;
  };
  std::vector<ConstValues> constValues;
  /// The const values for `headDim`, or null.
  const ConstValues *findConstValues(int64_t headDim) const;

  const ArtifactParam *findParam(const std::string &name) const;
  bool readsInput(const std::string &name) const;
};

struct Artifact {
  int version = kArtifactVersion;
  std::string compiler; ///< Who wrote it (vflowc and its version).
  std::vector<FlowArtifact> flows;

  const FlowArtifact *findFlow(const std::string &name) const;
};

/// The whole file (header line + body).
std::string serializeArtifact(const Artifact &artifact);
/// Parses and validates a whole file; `source` names it in errors. Throws
/// Error for a foreign file, another version, a checksum mismatch, a
/// truncated file, a malformed body, or a flow that validateFlowArtifact
/// refuses, saying which.
Artifact parseArtifact(const std::string &bytes, const std::string &source);

/// Reads and parses a file of at most kMaxArtifactBytes.
Artifact loadArtifact(const std::string &path);
/// Writes the file atomically (writeFileAtomically).
void saveArtifact(const Artifact &artifact, const std::string &path);

/// The SHA-256 (hex) of everything in `flow` except its code (the C++ and
/// CUDA sources and the PTX binaries), as the artifact writes it.
std::string flowSignature(const FlowArtifact &flow);

/// Puts "// vflow-signature: <flowSignature>" as the first line of the
/// flow's C++ and CUDA sources. The compiler does it once the metadata is
/// final; the runtime then refuses metadata that was changed afterwards.
void stampSignature(FlowArtifact &flow);

/// Checks that `flow` is consistent with itself (reserved params and their
/// copies, axes and sizes, per-block states, inputs, entry points, GPU
/// kernels), within the limits of Limits.h, and that every source carries
/// its signature. Throws Error naming `source`, the flow and the problem.
void validateFlowArtifact(const FlowArtifact &flow, const std::string &source);

} // namespace vflow::rt

#endif // VFLOW_RUNTIME_ARTIFACT_H
