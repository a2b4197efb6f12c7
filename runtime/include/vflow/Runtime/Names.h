//===- Names.h - The names of an enum's values, from one table --*- C++ -*-===//
//
// An enum whose values are numbered 0, 1, 2, ... in declaration order keeps
// its names (or spellings, or descriptions) in one array, indexed by the
// value: printing reads it, a parser that accepts the names looks them up in
// it, and a static_assert next to the array (coversEnum) fails to compile
// when the enum gains a value the table lacks. Header-only and
// dependency-free (C++17): the frontend, the compiler and the runtime can all
// include it.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_NAMES_H
#define VFLOW_RUNTIME_NAMES_H

#include <cstddef>
#include <optional>
#include <string_view>

namespace vflow::rt {

/// True when `table` has exactly one entry for each value of an enum whose
/// values are 0 to `last`: `static_assert(coversEnum(kNames, Op::Last))`.
template <typename Enum, size_t N>
constexpr bool coversEnum(const char *const (&)[N], Enum last) {
  return N == static_cast<size_t>(last) + 1;
}

/// The entry of `table` for `value`, or `fallback` when `value` is out of
/// the table's range (a value cast from an unchecked integer).
template <typename Enum, size_t N>
constexpr const char *nameOf(const char *const (&table)[N], Enum value,
                             const char *fallback = "?") {
  size_t i = static_cast<size_t>(value);
  return i < N ? table[i] : fallback;
}

/// True when `name` is one of the entries of `table`.
template <size_t N>
bool isOneOf(const char *const (&table)[N], std::string_view name) {
  for (const char *entry : table)
    if (name == entry)
      return true;
  return false;
}

/// The value whose entry in `table` is `name`, or nothing.
template <typename Enum, size_t N>
std::optional<Enum> enumNamed(const char *const (&table)[N],
                              std::string_view name) {
  for (size_t i = 0; i < N; ++i)
    if (name == table[i])
      return static_cast<Enum>(i);
  return std::nullopt;
}

} // namespace vflow::rt

#endif // VFLOW_RUNTIME_NAMES_H
