//===- ModelTestUtil.h - Writing tiny models for the tests ------*- C++ -*-===//
//
// Temporary directories and file helpers for the model tests, over the
// writers of ModelFiles.h, so the tests build every file they load byte by
// byte.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_TESTS_MODEL_MODELTESTUTIL_H
#define VFLOW_TESTS_MODEL_MODELTESTUTIL_H

#include "ModelFiles.h"

#include "vflow/Runtime/Error.h"

#include "../runtime/TestUtil.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace vflow::model::test {

/// The runtime tests' check of an rt::Error's message.
using vflow::rt::test::expectError;

/// A fresh directory under gtest's temp dir, removed at the end.
class TempDir {
public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "/vflow-model-XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data()))
      throw std::runtime_error("mkdtemp failed");
    dir = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string path(const std::string &name) const { return dir + "/" + name; }
  const std::string &str() const { return dir; }

private:
  std::string dir;
};

/// SmolLM2-135M's sizes (its config.json and its GGUF).
constexpr ModelShape kSmolLM2Shape{/*vocabSize=*/49152,
                                   /*hiddenSize=*/576,
                                   /*intermediateSize=*/1536,
                                   /*numLayers=*/30,
                                   /*numHeads=*/9,
                                   /*numKVHeads=*/3,
                                   /*headDim=*/64};

/// Checks that config `c` has the sizes `shape`, naming each one that
/// differs.
inline void expectShape(const ModelConfig &c, const ModelShape &shape) {
  EXPECT_EQ(c.vocabSize, shape.vocabSize) << "vocabSize";
  EXPECT_EQ(c.hiddenSize, shape.hiddenSize) << "hiddenSize";
  EXPECT_EQ(c.intermediateSize, shape.intermediateSize) << "intermediateSize";
  EXPECT_EQ(c.numLayers, shape.numLayers) << "numLayers";
  EXPECT_EQ(c.numHeads, shape.numHeads) << "numHeads";
  EXPECT_EQ(c.numKVHeads, shape.numKVHeads) << "numKVHeads";
  EXPECT_EQ(c.headDim, shape.headDim) << "headDim";
}

inline void writeFile(const std::string &path, const std::string &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

} // namespace vflow::model::test

#endif // VFLOW_TESTS_MODEL_MODELTESTUTIL_H
