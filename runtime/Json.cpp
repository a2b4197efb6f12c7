//===- Json.cpp - A small JSON value, reader and writer -------------------===//

#include "vflow/Runtime/Json.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Names.h"
#include "vflow/Runtime/Utf8.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

using namespace vflow::rt;

namespace {

const char *const kKindNames[] = {"null",   "boolean", "number",
                                  "string", "array",   "object"};
static_assert(coversEnum(kKindNames, Json::Kind::Object),
              "one name per Json::Kind");

const char *kindName(Json::Kind k) { return nameOf(kKindNames, k, "value"); }

[[noreturn]] void typeError(const std::string &what, const char *want,
                            Json::Kind have) {
  throw Error(what + " must be a " + want + ", not a " + kindName(have));
}

/// A recursive-descent reader with a depth limit (no input can exhaust the
/// stack).
class Reader {
public:
  Reader(const std::string &text, const std::string &source)
      : text(text), source(source) {}

  Json document() {
    Json v = value(0);
    skipSpace();
    if (pos != text.size())
      fail("unexpected text after the document");
    return v;
  }

private:
  [[noreturn]] void fail(const std::string &why) {
    throw Error(source + ": invalid JSON at byte " + std::to_string(pos) +
                ": " + why);
  }

  void skipSpace() {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\n' ||
                                 text[pos] == '\t' || text[pos] == '\r'))
      ++pos;
  }

  bool consume(const char *word) {
    size_t n = std::char_traits<char>::length(word);
    if (text.compare(pos, n, word) == 0) {
      pos += n;
      return true;
    }
    return false;
  }

  Json value(int depth) {
    if (depth > 64)
      fail("nesting is too deep");
    skipSpace();
    if (pos >= text.size())
      fail("unexpected end of input");
    char c = text[pos];
    if (c == '{')
      return object(depth);
    if (c == '[')
      return array(depth);
    if (c == '"')
      return Json(stringLiteral());
    if (consume("true"))
      return Json(true);
    if (consume("false"))
      return Json(false);
    if (consume("null"))
      return Json();
    if (c == '-' || (c >= '0' && c <= '9'))
      return numberLiteral();
    fail(std::string("unexpected character '") + c + "'");
  }

  Json object(int depth) {
    Json obj = Json::object();
    ++pos;
    skipSpace();
    if (pos < text.size() && text[pos] == '}') {
      ++pos;
      return obj;
    }
    while (true) {
      skipSpace();
      if (pos >= text.size() || text[pos] != '"')
        fail("expected a member name");
      std::string key = stringLiteral();
      skipSpace();
      if (pos >= text.size() || text[pos] != ':')
        fail("expected ':'");
      ++pos;
      obj.set(key, value(depth + 1));
      skipSpace();
      if (pos < text.size() && text[pos] == ',') {
        ++pos;
        continue;
      }
      if (pos < text.size() && text[pos] == '}') {
        ++pos;
        return obj;
      }
      fail("expected ',' or '}'");
    }
  }

  Json array(int depth) {
    Json arr = Json::array();
    ++pos;
    skipSpace();
    if (pos < text.size() && text[pos] == ']') {
      ++pos;
      return arr;
    }
    while (true) {
      arr.push(value(depth + 1));
      skipSpace();
      if (pos < text.size() && text[pos] == ',') {
        ++pos;
        continue;
      }
      if (pos < text.size() && text[pos] == ']') {
        ++pos;
        return arr;
      }
      fail("expected ',' or ']'");
    }
  }

  static void appendUTF8(std::string &out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xc0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += char(0xe0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    } else {
      out += char(0xf0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3f));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    }
  }

  std::string stringLiteral() {
    std::string out;
    ++pos; // opening quote
    while (true) {
      if (pos >= text.size())
        fail("unterminated string");
      char c = text[pos++];
      if (c == '"')
        return out;
      if (static_cast<unsigned char>(c) < 0x20)
        fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos >= text.size())
        fail("unterminated escape");
      char e = text[pos++];
      switch (e) {
      case '"':
      case '\\':
      case '/':
        out += e;
        break;
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'u': {
        if (pos + 4 > text.size())
          fail("short \\u escape");
        uint32_t cp = 0;
        for (int i = 0; i < 4; ++i) {
          char h = text[pos++];
          cp <<= 4;
          if (h >= '0' && h <= '9')
            cp |= h - '0';
          else if (h >= 'a' && h <= 'f')
            cp |= h - 'a' + 10;
          else if (h >= 'A' && h <= 'F')
            cp |= h - 'A' + 10;
          else
            fail("bad \\u escape");
        }
        appendUTF8(out, cp);
        break;
      }
      default:
        fail(std::string("bad escape '\\") + e + "'");
      }
    }
  }

  Json numberLiteral() {
    const char *start = text.c_str() + pos;
    char *end = nullptr;
    double v = std::strtod(start, &end);
    if (end == start)
      fail("bad number");
    pos += end - start;
    if (!std::isfinite(v))
      fail("number out of range");
    return Json(v);
  }

  const std::string &text;
  const std::string &source;
  size_t pos = 0;
};

} // namespace

