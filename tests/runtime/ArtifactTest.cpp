//===- ArtifactTest.cpp - Artifacts: round trip and every kind of damage --===//

#include "vflow/Runtime/Artifact.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Sha256.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>

#include <unistd.h>

using namespace vflow::rt;

namespace {

/// A consistent flow, not yet stamped with its signature.
FlowArtifact unstamped() {
  FlowArtifact f;
  f.name = "quest";
  f.blockSize = 16;
  f.keepLast = 2;
  f.params = {{"budget", "int", 64, false},
              {"block_size", "int", 16, true},
              {"keep_first", "int", 1, false},
              {"keep_last", "int", 2, false},
              {"head_dim", "int", 0, true}};
  ArtifactTensor kmax;
  kmax.name = "kmax";
  kmax.dtype = DType::BF16;
  kmax.axes = {{"dim", -3}};
  f.fields = {kmax};
  ArtifactTensor acc;
  acc.name = "acc";
  acc.axes = {{"block", -1}, {"head", -2}};
  acc.perBlock = true;
  acc.init = 0.5f;
  f.states = {acc};
  f.indexInputs = {"q", "mass"};
  f.selection = "topk(max(s, head), budget)";
  for (const char *role : {"consts", "cache", "index"})
    f.entryPoints[role] = std::string("vflow_quest_") + role;
  // topk(..., min(budget, num_blocks))
  BudgetExpr k;
  k.what = "vt.topk at line 7, column 12";
  k.nodes = {{BudgetNode::Kind::Param, 0, 0},
             {BudgetNode::Kind::NumBlocks},
             {BudgetNode::Kind::Min, 0, 0, 0, 1}};
  f.budgets = {k};
  f.selectionBudget = {{SelectionNode::Kind::Budget, 0}};
  f.sources = {{"quest.cpp", "c++", "extern \"C\" void f() {}\n"}};
  return f;
}

Artifact artifactOf(FlowArtifact f, bool stamp = true) {
  if (stamp)
    stampSignature(f);
  Artifact a;
  a.compiler = "vflowc test";
  a.flows = {f};
  return a;
}

Artifact sample() { return artifactOf(unstamped()); }

std::string errorOf(const std::string &bytes) {
  try {
    parseArtifact(bytes, "x.vfa");
  } catch (const Error &e) {
    return e.what();
  }
  return "no error";
}

/// The error parsing an artifact of `f` gives (after stamping it).
std::string errorOfFlow(const FlowArtifact &f, bool stamp = true) {
  return errorOf(serializeArtifact(artifactOf(f, stamp)));
}

bool contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

} // namespace

TEST(Artifact, RoundTrips) {
  std::string bytes = serializeArtifact(sample());
  EXPECT_EQ(bytes.rfind("vflow-artifact " + std::to_string(kArtifactVersion) +
                            " sha256=",
                        0),
            0u);
  Artifact back = parseArtifact(bytes, "x.vfa");
  ASSERT_EQ(back.flows.size(), 1u);
  const FlowArtifact &f = back.flows[0];
  EXPECT_EQ(f.name, "quest");
  EXPECT_EQ(f.keepLast, 2);
  EXPECT_TRUE(f.findParam("block_size")->compileTime);
  EXPECT_EQ(f.fields[0].dtype, DType::BF16);
  EXPECT_EQ(f.fields[0].elements(128, 4), 128);
  EXPECT_TRUE(f.states[0].perBlock);
  EXPECT_EQ(f.states[0].init, 0.5f);
  EXPECT_EQ(f.states[0].elements(128, 4), 4);
  EXPECT_TRUE(f.readsInput("mass"));
  EXPECT_EQ(f.sources[0].text, "// vflow-signature: " + flowSignature(f) +
                                   "\nextern \"C\" void f() {}\n");
  EXPECT_EQ(serializeArtifact(back), bytes);
}

