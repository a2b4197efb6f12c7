//===- Interpreter.h - Reference interpreter of vt IR -----------*- C++ -*-===//
//
// The semantic oracle: runs the cache stage and the index stage of a
// vt.flow on concrete f32 tensors, op by op, with the simplest possible
// loops. Every pass and every backend must compute what this computes
// (selections exactly; values within float tolerance).
//
// Semantics fixed here (docs/language.md repeats them for users):
//   - The index stage sees the *complete* blocks of a sequence: num_blocks is
//     floor(context_len / block_size). A partial last block is always
//     attended by the runtime and is not part of any selection.
//   - keep_first / keep_last blocks are excluded from the candidates of
//     topk, approx_topk and threshold (so k counts only other blocks) and are
//     added to the final block list.
//   - Ranking is by score, highest first; ties go to the lower block index;
//     NaN ranks below every number and never passes a threshold.
//   - Budgets (k, max) are evaluated in f64 from their host-evaluable
//     definition and rounded down; negative means 0.
//   - Field values are rounded to the field's storage dtype when stored;
//     states to theirs.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_COMPILER_INTERPRETER_H
#define VFLOW_COMPILER_INTERPRETER_H

#include "vflow/Dialect/VT/VTOps.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace vflow::interp {

/// A dense row-major f32 tensor with named axes.
struct Tensor {
  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  std::vector<float> data;

  Tensor() = default;
  Tensor(std::vector<std::string> names, std::vector<int64_t> sizes);
  static Tensor scalar(float value);

  int64_t numElements() const;
  /// The position of an axis, or -1.
  int axisIndex(const std::string &name) const;
  /// "[block:12, head:4]".
  std::string shapeString() const;
};

/// The blocks chosen by the index stage: logical ids of complete blocks,
/// sorted ascending, without the kept first/last blocks.
struct Selection {
  std::vector<int64_t> blocks;
};

/// What the index stage reads for one (sequence, KV head).
struct IndexInputs {
  Tensor q;                             ///< [head, dim]
  std::map<std::string, Tensor> fields; ///< name -> [block, ...field axes]
  Tensor mass;                          ///< [block, head]; only if read
  Tensor K, V;                          ///< [block, token, dim]; only if read
  int64_t numBlocks = 0;
  int64_t contextLen = 0;
  int64_t step = 0;
  int64_t layer = 0;  ///< the model's layer index (`layer`)
  int64_t kvHead = 0; ///< the model's KV head index (`kv_head`)
  /// `first_token`: each block's first token's original position ([block];
  /// empty: block * block_size, a sequence that never evicted).
  std::vector<float> firstToken;
};

/// State values of one (sequence, KV head), by state name. Per-block states
/// have the `block` axis sized to the sequence's complete blocks.
using StateValues = std::map<std::string, Tensor>;

/// A vt.flow bound to a head dimension, a GQA group size and param values.
class FlowInterpreter {
public:
  /// Binds `flow`. `params` overrides run-time params by name. Returns null
  /// with a reason in `error` when the sizes or params do not fit the flow.
  static std::unique_ptr<FlowInterpreter>
  create(vt::FlowOp flow, int64_t headDim, int64_t group,
         const std::map<std::string, double> &params, std::string &error);
  ~FlowInterpreter();

  int64_t blockSize() const { return blockSizeValue; }
  int64_t keepFirst() const { return keepFirstValue; }
  int64_t keepLast() const { return keepLastValue; }
  /// The materialized consts, by name.
  const std::map<std::string, Tensor> &getConsts() const { return consts; }
  /// Field names in declaration order.
  const std::vector<std::string> &getFieldNames() const { return fieldNames; }

  /// Runs the cache stage on one complete block. K and V are
  /// [token, dim]. Returns every field's value (rounded to its storage
  /// dtype), by name. Throws std::runtime_error on bad inputs.
  std::map<std::string, Tensor> runCacheStage(const Tensor &K,
                                              const Tensor &V) const;

  /// A fresh state of the flow for a sequence with `numBlocks` complete
  /// blocks (every entry at its init value).
  StateValues initialStates(int64_t numBlocks) const;

  /// Runs the index stage; stores into `states`. Per-block states must
  /// already cover `inputs.numBlocks` blocks (grow them with growStates).
  /// With `retainScore`, a flow with a retain block also writes its score
  /// there (one value per block; left empty without a retain block).
  Selection runIndexStage(const IndexInputs &inputs, StateValues &states,
                          std::vector<float> *retainScore = nullptr) const;

  /// Extends per-block states to `numBlocks` blocks; new blocks start at the
  /// state's init value.
  void growStates(StateValues &states, int64_t numBlocks) const;

  /// The blocks attention visits: the selection plus the kept first and last
  /// of `numBlocks` complete blocks, sorted.
  std::vector<int64_t> finalBlocks(const Selection &selection,
                                   int64_t numBlocks) const;

  /// The budget (k, or threshold's max) of the returned selection for a
  /// sequence, as the host evaluates it, at one layer and KV head.
  int64_t budget(int64_t numBlocks, int64_t contextLen, int64_t layer = 0,
                 int64_t kvHead = 0) const;

private:
  struct Impl;
  FlowInterpreter() = default;
  std::unique_ptr<Impl> impl;
  int64_t blockSizeValue = 16, keepFirstValue = 1, keepLastValue = 1;
  std::map<std::string, Tensor> consts;
  std::vector<std::string> fieldNames;
};

} // namespace vflow::interp

#endif // VFLOW_COMPILER_INTERPRETER_H
