//===- Json.h - A small JSON value, reader and writer -----------*- C++ -*-===//
//
// The one JSON writer (and reader) of the project: artifacts, diagnostics,
// summaries, run reports and benchmark rows are all built as Json values and
// written by dump(); docs/json.md documents each document's schema.
// Objects keep their key order, numbers are doubles (integers below 9e15 are
// written without a fraction, NaN and infinities as null), strings are
// written as valid UTF-8 whatever bytes they hold (invalid bytes become
// U+FFFD). The reader (nlohmann/json's, in Json.cpp only) takes linear time
// and reports the byte offset of the first problem; it never throws on bad
// input except through vflow::rt::Error with that message. docs/json.md says
// what it accepts and refuses.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_JSON_H
#define VFLOW_RUNTIME_JSON_H

#include <cstddef>
#include <cstdint>
#include <memory>
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
  static Json object() { return Json(Object()); }

  Kind getKind() const { return static_cast<Kind>(value.index()); }
  bool isNull() const { return getKind() == Kind::Null; }

  /// Typed accessors; throw Error("<what> must be a <type>") on mismatch.
  bool asBool(const std::string &what) const;
  double asNumber(const std::string &what) const;
  int64_t asInt(const std::string &what) const;
  const std::string &asString(const std::string &what) const;
  const std::vector<Json> &asArray(const std::string &what) const;

  /// Object members in insertion order (none for other kinds). Iterate them
  /// to visit every member: that is linear whatever the object's size.
  const Members &members() const;
  /// The member `key`, or null when absent (objects only). Constant time on
  /// an object of many members (it keeps an index by name from
  /// kIndexedFrom members on), a scan of at most that many otherwise.
  const Json *find(const std::string &key) const;
  /// The member `key`; throws Error("<what>: missing '<key>'") when absent.
  const Json &at(const std::string &key, const std::string &what) const;

  /// Appends to an array (a null becomes an empty array first); throws
  /// Error on other kinds.
  Json &push(Json item);
  /// Sets an object's member, replacing one of the same name in place (a
  /// null becomes an empty object first); throws Error on other kinds.
  /// Constant time (amortized) like find(), so building an object of n
  /// members takes O(n).
  Json &set(const std::string &key, Json member);

  /// Objects of at least this many members keep an index by name; smaller
  /// ones only their members (a document of many small objects stays small).
  static constexpr size_t kIndexedFrom = 32;

  /// Compact JSON text.
  std::string dump() const;
  /// Parses `text` in linear time; throws Error("<source>: invalid JSON at
  /// byte N: <why>"). Refuses duplicate member names, nesting deeper than
  /// kMaxDepth, a byte-order mark and invalid UTF-8 (docs/json.md).
  static Json parse(const std::string &text, const std::string &source);

  /// The deepest nesting of arrays and objects parse() accepts.
  static constexpr size_t kMaxDepth = 64;

private:
  /// An object: its members, and from kIndexedFrom members on an index by
  /// name (open addressing: each slot holds a member's position + 1, or 0).
  /// Only dumpTo and the members' order read `items`; every insertion goes
  /// through append(), which keeps the index.
  struct Object {
    Members items;
    std::unique_ptr<std::vector<uint32_t>> index;

    Object() = default;
    Object(const Object &other);
    Object &operator=(const Object &other);
    Object(Object &&) = default;
    Object &operator=(Object &&) = default;

    /// The position of the member `key`, or items.size() when absent.
    size_t position(const std::string &key) const;
    /// Appends a member whose name is not there yet.
    Json &append(std::string key, Json member);

  private:
    void reindex();
  };
  struct Reader;

  explicit Json(std::vector<Json> items) : value(std::move(items)) {}
  explicit Json(Object object) : value(std::move(object)) {}
  void dumpTo(std::string &out) const;

  /// One alternative per Kind, in its order (a document of many small values
  /// stays small: 40 bytes a value).
  std::variant<std::monostate, bool, double, std::string, std::vector<Json>,
               Object>
      value;
};

} // namespace vflow::rt

#endif // VFLOW_RUNTIME_JSON_H
