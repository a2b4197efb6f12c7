//===- KQuantTest.cpp - ggml block types against the gguf reference -------===//
//
// tests/model/data/kquants.gguf (tests/model/kquant_golden.py writes it with
// the gguf package) holds, for every ggml block type the reader decodes,
// blocks of random bytes and real blocks of Qwen2.5-Coder-0.5B's Q4_K_M
// GGUF, each beside NAME.expected: the reference's numpy dequantization of
// the same bytes. vflow's decoding must give the same f32 bits.
//
//===----------------------------------------------------------------------===//

#include "../../runtime/model/Internal.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>

using namespace vflow::model::detail;

namespace {

std::vector<float> decoded(const Tensor &t) {
  int64_t count = 1;
  for (int64_t d : t.shape)
    count *= d;
  std::vector<float> out(static_cast<size_t>(count));
  decodeElements(t, 0, count, out.data());
  return out;
}

} // namespace

TEST(KQuant, EveryBlockTypeMatchesTheGgufReference) {
  auto file = MappedFile::open(VFLOW_MODEL_DATA_DIR "/kquants.gguf");
  GgufContents contents = readGguf(file);
  std::map<std::string, const Tensor *> byName;
  for (const Tensor &t : contents.tensors)
    byName[t.storedName] = &t;
  std::set<std::string> types, real;
  for (const Tensor &t : contents.tensors) {
    const std::string &name = t.storedName;
    if (name.size() > 9 && name.substr(name.size() - 9) == ".expected")
      continue;
    auto want = byName.find(name + ".expected");
    ASSERT_NE(want, byName.end()) << name;
    std::vector<float> got = decoded(t), expected = decoded(*want->second);
    ASSERT_EQ(got.size(), expected.size()) << name;
    size_t differ = 0, first = got.size();
    for (size_t i = 0; i < got.size(); ++i)
      if (std::memcmp(&got[i], &expected[i], sizeof(float)) != 0) {
        differ += 1;
        first = std::min(first, i);
      }
    EXPECT_EQ(differ, 0u) << name << ": " << differ << " of " << got.size()
                          << " values differ, the first at " << first << " ("
                          << (first < got.size() ? got[first] : 0.0f) << " vs "
                          << (first < got.size() ? expected[first] : 0.0f)
                          << ")";
    types.insert(storageName(t.storage));
    if (name.find(".real") != std::string::npos)
      real.insert(storageName(t.storage));
  }
  EXPECT_EQ(types,
            (std::set<std::string>{"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}));
  // What Qwen2.5-Coder-0.5B's Q4_K_M file holds.
  EXPECT_EQ(real, (std::set<std::string>{"Q4_K", "Q5_0", "Q6_K", "Q8_0"}));
}
