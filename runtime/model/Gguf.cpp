//===- Gguf.cpp - The GGUF reader and ggml block dequantization -----------===//
//
// GGUF (v2 and v3, little-endian): "GGUF", u32 version, u64 tensor count,
// u64 key/value count, the key/value pairs (u64-length strings, a u32 value
// type, the value; arrays are a u32 element type, a u64 count, the
// elements), the tensor infos (name, u32 dim count, u64 dims innermost
// first, u32 ggml type, u64 offset), padding to general.alignment (32 by
// default), then the tensor data the offsets index.
//
// What a file may make the reader allocate is bounded before it is
// allocated: tensor data lies inside the file and no two tensors' data
// overlap (so the weights take at most the file's bytes, and their f32
// copies at most 1024/84 times that, Q2_K's expansion), and the metadata's
// values (an rt::Json each, 40 bytes) may take at most kMetadataFloor plus
// kMetadataPerByte times the bytes of metadata read: an array's element
// count times its cost is checked against that before the array is built.
//
// Block formats (ggml's): Q8_0 = f16 d, 32 x int8 q: q * d. Q4_0 = f16 d,
// 16 bytes: element j < 16 is the low nibble of byte j, element j + 16 its
// high nibble, value (q - 8) * d. Q4_1 = f16 d, f16 m, the same nibbles,
// value q * d + m. Q5_0 and Q5_1 add a fifth bit per element (bit j of a
// u32 after d, m) to Q4_0's and Q4_1's nibbles; Q5_0 subtracts 16. The
// K-quants pack 256 elements in sub-blocks with their own scales (and
// mins), each an integer scaled by the block's f16 d (and dmin); see
// decodeKQuant. The arithmetic follows the gguf package's numpy reference
// operation by operation (f32 products (d * scale) * q - dmin * min), so
// the values are the same bits (GgufTest, tests/model/kquant_golden.py).
//
//===----------------------------------------------------------------------===//

#include "Internal.h"

#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Error.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

using namespace vflow;
using namespace vflow::model::detail;
using vflow::rt::Error;
using vflow::rt::Json;

namespace {

/// Each weight storage: its name, its ggml type id, and its blocks
/// (elements and bytes; quantized types pack 32 elements with scales).
struct StorageInfo {
  Storage storage;
  const char *name;
  uint32_t ggmlType;
  int64_t blockElements, blockBytes;
};

constexpr StorageInfo kStorages[] = {{Storage::F32, "F32", 0, 1, 4},
                                     {Storage::F16, "F16", 1, 1, 2},
                                     {Storage::BF16, "BF16", 30, 1, 2},
                                     {Storage::Q8_0, "Q8_0", 8, 32, 34},
                                     {Storage::Q4_0, "Q4_0", 2, 32, 18},
                                     {Storage::Q4_1, "Q4_1", 3, 32, 20},
                                     {Storage::Q5_0, "Q5_0", 6, 32, 22},
                                     {Storage::Q5_1, "Q5_1", 7, 32, 24},
                                     {Storage::Q2_K, "Q2_K", 10, 256, 84},
                                     {Storage::Q3_K, "Q3_K", 11, 256, 110},
                                     {Storage::Q4_K, "Q4_K", 12, 256, 144},
                                     {Storage::Q5_K, "Q5_K", 13, 256, 176},
                                     {Storage::Q6_K, "Q6_K", 14, 256, 210}};

const StorageInfo *infoOf(Storage storage) {
  for (const StorageInfo &info : kStorages)
    if (info.storage == storage)
      return &info;
  return nullptr;
}

} // namespace

const char *vflow::model::detail::storageName(Storage storage) {
  const StorageInfo *info = infoOf(storage);
  return info ? info->name : "?";
}

int64_t vflow::model::detail::blockElements(Storage storage) {
  const StorageInfo *info = infoOf(storage);
  return info ? info->blockElements : 1;
}

int64_t vflow::model::detail::blockBytes(Storage storage) {
  const StorageInfo *info = infoOf(storage);
  return info ? info->blockBytes : 1;
}

