//===- ArtifactRunTest.cpp - Run an artifact with no compiler present -----===//
//
// This program links the runtime only (no MLIR, LLVM or ANTLR): it loads the
// artifact vflowc wrote at build time and serves decode steps from it.
//
//===----------------------------------------------------------------------===//

#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Session.h"

#include "../common/Configs.h"
#include "../common/Random.h"
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

using namespace vflow::rt;

namespace {

SessionConfig config() {
  return vflow::testing::sessionConfig(
      1, 2, 2, 32, 256, ::testing::TempDir() + "/vflow-artifact-jit");
}

std::string readAll(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

} // namespace

TEST(ArtifactRun, ServesDecodeStepsFromTheArtifact) {
  Artifact a = loadArtifact(VFLOW_STOCK_ARTIFACT);
  ASSERT_EQ(a.flows.size(), 2u);
  for (const char *name : {"quest", "h2o"}) {
    const FlowArtifact *flow = a.findFlow(name);
    ASSERT_TRUE(flow) << name;
    HostSession s(*flow, config());
    s.setParam("budget", 5);
    SeqId seq = s.addSequence();
    std::mt19937 rng(1);
    int64_t n = 20 * 16 + 7;
    std::vector<float> k(n * 2 * 32), v(k.size()), q(4 * 32), out(q.size());
    vflow::testing::NormalDraws(rng).fill(k, v, q);
    s.append(seq, n, k.data(), v.data());
    s.decode(0, {seq}, q.data(), out.data());
    std::vector<BlockLists> attended = s.selection(0),
                            pages = s.selectedPages(0);
    for (size_t kh = 0; kh < attended[0].size(); ++kh)
      for (size_t i = 0; i < attended[0][kh].size(); ++i)
        EXPECT_EQ(pages[0][kh][i],
                  s.cache().blockTable(seq)[attended[0][kh][i]]);
    size_t kept = size_t(flow->keepFirst + flow->keepLast);
    for (const auto &blocks : attended[0])
      EXPECT_EQ(blocks.size(), 5 + kept + 1) << name; // + the partial block
    for (float x : out)
      EXPECT_TRUE(std::isfinite(x));
  }
}

TEST(ArtifactRun, RejectsDamagedArtifacts) {
  std::string good = readAll(VFLOW_STOCK_ARTIFACT);
  std::string bad = good;
  bad[bad.size() / 2] ^= 0x20;
  EXPECT_THROW(parseArtifact(bad, "bad.vfa"), Error);
  // A version after this runtime's is refused, naming it.
  const std::string next = std::to_string(kArtifactVersion + 1);
  std::string newer = good;
  newer.replace(15, std::to_string(kArtifactVersion).size(), next);
  try {
    parseArtifact(newer, "newer.vfa");
    ADD_FAILURE() << "a version " << next << " artifact was accepted";
  } catch (const Error &e) {
    EXPECT_NE(
        std::string(e.what()).find("version " + next + " is not supported"),
        std::string::npos);
  }
}
