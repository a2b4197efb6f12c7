//===- StockPrograms.h - The programs of examples/ the tests run ---------===//
//
// Every stock program (examples/NAME.vflow) by name, in one place: the
// semantic, CPU, differential, CUDA compile and GPU tests iterate it.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_TESTS_COMMON_STOCKPROGRAMS_H
#define VFLOW_TESTS_COMMON_STOCKPROGRAMS_H

namespace vflow::testing {

inline constexpr const char *kStockPrograms[] = {
    "quest",          "block_topk",    "h2o",           "eps",
    "lserve",         "running_avg",   "value_gate",    "above_mean",
    "sliding_window", "double_sparse", "oracle",        "random",
    "centroid_topp",  "quest_shrunk",  "pyramid_quest", "sticky_quest",
    "h2o_evict",      "streaming_llm", "snapkv",        "rkv_evict"};

} // namespace vflow::testing

#endif // VFLOW_TESTS_COMMON_STOCKPROGRAMS_H