namespace {

/// ggml's type ids, for the ones supported and for naming the others.
std::string ggmlTypeName(uint32_t type) {
  static const char *const names[] = {
      "F32",   "F16",     "Q4_0",    "Q4_1",    "type 4",  "type 5",  "Q5_0",
      "Q5_1",  "Q8_0",    "Q8_1",    "Q2_K",    "Q3_K",    "Q4_K",    "Q5_K",
      "Q6_K",  "Q8_K",    "IQ2_XXS", "IQ2_XS",  "IQ3_XXS", "IQ1_S",   "IQ4_NL",
      "IQ3_S", "IQ2_S",   "IQ4_XS",  "I8",      "I16",     "I32",     "I64",
      "F64",   "IQ1_M",   "BF16",    "type 31", "type 32", "type 33", "TQ1_0",
      "TQ2_0", "type 36", "type 37", "type 38", "MXFP4"};
  if (type < sizeof(names) / sizeof(names[0]))
    return names[type];
  return "type " + std::to_string(type);
}

bool storageOf(uint32_t type, Storage &storage) {
  for (const StorageInfo &info : kStorages)
    if (info.ggmlType == type) {
      storage = info.storage;
      return true;
    }
  return false;
}

/// The metadata's memory budget (see the top of the file). The floor holds
/// the largest real tokenizers (Gemma 3's 262K tokens, scores and token
/// types take about 60 MiB as charged below); per byte of metadata, 10 is
/// more than any array of strings costs, so only arrays of small numbers
/// (20 to 80 bytes of memory per byte of file) can run into the limit.
constexpr uint64_t kMetadataFloor = uint64_t(64) << 20;
constexpr uint64_t kMetadataPerByte = 10;
/// What an array's element costs as it is charged: an rt::Json, twice over
/// (Json::push grows the array by doubling, so its capacity stays below
/// twice its length).
constexpr uint64_t kArrayElementCost = 2 * sizeof(Json);

enum ValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};

/// The fewest bytes a value of `type` takes; 0 for an unknown type.
uint64_t minValueBytes(uint32_t type) {
  switch (type) {
  case U8:
  case I8:
  case Bool:
    return 1;
  case U16:
  case I16:
    return 2;
  case U32:
  case I32:
  case F32:
    return 4;
  case U64:
  case I64:
  case F64:
  case String:
    return 8;
  case Array:
    return 12;
  default:
    return 0;
  }
}

const char *valueTypeName(uint32_t type) {
  static const char *const names[] = {
      "uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
      "bool",  "string", "array",  "uint64", "int64",  "float64"};
  return type < sizeof(names) / sizeof(names[0]) ? names[type] : "unknown";
}

/// Bounds-checked little-endian reads; errors name the file, the byte
/// offset and what was being read (`context`: the key or tensor).
class Reader {
public:
  explicit Reader(const MappedFile &file)
      : data(file.data()), size(file.size()), path(file.path()) {}

  [[noreturn]] void fail(uint64_t at, const std::string &why) const {
    throw Error(path + ": byte " + std::to_string(at) + ": " + why +
                (context.empty() ? "" : " (" + context + ")"));
  }
  void need(uint64_t n, const char *what) const {
    if (n > size - pos)
      fail(pos, std::string("truncated file: ") + what + " needs " +
                    std::to_string(n) + " bytes, " +
                    std::to_string(size - pos) + " left");
  }
  template <typename T> T get(const char *what) {
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, data + pos, sizeof(T));
    pos += sizeof(T);
    return value;
  }
  std::string string(const char *what) {
    uint64_t n = get<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char *>(data + pos), size_t(n));
    pos += n;
    return s;
  }
  uint64_t left() const { return size - pos; }

  /// Counts `bytes` of memory against the metadata's budget before they
  /// are allocated, for values that reach file byte `through`; `what`
  /// says what would take them.
  void charge(uint64_t at, uint64_t bytes, uint64_t through,
              const std::string &what) {
    uint64_t budget =
        kMetadataFloor + kMetadataPerByte * (through - metadataStart);
    if (bytes > budget - std::min(charged, budget))
      fail(at,
           what + " would take " + std::to_string(bytes) +
               " bytes of memory, and the metadata " + std::to_string(charged) +
               " already: more than its budget of " + std::to_string(budget) +
               " bytes (" + std::to_string(kMetadataFloor >> 20) + " MiB + " +
               std::to_string(kMetadataPerByte) + " per byte of metadata)");
    charged += bytes;
  }

  const uint8_t *data;
  uint64_t size;
  uint64_t pos = 0;
  const std::string &path;
  std::string context;
  /// Where the metadata starts, and the memory its values took so far.
  uint64_t metadataStart = 0;
  uint64_t charged = 0;
};

