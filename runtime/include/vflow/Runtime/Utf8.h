//===- Utf8.h - UTF-8 validation --------------------------------*- C++ -*-===//
//
// One copy of the UTF-8 rule for everything that writes JSON or checks
// source text: the front end's diagnostics and the runtime's JSON writer.
// Header-only and dependency-free.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_UTF8_H
#define VFLOW_RUNTIME_UTF8_H

#include <cstddef>
#include <cstdint>
#include <string>

namespace vflow {

/// The length of the valid UTF-8 sequence at `text[i]`, or 0 when it is not
/// one (overlong forms, surrogates and code points past U+10FFFF included).
inline size_t utf8SequenceLength(const std::string &text, size_t i) {
  unsigned char c = static_cast<unsigned char>(text[i]);
  size_t len = c < 0x80           ? 1
               : (c >> 5) == 0x6  ? 2
               : (c >> 4) == 0xe  ? 3
               : (c >> 3) == 0x1e ? 4
                                  : 0;
  if (len == 0 || i + len > text.size())
    return 0;
  uint32_t cp = len == 1 ? c : c & (0xff >> (len + 1));
  for (size_t k = 1; k < len; ++k) {
    unsigned char cc = static_cast<unsigned char>(text[i + k]);
    if ((cc >> 6) != 0x2)
      return 0;
    cp = (cp << 6) | (cc & 0x3f);
  }
  if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
      (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
      (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return len;
}

} // namespace vflow

#endif // VFLOW_RUNTIME_UTF8_H
