//===- DTypeTest.cpp - Storage dtype conversions --------------------------===//
//
// The storage encodings (NumericRules.h, through rt::DType's names) against
// independent expectations: every code round-trips, random values and every
// midpoint between codes round to the nearest code (ties to even) found in
// the sorted table of decoded codes, and hand-picked boundaries. The
// interpreter, the CPU backend's generated code and the GPU kernels compile
// the same encoders, so no test compares them with each other.
//
//===----------------------------------------------------------------------===//

#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/NumericRules.h"

#include "../common/Random.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

using namespace vflow::rt;
using vflow::rules::bitsFloat;
using vflow::rules::floatBits;

namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

/// Encode/decode of one narrow dtype as plain functions of uint32_t codes.
struct Codec {
  DType type;
  int bits;
  uint32_t (*encode)(float);
  float (*decode)(uint32_t);
  bool hasInfinity;
};

/// The Codec of a dtype whose codes are `Code`s, converted by `encode` and
/// `decode`.
template <typename Code, Code (*encode)(float), float (*decode)(Code)>
Codec codec(DType type, bool hasInfinity) {
  return {type, int(8 * sizeof(Code)),
          [](float x) -> uint32_t { return encode(x); },
          [](uint32_t c) { return decode(Code(c)); }, hasInfinity};
}

const Codec kBF16 =
    codec<uint16_t, floatToBF16, bf16ToFloat>(DType::BF16, true);
const Codec kF16 = codec<uint16_t, floatToF16, f16ToFloat>(DType::F16, true);
const Codec kE4M3 =
    codec<uint8_t, floatToFP8E4M3, fp8E4M3ToFloat>(DType::FP8E4M3, false);
const Codec kE5M2 =
    codec<uint8_t, floatToFP8E5M2, fp8E5M2ToFloat>(DType::FP8E5M2, true);

/// Every code decodes to a value that encodes back to the same code; NaN
/// codes stay NaN with their sign. Positive finite values increase with the
/// code (so the decoded table is the sorted value set).
void checkRoundTrip(const Codec &codec) {
  uint32_t count = 1u << codec.bits;
  uint32_t signBit = count >> 1;
  int nans = 0;
  for (uint32_t code = 0; code < count; ++code) {
    float value = codec.decode(code);
    uint32_t back = codec.encode(value);
    if (std::isnan(value)) {
      ++nans;
      EXPECT_TRUE(std::isnan(codec.decode(back))) << std::hex << code;
      EXPECT_EQ(back & signBit, code & signBit) << std::hex << code;
      continue;
    }
    EXPECT_EQ(back, code) << std::hex << "code 0x" << code << " value "
                          << value;
    EXPECT_EQ(std::signbit(value), (code & signBit) != 0) << std::hex << code;
  }
  float previous = -1.0f;
  for (uint32_t code = 0; code < signBit; ++code) {
    float value = codec.decode(code);
    if (std::isnan(value))
      break;
    EXPECT_GT(value, previous) << std::hex << code;
    previous = value;
  }
  EXPECT_GT(nans, 0);
}

/// The nearest representable value, found in the sorted table of decoded
/// codes, ties to the even code; past the largest finite value an IEEE type
/// rounds as if infinity were the next binade's first value, e4m3fn
/// saturates.
uint32_t nearestCode(const Codec &codec, const std::vector<double> &table,
                     float x) {
  uint32_t signBit = (1u << codec.bits) >> 1;
  uint32_t sign = std::signbit(x) ? signBit : 0;
  double a = std::fabs(static_cast<double>(x));
  // table[code] is the value of `code`; with infinity, one more entry.
  size_t upper =
      std::lower_bound(table.begin(), table.end(), a) - table.begin();
  if (upper == table.size())
    return sign | static_cast<uint32_t>(table.size() - 1);
  if (upper == 0 || table[upper] == a)
    return sign | static_cast<uint32_t>(upper);
  size_t lower = upper - 1;
  double below = a - table[lower], above = table[upper] - a;
  if (below < above || (below == above && lower % 2 == 0))
    return sign | static_cast<uint32_t>(lower);
  return sign | static_cast<uint32_t>(upper);
}

