//===- DType.cpp - Storage dtypes and exact conversions -------------------===//

#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/NumericRules.h"

#include <array>
#include <cstring>
#include <iterator>

using namespace vflow::rt;

namespace rules = vflow::rules;

namespace {

/// Every fp8 code decoded once: bulk conversions read a table.
template <float (*Decode)(unsigned char)> struct ByteTable {
  std::array<float, 256> values;
  ByteTable() {
    for (unsigned code = 0; code < 256; ++code)
      values[code] = Decode(static_cast<unsigned char>(code));
  }
};

const std::array<float, 256> &fp8E4M3Table() {
  static const ByteTable<rules::decodeFP8E4M3> table;
  return table.values;
}

const std::array<float, 256> &fp8E5M2Table() {
  static const ByteTable<rules::decodeFP8E5M2> table;
  return table.values;
}

/// What the runtime knows of each dtype, in the enum's order: the one list
/// that bytesPerElement, dtypeName and parseDType read.
struct DTypeInfo {
  DType type;
  const char *name; ///< as the language spells it
  size_t bytes;     ///< per element in storage
};
constexpr DTypeInfo kDTypes[] = {
    {DType::F32, "f32", 4},         {DType::BF16, "bf16", 2},
    {DType::F16, "f16", 2},         {DType::FP8E4M3, "fp8e4m3", 1},
    {DType::FP8E5M2, "fp8e5m2", 1}, {DType::INT8, "int8", 1},
};
constexpr bool inEnumOrder() {
  for (size_t i = 0; i < std::size(kDTypes); ++i)
    if (static_cast<size_t>(kDTypes[i].type) != i)
      return false;
  return std::size(kDTypes) == static_cast<size_t>(DType::INT8) + 1;
}
static_assert(inEnumOrder(), "kDTypes has one entry per dtype, in order");

/// The entry of `type`, or null for a value outside the enum.
const DTypeInfo *findDType(DType type) {
  size_t i = static_cast<size_t>(type);
  return i < std::size(kDTypes) ? &kDTypes[i] : nullptr;
}

} // namespace

size_t vflow::rt::bytesPerElement(DType type) {
  const DTypeInfo *info = findDType(type);
  return info ? info->bytes : 0;
}

const char *vflow::rt::dtypeName(DType type) {
  const DTypeInfo *info = findDType(type);
  return info ? info->name : "?";
}

std::optional<DType> vflow::rt::parseDType(std::string_view name) {
  for (const DTypeInfo &info : kDTypes)
    if (name == info.name)
      return info.type;
  return std::nullopt;
}

uint16_t vflow::rt::floatToBF16(float value) {
  return rules::encodeBF16(value);
}

float vflow::rt::bf16ToFloat(uint16_t bits) { return rules::decodeBF16(bits); }

uint16_t vflow::rt::floatToF16(float value) { return rules::encodeF16(value); }

float vflow::rt::f16ToFloat(uint16_t bits) { return rules::decodeF16(bits); }

uint8_t vflow::rt::floatToFP8E4M3(float value) {
  return rules::encodeFP8E4M3(value);
}

float vflow::rt::fp8E4M3ToFloat(uint8_t bits) { return fp8E4M3Table()[bits]; }

uint8_t vflow::rt::floatToFP8E5M2(float value) {
  return rules::encodeFP8E5M2(value);
}

float vflow::rt::fp8E5M2ToFloat(uint8_t bits) { return fp8E5M2Table()[bits]; }

bool vflow::rt::isScaledKVDType(DType type) { return kvFormatMax(type) > 0; }

float vflow::rt::kvFormatMax(DType type) {
  switch (type) {
  case DType::INT8:
    return rules::kInt8Max;
  case DType::FP8E4M3:
    return rules::kFP8E4M3Max;
  case DType::FP8E5M2:
    return rules::kFP8E5M2Max;
  default:
    return 0.0f;
  }
}

float vflow::rt::roundToDType(DType type, float value) {
  switch (type) {
  case DType::F32:
    return rules::roundF32(value);
  case DType::BF16:
    return rules::roundBF16(value);
  case DType::F16:
    return rules::roundF16(value);
  case DType::FP8E4M3:
    return rules::roundFP8E4M3(value);
  case DType::FP8E5M2:
    return rules::roundFP8E5M2(value);
  case DType::INT8:
    return rules::roundInt8(value);
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
  case DType::INT8:
    for (size_t i = 0; i < count; ++i)
      out[i] = static_cast<unsigned char>(rules::encodeInt8(src[i]));
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
    // Its own loop (a shift per element): it vectorizes; the host reads
    // every attended block through here.
    for (size_t i = 0; i < count; ++i) {
      uint16_t bits;
      std::memcpy(&bits, in + 2 * i, 2);
      dst[i] = rules::decodeBF16(bits);
    }
    return;
  case DType::F16:
    for (size_t i = 0; i < count; ++i) {
      uint16_t bits;
      std::memcpy(&bits, in + 2 * i, 2);
      dst[i] = f16ToFloat(bits);
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
  case DType::INT8:
    for (size_t i = 0; i < count; ++i)
      dst[i] = rules::decodeInt8(static_cast<signed char>(in[i]));
    return;
  }
}
