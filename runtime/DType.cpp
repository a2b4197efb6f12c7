//===- DType.cpp - Storage dtypes and exact conversions -------------------===//

#include "vflow/Runtime/DType.h"

#include <array>
#include <cmath>
#include <cstring>

using namespace vflow::rt;

namespace {

uint32_t floatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float bitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

/// A binary floating-point format narrower than f32: a sign bit, then
/// exponent bits, then `mantissaBits` fraction bits. IEEE formats reserve the
/// all-ones exponent for infinities and NaNs; fp8 e4m3fn has no infinities and
/// uses only the all-ones code for NaN.
struct NarrowFormat {
  int mantissaBits;
  int bias;
  int exponentBits;
  bool hasInfinity;
  uint32_t signBit;
  uint32_t maxFiniteCode;
  uint32_t canonicalNaN;
};

constexpr NarrowFormat kF16{10, 15, 5, true, 0x8000, 0x7BFF, 0x7E00};
constexpr NarrowFormat kFP8E5M2{2, 15, 5, true, 0x80, 0x7B, 0x7E};
constexpr NarrowFormat kFP8E4M3{3, 7, 4, false, 0x80, 0x7E, 0x7F};

uint32_t encodeNarrow(float value, const NarrowFormat &format) {
  uint32_t bits = floatBits(value);
  uint32_t sign = (bits >> 31) ? format.signBit : 0;
  uint32_t magnitude = bits & 0x7FFFFFFFu;
  const int m = format.mantissaBits;
  if (magnitude > 0x7F800000u) {
    if (!format.hasInfinity)
      return sign | format.canonicalNaN;
    // Keep the upper payload bits; the quiet bit makes it a NaN for sure.
    return sign | format.canonicalNaN | ((magnitude & 0x7FFFFF) >> (23 - m));
  }
  if (magnitude == 0x7F800000u)
    return sign | (format.hasInfinity ? format.maxFiniteCode + 1
                                      : format.maxFiniteCode);
  if (magnitude == 0)
    return sign;

  // magnitude = significand * 2^scale, exactly, with `exponent` the unbiased
  // exponent of its leading bit.
  uint32_t biasedExponent = magnitude >> 23;
  uint32_t fraction = magnitude & 0x7FFFFF;
  uint32_t significand;
  int scale, exponent;
  if (biasedExponent == 0) {
    significand = fraction;
    scale = -149;
    int leading = 31 - __builtin_clz(fraction);
    exponent = leading - 149;
  } else {
    significand = fraction | 0x800000u;
    scale = static_cast<int>(biasedExponent) - 150;
    exponent = static_cast<int>(biasedExponent) - 127;
  }

  // Quantize to the target's spacing at this magnitude: 2^(e - m) in a normal
  // binade, 2^(emin - m) in the subnormal range.
  const int minExponent = 1 - format.bias;
  int quantum = (exponent < minExponent ? minExponent : exponent) - m;
  int shift = quantum - scale; // > 0: every target is narrower than f32
  uint32_t units = 0;
  if (shift < 32) {
    units = significand >> shift;
    uint32_t remainder = significand & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (remainder > half || (remainder == half && (units & 1)))
      ++units;
  }

  // A subnormal count of 2^m is the smallest normal; a normal count of
  // 2^(m+1) carries into the next exponent: the encoding is continuous.
  uint64_t code;
  if (exponent < minExponent)
    code = units;
  else
    code = (static_cast<uint64_t>(exponent + format.bias) << m) +
           (units - (1u << m));
  if (code > format.maxFiniteCode)
    code = format.hasInfinity ? format.maxFiniteCode + 1 : format.maxFiniteCode;
  return sign | static_cast<uint32_t>(code);
}

float decodeNarrow(uint32_t code, const NarrowFormat &format) {
  const int m = format.mantissaBits;
  uint32_t sign = (code & format.signBit) ? 0x80000000u : 0;
  uint32_t magnitude = code & (format.signBit - 1);
  uint32_t exponentField = magnitude >> m;
  uint32_t fraction = magnitude & ((1u << m) - 1);
  uint32_t allOnes = (1u << format.exponentBits) - 1;
  if (format.hasInfinity && exponentField == allOnes) {
    if (fraction == 0)
      return bitsToFloat(sign | 0x7F800000u);
    return bitsToFloat(sign | 0x7FC00000u | (fraction << (23 - m)));
  }
  if (!format.hasInfinity && magnitude == format.canonicalNaN)
    return bitsToFloat(sign | 0x7FC00000u);
  if (exponentField == 0) {
    float value = std::ldexp(static_cast<float>(fraction), 1 - format.bias - m);
    return sign ? -value : value;
  }
  uint32_t exponent = exponentField - format.bias + 127;
  return bitsToFloat(sign | (exponent << 23) | (fraction << (23 - m)));
}

template <const NarrowFormat &Format> struct ByteTable {
  std::array<float, 256> values;
  ByteTable() {
    for (uint32_t code = 0; code < 256; ++code)
      values[code] = decodeNarrow(code, Format);
  }
};

const std::array<float, 256> &fp8E4M3Table() {
  static const ByteTable<kFP8E4M3> table;
  return table.values;
}

const std::array<float, 256> &fp8E5M2Table() {
  static const ByteTable<kFP8E5M2> table;
  return table.values;
}

} // namespace

