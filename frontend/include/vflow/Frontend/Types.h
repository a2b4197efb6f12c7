//===- Types.h - Named-axis shapes and storage dtypes -----------*- C++ -*-===//

#ifndef VFLOW_FRONTEND_TYPES_H
#define VFLOW_FRONTEND_TYPES_H

#include "vflow/Runtime/AxisSize.h"
#include "vflow/Runtime/DType.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace vflow {

/// Axis sizes: a positive integer, or a symbol fixed later. The encoding
/// is the one the vt dialect and the runtime share (vflow/Runtime/AxisSize.h).
enum : int64_t {
  kSizeBlocks = rt::kAxisSizeBlocks,   ///< N: blocks (vary per step).
  kSizeGroup = rt::kAxisSizeGroup,     ///< G: query heads per KV head.
  kSizeHeadDim = rt::kAxisSizeHeadDim, ///< D: the head dimension.
};

/// "N", "G", "D" or the number.
using rt::formatAxisSize;

struct Axis {
  std::string name;
  int64_t size = 0;
  bool operator==(const Axis &o) const {
    return name == o.name && size == o.size;
  }
};

/// The most axes one value may have (the checker's rule; it keeps every
/// shape operation and every copy of a shape small).
constexpr size_t kMaxAxesPerValue = 16;

/// A named-axis shape: a set of axes kept in canonical order (see
/// axisRank). A scalar has no axes. Copies share their axes (copy on write),
/// so that the checker can give every expression its shape cheaply.
class Shape {
public:
  Shape() = default;
  explicit Shape(std::vector<Axis> axes);

  const std::vector<Axis> &getAxes() const;
  bool isScalar() const { return getAxes().empty(); }
  bool has(const std::string &name) const { return find(name) != nullptr; }
  const Axis *find(const std::string &name) const;
  std::vector<std::string> names() const;
  /// Same set of axes with the same sizes.
  bool operator==(const Shape &o) const;
  bool operator!=(const Shape &o) const { return !(*this == o); }
  /// "[block:N, head:G]".
  std::string str() const;
  /// Shapes with the same identity share their axes (so they are equal). A
  /// cache keyed by it must keep the shapes alive.
  const void *identity() const { return axes.get(); }

  /// Inserts an axis at its canonical position (the caller ensures the name
  /// is new).
  void insert(Axis axis, const std::vector<std::string> &order);
  /// The same, with the canonical position of an axis given by `rank` (the
  /// checker's constant-time lookup).
  void insert(Axis axis,
              const std::function<size_t(const std::string &)> &rank);
  void remove(const std::string &name);

private:
  std::vector<Axis> &mutableAxes();
  std::shared_ptr<const std::vector<Axis>> axes;
};

/// The rule for int values, one copy for int literals in source and for -p
/// values of int params: an integer whose magnitude is at most
/// limits::kMaxExactInt (2^53), so that the f64 the runtime carries params in
/// holds it exactly. Parses `text` (decimal digits, optionally signed) exactly;
/// returns "" and sets `value`, or returns why it is not such an int
/// ("out of range: an int must be ...").
std::string parseIntValue(const std::string &text, int64_t &value);

/// Whether a computed value is an int under that rule.
bool isExactInt(double value);

/// Why a value is not an int under that rule, for messages: "an int must be
/// between -2^53 and 2^53 (9007199254740992)".
std::string intRangeRule();

/// Storage dtypes of cache fields and states: the runtime's, with its
/// spelling of their names.
using rt::DType;
using rt::dtypeName;
using rt::parseDType;

} // namespace vflow

#endif // VFLOW_FRONTEND_TYPES_H
