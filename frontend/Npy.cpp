//===- Npy.cpp - Reading NumPy .npy files ---------------------------------===//

#include "vflow/Frontend/Npy.h"
#include "vflow/Frontend/Diagnostics.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

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

/// Finds `'key':` in the header dict and returns the text after it.
bool findKey(const std::string &header, const std::string &key,
             std::string &rest) {
  size_t pos = header.find("'" + key + "'");
  if (pos == std::string::npos)
    return false;
  pos = header.find(':', pos);
  if (pos == std::string::npos)
    return false;
  rest = header.substr(pos + 1);
  size_t first = rest.find_first_not_of(" ");
  rest = first == std::string::npos ? "" : rest.substr(first);
  return true;
}

} // namespace

bool readNpy(const std::string &path, NpyArray &out, std::string &error) {
  std::string data;
  if (!readFileText(path, size_t(1) << 28, data, error))
    return false;
  if (data.size() < 10 || data.compare(0, 6, "\x93NUMPY") != 0) {
    error = "'" + path + "' is not a .npy file (bad magic)";
    return false;
  }
  unsigned major = static_cast<unsigned char>(data[6]);
  size_t headerLen, headerStart;
  if (major == 1) {
    headerLen = static_cast<unsigned char>(data[8]) |
                (static_cast<unsigned char>(data[9]) << 8);
    headerStart = 10;
  } else if (major == 2 || major == 3) {
    if (data.size() < 12) {
      error = "'" + path + "' is truncated";
      return false;
    }
    headerLen = 0;
    for (int i = 3; i >= 0; --i)
      headerLen = (headerLen << 8) | static_cast<unsigned char>(data[8 + i]);
    headerStart = 12;
  } else {
    error =
        "'" + path + "' has unsupported .npy version " + std::to_string(major);
    return false;
  }
  if (headerStart + headerLen > data.size()) {
    error = "'" + path + "' is truncated (header)";
    return false;
  }
  std::string header = data.substr(headerStart, headerLen);

  std::string descr, order, shapeText;
  if (!findKey(header, "descr", descr) ||
      !findKey(header, "fortran_order", order) ||
      !findKey(header, "shape", shapeText) || descr.size() < 4 ||
      shapeText.empty() || shapeText[0] != '(') {
    error = "'" + path + "' has a malformed .npy header";
    return false;
  }
  // descr is like '<f4'.
  char endian = descr[1], kind = descr[2];
  int itemSize = std::atoi(descr.c_str() + 3);
  bool fortran = order.compare(0, 4, "True") == 0;
  bool bigEndian = endian == '>';
  bool supported =
      (kind == 'f' && (itemSize == 2 || itemSize == 4 || itemSize == 8)) ||
      ((kind == 'i' || kind == 'u') &&
       (itemSize == 1 || itemSize == 2 || itemSize == 4 || itemSize == 8)) ||
      (kind == 'b' && itemSize == 1);
  if (!supported) {
    error = "'" + path + "' has unsupported dtype " +
            descr.substr(0, descr.find('\'', 1) + 1);
    return false;
  }

  out.shape.clear();
  size_t close = shapeText.find(')');
  if (close == std::string::npos) {
    error = "'" + path + "' has a malformed shape";
    return false;
  }
  std::stringstream dims(shapeText.substr(1, close - 1));
  std::string item;
  int64_t count = 1;
  while (std::getline(dims, item, ',')) {
    size_t first = item.find_first_not_of(" ");
    if (first == std::string::npos)
      continue;
    char *end = nullptr;
    long long d = std::strtoll(item.c_str() + first, &end, 10);
    if (d < 0 || d > (1 << 24)) {
      error = "'" + path + "' has a bad dimension";
      return false;
    }
    out.shape.push_back(d);
    count *= d;
    if (count > (1 << 26)) {
      error = "'" + path + "' is too large";
      return false;
    }
  }
  size_t payload = headerStart + headerLen;
  if (data.size() - payload < size_t(count) * itemSize) {
    error = "'" + path + "' is truncated: it needs " +
            std::to_string(count * itemSize) + " data bytes";
    return false;
  }

  std::vector<float> values(count);
  for (int64_t i = 0; i < count; ++i) {
    unsigned char bytes[8];
    std::memcpy(bytes, data.data() + payload + i * itemSize, itemSize);
    if (bigEndian)
      for (int a = 0, b = itemSize - 1; a < b; ++a, --b)
        std::swap(bytes[a], bytes[b]);
    uint64_t raw = 0;
    std::memcpy(&raw, bytes, std::min<size_t>(itemSize, sizeof(raw)));
    float v = 0;
    if (kind == 'f') {
      if (itemSize == 2) {
        v = halfToFloat(static_cast<uint16_t>(raw));
      } else if (itemSize == 4) {
        std::memcpy(&v, bytes, 4);
      } else {
        double d;
        std::memcpy(&d, bytes, 8);
        v = static_cast<float>(d);
      }
    } else if (kind == 'u' || kind == 'b') {
      v = static_cast<float>(raw);
    } else {
      int shift = 64 - 8 * itemSize;
      v = static_cast<float>(static_cast<int64_t>(raw << shift) >> shift);
    }
    values[i] = v;
  }
  if (fortran && out.shape.size() > 1) {
    // Convert column-major to row-major.
    std::vector<float> rowMajor(count);
    size_t rank = out.shape.size();
    std::vector<int64_t> idx(rank, 0);
    for (int64_t linear = 0; linear < count; ++linear) {
      int64_t rm = 0, cm = 0, stride = 1;
      for (size_t d = 0; d < rank; ++d)
        rm = rm * out.shape[d] + idx[d];
      for (size_t d = 0; d < rank; ++d) {
        cm += idx[d] * stride;
        stride *= out.shape[d];
      }
      rowMajor[rm] = values[cm];
      for (size_t d = rank; d-- > 0;) {
        if (++idx[d] < out.shape[d])
          break;
        idx[d] = 0;
      }
    }
    values.swap(rowMajor);
  }
  out.values = std::move(values);
  return true;
}

} // namespace vflow