TEST(Artifact, DamageIsAClearError) {
  std::string good = serializeArtifact(sample());
  EXPECT_EQ(errorOf("\x7f"
                    "ELF"),
            "x.vfa: not a vflow artifact (it does not "
            "start with 'vflow-artifact')");
  std::string other = good;
  const std::string next = std::to_string(kArtifactVersion + 1);
  other.replace(15, std::to_string(kArtifactVersion).size(), next);
  EXPECT_TRUE(contains(errorOf(other),
                       "artifact version " + next + " is not supported"));
  std::string edited = good;
  edited[edited.size() - 10] ^= 1;
  EXPECT_EQ(errorOf(edited), "x.vfa: artifact is corrupt (checksum mismatch); "
                             "artifacts are code: load only ones you trust");
  EXPECT_TRUE(contains(errorOf(good.substr(0, good.size() - 3)), "truncated"));
}

TEST(Artifact, HeaderIsParsedStrictly) {
  std::string good = serializeArtifact(sample());
  size_t newline = good.find('\n');
  std::string header = good.substr(0, newline), body = good.substr(newline);
  // The header after "vflow-artifact N".
  const std::string rest =
      header.substr(15 + std::to_string(kArtifactVersion).size());
  auto malformed = [&](const std::string &h) {
    return contains(errorOf(h + body), "malformed artifact header");
  };
  EXPECT_TRUE(malformed("vflow-artifact " + std::to_string(kArtifactVersion) +
                        " garbage"));
  // An artifact of version 1 (an FNV-1a checksum) is told to recompile.
  EXPECT_TRUE(contains(errorOf("vflow-artifact 1 fnv1a64=0 bytes=2\n{}"),
                       "artifact version 1 is not supported by this runtime "
                       "(it reads version " +
                           std::to_string(kArtifactVersion) + "); recompile"));
  // So is every later version before this runtime's, each for what changed
  // after it.
  const char *whyNot[] = {
      "2: it listed the vt.kernels of each flow",
      "3: its fields carried unread merge/finalize marks",
      "4: its CUDA kernels do not wait for the grid before them, so they "
      "may not be launched as programmatic dependents",
      "5: its top-k selections read as bounds",
      "6: its kernels do not say whether they have an appending twin",
      "7: its tile kernels take whole tiles whatever the runtime's split",
      "8: its PTX binaries spell the fp8 KV dtype fp8_e4m3",
      "9: it has no retain blocks (a runtime would keep every block)",
      "10: a retain block's CUDA code has no retain kernel",
      "11: its retain blocks score blocks only",
      "12: its CUDA code scales 8-bit K/V per KV head, not per stored row"};
  static_assert(std::size(whyNot) == kArtifactVersion - 2,
                "one reason per version between 1 and this runtime's");
  for (int v = 2; v < kArtifactVersion; ++v) {
    SCOPED_TRACE(whyNot[v - 2]);
    const std::string n = std::to_string(v);
    EXPECT_TRUE(contains(errorOf("vflow-artifact " + n + rest + body),
                         "artifact version " + n +
                             " is not supported by this runtime (it reads "
                             "version " +
                             std::to_string(kArtifactVersion) + "); recompile"))
        << n;
  }
  // A negative or overflowing version, a sign, spaces, junk, CRLF.
  EXPECT_TRUE(malformed("vflow-artifact -2" + rest));
  EXPECT_TRUE(malformed("vflow-artifact +2" + rest));
  EXPECT_TRUE(malformed("vflow-artifact  2" + rest));
  EXPECT_TRUE(malformed(header + " "));
  EXPECT_TRUE(malformed(header + "junk"));
  EXPECT_TRUE(malformed(header + "\r"));
  std::string upper = header;
  for (char &c : upper)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_FALSE(contains(errorOf(upper + body), "no error"));
  std::string huge = "vflow-artifact 99999999999999999999999" + rest;
  std::string why = errorOf(huge + body);
  EXPECT_TRUE(contains(why, "malformed") || contains(why, "not supported"))
      << why;
  std::string shortSum = header;
  shortSum.erase(shortSum.find("sha256=") + 7, 1);
  EXPECT_TRUE(malformed(shortSum));
}

