//===- ParamText.cpp - Param overrides written as text --------------------===//

#include "vflow/Runtime/ParamText.h"
#include "vflow/Runtime/Limits.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>

using namespace vflow::rt;

namespace {

bool isBlank(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' ||
         c == '\r';
}

std::string trimBlanks(const std::string &text) {
  size_t begin = 0, end = text.size();
  while (begin < end && isBlank(text[begin]))
    ++begin;
  while (end > begin && isBlank(text[end - 1]))
    --end;
  return text.substr(begin, end - begin);
}

} // namespace

bool vflow::rt::splitParamSpec(const std::string &text, std::string &name,
                               std::string &value, std::string &why) {
  size_t eq = text.find('=');
  if (eq == std::string::npos) {
    why = "expected NAME=VALUE or FLOW.NAME=VALUE, e.g. budget=32 or "
          "quest.budget=32";
    return false;
  }
  name = trimBlanks(text.substr(0, eq));
  value = trimBlanks(text.substr(eq + 1));
  return true;
}

bool vflow::rt::parseParamValue(const std::string &text, ParamValue &out,
                                std::string &why) {
  const std::string t = trimBlanks(text);
  if (t == "true" || t == "false") {
    out = {ParamValue::Kind::Bool, t == "true" ? 1.0 : 0.0};
    return true;
  }
  size_t i = t.empty() || (t[0] != '+' && t[0] != '-') ? 0 : 1;
  bool digits =
      i < t.size() && t.find_first_not_of("0123456789", i) == std::string::npos;
  if (digits) {
    // Exactly, while it fits: a double would round 2^53 + 1.
    int64_t magnitude = 0;
    bool exact = true;
    for (size_t j = i; j < t.size() && exact; ++j) {
      magnitude = magnitude * 10 + (t[j] - '0');
      exact = magnitude <= limits::kMaxExactInt;
    }
    if (exact) {
      out = {ParamValue::Kind::Int,
             double(t[0] == '-' ? -magnitude : magnitude)};
      return true;
    }
  }
  if (!t.empty() && t.find_first_of("xXpPiInN") == std::string::npos) {
    char *end = nullptr;
    errno = 0;
    double v = std::strtod(t.c_str(), &end);
    if (end == t.c_str() + t.size() && std::isfinite(v) && !isBlank(t[0])) {
      out = {ParamValue::Kind::Float, v};
      return true;
    }
    if (end == t.c_str() + t.size() && !std::isfinite(v)) {
      why = "'" + t + "' is out of range for a number";
      return false;
    }
  }
  why = "'" + t + "' is not a number, true or false";
  return false;
}
