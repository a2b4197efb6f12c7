//===- HostJitTest.cpp - The host JIT and the kernel ABI helpers ----------===//

#include "vflow/Runtime/HostJit.h"
#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/KernelABI.h"
#include "vflow/Runtime/Random.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <unistd.h>

using namespace vflow;
namespace fs = std::filesystem;

namespace {

/// A fresh cache directory per test, removed afterwards.
class HostJitTest : public ::testing::Test {
protected:
  void SetUp() override {
    dir = ::testing::TempDir() + "vflow-hostjit-" +
          std::to_string(static_cast<long>(::getpid())) + "-" +
          ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  rt::HostJitOptions options() const {
    rt::HostJitOptions o;
    o.cacheDir = dir;
    o.quiet = true;
    return o;
  }
  std::string dir;
};

const char *kSource = R"(#include "vflow/Runtime/KernelABI.h"
#include "vflow/Runtime/Random.h"
#include "vflow/Runtime/Random.h"
extern "C" float twice(float x) { return vflow::kabi::mul(x, 2.0f); }
extern "C" float firstGaussian() { return vflow::rt::gaussianValues(3, 1)[0]; }
)";

uint32_t bitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

float floatOf(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

/// Both roundings agree bit for bit (NaN: both NaN with the same bits).
void expectSameRounding(uint32_t bits, int &failures) {
  float x = floatOf(bits);
  struct {
    rt::DType type;
    float (*fn)(float);
  } cases[] = {{rt::DType::BF16, kabi::roundBF16},
               {rt::DType::F16, kabi::roundF16},
               {rt::DType::FP8E4M3, kabi::roundFP8E4M3},
               {rt::DType::FP8E5M2, kabi::roundFP8E5M2},
               {rt::DType::F32, kabi::roundF32}};
  for (const auto &c : cases) {
    uint32_t want = bitsOf(rt::roundToDType(c.type, x));
    uint32_t got = bitsOf(c.fn(x));
    if (want != got && failures++ < 10)
      ADD_FAILURE() << rt::dtypeName(c.type) << " of 0x" << std::hex << bits
                    << ": runtime 0x" << want << ", KernelABI.h 0x" << got;
  }
}

} // namespace

TEST_F(HostJitTest, CompilesLoadsAndHitsTheCache) {
  auto start = std::chrono::steady_clock::now();
  rt::HostJit cold("twice", kSource, options());
  EXPECT_TRUE(cold.compiledNow());
  EXPECT_TRUE(fs::exists(cold.libraryPath()));
  EXPECT_EQ(cold.libraryPath().rfind(dir + "/cpu-v1/twice-", 0), 0u)
      << cold.libraryPath();
  auto twice = cold.lookup<float (*)(float)>("twice");
  EXPECT_EQ(twice(1.5f), 3.0f);
  auto gauss = cold.lookup<float (*)()>("firstGaussian");
  EXPECT_EQ(gauss(), rt::gaussianValues(3, 1)[0]);
  double coldSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();

  start = std::chrono::steady_clock::now();
  rt::HostJit warm("twice", kSource, options());
  double warmSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_FALSE(warm.compiledNow());
  EXPECT_EQ(warm.libraryPath(), cold.libraryPath());
  EXPECT_LT(warmSeconds, 0.1);
  EXPECT_LT(warmSeconds, coldSeconds);
  EXPECT_EQ(warm.lookup<float (*)(float)>("twice")(2.0f), 4.0f);

  // Another source is another object.
  rt::HostJit other("twice", std::string(kSource) + "// changed\n", options());
  EXPECT_TRUE(other.compiledNow());
  EXPECT_NE(other.libraryPath(), cold.libraryPath());
  // The headers were written next to the objects.
  bool found = false;
  for (const auto &entry : fs::recursive_directory_iterator(dir))
    found |= entry.path().filename() == "KernelABI.h";
  EXPECT_TRUE(found);
}

TEST_F(HostJitTest, ReportsCompileErrors) {
  try {
    rt::HostJit bad("broken", "extern \"C\" int f() { return undeclared; }\n",
                    options());
    FAIL() << "a broken source compiled";
  } catch (const rt::Error &e) {
    std::string what = e.what();
    EXPECT_NE(what.find("host compiler failed on broken"), std::string::npos)
        << what;
    EXPECT_NE(what.find("undeclared"), std::string::npos) << what;
  }
}

TEST_F(HostJitTest, RejectsMissingSymbols) {
  rt::HostJit jit("twice", kSource, options());
  try {
    jit.lookupSymbol("vflow_nothing_index");
    FAIL() << "found a missing symbol";
  } catch (const rt::Error &e) {
    EXPECT_NE(std::string(e.what()).find("no symbol 'vflow_nothing_index'"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(HostJitTest, EmbedsTheHeaders) {
  EXPECT_NE(rt::HostJit::embeddedHeader("KernelABI.h").find("VflowIndexArgs"),
            std::string::npos);
  EXPECT_NE(rt::HostJit::embeddedHeader("Random.h").find("SplitMix64"),
            std::string::npos);
  EXPECT_THROW(rt::HostJit::embeddedHeader("Nope.h"), rt::Error);
}

TEST(KernelABI, RoundingMatchesTheRuntime) {
  int failures = 0;
  // A sweep over all floats, every bf16 rounding boundary (low 16 bits),
  // and every f16/fp8 boundary (low 12 bits; fp8's lie above them).
  for (uint64_t b = 0; b < (1ull << 32); b += 1021)
    expectSameRounding(static_cast<uint32_t>(b), failures);
  for (uint32_t hi = 0; hi < (1u << 16); ++hi)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu})
      expectSameRounding(hi << 16 | lo, failures);
  for (uint32_t hi = 0; hi < (1u << 20); ++hi)
    for (uint32_t lo : {0x000u, 0x7FFu, 0x800u, 0x801u, 0xFFFu})
      expectSameRounding(hi << 12 | lo, failures);
  EXPECT_EQ(failures, 0);
}

TEST(KernelABI, SelectionRules) {
  const float nan = kabi::kNaN;
  // Ties go to the lower index; NaN ranks last; kept blocks are excluded.
  float score[] = {9, 1, 5, 5, nan, 5, 0, 9};
  kabi::Kept kept{8, 1, 1};
  EXPECT_EQ(kabi::selectTopK(score, kept, 2), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(kabi::selectTopK(score, kept, 5),
            (std::vector<int64_t>{1, 2, 3, 5, 6}));
  EXPECT_EQ(kabi::selectTopK(score, kept, 100).size(), 6u);
  EXPECT_EQ(kabi::selectTopK(score, kept, 0).size(), 0u);
  EXPECT_EQ(kabi::selectThreshold(score, kept, 5, -1),
            (std::vector<int64_t>{2, 3, 5}));
  EXPECT_EQ(kabi::selectThreshold(score, kept, 5, 1),
            (std::vector<int64_t>{2}));
  EXPECT_EQ(kabi::selectThreshold(score, kept, nan, -1).size(), 0u);
  EXPECT_EQ(kabi::selectUnion({1, 4}, {2, 4, 6}),
            (std::vector<int64_t>{1, 2, 4, 6}));
  float line[] = {3, nan, 7, 1};
  EXPECT_EQ(kabi::kthLargestLine(line, 1, 4, 1), 7);
  EXPECT_EQ(kabi::kthLargestLine(line, 1, 4, 3), 1);
  EXPECT_TRUE(std::isnan(kabi::kthLargestLine(line, 1, 4, 9)));
  EXPECT_EQ(kabi::kthLargestLine(line, 1, 4, 0), kabi::kInf);
  EXPECT_EQ(kabi::roundBudget(-1), 0);
  EXPECT_EQ(kabi::roundBudget(nan), 0);
  EXPECT_EQ(kabi::roundBudget(2.9), 2);
}