Json readValue(Reader &r, uint32_t type, int depth) {
  uint64_t at = r.pos;
  switch (type) {
  case U8:
    return Json(r.get<uint8_t>("a uint8"));
  case I8:
    return Json(r.get<int8_t>("an int8"));
  case U16:
    return Json(r.get<uint16_t>("a uint16"));
  case I16:
    return Json(r.get<int16_t>("an int16"));
  case U32:
    return Json(r.get<uint32_t>("a uint32"));
  case I32:
    return Json(r.get<int32_t>("an int32"));
  case U64:
    return Json(r.get<uint64_t>("a uint64"));
  case I64:
    return Json(r.get<int64_t>("an int64"));
  case F32:
    return Json(double(r.get<float>("a float32")));
  case F64:
    return Json(r.get<double>("a float64"));
  case Bool: {
    uint8_t b = r.get<uint8_t>("a bool");
    if (b > 1)
      r.fail(at, "bad bool value " + std::to_string(b));
    return Json(b != 0);
  }
  case String: {
    uint64_t n = r.get<uint64_t>("a string");
    r.need(n, "a string");
    r.charge(at, n, r.pos + n, "a string of " + std::to_string(n) + " bytes");
    Json value(
        std::string(reinterpret_cast<const char *>(r.data + r.pos), size_t(n)));
    r.pos += n;
    return value;
  }
  case Array: {
    if (depth >= 4)
      r.fail(at, "arrays nested more than 4 deep");
    uint32_t elementType = r.get<uint32_t>("an array's element type");
    uint64_t count = r.get<uint64_t>("an array's length");
    uint64_t min = minValueBytes(elementType);
    if (min == 0)
      r.fail(at, "unknown array element type " + std::to_string(elementType));
    if (count > r.left() / min)
      r.fail(at, "truncated file: an array of " + std::to_string(count) +
                     " elements does not fit in the " +
                     std::to_string(r.left()) + " bytes left");
    // count * min <= left: neither product overflows.
    r.charge(at, count * kArrayElementCost, r.pos + count * min,
             "an array of " + std::to_string(count) + " " +
                 valueTypeName(elementType) + " values");
    Json array = Json::array();
    for (uint64_t i = 0; i < count; ++i)
      array.push(readValue(r, elementType, depth + 1));
    return array;
  }
  default:
    r.fail(at, "unknown value type " + std::to_string(type));
  }
}

} // namespace