std::vector<double> positiveTable(const Codec &codec) {
  uint32_t signBit = (1u << codec.bits) >> 1;
  std::vector<double> table;
  for (uint32_t code = 0; code < signBit; ++code) {
    float value = codec.decode(code);
    if (std::isnan(value) || std::isinf(value))
      break;
    table.push_back(value);
  }
  if (codec.hasInfinity) {
    double ulp = table.back() - table[table.size() - 2];
    table.push_back(table.back() + ulp);
  }
  return table;
}

void checkAgainstNearest(const Codec &codec, unsigned seed) {
  std::mt19937 rng(seed);
  // Values near the type's range: random bit patterns with small exponents,
  // plus exact midpoints between neighbouring codes (ties).
  std::uniform_int_distribution<uint32_t> fraction(0, (1u << 23) - 1);
  std::uniform_int_distribution<int> exponent(-30, 20);
  std::vector<float> inputs;
  for (int i = 0; i < 20000; ++i) {
    float value = std::ldexp(1.0f + fraction(rng) * 0x1p-23f, exponent(rng));
    inputs.push_back(i % 2 ? value : -value);
  }
  uint32_t signBit = (1u << codec.bits) >> 1;
  for (uint32_t code = 0; code + 1 < signBit; ++code) {
    float low = codec.decode(code), high = codec.decode(code + 1);
    if (std::isnan(high) || std::isinf(high))
      break;
    inputs.push_back(low + (high - low) / 2); // exact in f32
    inputs.push_back(std::nextafter(low + (high - low) / 2, kInf));
    inputs.push_back(std::nextafter(low + (high - low) / 2, -kInf));
  }
  inputs.push_back(3.0e38f);
  inputs.push_back(-1.0e-40f);
  std::vector<double> table = positiveTable(codec);
  for (float x : inputs)
    EXPECT_EQ(codec.encode(x), nearestCode(codec, table, x))
        << dtypeName(codec.type) << " x=" << x << " bits=0x" << std::hex
        << floatBits(x);
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(bytesPerElement(DType::F32), 4u);
  EXPECT_EQ(bytesPerElement(DType::BF16), 2u);
  EXPECT_EQ(bytesPerElement(DType::F16), 2u);
  EXPECT_EQ(bytesPerElement(DType::FP8E4M3), 1u);
  EXPECT_EQ(bytesPerElement(DType::FP8E5M2), 1u);
  EXPECT_EQ(bytesPerElement(DType::INT8), 1u);
  for (DType type : {DType::F32, DType::BF16, DType::F16, DType::FP8E4M3,
                     DType::FP8E5M2, DType::INT8})
    EXPECT_EQ(parseDType(dtypeName(type)), type);
  EXPECT_STREQ(dtypeName(DType::FP8E4M3), "fp8e4m3");
  EXPECT_FALSE(parseDType("fp8").has_value());
  EXPECT_FALSE(parseDType("").has_value());
}

TEST(DType, BF16RoundTripsEveryCode) { checkRoundTrip(kBF16); }
TEST(DType, F16RoundTripsEveryCode) { checkRoundTrip(kF16); }
TEST(DType, FP8E4M3RoundTripsEveryCode) { checkRoundTrip(kE4M3); }
TEST(DType, FP8E5M2RoundTripsEveryCode) { checkRoundTrip(kE5M2); }

TEST(DType, F16MatchesNearestValue) { checkAgainstNearest(kF16, 11); }
TEST(DType, BF16MatchesNearestValue) { checkAgainstNearest(kBF16, 12); }
TEST(DType, FP8E4M3MatchesNearestValue) { checkAgainstNearest(kE4M3, 13); }
TEST(DType, FP8E5M2MatchesNearestValue) { checkAgainstNearest(kE5M2, 14); }

TEST(DType, BF16HandPicked) {
  EXPECT_EQ(floatToBF16(1.0f), 0x3F80);
  EXPECT_EQ(floatToBF16(-2.0f), 0xC000);
  // Ties go to the even code: 1 + 2^-8 lies between 0x3F80 and 0x3F81.
  EXPECT_EQ(floatToBF16(1.0f + 0x1p-8f), 0x3F80);
  EXPECT_EQ(floatToBF16(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(floatToBF16(std::nextafter(1.0f + 0x1p-8f, 2.0f)), 0x3F81);
  EXPECT_EQ(floatToBF16(std::numeric_limits<float>::max()), 0x7F80); // inf
  EXPECT_EQ(floatToBF16(kInf), 0x7F80);
  EXPECT_EQ(floatToBF16(-kInf), 0xFF80);
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBF16(kNaN))));
  EXPECT_EQ(floatToBF16(-0.0f), 0x8000);
  EXPECT_EQ(floatToBF16(bitsFloat(0x00000001)), 0x0000); // tiny subnormal
  EXPECT_EQ(floatToBF16(bitsFloat(0x00010000)), 0x0001); // bf16 subnormal
  EXPECT_EQ(bf16ToFloat(0x0001), bitsFloat(0x00010000));
  EXPECT_EQ(bf16ToFloat(0x4049), 3.140625f);
}

