//===- FrontendFuzz.cpp - Random mutation test of the front end -----------===//
//
//   vflow-fuzz-frontend [--seconds S] [--seed N] [--iterations N] DIR...
//
// Takes every .vflow file in the given directories as a seed, runs each as
// it is, then applies random token- and byte-level mutations, and runs each
// mutant through the whole front end (parse, semantic analysis, lowering to vt,
// verification) in this process. It fails when a mutant crashes the compiler
// (the process dies), takes more than a second, or is accepted by the checker
// but lowers to IR that does not verify (an internal error). The first failing
// mutant is written to fuzz-failure.vflow for reproduction. Deterministic for a
// seed and iteration count; --seconds bounds the wall time.
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/ASTToVT.h"
#include "vflow/Compiler/Driver.h"

#include "mlir/IR/MLIRContext.h"

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <random>
#include <string>
#include <vector>

using namespace vflow;

namespace {

const char *const kVocabulary[] = {
    "flow",       "param",       "axis",        "const",   "cache",
    "state",      "index",       "let",         "return",  "and",
    "or",         "not",         "true",        "false",   "inf",
    "->",         "<=",          ">=",          "==",      "!=",
    "<",          ">",           "=",           "+",       "-",
    "*",          "/",           "(",           ")",       "[",
    "]",          "{",           "}",           ",",       ";",
    ":",          "0",           "1",           "-1",      "16",
    "0.5",        "1e9",         "1e999",       "3",       "128",
    "K",          "V",           "q",           "mass",    "position",
    "num_blocks", "context_len", "step",        "block",   "token",
    "head",       "dim",         "sum",         "mean",    "max",
    "min",        "l2norm",      "maximum",     "minimum", "softmax",
    "normalize",  "conv",        "kth_largest", "split",   "rename",
    "topk",       "approx_topk", "threshold",   "topp",    "union",
    "rademacher", "gaussian",    "tensor",      "load",    "where",
    "clamp",      "exp",         "sqrt",        "budget",  "block_size",
    "keep_last",  "head_dim",    "bf16",        "f32",     "fp8e4m3",
    "\"x.npy\"",  "seed",        "scale",       "recall",  "sub",
    "m",          "n",           "//",          "/*",      "*/",
    "\"",         "$",           "65536",       "1024",    "-0.5"};

/// Numbers at and past the checker's limits (axis sizes, element counts,
/// int range): a mutant that swaps one in must be rejected, never overflow.
const char *const kExtremeNumbers[] = {"65536",
                                       "65537",
                                       "16777216",
                                       "2147483648",
                                       "9007199254740992",
                                       "9007199254740993",
                                       "9223372036854775807",
                                       "18446744073709551616",
                                       "99999999999999999999999999999999",
                                       "1e300",
                                       "0",
                                       "-1"};

/// Splits text into rough tokens (names, numbers, punctuation, spaces) so
/// mutations mostly keep the program lexically plausible.
std::vector<std::string> tokenize(const std::string &text) {
  std::vector<std::string> tokens;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i + 1;
    unsigned char c = text[i];
    if (std::isalnum(c) || c == '_' || c == '.') {
      while (j < text.size() && (std::isalnum((unsigned char)text[j]) ||
                                 text[j] == '_' || text[j] == '.'))
        ++j;
    } else if (std::isspace(c)) {
      while (j < text.size() && std::isspace((unsigned char)text[j]))
        ++j;
    }
    tokens.push_back(text.substr(i, j - i));
    i = j;
  }
  return tokens;
}

std::string join(const std::vector<std::string> &tokens) {
  std::string out;
  for (const std::string &t : tokens)
    out += t;
  return out;
}