namespace {

/// The header: magic, version, and the tensor and metadata counts, checked
/// against the bytes left.
void readHeader(Reader &r, GgufContents &out, uint64_t &tensorCount,
                uint64_t &kvCount) {
  r.need(4, "the magic");
  if (std::memcmp(r.data, "GGUF", 4) != 0) {
    std::string magic(reinterpret_cast<const char *>(r.data), 4);
    for (char &c : magic)
      if (c < 32 || c > 126)
        c = '?';
    r.fail(0, "bad magic '" + magic + "' (expected 'GGUF'): not a GGUF file");
  }
  r.pos = 4;
  out.version = r.get<uint32_t>("the version");
  if (out.version != 2 && out.version != 3)
    r.fail(4, "unsupported GGUF version " + std::to_string(out.version) +
                  " (supported: 2, 3)");
  tensorCount = r.get<uint64_t>("the tensor count");
  kvCount = r.get<uint64_t>("the metadata count");
  if (kvCount > 8192 || kvCount > r.left() / 13)
    r.fail(16, "implausible metadata count " + std::to_string(kvCount));
  if (tensorCount > r.left() / 32)
    r.fail(8, "implausible tensor count " + std::to_string(tensorCount) +
                  " for the " + std::to_string(r.left()) + " bytes left");
}

/// The key/value pairs, and the data alignment they set.
uint64_t readMetadata(Reader &r, GgufContents &out, uint64_t kvCount,
                      const std::string &path) {
  out.metadata = Json::object();
  std::unordered_set<std::string> keys;
  r.metadataStart = r.pos;
  for (uint64_t i = 0; i < kvCount; ++i) {
    uint64_t at = r.pos;
    r.context = "metadata entry " + std::to_string(i);
    std::string key = r.string("a metadata key");
    r.context = "metadata key '" + key + "'";
    // The member, its name and its place in the object's index and in the
    // set of names, each held twice over while they grow.
    r.charge(at, 2 * (sizeof(Json::Members::value_type) + key.size() + 64),
             r.pos, "a metadata key");
    if (!keys.insert(key).second)
      r.fail(at, "duplicate metadata key");
    uint32_t type = r.get<uint32_t>("a value type");
    out.metadata.set(key, readValue(r, type, 0));
  }
  uint64_t alignment = 32;
  if (const Json *a = out.metadata.find("general.alignment")) {
    double v = a->getKind() == Json::Kind::Number ? a->asNumber("") : 0;
    alignment =
        v >= 1 && v <= 65536 && v == double(uint64_t(v)) ? uint64_t(v) : 0;
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
      throw Error(path +
                  ": metadata key 'general.alignment' must be "
                  "a power of two in [1, 65536], not " +
                  a->dump());
  }
  return alignment;
}

/// Where a tensor info stands in the file, its ggml type and data offset.
struct TensorInfo {
  uint64_t at;
  uint32_t type;
  uint64_t offset;
};

/// The tensor infos: names (distinct), shapes, types, offsets.
std::vector<TensorInfo>
readTensorInfos(Reader &r, GgufContents &out, uint64_t tensorCount,
                const std::shared_ptr<MappedFile> &file) {
  std::vector<TensorInfo> infos;
  std::unordered_set<std::string> names;
  for (uint64_t i = 0; i < tensorCount; ++i) {
    TensorInfo info;
    info.at = r.pos;
    r.context = "tensor info " + std::to_string(i);
    Tensor t;
    t.file = file;
    t.storedName = r.string("a tensor name");
    r.context = "tensor '" + t.storedName + "'";
    if (!names.insert(t.storedName).second)
      r.fail(info.at, "duplicate tensor name");
    uint32_t dims = r.get<uint32_t>("the dim count");
    if (dims < 1 || dims > 4)
      r.fail(info.at, "bad dim count " + std::to_string(dims) + " (1 to 4)");
    t.shape.resize(dims);
    for (uint32_t d = 0; d < dims; ++d) {
      uint64_t ne = r.get<uint64_t>("a dim");
      if (ne > (uint64_t(1) << 40))
        r.fail(info.at, "implausible dim " + std::to_string(ne));
      t.shape[dims - 1 - d] = int64_t(ne); // innermost first in the file
    }
    info.type = r.get<uint32_t>("the type");
    info.offset = r.get<uint64_t>("the offset");
    infos.push_back(info);
    out.tensors.push_back(std::move(t));
  }
  return infos;
}

/// Each tensor's storage, byte count and place in the data section: inside
/// the file, aligned, and overlapping no other tensor.
void placeTensors(Reader &r, GgufContents &out,
                  const std::vector<TensorInfo> &infos, uint64_t alignment,
                  const MappedFile &file) {
  uint64_t dataStart = (r.pos + alignment - 1) / alignment * alignment;
  std::vector<DataRange> ranges;
  ranges.reserve(out.tensors.size());
  for (size_t i = 0; i < out.tensors.size(); ++i) {
    Tensor &t = out.tensors[i];
    const TensorInfo &info = infos[i];
    r.context = "tensor '" + t.storedName + "'";
    if (!storageOf(info.type, t.storage))
      r.fail(info.at, "tensor type " + ggmlTypeName(info.type) +
                          " is not supported (supported: F32, F16, BF16, "
                          "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, "
                          "Q5_K, Q6_K)");
    int64_t count;
    try {
      count = numElements(t.shape);
    } catch (const Error &e) {
      r.fail(info.at, e.what());
    }
    if (t.shape.back() % blockElements(t.storage) != 0)
      r.fail(info.at, "row length " + std::to_string(t.shape.back()) +
                          " is not a multiple of " + storageName(t.storage) +
                          "'s block of " +
                          std::to_string(blockElements(t.storage)));
    t.bytes =
        uint64_t(count / blockElements(t.storage) * blockBytes(t.storage));
    if (info.offset % alignment != 0)
      r.fail(info.at, "data offset " + std::to_string(info.offset) +
                          " is not a multiple of the alignment " +
                          std::to_string(alignment));
    if (dataStart > file.size() || info.offset > file.size() - dataStart ||
        t.bytes > file.size() - dataStart - info.offset)
      r.fail(info.at, "the data (" + std::to_string(t.bytes) +
                          " bytes at offset " + std::to_string(info.offset) +
                          " from the data section at byte " +
                          std::to_string(dataStart) +
                          ") lies outside the file (" +
                          std::to_string(file.size()) + " bytes)");
    t.offset = dataStart + info.offset;
    ranges.push_back({info.offset, info.offset + t.bytes, t.storedName});
  }
  refuseOverlaps(std::move(ranges), file.path(),
                 "in the data section (from byte " + std::to_string(dataStart) +
                     ")");
}

} // namespace