TEST(DType, F16HandPicked) {
  EXPECT_EQ(floatToF16(1.0f), 0x3C00);
  EXPECT_EQ(floatToF16(-2.0f), 0xC000);
  EXPECT_EQ(floatToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(floatToF16(65519.0f), 0x7BFF);
  EXPECT_EQ(floatToF16(65520.0f), 0x7C00); // tie with infinity: even code
  EXPECT_EQ(floatToF16(1e9f), 0x7C00);
  EXPECT_EQ(floatToF16(-kInf), 0xFC00);
  EXPECT_EQ(f16ToFloat(0x7C00), kInf);
  EXPECT_TRUE(std::isnan(f16ToFloat(0x7E00)));
  EXPECT_TRUE(std::isnan(f16ToFloat(floatToF16(kNaN))));
  EXPECT_EQ(floatToF16(0x1p-24f), 0x0001);        // smallest subnormal
  EXPECT_EQ(floatToF16(0x1p-25f), 0x0000);        // tie: even is zero
  EXPECT_EQ(floatToF16(1.5f * 0x1p-25f), 0x0001); // above the tie
  EXPECT_EQ(floatToF16(-0x1p-26f), 0x8000);       // underflow keeps the sign
  EXPECT_EQ(floatToF16(0x1p-14f), 0x0400);        // smallest normal
  EXPECT_EQ(f16ToFloat(0x03FF), 1023 * 0x1p-24f);
  EXPECT_EQ(floatToF16(1.0f / 3.0f), 0x3555);
  // 1 + 2^-11 is a tie between 0x3C00 and 0x3C01.
  EXPECT_EQ(floatToF16(1.0f + 0x1p-11f), 0x3C00);
  EXPECT_EQ(floatToF16(1.0f + 3 * 0x1p-11f), 0x3C02);
  // Rounding up carries into the exponent: 2 - 2^-12 rounds to 2.
  EXPECT_EQ(floatToF16(2.0f - 0x1p-12f), 0x4000);
}

TEST(DType, FP8E4M3HandPicked) {
  EXPECT_EQ(floatToFP8E4M3(1.0f), 0x38);
  EXPECT_EQ(fp8E4M3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(fp8E4M3ToFloat(0x08), 0x1p-6f);
  EXPECT_EQ(fp8E4M3ToFloat(0x01), 0x1p-9f);
  EXPECT_TRUE(std::isnan(fp8E4M3ToFloat(0x7F)));
  EXPECT_TRUE(std::isnan(fp8E4M3ToFloat(0xFF)));
  // No infinities: everything past 448 saturates, infinities too.
  EXPECT_EQ(floatToFP8E4M3(448.0f), 0x7E);
  EXPECT_EQ(floatToFP8E4M3(464.0f), 0x7E);
  EXPECT_EQ(floatToFP8E4M3(1e9f), 0x7E);
  EXPECT_EQ(floatToFP8E4M3(kInf), 0x7E);
  EXPECT_EQ(floatToFP8E4M3(-kInf), 0xFE);
  EXPECT_EQ(floatToFP8E4M3(-500.0f), 0xFE);
  EXPECT_EQ(floatToFP8E4M3(kNaN) & 0x7F, 0x7F);
  EXPECT_EQ(floatToFP8E4M3(0x1p-10f), 0x00); // tie: even is zero
  EXPECT_EQ(floatToFP8E4M3(0x1p-9f), 0x01);
  EXPECT_EQ(floatToFP8E4M3(1.0625f), 0x38); // tie between 1 and 1.125
  EXPECT_EQ(floatToFP8E4M3(1.1875f), 0x3A); // tie between 1.125 and 1.25
  EXPECT_EQ(floatToFP8E4M3(-0.0f), 0x80);
}

TEST(DType, FP8E5M2HandPicked) {
  EXPECT_EQ(floatToFP8E5M2(1.0f), 0x3C);
  EXPECT_EQ(fp8E5M2ToFloat(0x7B), 57344.0f);
  EXPECT_EQ(fp8E5M2ToFloat(0x7C), kInf);
  EXPECT_EQ(fp8E5M2ToFloat(0x01), 0x1p-16f);
  EXPECT_TRUE(std::isnan(fp8E5M2ToFloat(0x7D)));
  EXPECT_EQ(floatToFP8E5M2(60000.0f), 0x7B);
  EXPECT_EQ(floatToFP8E5M2(61440.0f), 0x7C); // tie with infinity
  EXPECT_EQ(floatToFP8E5M2(kInf), 0x7C);
  EXPECT_EQ(floatToFP8E5M2(-kInf), 0xFC);
  EXPECT_TRUE(std::isnan(fp8E5M2ToFloat(floatToFP8E5M2(kNaN))));
  EXPECT_EQ(floatToFP8E5M2(0x1p-17f), 0x00);
  EXPECT_EQ(floatToFP8E5M2(1.125f), 0x3C); // tie between 1 and 1.25
  EXPECT_EQ(floatToFP8E5M2(1.375f), 0x3E); // tie between 1.25 and 1.5
}

TEST(DType, Int8RoundsHalfToEvenAndSaturates) {
  auto code = [](float x) {
    signed char c;
    convertFromF32(DType::INT8, &x, &c, 1);
    return int(c);
  };
  EXPECT_EQ(code(0.5f), 0);
  EXPECT_EQ(code(1.5f), 2);
  EXPECT_EQ(code(2.5f), 2);
  EXPECT_EQ(code(-2.5f), -2);
  EXPECT_EQ(code(-3.5f), -4);
  EXPECT_EQ(code(2.4999998f), 2);
  EXPECT_EQ(code(126.5f), 126);
  EXPECT_EQ(code(127.4f), 127);
  EXPECT_EQ(code(1000.0f), 127);
  EXPECT_EQ(code(-1000.0f), -127); // -128 is never written
  EXPECT_EQ(code(kInf), 127);
  EXPECT_EQ(code(kNaN), 0);
  for (int c = -127; c <= 127; ++c) {
    float x = float(c), back;
    signed char stored = static_cast<signed char>(c);
    convertToF32(DType::INT8, &stored, &back, 1);
    EXPECT_EQ(back, x);
    EXPECT_EQ(roundToDType(DType::INT8, x), x);
  }
  // The scaled formats and their largest values; the others are unscaled.
  EXPECT_EQ(kvFormatMax(DType::INT8), 127.0f);
  EXPECT_EQ(kvFormatMax(DType::FP8E4M3), 448.0f);
  EXPECT_EQ(kvFormatMax(DType::FP8E5M2), 57344.0f);
  EXPECT_TRUE(isScaledKVDType(DType::INT8));
  EXPECT_FALSE(isScaledKVDType(DType::BF16));
  EXPECT_FALSE(isScaledKVDType(DType::F32));
}

TEST(DType, NaNKeepsItsSignAndUpperPayload) {
  const float quiet = bitsFloat(0x7FC00000u), negative = bitsFloat(0xFFC00000u);
  // bf16 and f16 keep the upper payload bits and set the quiet bit.
  EXPECT_EQ(floatToBF16(quiet), 0x7FC0);
  EXPECT_EQ(floatToBF16(negative), 0xFFC0);
  EXPECT_EQ(floatToBF16(bitsFloat(0x7F812345u)), 0x7FC1); // signalling, quieted
  EXPECT_EQ(floatBits(bf16ToFloat(0x7FC1)), 0x7FC10000u);
  EXPECT_EQ(floatToF16(quiet), 0x7E00);
  EXPECT_EQ(floatToF16(negative), 0xFE00);
  EXPECT_EQ(floatToF16(bitsFloat(0x7FFFE000u)), 0x7FFF); // payload 0x3FF
  EXPECT_EQ(floatBits(f16ToFloat(0x7E01)), 0x7FC02000u);
  EXPECT_EQ(floatToFP8E5M2(negative), 0xFE);
  EXPECT_EQ(floatBits(fp8E5M2ToFloat(0x7F)), 0x7FE00000u);
  // e4m3fn has one NaN code per sign: the payload is dropped.
  EXPECT_EQ(floatToFP8E4M3(bitsFloat(0x7FFFFFFFu)), 0x7F);
  EXPECT_EQ(floatToFP8E4M3(negative), 0xFF);
  EXPECT_EQ(floatBits(fp8E4M3ToFloat(0xFF)), 0xFFC00000u);
}

TEST(DType, RoundingIsDecodeOfEncode) {
  // roundToDType is what storing keeps; NumericRules.h's roundX are the same
  // functions the generated code calls.
  const float values[] = {0.1f, -3.3f, 1e-30f, 70000.0f, 449.0f, -0.0f, kInf};
  for (float x : values) {
    EXPECT_EQ(floatBits(roundToDType(DType::BF16, x)),
              floatBits(bf16ToFloat(floatToBF16(x))));
    EXPECT_EQ(floatBits(roundToDType(DType::F16, x)),
              floatBits(f16ToFloat(floatToF16(x))));
    EXPECT_EQ(floatBits(roundToDType(DType::FP8E4M3, x)),
              floatBits(fp8E4M3ToFloat(floatToFP8E4M3(x))));
    EXPECT_EQ(floatBits(roundToDType(DType::FP8E5M2, x)),
              floatBits(fp8E5M2ToFloat(floatToFP8E5M2(x))));
    EXPECT_EQ(floatBits(roundToDType(DType::F32, x)), floatBits(x));
  }
  EXPECT_EQ(roundToDType(DType::BF16, 0.1f), 0.10009765625f);
  EXPECT_EQ(roundToDType(DType::F16, 0.1f), 0.0999755859375f);
  EXPECT_EQ(roundToDType(DType::FP8E4M3, 0.1f), 0.1015625f);
  EXPECT_EQ(roundToDType(DType::FP8E5M2, 0.1f), 0.09375f);
  EXPECT_EQ(roundToDType(DType::FP8E5M2, 70000.0f), kInf);
  EXPECT_EQ(roundToDType(DType::FP8E4M3, -kInf), -448.0f);
}

TEST(DType, FormatsDescribeTheirCodes) {
  // The largest finite value, the smallest subnormal and the NaN code of
  // each format follow from its NarrowFormat alone.
  struct {
    vflow::rules::NarrowFormat format;
    float largest, smallest;
  } cases[] = {{vflow::rules::f16Format(), 65504.0f, 0x1p-24f},
               {vflow::rules::fp8E5M2Format(), 57344.0f, 0x1p-16f},
               {vflow::rules::fp8E4M3Format(), 448.0f, 0x1p-9f}};
  for (const auto &c : cases) {
    EXPECT_EQ(vflow::rules::decodeNarrow(c.format.maxFiniteCode, c.format),
              c.largest);
    EXPECT_EQ(vflow::rules::decodeNarrow(1, c.format), c.smallest);
    EXPECT_TRUE(std::isnan(
        vflow::rules::decodeNarrow(c.format.canonicalNaN, c.format)));
    EXPECT_EQ(vflow::rules::encodeNarrow(c.largest, c.format),
              c.format.maxFiniteCode);
    EXPECT_EQ(vflow::rules::encodeNarrow(-c.smallest, c.format),
              c.format.signBit | 1);
  }
}

TEST(DType, BulkConversionMatchesScalar) {
  std::mt19937 rng(21);
  std::vector<float> values =
      vflow::testing::NormalDraws(rng, 100.0f).take(1000);
  values[3] = kInf;
  values[4] = -0.0f;
  values[5] = 1e-30f;
  for (DType type :
       {DType::F32, DType::BF16, DType::F16, DType::FP8E4M3, DType::FP8E5M2}) {
    // One byte of offset: the helpers need no alignment.
    std::vector<unsigned char> storage(1 +
                                       values.size() * bytesPerElement(type));
    convertFromF32(type, values.data(), storage.data() + 1, values.size());
    std::vector<float> back(values.size());
    convertToF32(type, storage.data() + 1, back.data(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      float expected = roundToDType(type, values[i]);
      EXPECT_EQ(floatBits(back[i]), floatBits(expected))
          << dtypeName(type) << " " << values[i];
    }
  }
  EXPECT_EQ(roundToDType(DType::F32, 0.1f), 0.1f);
  EXPECT_EQ(roundToDType(DType::FP8E4M3, 1000.0f), 448.0f);
}

} // namespace
