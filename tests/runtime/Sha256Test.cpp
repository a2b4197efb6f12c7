//===- Sha256Test.cpp - SHA-256 against the FIPS 180-2 vectors ------------===//

#include "vflow/Runtime/Sha256.h"

#include <gtest/gtest.h>

#include <string>

using namespace vflow::rt;

namespace {

TEST(Sha256, FipsVectors) {
  EXPECT_EQ(sha256Hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(
      sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, FipsTwoBlockVector) {
  EXPECT_EQ(
      sha256Hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn"
                "hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
      "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

// Lengths around the padding boundaries (55/56 bytes: the length fits in the
// last block or not; 64: a whole block). Expected values from coreutils
// sha256sum.
TEST(Sha256, PaddingBoundaries) {
  struct Case {
    size_t length;
    const char *hex;
  } cases[] = {
      {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
      {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
      {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
      {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
      {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
      {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
      {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
  };
  for (const Case &c : cases)
    EXPECT_EQ(sha256Hex(std::string(c.length, 'a')), c.hex) << c.length;
}

// Feeding the same bytes in pieces of every size gives the same digest, and
// hex() can be called in the middle without disturbing the state.
TEST(Sha256, IncrementalMatchesOneShot) {
  std::string text;
  for (int i = 0; i < 300; ++i)
    text += static_cast<char>(i * 37 + 11);
  std::string whole = sha256Hex(text);
  for (size_t piece = 1; piece <= 130; ++piece) {
    Sha256 hash;
    for (size_t at = 0; at < text.size(); at += piece) {
      hash.update(text.substr(at, piece));
      if (at == 0) {
        EXPECT_EQ(hash.hex(), sha256Hex(text.substr(0, piece)));
      }
    }
    EXPECT_EQ(hash.hex(), whole) << "piece " << piece;
  }
  Sha256 byPointer;
  byPointer.update(text.data(), text.size());
  EXPECT_EQ(byPointer.hex(), whole);
  EXPECT_EQ(sha256Hex(text.data(), text.size()), whole);
  EXPECT_EQ(byPointer.digest().size(), 32u);
}

} // namespace