GgufContents
vflow::model::detail::readGguf(const std::shared_ptr<MappedFile> &file) {
  Reader r(*file);
  GgufContents out;
  uint64_t tensorCount = 0, kvCount = 0;
  readHeader(r, out, tensorCount, kvCount);
  const uint64_t alignment = readMetadata(r, out, kvCount, file->path());
  const std::vector<TensorInfo> infos =
      readTensorInfos(r, out, tensorCount, file);
  placeTensors(r, out, infos, alignment, *file);
  return out;
}

namespace {

float halfAt(const uint8_t *q) {
  uint16_t bits;
  std::memcpy(&bits, q, 2);
  return rt::f16ToFloat(bits);
}

/// Q5_0 (offset 16, no m) and Q5_1 (no offset, + m): 32 elements.
void decodeQ5(const uint8_t *p, int64_t blocks, bool withMin, float *out) {
  const int64_t bytes = withMin ? 24 : 22;
  for (int64_t b = 0; b < blocks; ++b, p += bytes, out += 32) {
    float d = halfAt(p), m = withMin ? halfAt(p + 2) : 0.0f;
    const uint8_t *h = p + (withMin ? 4 : 2), *qs = h + 4;
    uint32_t high;
    std::memcpy(&high, h, 4);
    for (int j = 0; j < 32; ++j) {
      int low = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
      int q = low | int((high >> j) & 1u) << 4;
      out[j] = withMin ? float(q) * d + m : d * float(q - 16);
    }
  }
}

/// Q4_K's and Q5_K's eight 6-bit scales and mins from their 12 bytes.
void scaleMin(const uint8_t *s, int sub, int &scale, int &min) {
  if (sub < 4) {
    scale = s[sub] & 63;
    min = s[sub + 4] & 63;
  } else {
    scale = (s[sub + 4] & 0xF) | ((s[sub - 4] >> 2) & 0x30);
    min = (s[sub + 4] >> 4) | ((s[sub] >> 2) & 0x30);
  }
}

void decodeQ2K(const uint8_t *p, float *out) {
  const uint8_t *scales = p, *qs = p + 16;
  float d = halfAt(p + 80), dmin = halfAt(p + 82);
  for (int e = 0; e < 256; ++e) {
    int s = e / 16, half = e / 128, shift = 2 * ((e / 32) % 4);
    float dl = d * float(scales[s] & 0xF), ml = dmin * float(scales[s] >> 4);
    out[e] = dl * float((qs[half * 32 + e % 32] >> shift) & 3) - ml;
  }
}

void decodeQ3K(const uint8_t *p, float *out) {
  const uint8_t *hmask = p, *qs = p + 32, *sc = p + 96;
  float d = halfAt(p + 108);
  float dl[16];
  for (int k = 0; k < 16; ++k) {
    int low = (sc[k % 8] >> (4 * (k / 8))) & 0xF;
    int high = (sc[8 + k % 4] >> (2 * (k / 4))) & 3;
    dl[k] = d * float(int8_t(uint8_t(low | high << 4)) - 32);
  }
  for (int e = 0; e < 256; ++e) {
    int l = e % 32, half = e / 128, shift = 2 * ((e / 32) % 4);
    int low = (qs[half * 32 + l] >> shift) & 3;
    int high = ((hmask[l] >> (e / 32)) & 1) ^ 1;
    out[e] = dl[e / 16] * float(low - (high << 2));
  }
}

/// Q4_K and Q5_K (the fifth bit of element l of sub-block s is bit s of
/// qh[l]): eight sub-blocks of 32, (d * scale) * q - dmin * min.
void decodeQ45K(const uint8_t *p, bool five, float *out) {
  float d = halfAt(p), dmin = halfAt(p + 2);
  const uint8_t *scales = p + 4, *qh = p + 16, *qs = p + (five ? 48 : 16);
  for (int s = 0; s < 8; ++s) {
    int scale, min;
    scaleMin(scales, s, scale, min);
    float ds = d * float(scale), dm = dmin * float(min);
    for (int l = 0; l < 32; ++l) {
      int q = (qs[(s / 2) * 32 + l] >> (4 * (s % 2))) & 0xF;
      if (five)
        q |= ((qh[l] >> s) & 1) << 4;
      out[s * 32 + l] = ds * float(q) - dm;
    }
  }
}

void decodeQ6K(const uint8_t *p, float *out) {
  const uint8_t *ql = p, *qh = p + 128;
  const int8_t *scales = reinterpret_cast<const int8_t *>(p + 192);
  float d = halfAt(p + 208);
  for (int e = 0; e < 256; ++e) {
    int half = e / 128, r = e % 128;
    int low = (ql[half * 64 + r % 64] >> (4 * (r / 64))) & 0xF;
    int high = (qh[half * 32 + r % 32] >> (2 * (r / 32))) & 3;
    int q = int(int8_t(uint8_t(low | high << 4))) - 32;
    out[e] = d * float(scales[e / 16]) * float(q);
  }
}

} // namespace

