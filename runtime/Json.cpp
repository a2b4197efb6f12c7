//===- Json.cpp - A small JSON value, reader and writer -------------------===//

#include "vflow/Runtime/Json.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Names.h"
#include "vflow/Runtime/Utf8.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string_view>

using namespace vflow::rt;

namespace {

const char *const kKindNames[] = {"null",   "boolean", "number",
                                  "string", "array",   "object"};
static_assert(coversEnum(kKindNames, Json::Kind::Object),
              "one name per Json::Kind");

const char *kindName(Json::Kind k) { return nameOf(kKindNames, k, "value"); }

[[noreturn]] void typeError(const std::string &what, const char *want,
                            Json::Kind have) {
  // "an array", "an object": the article follows the word.
  auto article = [](const char *word) {
    return std::string(word[0] == 'a' || word[0] == 'o' ? "an " : "a ") + word;
  };
  throw Error(what + " must be " + article(want) + ", not " +
              article(kindName(have)));
}

/// A pointer into the text for nlohmann's lexer that also records how far
/// it has read (its SAX events carry no byte offset): `*read` is one past
/// the last byte it took.
class TrackedChar {
public:
  using iterator_category = std::forward_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char *;
  using reference = const char &;

  TrackedChar(const char *p, const char **read) : p(p), read(read) {}
  reference operator*() const { return *p; }
  TrackedChar &operator++() {
    *read = ++p;
    return *this;
  }
  TrackedChar operator++(int) {
    TrackedChar before = *this;
    ++*this;
    return before;
  }
  bool operator==(const TrackedChar &o) const { return p == o.p; }
  bool operator!=(const TrackedChar &o) const { return p != o.p; }

private:
  const char *p;
  const char **read;
};

bool startsWith(const std::string &s, const char *prefix) {
  return s.compare(0, std::char_traits<char>::length(prefix), prefix) == 0;
}

/// The text after `marker` in `s` (up to `until` if given), or "".
std::string between(const std::string &s, const char *marker,
                    const char *until = nullptr) {
  size_t at = s.find(marker);
  if (at == std::string::npos)
    return "";
  at += std::char_traits<char>::length(marker);
  size_t end = until ? s.find(until, at) : std::string::npos;
  return s.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

/// "unexpected character 'x'", or the byte in hex when it is not printable.
std::string unexpected(char c) {
  unsigned char u = static_cast<unsigned char>(c);
  if (u > 0x20 && u < 0x7f)
    return std::string("unexpected character '") + c + "'";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "unexpected byte 0x%02x", u);
  return buf;
}

} // namespace

/// The SAX handler nlohmann's parser calls (no nlohmann value in between):
/// it builds the Json in place, keeping a stack of the arrays and objects
/// being read, so nothing recurses per nesting level; it refuses nesting
/// deeper than kMaxDepth and duplicate member names (the object's own index
/// finds them in constant time), and turns nlohmann's errors into ours.
struct Json::Reader {
  Reader(const std::string &text, const std::string &source)
      : text(text), source(source), read(text.data()) {}

  Json document() {
    if (startsWith(text, "\xef\xbb\xbf"))
      refuse(0, "the document starts with a UTF-8 byte-order mark (JSON "
                "text has none)");
    // (nlohmann 3.11.3 words an empty document its own way.)
    if (text.find_first_not_of(" \t\n\r") == std::string::npos)
      refuse(text.size(), "unexpected end of input");
    const char *begin = text.data(), *end = begin + text.size();
    if (!nlohmann::json::sax_parse(TrackedChar(begin, &read),
                                   TrackedChar(end, &read), this))
      refuse(errorAt, error);
    return std::move(root);
  }