TEST(Artifact, HeaderNumbersHaveNoLeadingZero) {
  // One header per artifact: "08" is not version 8, "bytes=0123" is not 123
  // (both were read as such).
  std::string good = serializeArtifact(sample());
  size_t newline = good.find('\n');
  std::string header = good.substr(0, newline), body = good.substr(newline);
  // The header after "vflow-artifact N".
  const std::string rest =
      header.substr(15 + std::to_string(kArtifactVersion).size());
  std::string version = std::to_string(kArtifactVersion);
  std::string tail = header.substr(std::strlen("vflow-artifact ") +
                                   version.size()); // " sha256=..."
  for (std::string zeros : {"0", "00"}) {
    std::string why =
        errorOf("vflow-artifact " + zeros + version + tail + body);
    EXPECT_TRUE(contains(why, "x.vfa: malformed artifact header 'vflow-"
                              "artifact " +
                                  zeros + version))
        << why;
    EXPECT_TRUE(contains(why, "': the version has a leading zero (expected "
                              "'vflow-artifact " +
                                  version))
        << why;
  }
  std::string padded = header;
  padded.insert(padded.find(" bytes=") + 7, "0");
  EXPECT_TRUE(contains(errorOf(padded + body),
                       "': the byte count has a leading zero (expected"))
      << errorOf(padded + body);
  // A lone 0 is a number: an empty body's count.
  std::string empty =
      "vflow-artifact " + version + " sha256=" + sha256Hex("") + " bytes=0\n";
  EXPECT_FALSE(contains(errorOf(empty), "leading zero")) << errorOf(empty);
  EXPECT_FALSE(contains(errorOf(empty), "malformed")) << errorOf(empty);
  EXPECT_EQ(errorOf(good), "no error");
}

TEST(Artifact, Int8IsNoFieldOrStateDType) {
  // int8 is the KV cache's dtype (scaled per token): a field or state
  // stored as int8 has no rule for its values.
  FlowArtifact f = unstamped();
  f.fields[0].dtype = DType::INT8;
  EXPECT_TRUE(contains(errorOfFlow(f), "dtype int8 is for the KV cache only"))
      << errorOfFlow(f);
  f = unstamped();
  f.states[0].dtype = DType::INT8;
  EXPECT_TRUE(contains(errorOfFlow(f), "dtype int8 is for the KV cache only"))
      << errorOfFlow(f);
}

TEST(Artifact, MissingMembersAreNamed) {
  std::string body = "{\"compiler\":\"x\",\"flows\":[{\"name\":\"f\"}]}";
  std::string header = "vflow-artifact " + std::to_string(kArtifactVersion) +
                       " sha256=" + sha256Hex(body) +
                       " bytes=" + std::to_string(body.size()) + "\n";
  EXPECT_EQ(errorOf(header + body), "flow 'f': missing 'block_size'");
}

// Each of these edits, made after the compiler wrote the code, crashed the
// runtime or selected silently wrong blocks: now the metadata no longer
// matches the code's signature and the artifact is refused.
TEST(Artifact, MetadataMustMatchItsCode) {
  std::vector<std::function<void(FlowArtifact &)>> edits = {
      [](FlowArtifact &f) {
        f.fields[0].axes = {{"dim", -3}, {"m", 8}};
      },
      [](FlowArtifact &f) { f.fields[0].axes.clear(); },
      [](FlowArtifact &f) { f.fields.clear(); },
      [](FlowArtifact &f) { f.states.clear(); },
      [](FlowArtifact &f) { f.indexInputs = {"q"}; },
      [](FlowArtifact &f) {
        f.blockSize = 32;
        f.params[1].value = 32;
      },
      [](FlowArtifact &f) { std::swap(f.params[0], f.params[2]); },
      [](FlowArtifact &f) { f.params[0].value = 8; },
      [](FlowArtifact &f) { f.states[0].init = 1; },
      [](FlowArtifact &f) {
        f.budgets[0].nodes[2].kind = BudgetNode::Kind::Max;
      },
      [](FlowArtifact &f) {
        f.selectionBudget[0].kind = SelectionNode::Kind::All;
      },
  };
  for (size_t i = 0; i < edits.size(); ++i) {
    FlowArtifact f = unstamped();
    stampSignature(f);
    edits[i](f);
    std::string why = errorOfFlow(f, /*stamp=*/false);
    EXPECT_TRUE(contains(why, "was not generated for this metadata"))
        << "edit " << i << ": " << why;
    EXPECT_TRUE(contains(why, "recompile the program with vflowc"))
        << "edit " << i << ": " << why;
  }
  // The CUDA source is checked the same way.
  FlowArtifact f = unstamped();
  f.gpu.source = "extern \"C\" __global__ void k() {}\n";
  stampSignature(f);
  f.gpu.source = "// vflow-signature: 0\n" + f.gpu.source;
  EXPECT_TRUE(contains(errorOfFlow(f, false), "its CUDA source was not"));
}