void vflow::model::detail::decodeElements(const Tensor &t, int64_t first,
                                          int64_t count, float *out) {
  const uint8_t *base = t.file->data() + t.offset;
  int64_t block = blockElements(t.storage);
  const uint8_t *p = base + first / block * blockBytes(t.storage);
  auto half = [](const uint8_t *q) {
    uint16_t bits;
    std::memcpy(&bits, q, 2);
    return rt::f16ToFloat(bits);
  };
  switch (t.storage) {
  case Storage::F32:
    rt::convertToF32(rt::DType::F32, p, out, size_t(count));
    return;
  case Storage::F16:
    rt::convertToF32(rt::DType::F16, p, out, size_t(count));
    return;
  case Storage::BF16:
    rt::convertToF32(rt::DType::BF16, p, out, size_t(count));
    return;
  case Storage::Q8_0:
    for (int64_t b = 0; b < count / 32; ++b, p += 34, out += 32) {
      float d = half(p);
      for (int j = 0; j < 32; ++j)
        out[j] = float(int8_t(p[2 + j])) * d;
    }
    return;
  case Storage::Q4_0:
    for (int64_t b = 0; b < count / 32; ++b, p += 18, out += 32) {
      float d = half(p);
      for (int j = 0; j < 16; ++j) {
        out[j] = float(int(p[2 + j] & 0xF) - 8) * d;
        out[j + 16] = float(int(p[2 + j] >> 4) - 8) * d;
      }
    }
    return;
  case Storage::Q4_1:
    for (int64_t b = 0; b < count / 32; ++b, p += 20, out += 32) {
      float d = half(p), m = half(p + 2);
      for (int j = 0; j < 16; ++j) {
        out[j] = float(p[4 + j] & 0xF) * d + m;
        out[j + 16] = float(p[4 + j] >> 4) * d + m;
      }
    }
    return;
  case Storage::Q5_0:
  case Storage::Q5_1:
    decodeQ5(p, count / 32, t.storage == Storage::Q5_1, out);
    return;
  case Storage::Q2_K:
  case Storage::Q3_K:
  case Storage::Q4_K:
  case Storage::Q5_K:
  case Storage::Q6_K:
    for (int64_t b = 0; b < count / 256; ++b, out += 256) {
      const uint8_t *q = p + b * blockBytes(t.storage);
      if (t.storage == Storage::Q2_K)
        decodeQ2K(q, out);
      else if (t.storage == Storage::Q3_K)
        decodeQ3K(q, out);
      else if (t.storage == Storage::Q6_K)
        decodeQ6K(q, out);
      else
        decodeQ45K(q, t.storage == Storage::Q5_K, out);
    }
    return;
  }
}
