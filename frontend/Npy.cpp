//===- Npy.cpp - Reading NumPy .npy files ---------------------------------===//
//
// The header is parsed strictly (the NPY format's Python dict literal), its
// element count is checked against the limit before anything is allocated,
// the file size must match the header exactly, and the data is converted in
// one streaming pass (Fortran order included), so that a file costs time and
// memory linear in its size.
//
//===----------------------------------------------------------------------===//

#include "vflow/Frontend/Npy.h"
#include "vflow/Frontend/Diagnostics.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unistd.h>

namespace vflow {
namespace {

float halfToFloat(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float value;
  if (exp == 0)
    value = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31)
    value = mant ? NAN : INFINITY;
  else
    value = std::ldexp(static_cast<float>(mant | 0x400), int(exp) - 25);
  return sign ? -value : value;
}

/// A recursive-descent reader of the header's dict literal:
///   { 'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
/// Whitespace may separate tokens; the dict may end with a comma; after it
/// comes only the padding (spaces, then a newline).
class HeaderParser {
public:
  explicit HeaderParser(const std::string &text) : text(text) {}

  bool parse(NpyHeader &out, std::string &error) {
    bool haveDescr = false, haveOrder = false, haveShape = false;
    skipSpace();
    if (!expect('{', "the header is not a dict ('{' expected)", error))
      return false;
    skipSpace();
    while (!at('}')) {
      std::string key;
      if (!readString(key, "a key", error))
        return false;
      skipSpace();
      if (!expect(':', "':' expected after key '" + key + "'", error))
        return false;
      skipSpace();
      if (key == "descr") {
        if (haveDescr)
          return fail("key 'descr' is given twice", error);
        haveDescr = true;
        std::string descr;
        if (!readString(descr, "the value of 'descr' (a dtype string)",
                        error) ||
            !parseDescr(descr, out, error))
          return false;
      } else if (key == "fortran_order") {
        if (haveOrder)
          return fail("key 'fortran_order' is given twice", error);
        haveOrder = true;
        if (text.compare(pos, 4, "True") == 0) {
          out.fortranOrder = true;
          pos += 4;
        } else if (text.compare(pos, 5, "False") == 0) {
          out.fortranOrder = false;
          pos += 5;
        } else {
          return fail("'fortran_order' must be True or False", error);
        }
      } else if (key == "shape") {
        if (haveShape)
          return fail("key 'shape' is given twice", error);
        haveShape = true;
        if (!parseShape(out.shape, error))
          return false;
      } else {
        return fail("unexpected key '" + shortName(key) +
                        "' (a .npy header has exactly 'descr', "
                        "'fortran_order' and 'shape')",
                    error);
      }
      skipSpace();
      if (at(',')) {
        ++pos;
        skipSpace();
        continue;
      }
      if (!at('}'))
        return fail("',' or '}' expected after the value of '" + key + "'",
                    error);
    }
    ++pos; // '}'
    for (; pos < text.size(); ++pos)
      if (text[pos] != ' ' && text[pos] != '\n' && text[pos] != '\t' &&
          text[pos] != '\r')
        return fail("unexpected text after the header dict", error);
    if (!haveDescr || !haveOrder || !haveShape)
      return fail(std::string("the header lacks key '") +
                      (!haveDescr   ? "descr"
                       : !haveOrder ? "fortran_order"
                                    : "shape") +
                      "'",
                  error);
    return true;
  }

private:
  bool at(char c) const { return pos < text.size() && text[pos] == c; }
  void skipSpace() {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t' ||
                                 text[pos] == '\n' || text[pos] == '\r'))
      ++pos;
  }
  bool fail(const std::string &why, std::string &error) {
    error = why;
    return false;
  }
  bool expect(char c, const std::string &why, std::string &error) {
    if (!at(c))
      return fail(why, error);
    ++pos;
    return true;
  }

  /// A Python string literal in single or double quotes, without escapes.
  bool readString(std::string &out, const std::string &what,
                  std::string &error) {
    if (!at('\'') && !at('"'))
      return fail(what + " must be a quoted string", error);
    char quote = text[pos++];
    size_t end = pos;
    while (end < text.size() && text[end] != quote && text[end] != '\\' &&
           text[end] != '\n')
      ++end;
    if (end == text.size() || text[end] != quote)
      return fail(what + " is not a plain quoted string", error);
    out = text.substr(pos, end - pos);
    pos = end + 1;
    return true;
  }

  /// '<f4' and friends: a byte order, a kind and an item size.
  bool parseDescr(const std::string &descr, NpyHeader &out,
                  std::string &error) {
    std::string shown = "'" + shortName(descr) + "'";
    if (descr.size() != 3 ||
        (descr[0] != '<' && descr[0] != '>' && descr[0] != '|'))
      return fail("unsupported dtype " + shown +
                      " (supported: f2, f4, f8, i1-i8, u1-u8, b1 with "
                      "byte order '<', '>' or '|')",
                  error);
    char kind = descr[1];
    int size = descr[2] - '0';
    bool supported = (kind == 'f' && (size == 2 || size == 4 || size == 8)) ||
                     ((kind == 'i' || kind == 'u') &&
                      (size == 1 || size == 2 || size == 4 || size == 8)) ||
                     (kind == 'b' && size == 1);
    if (!supported)
      return fail("unsupported dtype " + shown +
                      " (supported: f2, f4, f8, i1-i8, u1-u8, b1)",
                  error);
    if (descr[0] == '|' && size != 1)
      return fail("dtype " + shown + " needs a byte order ('<' or '>')", error);
    out.byteOrder = descr[0];
    out.kind = kind;
    out.itemSize = size;
    return true;
  }

  /// A tuple of non-negative ints: (), (8,), (8, 4), (8, 4,).
  bool parseShape(std::vector<int64_t> &shape, std::string &error) {
    shape.clear();
    if (!expect('(', "'shape' must be a tuple such as (8, 4)", error))
      return false;
    skipSpace();
    bool trailingComma = false;
    while (!at(')')) {
      size_t start = pos;
      while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9')
        ++pos;
      size_t digits = pos - start;
      if (digits == 0 || (digits > 1 && text[start] == '0'))
        return fail("'shape' must be a tuple of non-negative integers", error);
      if (digits > 12)
        return fail("a dimension of 'shape' is too large", error);
      shape.push_back(std::stoll(text.substr(start, digits)));
      skipSpace();
      trailingComma = at(',');
      if (trailingComma) {
        ++pos;
        skipSpace();
      } else if (!at(')')) {
        return fail("'shape' must be a tuple of non-negative integers", error);
      }
    }
    ++pos; // ')'
    // (8) is the int 8 in Python, not a tuple.
    if (shape.size() == 1 && !trailingComma)
      return fail("'shape' must be a tuple: a single dimension is written "
                  "(8,)",
                  error);
    return true;
  }

  const std::string &text;
  size_t pos = 0;
};