std::string mutate(const std::string &seed, std::mt19937_64 &rng) {
  std::vector<std::string> tokens = tokenize(seed);
  auto pick = [&](size_t n) { return n ? size_t(rng() % n) : 0; };
  unsigned rounds = 1 + rng() % 4;
  for (unsigned r = 0; r < rounds && !tokens.empty(); ++r) {
    size_t at = pick(tokens.size());
    switch (rng() % 10) {
    case 0: // Delete a token.
      tokens.erase(tokens.begin() + at);
      break;
    case 1: // Delete a span.
      tokens.erase(tokens.begin() + at,
                   tokens.begin() + std::min(tokens.size(), at + 1 + pick(8)));
      break;
    case 2: // Insert a vocabulary token.
      tokens.insert(tokens.begin() + at,
                    std::string(" ") +
                        kVocabulary[pick(std::size(kVocabulary))] + " ");
      break;
    case 3: // Replace a token with a vocabulary token.
      tokens[at] = kVocabulary[pick(std::size(kVocabulary))];
      break;
    case 4: // Replace a token with another token of the same file.
      tokens[at] = tokens[pick(tokens.size())];
      break;
    case 5: { // Duplicate a span somewhere else.
      size_t len = 1 + pick(12);
      std::vector<std::string> span(tokens.begin() + at,
                                    tokens.begin() +
                                        std::min(tokens.size(), at + len));
      size_t to = pick(tokens.size());
      tokens.insert(tokens.begin() + to, span.begin(), span.end());
      break;
    }
    case 6: // Swap two tokens.
      std::swap(tokens[at], tokens[pick(tokens.size())]);
      break;
    case 7: { // Flip a byte to anything (junk, control bytes, high bytes).
      std::string &t = tokens[at];
      if (!t.empty())
        t[pick(t.size())] = static_cast<char>(rng() & 0xff);
      break;
    }
    case 8: // Truncate.
      tokens.resize(at);
      break;
    case 9: { // Replace a number with an extreme one.
      for (size_t k = 0; k < tokens.size(); ++k) {
        std::string &t = tokens[(at + k) % tokens.size()];
        if (!t.empty() && std::isdigit(static_cast<unsigned char>(t[0]))) {
          t = kExtremeNumbers[pick(std::size(kExtremeNumbers))];
          break;
        }
      }
      break;
    }
    }
  }
  return join(tokens);
}

std::vector<std::string> collectSeeds(const std::vector<std::string> &dirs) {
  std::vector<std::string> files;
  for (const std::string &dir : dirs) {
    DIR *d = opendir(dir.c_str());
    if (!d)
      continue;
    while (dirent *e = readdir(d)) {
      std::string name = e->d_name;
      if (name.size() > 6 && name.substr(name.size() - 6) == ".vflow")
        files.push_back(dir + "/" + name);
    }
    closedir(d);
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> seeds;
  for (const std::string &f : files) {
    std::string text, error;
    if (readSourceFile(f, text, error))
      seeds.push_back(text);
  }
  return seeds;
}

} // namespace

int main(int argc, char **argv) {
  double seconds = 30;
  uint64_t seed = 1;
  long iterations = -1;
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc)
      seconds = std::atof(argv[++i]);
    else if (a == "--seed" && i + 1 < argc)
      seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--iterations" && i + 1 < argc)
      iterations = std::atol(argv[++i]);
    else
      dirs.push_back(a);
  }
  std::vector<std::string> seeds = collectSeeds(dirs);
  if (seeds.empty()) {
    std::fprintf(stderr, "fuzz: no .vflow seeds found\n");
    return 2;
  }

  std::mt19937_64 rng(seed);
  auto start = std::chrono::steady_clock::now();
  long runs = 0, accepted = 0, failed = 0;
  double slowest = 0;
  mlir::MLIRContext context;
  registerCompilerDialects(context);
  context.disableMultithreading();

  auto fail = [&](const std::string &why, const std::string &program) {
    ++failed;
    if (failed == 1) {
      std::ofstream("fuzz-failure.vflow", std::ios::binary) << program;
      std::fprintf(stderr,
                   "fuzz: FAILED: %s (mutant written to "
                   "fuzz-failure.vflow)\n",
                   why.c_str());
    }
  };

  runWithLargeStack([&] {
    while (true) {
      double elapsed = std::chrono::duration<double>(
                           std::chrono::steady_clock::now() - start)
                           .count();
      if (iterations >= 0 ? runs >= iterations : elapsed >= seconds)
        break;
      // Every seed once as it is, then random mutants.
      std::string program = size_t(runs) < seeds.size()
                                ? seeds[runs]
                                : mutate(seeds[rng() % seeds.size()], rng);
      Compilation c(std::make_unique<SourceBuffer>("fuzz.vflow", program));
      SemaOptions options;
      auto t0 = std::chrono::steady_clock::now();
      bool ok = compileSource(c, context, options, CompileStage::VT);
      double took =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
              .count();
      slowest = std::max(slowest, took);
      ++runs;
      accepted += ok;
      // Rendering must work on every diagnostic too.
      (void)c.diags.renderText();
      (void)c.diags.renderJSON();
      if (took > 1.0)
        fail("a mutant took " + std::to_string(took) + " s", program);
      for (const Diagnostic &d : c.diags.getDiagnostics())
        if (d.message.rfind("internal error", 0) == 0)
          fail(d.message, program);
      if (!ok && !c.diags.hasErrors())
        fail("compilation failed without an error", program);
    }
  });

  std::printf("fuzz: %ld mutants of %zu seeds, %ld accepted, slowest %.3f s\n",
              runs, seeds.size(), accepted, slowest);
  std::printf("%ld passed, %ld failed\n", runs - failed, failed);
  return failed ? 1 : 0;
}