size_t vflow::rt::bytesPerElement(DType type) {
  switch (type) {
  case DType::F32:
    return 4;
  case DType::BF16:
  case DType::F16:
    return 2;
  case DType::FP8E4M3:
  case DType::FP8E5M2:
    return 1;
  }
  return 0;
}

const char *vflow::rt::dtypeName(DType type) {
  switch (type) {
  case DType::F32:
    return "f32";
  case DType::BF16:
    return "bf16";
  case DType::F16:
    return "f16";
  case DType::FP8E4M3:
    return "fp8e4m3";
  case DType::FP8E5M2:
    return "fp8e5m2";
  }
  return "?";
}

std::optional<DType> vflow::rt::parseDType(std::string_view name) {
  for (DType type :
       {DType::F32, DType::BF16, DType::F16, DType::FP8E4M3, DType::FP8E5M2})
    if (name == dtypeName(type))
      return type;
  return std::nullopt;
}

uint16_t vflow::rt::floatToBF16(float value) {
  uint32_t bits = floatBits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
    return static_cast<uint16_t>((bits >> 16) | 0x0040);
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to even;
  // a carry out of the fraction bumps the exponent (up to infinity).
  bits += 0x7FFFu + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

float vflow::rt::bf16ToFloat(uint16_t bits) {
  return bitsToFloat(static_cast<uint32_t>(bits) << 16);
}

uint16_t vflow::rt::floatToF16(float value) {
  return static_cast<uint16_t>(encodeNarrow(value, kF16));
}

float vflow::rt::f16ToFloat(uint16_t bits) { return decodeNarrow(bits, kF16); }

uint8_t vflow::rt::floatToFP8E4M3(float value) {
  return static_cast<uint8_t>(encodeNarrow(value, kFP8E4M3));
}

float vflow::rt::fp8E4M3ToFloat(uint8_t bits) { return fp8E4M3Table()[bits]; }

uint8_t vflow::rt::floatToFP8E5M2(float value) {
  return static_cast<uint8_t>(encodeNarrow(value, kFP8E5M2));
}

float vflow::rt::fp8E5M2ToFloat(uint8_t bits) { return fp8E5M2Table()[bits]; }

float vflow::rt::roundToDType(DType type, float value) {
  switch (type) {
  case DType::F32:
    return value;
  case DType::BF16:
    return bf16ToFloat(floatToBF16(value));
  case DType::F16:
    return f16ToFloat(floatToF16(value));
  case DType::FP8E4M3:
    return fp8E4M3ToFloat(floatToFP8E4M3(value));
  case DType::FP8E5M2:
    return fp8E5M2ToFloat(floatToFP8E5M2(value));
  }
  return value;
}

void vflow::rt::convertFromF32(DType type, const float *src, void *dst,
                               size_t count) {
  auto *out = static_cast<unsigned char *>(dst);
  switch (type) {
  case DType::F32:
    std::memcpy(out, src, count * sizeof(float));
    return;
  case DType::BF16:
  case DType::F16:
    for (size_t i = 0; i < count; ++i) {
      uint16_t bits =
          type == DType::BF16 ? floatToBF16(src[i]) : floatToF16(src[i]);
      std::memcpy(out + 2 * i, &bits, 2);
    }
    return;
  case DType::FP8E4M3:
    for (size_t i = 0; i < count; ++i)
      out[i] = floatToFP8E4M3(src[i]);
    return;
  case DType::FP8E5M2:
    for (size_t i = 0; i < count; ++i)
      out[i] = floatToFP8E5M2(src[i]);
    return;
  }
}

void vflow::rt::convertToF32(DType type, const void *src, float *dst,
                             size_t count) {
  const auto *in = static_cast<const unsigned char *>(src);
  switch (type) {
  case DType::F32:
    std::memcpy(dst, in, count * sizeof(float));
    return;
  case DType::BF16:
  case DType::F16:
    for (size_t i = 0; i < count; ++i) {
      uint16_t bits;
      std::memcpy(&bits, in + 2 * i, 2);
      dst[i] = type == DType::BF16 ? bf16ToFloat(bits) : f16ToFloat(bits);
    }
    return;
  case DType::FP8E4M3: {
    const auto &table = fp8E4M3Table();
    for (size_t i = 0; i < count; ++i)
      dst[i] = table[in[i]];
    return;
  }
  case DType::FP8E5M2: {
    const auto &table = fp8E5M2Table();
    for (size_t i = 0; i < count; ++i)
      dst[i] = table[in[i]];
    return;
  }
  }
}
