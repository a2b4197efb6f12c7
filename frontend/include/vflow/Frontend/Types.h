//===- Types.h - Named-axis shapes and storage dtypes -----------*- C++ -*-===//

#ifndef VFLOW_FRONTEND_TYPES_H
#define VFLOW_FRONTEND_TYPES_H

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace vflow {

/// Axis sizes: a positive integer, or a symbol fixed later. The encoding
/// matches the vt dialect's (kSizeBlocks and friends in VTTypes.h).
enum : int64_t {
  kSizeBlocks = -1,  ///< N: blocks of the sequence (varies per step).
  kSizeGroup = -2,   ///< G: query heads per KV head.
  kSizeHeadDim = -3, ///< D: the head dimension.
};

/// "N", "G", "D" or the number.
std::string formatAxisSize(int64_t size);

struct Axis {
  std::string name;
  int64_t size = 0;
  bool operator==(const Axis &o) const {
    return name == o.name && size == o.size;
  }
};

/// A named-axis shape: a set of axes kept in canonical order (see
/// axisRank). A scalar has no axes.
class Shape {
public:
  Shape() = default;
  explicit Shape(std::vector<Axis> axes) : axes(std::move(axes)) {}

  const std::vector<Axis> &getAxes() const { return axes; }
  bool isScalar() const { return axes.empty(); }
  bool has(const std::string &name) const { return find(name) != nullptr; }
  const Axis *find(const std::string &name) const;
  std::vector<std::string> names() const;
  /// Same set of axes with the same sizes.
  bool operator==(const Shape &o) const;
  bool operator!=(const Shape &o) const { return !(*this == o); }
  /// "[block:N, head:G]".
  std::string str() const;

  /// Inserts an axis at its canonical position (the caller ensures the name
  /// is new).
  void insert(Axis axis, const std::vector<std::string> &order);
  void remove(const std::string &name);

private:
  std::vector<Axis> axes;
};

/// Storage dtypes of cache fields and states.
enum class DType { F32, BF16, F16, FP8E4M3, FP8E5M2 };
std::optional<DType> parseDType(const std::string &name);
const char *dtypeName(DType dtype);

} // namespace vflow

#endif // VFLOW_FRONTEND_TYPES_H