TEST(Artifact, InconsistentMetadataIsRefused) {
  struct Case {
    std::function<void(FlowArtifact &)> edit;
    std::string message;
  };
  std::vector<Case> cases = {
      {[](FlowArtifact &f) { f.blockSize = 32; },
       "its block_size (32) differs from its param's (16)"},
      {[](FlowArtifact &f) {
         f.blockSize = 0;
         f.params[1].value = 0;
       },
       "block_size, keep_first, keep_last or head_dim is out of range"},
      {[](FlowArtifact &f) {
         f.blockSize = 24;
         f.params[1].value = 24;
       },
       "block_size 24 is not a power of two"},
      {[](FlowArtifact &f) { f.params.erase(f.params.begin() + 2); },
       "it has no 'keep_first' param"},
      {[](FlowArtifact &f) { f.keepFirst = 3; },
       "its keep_first differs from its param's"},
      {[](FlowArtifact &f) { f.params[0].value = 0.5; },
       "param 'budget' is an int but its value is not an integer"},
      {[](FlowArtifact &f) { f.params.push_back(f.params[0]); },
       "param 'budget' is declared twice"},
      {[](FlowArtifact &f) { f.states[0].perBlock = false; },
       "state 'acc': per_block disagrees with its axes"},
      {[](FlowArtifact &f) {
         f.fields[0].axes.push_back({"block", -1});
       },
       "only states have the block axis"},
      {[](FlowArtifact &f) {
         f.fields[0].axes = {{"token", 16}};
       },
       "cannot have the token axis"},
      {[](FlowArtifact &f) {
         f.fields[0].axes = {{"m", 0}};
       },
       "bad size 0 for axis 'm'"},
      {[](FlowArtifact &f) {
         f.fields[0].axes = {{"m", 65537}};
       },
       "has size 65537, not in [1, 65536]"},
      {[](FlowArtifact &f) {
         f.fields[0].axes = {
             {"a", 65536}, {"b", 65536}, {"c", 65536}, {"d", 65536}};
       },
       "has more elements than the limits allow"},
      {[](FlowArtifact &f) {
         f.fields[0].axes = {{"dim", -3}, {"dim", -3}};
       },
       "is not a valid, distinct axis name"},
      {[](FlowArtifact &f) { f.fields[0].name = "acc"; },
       "state 'acc': the name is used twice"},
      {[](FlowArtifact &f) { f.indexInputs.push_back("magic"); },
       "index input 'magic' is unknown or repeated"},
      {[](FlowArtifact &f) { f.entryPoints["index"] = "system"; },
       "its entry points are not vflow_quest_"},
      {[](FlowArtifact &f) { f.name = "bad name"; },
       "the flow name is not an identifier"},
      {[](FlowArtifact &f) { f.budgets[0].nodes[2].a = 2; },
       "budget node 2 reads a node that is not before it"},
      {[](FlowArtifact &f) { f.selectionBudget[0].budget = 1; },
       "selection node 0 reads a budget that does not exist"},
  };
  EXPECT_EQ(errorOfFlow(unstamped()), "no error");
  for (const Case &c : cases) {
    FlowArtifact f = unstamped();
    c.edit(f);
    std::string why = errorOfFlow(f);
    EXPECT_TRUE(contains(why, c.message)) << why;
  }
}

