//===- WritePrograms.cpp - Writes random programs to a directory ----------===//
//
// vflow-random-programs --out DIR [--first S] [--count N] [--head-dim D]
//                       [--block-sizes A,B,...]
//
// Writes the generator's programs for seeds S .. S+N-1 as DIR/genS/genS.vflow
// (with the .npy files they load) and DIR/manifest.txt, one line per program:
// "genS GROUP HEAD_DIM APPROX" (APPROX 1: it uses approx_topk). With
// --block-sizes, seed i declares the (i mod n)-th of them. tools/gpu-prepare.sh
// compiles them to artifacts for the GPU's differential test (tests/gpu/flow),
// which cannot run the compiler.
//
//===----------------------------------------------------------------------===//

#include "ProgramGenerator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

int usage(const char *why) {
  std::fprintf(stderr,
               "vflow-random-programs: %s\nusage: vflow-random-programs --out "
               "DIR [--first S] [--count N] [--head-dim D] "
               "[--block-sizes A,B,...]\n",
               why);
  return 2;
}

bool parseCount(const char *text, long long min, long long &out) {
  char *end = nullptr;
  long long v = std::strtoll(text, &end, 10);
  if (!*text || *end || v < min)
    return false;
  out = v;
  return true;
}

} // namespace

int main(int argc, char **argv) {
  std::string out;
  long long first = 1, count = 20, headDim = 0;
  std::vector<long long> blockSizes;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc)
      return usage(("missing a value after " + a).c_str());
    const char *v = argv[++i];
    if (a == "--out")
      out = v;
    else if (a == "--first" && parseCount(v, 0, first))
      continue;
    else if (a == "--count" && parseCount(v, 1, count))
      continue;
    else if (a == "--head-dim" && parseCount(v, 1, headDim))
      continue;
    else if (a == "--block-sizes") {
      std::string list = v;
      for (size_t at = 0; at <= list.size();) {
        size_t comma = std::min(list.find(',', at), list.size());
        long long size = 0;
        if (!parseCount(list.substr(at, comma - at).c_str(), 1, size))
          return usage(("bad --block-sizes: " + list).c_str());
        blockSizes.push_back(size);
        at = comma + 1;
      }
    } else
      return usage(("bad option or value: " + a + " " + v).c_str());
  }
  if (out.empty())
    return usage("--out is required");
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  std::ofstream manifest(out + "/manifest.txt");
  if (ec || !manifest)
    return usage(("cannot write to " + out).c_str());
  for (long long seed = first; seed < first + count; ++seed) {
    vflow::testing::GeneratorOptions options;
    options.seed = uint64_t(seed);
    options.headDim = headDim;
    if (!blockSizes.empty())
      options.blockSize = blockSizes[size_t(seed - first) % blockSizes.size()];
    vflow::testing::GeneratedProgram p =
        vflow::testing::generateProgram(options);
    std::string dir = out + "/" + p.flowName;
    std::filesystem::create_directories(dir, ec);
    try {
      vflow::testing::writeProgramFiles(p, dir, p.flowName + ".vflow");
    } catch (const std::exception &e) {
      return usage(e.what());
    }
    bool approx = p.source.find("approx_topk") != std::string::npos;
    manifest << p.flowName << " " << p.group << " " << p.headDim << " "
             << (approx ? 1 : 0) << "\n";
  }
  return manifest.good() ? 0 : 1;
}
