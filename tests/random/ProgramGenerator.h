//===- ProgramGenerator.h - Random well-typed .vflow programs ---*- C++ -*-===//
//
// Generates small random flows that the compiler accepts, for differential
// tests: every pass must leave the reference interpreter's results unchanged
// on them. Expressions are built from a small model of the checker's named-
// axis shape system (broadcasting by name, reductions remove axes, split and
// rename create axes), with rough magnitude bounds so that values stay finite
// most of the time. Plain C++17; no dependency on the compiler.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_TESTS_RANDOM_PROGRAMGENERATOR_H
#define VFLOW_TESTS_RANDOM_PROGRAMGENERATOR_H

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace vflow::testing {

struct GeneratorOptions {
  /// Same seed, same options: same program, on every platform.
  uint64_t seed = 1;
  int maxFields = 3, maxStates = 2, maxLets = 6, maxExprDepth = 4;
  bool allowStates = true, allowConsts = true, allowSplit = true;
  /// rename(x, a -> b) in expressions.
  bool allowRename = true;
  /// load("....npy", [axes]) consts; the files come back in
  /// GeneratedProgram::files and must be placed in SemaOptions::baseDir.
  bool allowLoad = true;
  /// K and V read in the index stage ([block, token, dim]).
  bool allowIndexKV = true;
  /// When > 0, every program runs at this head dim (and pins it when it
  /// declares `param head_dim`), e.g. 64 for the GPU attention kernels;
  /// otherwise small dims (4 to 16). The other choices of a seed stay the
  /// same.
  int64_t headDim = 0;
  /// When > 0, every program declares this block_size (else 4, 8 or 16).
  int64_t blockSize = 0;
};

struct GeneratedProgram {
  /// A complete .vflow file holding one flow.
  std::string source;
  std::string flowName;
  /// Sizes to run it with (headDim equals `param head_dim` when set).
  int64_t headDim = 8, group = 1;
  /// Other values for some run-time params, safe to pass to the
  /// interpreter's params (never a compile-time or reserved param).
  std::map<std::string, double> runtimeParams;
  /// Files that load(...) reads: (file name, bytes), relative to the source.
  std::vector<std::pair<std::string, std::string>> files;
};

GeneratedProgram generateProgram(const GeneratorOptions &options);

/// Writes the files `program` loads into `dir`, and its source as
/// dir/sourceName when sourceName is not empty; returns that path (or
/// empty). Throws std::runtime_error when a file cannot be written.
std::string writeProgramFiles(const GeneratedProgram &program,
                              const std::string &dir,
                              const std::string &sourceName = "");

/// The seeds a random-program test runs, first .. first + count - 1;
/// $<prefix>_SEEDS (count) and $<prefix>_FIRST override the defaults, for
/// a longer search.
struct SeedRange {
  uint64_t first, count;
};
SeedRange seedRangeFromEnv(const std::string &prefix, uint64_t count,
                           uint64_t first = 1);

} // namespace vflow::testing

#endif // VFLOW_TESTS_RANDOM_PROGRAMGENERATOR_H