/// A flow with CUDA kernels of every grid, as the CUDA backend describes
/// them.
FlowArtifact withGpuKernels() {
  FlowArtifact f = unstamped();
  f.gpu.source = "extern \"C\" __global__ void k() {}\n";
  f.gpu.kernels = {{"vflow_quest_append", GpuGrid::Append, 256, 0, {}, {}},
                   {"vflow_quest_fields", GpuGrid::Fields, 256, 0, {}, {}},
                   {"vflow_quest_k0", GpuGrid::Tile, 256, 64, {{-2}}, {}, true},
                   {"vflow_quest_k1", GpuGrid::Row, 1024, 0, {}, {}},
                   {"vflow_quest_commit", GpuGrid::Commit, 256, 0, {}, {}}};
  return f;
}

/// `bytes` with `from` replaced by `to` in the body and the header's
/// checksum and size made right again.
std::string editBody(const std::string &bytes, const std::string &from,
                     const std::string &to) {
  std::string body = bytes.substr(bytes.find('\n') + 1);
  size_t at = body.find(from);
  if (at == std::string::npos)
    return "";
  body.replace(at, from.size(), to);
  return "vflow-artifact " + std::to_string(kArtifactVersion) +
         " sha256=" + sha256Hex(body) +
         " bytes=" + std::to_string(body.size()) + "\n" + body;
}

TEST(Artifact, GpuKernelGridsRoundTripByName) {
  std::string bytes = serializeArtifact(artifactOf(withGpuKernels()));
  for (const char *name : {"append", "fields", "tile", "row", "commit"})
    EXPECT_TRUE(contains(bytes, std::string("\"grid\":\"") + name + "\""))
        << name;
  Artifact back = parseArtifact(bytes, "gpu.vfa");
  const std::vector<GpuKernelInfo> &kernels = back.flows[0].gpu.kernels;
  ASSERT_EQ(kernels.size(), 5u);
  std::vector<GpuGrid> grids;
  for (const GpuKernelInfo &k : kernels)
    grids.push_back(k.grid);
  EXPECT_EQ(grids, (std::vector<GpuGrid>{GpuGrid::Append, GpuGrid::Fields,
                                         GpuGrid::Tile, GpuGrid::Row,
                                         GpuGrid::Commit}));
  EXPECT_EQ(kernels[2].planTile, 64);
  EXPECT_EQ(kernels[3].threads, 1024);
  EXPECT_TRUE(kernels[2].appends);
  EXPECT_FALSE(kernels[3].appends);
  EXPECT_EQ(serializeArtifact(back), bytes);
  for (GpuGrid grid : grids)
    EXPECT_EQ(parseGpuGrid(gpuGridName(grid)), grid);
  EXPECT_EQ(parseGpuGrid("seq_kvhead"), std::nullopt);
}

