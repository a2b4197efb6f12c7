//===- NpyTest.cpp - Reading .npy files: strict headers, limits, data -----===//

#include "vflow/Frontend/Npy.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <unistd.h>

using namespace vflow;

namespace {

/// A .npy file (format 1.0) with `header` padded to 64 bytes and `data`.
std::string npyBytes(const std::string &header, const std::string &data,
                     bool pad = true) {
  std::string h = header;
  if (pad) {
    while ((10 + h.size() + 1) % 64 != 0)
      h += ' ';
    h += '\n';
  }
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(h.size() & 0xff);
  out += static_cast<char>(h.size() >> 8);
  return out + h + data;
}

std::string dict(const std::string &descr, const std::string &shape,
                 bool fortran = false) {
  return "{'descr': '" + descr +
         "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + shape + ", }";
}

std::string floats(std::initializer_list<float> values) {
  std::string out;
  for (float v : values)
    out.append(reinterpret_cast<const char *>(&v), 4);
  return out;
}

/// A file in a private temporary directory, removed at the end of the test.
class NpyFile : public ::testing::Test {
protected:
  void SetUp() override {
    char pattern[] = "/tmp/vflow-npy-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir = pattern;
  }
  void TearDown() override {
    for (const std::string &f : files)
      std::remove(f.c_str());
    rmdir(dir.c_str());
  }
  std::string write(const std::string &name, const std::string &bytes) {
    std::string path = dir + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    files.push_back(path);
    return path;
  }
  std::string dir;
  std::vector<std::string> files;
};

bool header(const std::string &text, std::string &error) {
  NpyHeader h;
  return parseNpyHeader(text, h, error);
}

} // namespace

TEST(NpyHeader, AcceptsWhatNumPyWrites) {
  NpyHeader h;
  std::string error;
  ASSERT_TRUE(parseNpyHeader(dict("<f4", "(3, 4)") + "      \n", h, error))
      << error;
  EXPECT_EQ(h.kind, 'f');
  EXPECT_EQ(h.itemSize, 4);
  EXPECT_EQ(h.byteOrder, '<');
  EXPECT_FALSE(h.fortranOrder);
  EXPECT_EQ(h.shape, (std::vector<int64_t>{3, 4}));
  ASSERT_TRUE(parseNpyHeader(
      "{\"shape\":(8,),\"fortran_order\":True,\"descr\":\"|b1\"}", h, error))
      << error;
  EXPECT_EQ(h.shape, (std::vector<int64_t>{8}));
  EXPECT_TRUE(h.fortranOrder);
  ASSERT_TRUE(parseNpyHeader(dict(">i8", "()"), h, error)) << error;
  EXPECT_TRUE(h.shape.empty());
  ASSERT_TRUE(parseNpyHeader(dict("<u2", "(2, 0, 5,)"), h, error)) << error;
  EXPECT_EQ(h.shape, (std::vector<int64_t>{2, 0, 5}));
}

TEST(NpyHeader, RejectsLaxShapes) {
  std::string error;
  EXPECT_FALSE(header(dict("<f4", "(8, 'x')"), error));
  EXPECT_NE(error.find("non-negative integers"), std::string::npos) << error;
  EXPECT_FALSE(header(dict("<f4", "( 8abc , )"), error));
  EXPECT_FALSE(header(dict("<f4", "(8)"), error));
  EXPECT_NE(error.find("(8,)"), std::string::npos) << error;
  EXPECT_FALSE(header(dict("<f4", "(-1,)"), error));
  EXPECT_FALSE(header(dict("<f4", "(08,)"), error));
  EXPECT_FALSE(header(dict("<f4", "(8,,)"), error));
  EXPECT_FALSE(header(dict("<f4", "[8]"), error));
  EXPECT_FALSE(header(dict("<f4", "(8L,)"), error));
  EXPECT_FALSE(header(dict("<f4", "(99999999999999,)"), error));
}