std::string formatShape(const std::vector<int64_t> &shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

/// Converts one element of the file to f32.
float convert(const unsigned char *bytes, const NpyHeader &h) {
  unsigned char b[8];
  std::memcpy(b, bytes, h.itemSize);
  if (h.byteOrder == '>')
    std::reverse(b, b + h.itemSize);
  uint64_t raw = 0;
  std::memcpy(&raw, b, h.itemSize); // Little-endian host.
  if (h.kind == 'f') {
    if (h.itemSize == 2)
      return halfToFloat(static_cast<uint16_t>(raw));
    if (h.itemSize == 4) {
      float v;
      std::memcpy(&v, b, 4);
      return v;
    }
    double d;
    std::memcpy(&d, b, 8);
    return static_cast<float>(d);
  }
  if (h.kind == 'u' || h.kind == 'b')
    return static_cast<float>(raw);
  int shift = 64 - 8 * h.itemSize;
  return static_cast<float>(static_cast<int64_t>(raw << shift) >> shift);
}

/// Reads the data section into `values` (row-major), in chunks.
bool readData(int fd, const NpyHeader &h, int64_t count,
              std::vector<float> &values, const std::string &path,
              std::string &error) {
  values.assign(static_cast<size_t>(count), 0.0f);
  size_t rank = h.shape.size();
  // Fortran order: the file's element i goes to the row-major offset of its
  // column-major index, walked like an odometer (first axis fastest).
  bool fortran = h.fortranOrder && rank > 1;
  std::vector<int64_t> rowStride(rank, 1), idx(rank, 0);
  for (size_t d = rank; d-- > 1;)
    rowStride[d - 1] = rowStride[d] * h.shape[d];
  int64_t dest = 0;
  constexpr size_t kChunk = size_t(1) << 20;
  std::vector<unsigned char> buffer;
  int64_t done = 0;
  while (done < count) {
    int64_t n = std::min<int64_t>(count - done, kChunk / h.itemSize);
    buffer.resize(static_cast<size_t>(n) * h.itemSize);
    if (!readExactly(fd, reinterpret_cast<char *>(buffer.data()), buffer.size(),
                     path, error))
      return false;
    for (int64_t i = 0; i < n; ++i) {
      const unsigned char *bytes = buffer.data() + i * h.itemSize;
      if (h.kind == 'b' && bytes[0] > 1) {
        error = "'" + path + "' is a bool array but element " +
                std::to_string(done + i) + " is " + std::to_string(bytes[0]) +
                "; bool entries must be 0 or 1";
        return false;
      }
      float v = convert(bytes, h);
      if (!fortran) {
        values[done + i] = v;
        continue;
      }
      values[dest] = v;
      for (size_t d = 0; d < rank; ++d) {
        dest += rowStride[d];
        if (++idx[d] < h.shape[d])
          break;
        dest -= rowStride[d] * h.shape[d];
        idx[d] = 0;
      }
    }
    done += n;
  }
  return true;
}

} // namespace