bool Json::asBool(const std::string &what) const {
  if (getKind() != Kind::Bool)
    typeError(what, "boolean", getKind());
  return std::get<bool>(value);
}

double Json::asNumber(const std::string &what) const {
  if (getKind() != Kind::Number)
    typeError(what, "number", getKind());
  return std::get<double>(value);
}

int64_t Json::asInt(const std::string &what) const {
  double v = asNumber(what);
  if (v != std::floor(v) || std::fabs(v) > 9.0e15)
    throw Error(what + " must be an integer");
  return static_cast<int64_t>(v);
}

const std::string &Json::asString(const std::string &what) const {
  if (getKind() != Kind::String)
    typeError(what, "string", getKind());
  return std::get<std::string>(value);
}

const std::vector<Json> &Json::asArray(const std::string &what) const {
  if (getKind() != Kind::Array)
    typeError(what, "array", getKind());
  return std::get<std::vector<Json>>(value);
}

const Json::Members &Json::members() const {
  static const Members none;
  const Members *m = std::get_if<Members>(&value);
  return m ? *m : none;
}

const Json *Json::find(const std::string &key) const {
  for (const auto &f : members())
    if (f.first == key)
      return &f.second;
  return nullptr;
}

const Json &Json::at(const std::string &key, const std::string &what) const {
  if (getKind() != Kind::Object)
    typeError(what, "object", getKind());
  const Json *v = find(key);
  if (!v)
    throw Error(what + ": missing '" + key + "'");
  return *v;
}

Json &Json::push(Json item) {
  if (isNull())
    value = std::vector<Json>();
  if (getKind() != Kind::Array)
    throw Error(std::string("Json::push on a ") + kindName(getKind()) +
                ", not an array");
  auto &items = std::get<std::vector<Json>>(value);
  items.push_back(std::move(item));
  return items.back();
}

Json &Json::set(const std::string &key, Json member) {
  if (isNull())
    value = Members();
  if (getKind() != Kind::Object)
    throw Error(std::string("Json::set on a ") + kindName(getKind()) +
                ", not an object");
  auto &fields = std::get<Members>(value);
  for (auto &f : fields)
    if (f.first == key) {
      f.second = std::move(member);
      return f.second;
    }
  fields.emplace_back(key, std::move(member));
  return fields.back().second;
}

std::string Json::dump() const {
  std::string out;
  dumpTo(out);
  return out;
}

/// A JSON string literal; bytes that are not UTF-8 become U+FFFD, so the
/// output is valid JSON whatever the input (file names can be any bytes).
static void dumpString(std::string &out, const std::string &s) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    size_t len = vflow::utf8SequenceLength(s, i);
    if (len == 0) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    if (len > 1) {
      out.append(s, i, len);
      i += len;
      continue;
    }
    char c = s[i++];
    unsigned char u = static_cast<unsigned char>(c);
    switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\t':
      out += "\\t";
      break;
    case '\r':
      out += "\\r";
      break;
    default:
      if (u < 0x20 || u == 0x7f) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", u);
        out += buf;
      } else {
        out += c;
      }
    }
  }
  out += '"';
}

void Json::dumpTo(std::string &out) const {
  switch (getKind()) {
  case Kind::Null:
    out += "null";
    break;
  case Kind::Bool:
    out += std::get<bool>(value) ? "true" : "false";
    break;
  case Kind::Number: {
    double number = std::get<double>(value);
    // JSON has no NaN or infinity: they are written as null.
    if (!std::isfinite(number)) {
      out += "null";
      break;
    }
    char buf[32];
    if (number == std::floor(number) && std::fabs(number) < 9.0e15) {
      std::snprintf(buf, sizeof(buf), "%lld", (long long)number);
    } else {
      // The shortest text that reads back as the same double: 1.1, not
      // 1.1000000000000001.
      for (int digits = 15; digits <= 17; ++digits) {
        std::snprintf(buf, sizeof(buf), "%.*g", digits, number);
        if (std::strtod(buf, nullptr) == number)
          break;
      }
    }
    out += buf;
    break;
  }
  case Kind::String:
    dumpString(out, std::get<std::string>(value));
    break;
  case Kind::Array: {
    const auto &items = std::get<std::vector<Json>>(value);
    out += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i)
        out += ',';
      items[i].dumpTo(out);
    }
    out += ']';
    break;
  }
  case Kind::Object: {
    const Members &fields = std::get<Members>(value);
    out += '{';
    for (size_t i = 0; i < fields.size(); ++i) {
      if (i)
        out += ',';
      dumpString(out, fields[i].first);
      out += ':';
      fields[i].second.dumpTo(out);
    }
    out += '}';
    break;
  }
  }
}

Json Json::parse(const std::string &text, const std::string &source) {
  return Reader(text, source).document();
}