TEST(Artifact, GpuKernelGridsAreChecked) {
  std::string bytes = serializeArtifact(artifactOf(withGpuKernels()));
  // An unknown grid is named, with the ones there are.
  std::string unknown =
      editBody(bytes, "\"grid\":\"row\"", "\"grid\":\"seq_kvhead\"");
  ASSERT_FALSE(unknown.empty());
  EXPECT_EQ(errorOf(unknown),
            "flow 'quest' cuda kernel 'vflow_quest_k1': unknown grid "
            "'seq_kvhead' (expected append, fields, tile, row or commit)");
  std::string number = editBody(bytes, "\"grid\":\"row\"", "\"grid\":3");
  ASSERT_FALSE(number.empty());
  EXPECT_TRUE(contains(errorOf(number), "vflow_quest_k1'.grid"))
      << errorOf(number);
  // A tile kernel has a planned tile; no other kernel has one.
  FlowArtifact f = withGpuKernels();
  f.gpu.kernels[2].planTile = 0;
  EXPECT_TRUE(contains(errorOfFlow(f), "GPU kernel 'vflow_quest_k0' of grid "
                                       "tile has plan_tile 0"))
      << errorOfFlow(f);
  f = withGpuKernels();
  f.gpu.kernels[3].planTile = 64;
  EXPECT_TRUE(contains(errorOfFlow(f), "GPU kernel 'vflow_quest_k1' of grid "
                                       "row has plan_tile 64"))
      << errorOfFlow(f); // Only the first index kernel may do the append.
  f = withGpuKernels();
  f.gpu.kernels[3].appends = true;
  EXPECT_TRUE(contains(errorOfFlow(f), "GPU kernel 'vflow_quest_k1' appends "
                                       "but is not the first index kernel"))
      << errorOfFlow(f);
  f = withGpuKernels();
  f.gpu.kernels[4].appends = true;
  EXPECT_TRUE(contains(errorOfFlow(f), "GPU kernel 'vflow_quest_commit' "
                                       "appends but is not the first index "
                                       "kernel"))
      << errorOfFlow(f);
  std::string missing = editBody(bytes, ",\"appends\":true", "");
  ASSERT_FALSE(missing.empty());
  EXPECT_TRUE(contains(errorOf(missing), "vflow_quest_k0'") &&
              contains(errorOf(missing), "appends"))
      << errorOf(missing);
}

TEST(Artifact, ConstValuesRoundTripAndAreChecked) {
  FlowArtifact f = unstamped();
  ArtifactTensor w;
  w.name = "W";
  w.axes = {{"dim", -3}, {"m", 3}};
  f.consts = {w};
  for (int64_t d : {64, 128}) {
    FlowArtifact::ConstValues c;
    c.headDim = d;
    c.values.push_back(std::vector<float>(size_t(d) * 3));
    for (size_t i = 0; i < c.values[0].size(); ++i)
      c.values[0][i] = float(i) * 0.5f - 7.25f;
    c.values[0][1] = -0.0f;
    c.values[0][2] = std::numeric_limits<float>::denorm_min();
    f.constValues.push_back(c);
  }
  Artifact back = parseArtifact(serializeArtifact(artifactOf(f)), "consts.vfa");
  const FlowArtifact::ConstValues *c128 = back.flows[0].findConstValues(128);
  ASSERT_NE(c128, nullptr);
  ASSERT_EQ(c128->values[0].size(), 384u);
  for (size_t i = 0; i < 384; ++i)
    EXPECT_EQ(
        std::memcmp(&c128->values[0][i], &f.constValues[1].values[0][i], 4), 0)
        << i;
  EXPECT_EQ(back.flows[0].findConstValues(256), nullptr);
  FlowArtifact bad = f;
  bad.constValues[0].values[0].pop_back();
  EXPECT_TRUE(contains(errorOfFlow(bad), "const 'W' has 191 values, not 192"));
  bad = f;
  bad.constValues[1].headDim = 64;
  EXPECT_TRUE(contains(errorOfFlow(bad), "out of range or repeated"));
}

TEST(Artifact, SavesAndLoadsFiles) {
  std::string path = ::testing::TempDir() + "/sample.vfa";
  saveArtifact(sample(), path);
  EXPECT_EQ(loadArtifact(path).flows[0].name, "quest");
  EXPECT_THROW(loadArtifact(path + ".missing"), Error);
  EXPECT_THROW(loadArtifact(::testing::TempDir()), Error);
  std::string loop = ::testing::TempDir() + "/loop.vfa";
  std::remove(loop.c_str());
  ASSERT_EQ(::symlink(loop.c_str(), loop.c_str()), 0);
  try {
    loadArtifact(loop);
    ADD_FAILURE() << "a symlink loop loaded";
  } catch (const Error &e) {
    EXPECT_TRUE(contains(e.what(), "Too many levels of symbolic links"))
        << e.what();
  }
  std::remove(loop.c_str());
}