bool parseNpyHeader(const std::string &header, NpyHeader &out,
                    std::string &error) {
  return HeaderParser(header).parse(out, error);
}

bool readNpy(const std::string &path, NpyArray &out, std::string &error,
             int64_t maxElements) {
  uint64_t fileSize = 0;
  int fd = openRegularFile(path, fileSize, error);
  if (fd < 0)
    return false;
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  auto fail = [&](const std::string &why) {
    error = "'" + path + "' " + why;
    return false;
  };

  unsigned char prefix[12];
  if (fileSize < 10)
    return fail("is not a .npy file (it is too short)");
  if (!readExactly(fd, reinterpret_cast<char *>(prefix), 10, path, error))
    return false;
  if (std::memcmp(prefix, "\x93NUMPY", 6) != 0)
    return fail("is not a .npy file (bad magic)");
  unsigned major = prefix[6];
  uint64_t headerLen, headerStart;
  if (major == 1) {
    headerLen = prefix[8] | (uint64_t(prefix[9]) << 8);
    headerStart = 10;
  } else if (major == 2 || major == 3) {
    if (fileSize < 12)
      return fail("is truncated (in the header)");
    if (!readExactly(fd, reinterpret_cast<char *>(prefix) + 10, 2, path, error))
      return false;
    headerLen = 0;
    for (int i = 3; i >= 0; --i)
      headerLen = (headerLen << 8) | prefix[8 + i];
    headerStart = 12;
  } else {
    return fail("has unsupported .npy version " + std::to_string(major));
  }
  if (headerLen > (uint64_t(1) << 20))
    return fail("has a header of " + std::to_string(headerLen) +
                " bytes; the limit is 1048576");
  if (headerStart + headerLen > fileSize)
    return fail("is truncated (in the header)");
  std::string text(static_cast<size_t>(headerLen), '\0');
  if (!readExactly(fd, &text[0], text.size(), path, error))
    return false;

  NpyHeader header;
  std::string why;
  if (!parseNpyHeader(text, header, why))
    return fail("has a malformed .npy header: " + why);

  int64_t count = 1;
  for (int64_t d : header.shape)
    count = count < 0 ? -1 : limits::boundedProduct(count, d, maxElements);
  if (count < 0)
    return fail("has shape " + formatShape(header.shape) +
                ", more than the limit of " + std::to_string(maxElements) +
                " elements");
  uint64_t dataBytes = uint64_t(count) * uint64_t(header.itemSize);
  uint64_t have = fileSize - headerStart - headerLen;
  if (have != dataBytes)
    return fail(std::string(have < dataBytes ? "is truncated" : "is too long") +
                ": its header (shape " + formatShape(header.shape) +
                ", dtype " + header.kind + std::to_string(header.itemSize) +
                ") describes " + std::to_string(dataBytes) +
                " data bytes, but the file has " + std::to_string(have));

  out.shape = header.shape;
  return readData(fd, header, count, out.values, path, error);
}

} // namespace vflow