  // nlohmann's SAX interface.
  bool null() { return place(Json()); }
  bool boolean(bool b) { return place(Json(b)); }
  bool number_integer(int64_t n) {
    return place(Json(n == 0 && negativeZero() ? -0.0 : double(n)));
  }
  bool number_unsigned(uint64_t n) { return place(Json(double(n))); }
  // Non-finite numbers never get here: nlohmann refuses them (406).
  bool number_float(double n, const std::string &) { return place(Json(n)); }
  bool string(std::string &s) { return place(Json(std::move(s))); }
  bool binary(nlohmann::json::binary_t &) { // CBOR and such, not JSON text
    return fail(readSoFar(), "binary value");
  }
  bool start_object(size_t) { return open(Json::object()); }
  bool start_array(size_t) { return open(Json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(std::string &name) {
    Object &object = std::get<Object>(stack.back()->value);
    if (object.position(name) != object.items.size())
      return fail(stringStart(), "duplicate member name " + quoted(name));
    object.append(std::move(name), Json());
    return true;
  }
  bool parse_error(size_t position, const std::string &lastToken,
                   const nlohmann::json::exception &e);

private:
  [[noreturn]] void refuse(size_t at, const std::string &why) const {
    throw Error(source + ": invalid JSON at byte " + std::to_string(at) + ": " +
                why);
  }

  bool fail(size_t at, std::string why) {
    errorAt = at;
    error = std::move(why);
    return false;
  }

  size_t readSoFar() const { return size_t(read - text.data()); }

  /// Puts a value where the document is: the root, the next item of the
  /// innermost array or the value of the innermost object's last member.
  Json *put(Json v) {
    if (stack.empty()) {
      root = std::move(v);
      return &root;
    }
    Json &top = *stack.back();
    if (auto *items = std::get_if<std::vector<Json>>(&top.value)) {
      items->push_back(std::move(v));
      return &items->back();
    }
    Json &member = std::get<Object>(top.value).items.back().second;
    member = std::move(v);
    return &member;
  }
  bool place(Json v) {
    put(std::move(v));
    return true;
  }

  /// An array or object starts (its '[' or '{' was the last byte read).
  /// The stack's pointers stay valid: a container grows only while it is
  /// the innermost, and then nothing inside it is on the stack.
  bool open(Json container) {
    if (stack.size() >= kMaxDepth)
      return fail(readSoFar() - 1, "nesting is too deep (more than " +
                                       std::to_string(kMaxDepth) +
                                       " levels of arrays and objects)");
    stack.push_back(put(std::move(container)));
    return true;
  }
  bool close() {
    stack.pop_back();
    return true;
  }

  /// nlohmann reads "-0" as the integer 0; the reader keeps its sign, as a
  /// double. The lexer has read one byte past the number, or to the end.
  bool negativeZero() const {
    size_t end = readSoFar();
    size_t last = end > 0 && text[end - 1] == '0' ? end - 1 : end - 2;
    return last >= 1 && last < text.size() && text[last - 1] == '-';
  }

  /// Where the string that ends at the last byte read starts: its opening
  /// quote is the first quote before it not escaped by a backslash.
  size_t stringStart() const {
    size_t i = readSoFar() - 1; // the closing quote
    while (i > 0) {
      if (text[--i] != '"')
        continue;
      size_t backslashes = 0;
      while (backslashes < i && text[i - 1 - backslashes] == '\\')
        ++backslashes;
      if (backslashes % 2 == 0)
        return i;
    }
    return 0;
  }

  /// A member name for a message: as JSON writes it, cut after 80 bytes.
  static std::string quoted(const std::string &name) {
    std::string shown;
    size_t cut = 0;
    while (cut < name.size() && cut < 80) {
      size_t len = vflow::utf8SequenceLength(name, cut);
      cut += len ? len : 1;
    }
    Json(name.substr(0, cut)).dumpTo(shown);
    return cut < name.size() ? shown + "..." : shown;
  }

  const std::string &text;
  const std::string &source;
  const char *read;
  Json root;
  std::vector<Json *> stack;
  size_t errorAt = 0;
  std::string error;
};

/// Turns nlohmann's message ("[json.exception.parse_error.101] parse error
/// at line 1, column 7: syntax error while parsing value - unexpected '}';
/// expected '[', '{', or a literal") into one sentence of ours at a byte
/// offset. `position` counts the bytes the lexer read (the end of input once
/// more). `lastToken` is what the lexer read since it last started a string
/// or number, so it is the token itself only for those two.
bool Json::Reader::parse_error(size_t position, const std::string &lastToken,
                               const nlohmann::json::exception &e) {
  size_t end = std::min(position, text.size());
  std::string what = e.what();
  std::string context = between(what, "syntax error while parsing ", " - ");
  std::string detail = between(what, " - ");
  // Where the token the parser stopped at starts.
  size_t tokenStart = end - std::min(end, size_t(1)); // punctuation
  if (e.id == 406 || startsWith(detail, "unexpected number literal") ||
      startsWith(detail, "unexpected string literal"))
    tokenStart = end - std::min(end, lastToken.size());
  else if (startsWith(detail, "unexpected end of input"))
    tokenStart = text.size();
  else if (startsWith(detail, "unexpected true literal") ||
           startsWith(detail, "unexpected null literal"))
    tokenStart = end - std::min(end, size_t(4));
  else if (startsWith(detail, "unexpected false literal"))
    tokenStart = end - std::min(end, size_t(5));
  if (e.id == 406) // a number that is not finite as a double
    return fail(tokenStart, "number out of range");
  if (startsWith(detail, "unexpected ")) {
    // A whole token where another kind was expected.
    std::string expected = between(detail, "; expected ");
    bool number = startsWith(detail, "unexpected number literal");
    if (number && tokenStart > 0 && text[tokenStart - 1] == '0')
      return fail(tokenStart - 1, "a number starts with 0 and goes on "
                                  "(leading zeros are not JSON)");
    if (expected == "end of input")
      return fail(tokenStart, "unexpected text after the document");
    if (context == "object key")
      return fail(tokenStart, "expected a member name");
    if (context == "object separator")
      return fail(tokenStart, "expected ':'");
    if (context == "object")
      return fail(tokenStart, "expected ',' or '}'");
    if (context == "array")
      return fail(tokenStart, "expected ',' or ']'");
    return fail(tokenStart, tokenStart < text.size()
                                ? unexpected(text[tokenStart])
                                : "unexpected end of input");
  }
  // The lexer stopped at the last byte it read.
  size_t at = std::min(position > 0 ? position - 1 : 0, text.size());
  std::string lexer = detail.substr(0, detail.find("; last read: "));
  if (lexer == "invalid literal")
    return fail(at, at < text.size() ? unexpected(text[at])
                                     : "unexpected end of input");
  if (lexer == "invalid string: missing closing quote")
    return fail(at, "unterminated string");
  if (startsWith(lexer, "invalid string: control character"))
    return fail(at, "control character in a string (escape it as \\u00" +
                        between(lexer, "U+00", " ") + ")");
  if (lexer == "invalid string: forbidden character after backslash")
    return fail(at, at < text.size()
                        ? "bad escape '\\" + std::string(1, text[at]) + "'"
                        : "unterminated string");
  if (startsWith(lexer, "invalid string: '\\u' must be followed by"))
    return fail(at, "bad \\u escape (4 hex digits must follow \\u)");
  if (startsWith(lexer, "invalid string: surrogate U+D800..U+DBFF"))
    return fail(at, "a \\u escape of a high surrogate (D800 to DBFF) must "
                    "be followed by one of a low surrogate (DC00 to DFFF)");
  if (startsWith(lexer, "invalid string: surrogate U+DC00..U+DFFF"))
    return fail(at - std::min(at, size_t(5)), // the escape's backslash
                "a \\u escape of a low surrogate (DC00 to DFFF) must "
                "follow one of a high surrogate (D800 to DBFF)");
  if (lexer == "invalid string: ill-formed UTF-8 byte")
    return fail(at, "invalid UTF-8 in a string");
  if (startsWith(lexer, "invalid number"))
    return fail(at, "bad number (" + between(lexer, "invalid number; ") + ")");
  if (startsWith(lexer, "invalid BOM"))
    return fail(0, unexpected(text[0]));
  return fail(at, lexer.empty() ? what : lexer);
}

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
  const Object *o = std::get_if<Object>(&value);
  return o ? o->items : none;
}

const Json *Json::find(const std::string &key) const {
  const Object *o = std::get_if<Object>(&value);
  if (!o)
    return nullptr;
  size_t at = o->position(key);
  return at < o->items.size() ? &o->items[at].second : nullptr;
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
    value = Object();
  if (getKind() != Kind::Object)
    throw Error(std::string("Json::set on a ") + kindName(getKind()) +
                ", not an object");
  auto &object = std::get<Object>(value);
  size_t at = object.position(key);
  if (at < object.items.size())
    return object.items[at].second = std::move(member);
  return object.append(key, std::move(member));
}

namespace {

/// The slot of `key` in an object's index: the one that holds it, or the
/// empty one where it goes (linear probing; the index is at most half full).
size_t slotOf(const std::vector<uint32_t> &slots, const Json::Members &items,
              std::string_view key) {
  size_t mask = slots.size() - 1;
  for (size_t i = std::hash<std::string_view>()(key) & mask;;
       i = (i + 1) & mask)
    if (slots[i] == 0 || items[slots[i] - 1].first == key)
      return i;
}

} // namespace

Json::Object::Object(const Object &other)
    : items(other.items),
      index(other.index ? std::make_unique<std::vector<uint32_t>>(*other.index)
                        : nullptr) {}

Json::Object &Json::Object::operator=(const Object &other) {
  if (this != &other)
    *this = Object(other);
  return *this;
}

size_t Json::Object::position(const std::string &key) const {
  if (index) {
    uint32_t slot = (*index)[slotOf(*index, items, key)];
    return slot ? slot - 1 : items.size();
  }
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].first == key)
      return i;
  return items.size();
}

Json &Json::Object::append(std::string key, Json member) {
  items.emplace_back(std::move(key), std::move(member));
  if (items.size() >= UINT32_MAX) // past what a slot holds: scans only
    index.reset();
  else if (index && items.size() * 2 <= index->size())
    (*index)[slotOf(*index, items, items.back().first)] =
        uint32_t(items.size());
  else if (index || items.size() >= kIndexedFrom)
    reindex();
  return items.back().second;
}

/// Builds the index with room for twice the members (so that appending
/// doubles it now and then: amortized constant time).
void Json::Object::reindex() {
  size_t size = 2 * kIndexedFrom;
  while (size < 4 * items.size())
    size *= 2;
  index = std::make_unique<std::vector<uint32_t>>(size, 0);
  for (size_t i = 0; i < items.size(); ++i)
    (*index)[slotOf(*index, items, items[i].first)] = uint32_t(i + 1);
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
    const Members &fields = std::get<Object>(value).items;
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
