//===- ArtifactTest.cpp - Artifacts: round trip and every kind of damage --===//

#include "vflow/Runtime/Artifact.h"
#include "vflow/Runtime/Error.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

using namespace vflow::rt;

namespace {

Artifact sample() {
  Artifact a;
  a.compiler = "vflowc test";
  FlowArtifact f;
  f.name = "quest";
  f.blockSize = 16;
  f.keepLast = 2;
  f.params = {{"budget", "int", 64, false}, {"block_size", "int", 16, true}};
  ArtifactTensor kmax;
  kmax.name = "kmax";
  kmax.dtype = DType::BF16;
  kmax.axes = {{"dim", -3}};
  kmax.merge = "max";
  f.fields = {kmax};
  ArtifactTensor acc;
  acc.name = "acc";
  acc.axes = {{"block", -1}, {"head", -2}};
  acc.perBlock = true;
  acc.init = 0.5f;
  f.states = {acc};
  f.indexInputs = {"q", "mass"};
  f.selection = "topk(max(s, head), budget)";
  f.kernels = {{"index", "select", "{\"grid\":\"seq_kvhead\"}", "[]"}};
  f.entryPoints = {{"index", "vflow_quest_index"}};
  f.sources = {{"quest.cpp", "c++", "extern \"C\" void f() {}\n"}};
  a.flows = {f};
  return a;
}

std::string errorOf(const std::string &bytes) {
  try {
    parseArtifact(bytes, "x.vfa");
  } catch (const Error &e) {
    return e.what();
  }
  return "no error";
}

} // namespace

TEST(Artifact, RoundTrips) {
  std::string bytes = serializeArtifact(sample());
  EXPECT_EQ(bytes.rfind("vflow-artifact 1 fnv1a64=", 0), 0u);
  Artifact back = parseArtifact(bytes, "x.vfa");
  ASSERT_EQ(back.flows.size(), 1u);
  const FlowArtifact &f = back.flows[0];
  EXPECT_EQ(f.name, "quest");
  EXPECT_EQ(f.keepLast, 2);
  EXPECT_TRUE(f.findParam("block_size")->compileTime);
  EXPECT_EQ(f.fields[0].dtype, DType::BF16);
  EXPECT_EQ(f.fields[0].merge, "max");
  EXPECT_EQ(f.fields[0].elements(128, 4), 128);
  EXPECT_TRUE(f.states[0].perBlock);
  EXPECT_EQ(f.states[0].init, 0.5f);
  EXPECT_EQ(f.states[0].elements(128, 4), 4);
  EXPECT_TRUE(f.readsInput("mass"));
  EXPECT_EQ(f.sources[0].text, "extern \"C\" void f() {}\n");
  EXPECT_EQ(serializeArtifact(back), bytes);
}

TEST(Artifact, DamageIsAClearError) {
  std::string good = serializeArtifact(sample());
  EXPECT_EQ(errorOf("\x7f"
                    "ELF"),
            "x.vfa: not a vflow artifact (it does not "
            "start with 'vflow-artifact')");
  std::string other = good;
  other.replace(15, 1, "9");
  EXPECT_NE(errorOf(other).find("artifact version 9 is not supported"),
            std::string::npos);
  std::string edited = good;
  edited[edited.size() - 10] ^= 1;
  EXPECT_EQ(errorOf(edited), "x.vfa: artifact is corrupt (checksum mismatch)");
  EXPECT_NE(errorOf(good.substr(0, good.size() - 3)).find("truncated"),
            std::string::npos);
  EXPECT_NE(errorOf("vflow-artifact 1 garbage\n{}")
                .find("malformed artifact "
                      "header"),
            std::string::npos);
}

TEST(Artifact, MissingMembersAreNamed) {
  std::string body = "{\"compiler\":\"x\",\"flows\":[{\"name\":\"f\"}]}";
  char header[128];
  std::snprintf(header, sizeof(header),
                "vflow-artifact 1 fnv1a64=%016llx bytes=%zu\n",
                (unsigned long long)fnv1a64(body), body.size());
  EXPECT_EQ(errorOf(header + body), "flow 'f': missing 'block_size'");
}

TEST(Artifact, SavesAndLoadsFiles) {
  std::string path = ::testing::TempDir() + "/sample.vfa";
  saveArtifact(sample(), path);
  EXPECT_EQ(loadArtifact(path).flows[0].name, "quest");
  EXPECT_THROW(loadArtifact(path + ".missing"), Error);
  EXPECT_THROW(loadArtifact(::testing::TempDir()), Error);
}