TEST(NpyHeader, RejectsOtherKeysAndValues) {
  std::string error;
  EXPECT_FALSE(header("{'descr': '<f4', 'shape': (8,)}", error));
  EXPECT_NE(error.find("fortran_order"), std::string::npos) << error;
  EXPECT_FALSE(header(dict("<f4", "(8,)") + " x", error));
  EXPECT_FALSE(header("{'descr': '<f4', 'fortran_order': False, 'shape': "
                      "(8,), 'extra': 1}",
                      error));
  EXPECT_NE(error.find("'extra'"), std::string::npos) << error;
  EXPECT_FALSE(header("{'descr': '<f4', 'descr': '<f4', 'fortran_order': "
                      "False, 'shape': (8,)}",
                      error));
  EXPECT_FALSE(header(dict("<f4", "(8,)", false).substr(1), error));
  EXPECT_FALSE(
      header("{'descr': '<f4', 'fortran_order': 0, 'shape': (8,)}", error));
  EXPECT_FALSE(header(dict("<c8", "(8,)"), error));
  EXPECT_NE(error.find("unsupported dtype"), std::string::npos) << error;
  EXPECT_FALSE(header(dict("|f4", "(8,)"), error));
  EXPECT_FALSE(header(dict("<f16", "(8,)"), error));
  EXPECT_FALSE(header("{'descr': [('a', '<f4')], 'fortran_order': False, "
                      "'shape': (8,)}",
                      error));
}

