//===- Json.h - A small JSON value, reader and writer -----------*- C++ -*-===//
//
// The one JSON writer (and reader) of the project: artifacts, diagnostics,
// summaries, run reports and benchmark rows are all built as Json values and
// written by dump(); docs/json.md documents each document's schema.
// Objects keep their key order, numbers are doubles (integers below 9e15 are
// written without a fraction, NaN and infinities as null), strings are
// written as valid UTF-8 whatever bytes they hold (invalid bytes become
// U+FFFD). The reader reports the byte offset of the first problem; it never
// throws on bad input except through vflow::rt::Error with that message.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_JSON_H
#define VFLOW_RUNTIME_JSON_H

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace vflow::rt {

class Json {
public:
  enum class Kind { Null, Bool, Number, String, Array, Object };

  using Members = std::vector<std::pair<std::string, Json>>;

  Json() = default;
  Json(bool b) : value(b) {}
  Json(double n) : value(n) {}
  /// Any integer type (counts, sizes, ids): a number.
  template <typename T,
            std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>,
                             int> = 0>
  Json(T n) : value(double(n)) {}
  Json(std::string s) : value(std::move(s)) {}
  Json(const char *s) : value(std::string(s)) {}
  static Json array() { return Json(std::vector<Json>()); }
  static Json object() { return Json(Members()); }

  Kind getKind() const { return static_cast<Kind>(value.index()); }
  bool isNull() const { return getKind() == Kind::Null; }

  /// Typed accessors; throw Error("<what> must be a <type>") on mismatch.
  bool asBool(const std::string &what) const;
  double asNumber(const std::string &what) const;
  int64_t asInt(const std::string &what) const;
  const std::string &asString(const std::string &what) const;
  const std::vector<Json> &asArray(const std::string &what) const;

  /// Object members in insertion order (none for other kinds).
  const Members &members() const;
  /// The member `key`, or null when absent (objects only).
  const Json *find(const std::string &key) const;
  /// The member `key`; throws Error("<what>: missing '<key>'") when absent.
  const Json &at(const std::string &key, const std::string &what) const;

  /// Appends to an array (a null becomes an empty array first); throws
  /// Error on other kinds.
  Json &push(Json item);
  /// Sets an object's member, replacing one of the same name in place (a
  /// null becomes an empty object first); throws Error on other kinds.
  Json &set(const std::string &key, Json member);

  /// Compact JSON text.
  std::string dump() const;
  /// Parses `text`; throws Error("<source>: invalid JSON at byte N: ...").
  static Json parse(const std::string &text, const std::string &source);

private:
  explicit Json(std::vector<Json> items) : value(std::move(items)) {}
  explicit Json(Members members) : value(std::move(members)) {}
  void dumpTo(std::string &out) const;

  /// One alternative per Kind, in its order (a document of many small values
  /// stays small: 40 bytes a value).
  std::variant<std::monostate, bool, double, std::string, std::vector<Json>,
               Members>
      value;
};

} // namespace vflow::rt

#endif // VFLOW_RUNTIME_JSON_H
