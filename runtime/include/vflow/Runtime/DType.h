//===- DType.h - Storage dtypes and exact conversions -----------*- C++ -*-===//
//
// The storage dtypes of the KV cache, cache fields and states, and exact
// round-to-nearest-even conversions between them and f32. All arithmetic is
// f32; these types only say how values are stored.
//
// Conversion rules (float -> narrow type), all round to nearest, ties to even:
//   bf16, f16, fp8e5m2: IEEE-style; finite values past the largest finite
//     value round to infinity, infinities stay infinities.
//   fp8e4m3 (the "fn" variant: no infinities, one NaN pattern per sign):
//     saturating; finite values past 448 and infinities become +-448.
//   NaN stays NaN (sign kept; bf16 also keeps the upper payload bits), and
//   subnormals of every type are represented exactly.
// Narrow -> float conversions are exact.
//
// The encoders are NumericRules.h's (vflow::rules), the same code the
// interpreter, the CPU backend's generated code and the GPU's kernels
// compile; these are the runtime's names for them, with bulk conversions.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_DTYPE_H
#define VFLOW_RUNTIME_DTYPE_H

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace vflow {
namespace rt {

/// INT8 is a KV cache dtype only (always stored with a scale per token and
/// KV head, PagedKVCache); the language's fields and states have the others.
enum class DType : uint8_t { F32, BF16, F16, FP8E4M3, FP8E5M2, INT8 };

/// Bytes one element of `type` occupies in storage.
size_t bytesPerElement(DType type);

/// The dtype's name as the language spells it: f32, bf16, f16, fp8e4m3,
/// fp8e5m2 (and int8, for the KV cache).
const char *dtypeName(DType type);

/// The dtype named `name` (the language's spelling), or nothing.
std::optional<DType> parseDType(std::string_view name);

uint16_t floatToBF16(float value);
float bf16ToFloat(uint16_t bits);
uint16_t floatToF16(float value);
float f16ToFloat(uint16_t bits);
uint8_t floatToFP8E4M3(float value);
float fp8E4M3ToFloat(uint8_t bits);
uint8_t floatToFP8E5M2(float value);
float fp8E5M2ToFloat(uint8_t bits);

/// Whether K/V of `type` are stored with a scale per (token, KV head): the
/// 8-bit dtypes on the host (NumericRules' kvScale), and the largest
/// finite value of the format, which the scale maps a row's largest
/// magnitude to (0 for the others).
bool isScaledKVDType(DType type);
float kvFormatMax(DType type);

/// `value` rounded to `type` and back: what storing it would keep.
float roundToDType(DType type, float value);

/// Converts `count` f32 values to `type`, written to `dst` (count elements of
/// bytesPerElement(type) bytes each, no alignment required).
void convertFromF32(DType type, const float *src, void *dst, size_t count);

/// Converts `count` stored elements of `type` at `src` to f32.
void convertToF32(DType type, const void *src, float *dst, size_t count);

} // namespace rt
} // namespace vflow

#endif // VFLOW_RUNTIME_DTYPE_H