TEST_F(NpyFile, ReadsCAndFortranOrder) {
  NpyArray a;
  std::string error;
  std::string c = write(
      "c.npy", npyBytes(dict("<f4", "(2, 3)"), floats({0, 1, 2, 3, 4, 5})));
  ASSERT_TRUE(readNpy(c, a, error)) << error;
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.values, (std::vector<float>{0, 1, 2, 3, 4, 5}));
  // Column-major [[0, 1, 2], [3, 4, 5]] is stored 0 3 1 4 2 5.
  std::string f = write("f.npy", npyBytes(dict("<f4", "(2, 3)", true),
                                          floats({0, 3, 1, 4, 2, 5})));
  ASSERT_TRUE(readNpy(f, a, error)) << error;
  EXPECT_EQ(a.values, (std::vector<float>{0, 1, 2, 3, 4, 5}));
  // Three axes in Fortran order: element (i, j, k) is at i + 2 j + 4 k.
  std::string data;
  for (int k = 0; k < 2; ++k)
    for (int j = 0; j < 2; ++j)
      for (int i = 0; i < 2; ++i) {
        float v = float(4 * i + 2 * j + k);
        data.append(reinterpret_cast<const char *>(&v), 4);
      }
  std::string f3 =
      write("f3.npy", npyBytes(dict("<f4", "(2, 2, 2)", true), data));
  ASSERT_TRUE(readNpy(f3, a, error)) << error;
  EXPECT_EQ(a.values, (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST_F(NpyFile, ReadsIntegersBigEndianAndBools) {
  NpyArray a;
  std::string error;
  std::string be =
      write("be.npy",
            npyBytes(dict(">i2", "(2,)"), std::string("\xff\xfe\x01\x00", 4)));
  ASSERT_TRUE(readNpy(be, a, error)) << error;
  EXPECT_EQ(a.values, (std::vector<float>{-2, 256}));
  std::string b =
      write("b.npy", npyBytes(dict("|b1", "(3,)"), std::string("\1\0\1", 3)));
  ASSERT_TRUE(readNpy(b, a, error)) << error;
  EXPECT_EQ(a.values, (std::vector<float>{1, 0, 1}));
}

TEST_F(NpyFile, BoolEntriesMustBeZeroOrOne) {
  NpyArray a;
  std::string error;
  for (unsigned char bad : {2, 255}) {
    std::string bytes("\1\0\0", 3);
    bytes[2] = static_cast<char>(bad);
    std::string p = write("bad" + std::to_string(bad) + ".npy",
                          npyBytes(dict("|b1", "(3,)"), bytes));
    EXPECT_FALSE(readNpy(p, a, error));
    EXPECT_NE(error.find("element 2 is " + std::to_string(bad) +
                         "; bool entries must be 0 or 1"),
              std::string::npos)
        << error;
  }
}

TEST_F(NpyFile, SizeMustMatchTheHeaderExactly) {
  NpyArray a;
  std::string error;
  std::string shorter =
      write("short.npy", npyBytes(dict("<f4", "(3,)"), floats({1, 2})));
  EXPECT_FALSE(readNpy(shorter, a, error));
  EXPECT_NE(error.find("is truncated"), std::string::npos) << error;
  EXPECT_NE(error.find("describes 12 data bytes, but the file has 8"),
            std::string::npos)
      << error;
  std::string longer =
      write("long.npy", npyBytes(dict("<f4", "(1,)"), floats({1, 2})));
  EXPECT_FALSE(readNpy(longer, a, error));
  EXPECT_NE(error.find("is too long"), std::string::npos) << error;
  std::string cut =
      write("cut.npy", npyBytes(dict("<f4", "(1,)"), "").substr(0, 20));
  EXPECT_FALSE(readNpy(cut, a, error));
  EXPECT_NE(error.find("truncated"), std::string::npos) << error;
  std::string magic = write("magic.npy", "not a numpy file at all");
  EXPECT_FALSE(readNpy(magic, a, error));
  EXPECT_NE(error.find("bad magic"), std::string::npos) << error;
}

TEST_F(NpyFile, ElementCountIsCheckedBeforeAnythingIsRead) {
  // A header that claims 10^10 elements over a few bytes: refused at once,
  // without allocating.
  NpyArray a;
  std::string error;
  std::string p =
      write("huge.npy", npyBytes(dict("<f4", "(100000, 100000)"), "1234"));
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(readNpy(p, a, error));
  EXPECT_LT(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count(),
      1.0);
  EXPECT_NE(error.find("more than the limit of 1048576 elements"),
            std::string::npos)
      << error;
  EXPECT_TRUE(a.values.empty());
  // The limit is a parameter: 6 elements against a limit of 5.
  std::string six = write(
      "six.npy", npyBytes(dict("<f4", "(2, 3)"), floats({0, 1, 2, 3, 4, 5})));
  EXPECT_FALSE(readNpy(six, a, error, 5));
  EXPECT_TRUE(readNpy(six, a, error, 6)) << error;
}

TEST_F(NpyFile, ReadingIsLinear) {
  // 2^22 f32 elements in Fortran order (16 MiB): well under a second even on
  // a loaded machine (the old reader took quadratic-ish time and 70x the
  // memory on such files).
  int64_t rows = 2048, cols = 2048;
  std::string data(size_t(rows * cols) * 4, '\0');
  for (int64_t i = 0; i < rows * cols; ++i) {
    float v = float(i % 1000);
    std::memcpy(&data[size_t(i) * 4], &v, 4);
  }
  std::string p =
      write("big.npy", npyBytes(dict("<f4", "(2048, 2048)", true), data));
  NpyArray a;
  std::string error;
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(readNpy(p, a, error, int64_t(1) << 22)) << error;
  double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_LT(took, 3.0);
  ASSERT_EQ(a.values.size(), size_t(rows * cols));
  // Row-major (r, c) came from column-major position r + rows * c.
  EXPECT_EQ(a.values[1], float((rows * 1) % 1000));
  EXPECT_EQ(a.values[size_t(cols)], 1.0f);
}

TEST_F(NpyFile, UnreadableFilesSayWhy) {
  NpyArray a;
  std::string error;
  EXPECT_FALSE(readNpy(dir + "/missing.npy", a, error));
  EXPECT_NE(error.find("no such file"), std::string::npos) << error;
  std::string loop1 = dir + "/loop1.npy", loop2 = dir + "/loop2.npy";
  ASSERT_EQ(symlink(loop2.c_str(), loop1.c_str()), 0);
  ASSERT_EQ(symlink(loop1.c_str(), loop2.c_str()), 0);
  files.push_back(loop1);
  files.push_back(loop2);
  EXPECT_FALSE(readNpy(loop1, a, error));
  EXPECT_NE(error.find("too many levels of symbolic links"), std::string::npos)
      << error;
  EXPECT_FALSE(readNpy(dir, a, error));
  EXPECT_NE(error.find("is a directory"), std::string::npos) << error;
}
