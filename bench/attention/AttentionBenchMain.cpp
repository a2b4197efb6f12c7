//===- AttentionBenchMain.cpp - vflow-bench-attention ---------------------===//
//
// vflow-bench-attention [--batches 1,8,64] [--lengths 4096,32768,131072]
//   [--dtypes bf16,fp8] [--hkv 8] [--group 4] [--dim 128] [--page 16]
//   [--k 64] [--iters 30] [--warmup 5] [--copy-gib 1] [--out rows.jsonl]
//
// Prints the copy ceiling and, per shape, the dense and sparse paged decode
// attention rows (ms, bytes moved, GB/s, % of the ceiling); --out also
// writes them as JSON lines for bench/table.py.
//
//===----------------------------------------------------------------------===//

#include "AttentionBench.h"

#include "vflow/Runtime/Error.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

using namespace vflow::bench;
using vflow::rt::cuda::KVType;

namespace {

std::vector<int> parseInts(const std::string &text) {
  std::vector<int> values;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    int scale = 1;
    if (!item.empty() && (item.back() == 'K' || item.back() == 'k')) {
      scale = 1024;
      item.pop_back();
    }
    values.push_back(std::atoi(item.c_str()) * scale);
  }
  return values;
}

std::vector<KVType> parseTypes(const std::string &text) {
  std::vector<KVType> types;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    std::optional<KVType> type = parseBenchType(item);
    if (!type)
      throw vflow::rt::Error("unknown dtype '" + item + "' (bf16, f16 or fp8)");
    types.push_back(*type);
  }
  return types;
}

void printRow(const BenchRow &row, double ceiling) {
  const AttentionShape &s = row.shape;
  if (row.what == "skipped") {
    std::printf("%-17s %3d %7d %3d %2d %4d %3d %4s %-5s skipped: %s\n",
                row.what.c_str(), s.batch, s.length, s.numKVHeads, s.group,
                s.headDim, s.pageSize, "", benchTypeName(s.type),
                row.note.c_str());
    return;
  }
  const bool sparse =
      row.what == "sparse_attention" || row.what == "flashinfer_sparse";
  const std::string k = sparse ? std::to_string(s.selected) : "-";
  std::printf("%-17s %3d %7d %3d %2d %4d %3d %4s %-5s %9.4f %10.2f %8.1f "
              "%6.1f%% %6d %4d\n",
              row.what.c_str(), s.batch, s.length, s.numKVHeads, s.group,
              s.headDim, s.pageSize, k.c_str(), benchTypeName(s.type), row.ms,
              row.bytes / 1e6, row.gbps, 100.0 * row.gbps / ceiling, row.splits,
              row.inputSets);
  if (row.source == "peer" && !row.note.empty())
    std::printf("  %s\n", row.note.c_str());
}

} // namespace

int main(int argc, char **argv) {
  std::vector<int> batches{1, 8, 64}, lengths{4096, 32768, 131072};
  std::vector<KVType> types{KVType::BF16, KVType::FP8E4M3};
  AttentionShape base;
  BenchOptions options;
  double copyGiB = 1;
  std::string outPath;
  // The flags that set one int each.
  const std::pair<const char *, int *> intFlags[] = {
      {"--hkv", &base.numKVHeads},  {"--group", &base.group},
      {"--dim", &base.headDim},     {"--page", &base.pageSize},
      {"--k", &base.selected},      {"--iters", &options.iterations},
      {"--warmup", &options.warmup}};
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (i + 1 >= argc)
        throw vflow::rt::Error("missing value after " + flag);
      const std::string value = argv[++i];
      auto intFlag =
          std::find_if(std::begin(intFlags), std::end(intFlags),
                       [&](const auto &entry) { return flag == entry.first; });
      if (intFlag != std::end(intFlags))
        *intFlag->second = std::atoi(value.c_str());
      else if (flag == "--batches")
        batches = parseInts(value);
      else if (flag == "--lengths")
        lengths = parseInts(value);
      else if (flag == "--dtypes")
        types = parseTypes(value);
      else if (flag == "--copy-gib")
        copyGiB = std::atof(value.c_str());
      else if (flag == "--out")
        outPath = value;
      else
        throw vflow::rt::Error("unknown option " + flag);
    }

    std::vector<BenchRow> rows;
    const BenchRow copy =
        benchCopy(static_cast<size_t>(copyGiB * (1ull << 30)), options);
    rows.push_back(copy);
    std::printf("copy ceiling: %.1f GB/s (%.3f ms for %.2f GB read+written, "
                "median of %d)\n\n",
                copy.gbps, copy.ms, copy.bytes / 1e9, options.iterations);
    std::printf("%-17s %3s %7s %3s %2s %4s %3s %4s %-5s %9s %10s %8s %7s "
                "%6s %4s\n",
                "what", "B", "L", "Hkv", "G", "D", "P", "k", "dtype", "ms",
                "MB", "GB/s", "%ceil", "splits", "sets");
    for (KVType type : types)
      for (int batch : batches)
        for (int length : lengths) {
          AttentionShape shape = base;
          shape.type = type;
          shape.batch = batch;
          shape.length = length;
          for (const BenchRow &row : benchDecodeAttention(shape, options)) {
            printRow(row, copy.gbps);
            std::fflush(stdout);
            rows.push_back(row);
          }
        }
    if (!outPath.empty()) {
      std::ofstream out(outPath);
      for (const BenchRow &row : rows)
        out << row.json() << "\n";
      if (!out)
        throw vflow::rt::Error("could not write " + outPath);
    }
  } catch (const std::exception &error) {
    std::fprintf(stderr, "vflow-bench-attention: %s\n", error.what());
    return 1;
  }
  return 0;
}
