//===- Json.h - A small JSON value, reader and writer ------------*- C++
//-*-===//
//
// Enough JSON for artifact manifests: objects (key order kept), arrays,
// strings, numbers (double), booleans and null. The reader reports the
// byte offset of the first problem; it never throws on bad input except
// through vflow::rt::Error with that message.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_JSON_H
#define VFLOW_RUNTIME_JSON_H

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace vflow::rt {

class Json {
public:
  enum class Kind { Null, Bool, Number, String, Array, Object };

  Json() = default;
  Json(bool b) : kind(Kind::Bool), boolean(b) {}
  Json(double n) : kind(Kind::Number), number(n) {}
  Json(int64_t n) : kind(Kind::Number), number(double(n)) {}
  Json(int n) : kind(Kind::Number), number(n) {}
  Json(std::string s) : kind(Kind::String), string(std::move(s)) {}
  Json(const char *s) : kind(Kind::String), string(s) {}
  static Json array() { return Json(Kind::Array); }
  static Json object() { return Json(Kind::Object); }

  Kind getKind() const { return kind; }
  bool isNull() const { return kind == Kind::Null; }

  /// Typed accessors; throw Error("<what> must be a <type>") on mismatch.
  bool asBool(const std::string &what) const;
  double asNumber(const std::string &what) const;
  int64_t asInt(const std::string &what) const;
  const std::string &asString(const std::string &what) const;
  const std::vector<Json> &asArray(const std::string &what) const;

  /// Object members in insertion order.
  const std::vector<std::pair<std::string, Json>> &members() const {
    return fields;
  }
  /// The member `key`, or null when absent (objects only).
  const Json *find(const std::string &key) const;
  /// The member `key`; throws Error("<what>: missing '<key>'") when absent.
  const Json &at(const std::string &key, const std::string &what) const;

  Json &push(Json value);
  Json &set(const std::string &key, Json value);

  /// Compact JSON text.
  std::string dump() const;
  /// Parses `text`; throws Error("<source>: invalid JSON at byte N: ...").
  static Json parse(const std::string &text, const std::string &source);

private:
  explicit Json(Kind k) : kind(k) {}
  void dumpTo(std::string &out) const;

  Kind kind = Kind::Null;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> fields;
};

} // namespace vflow::rt

#endif // VFLOW_RUNTIME_JSON_H
