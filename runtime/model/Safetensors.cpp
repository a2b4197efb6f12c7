//===- Safetensors.cpp - Mapped files and the safetensors reader ----------===//
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of
// JSON ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, with an
// optional "__metadata__"}), then the data section the offsets index.
//
// Bounded before allocating: the header is at most kMaxHeaderBytes (the
// reference implementation's limit), every tensor's data lies inside the
// data section, takes exactly its shape times its dtype's size, and
// overlaps no other tensor's, so the weights take at most the file's bytes.
//
//===----------------------------------------------------------------------===//

#include "Internal.h"

#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Files.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace vflow;
using namespace vflow::model::detail;
using vflow::rt::Error;
using vflow::rt::Json;

/// The longest header accepted, as the safetensors reference implementation
/// (MAX_HEADER_SIZE): parsed, a header takes up to 20 times its bytes.
constexpr uint64_t kMaxHeaderBytes = 100000000;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the weight readers assume a little-endian host");

std::shared_ptr<MappedFile> MappedFile::open(const std::string &path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw Error("cannot open " + path + ": " + rt::errnoText(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw Error("cannot stat " + path + ": " + rt::errnoText(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + " is not a regular file");
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->name = path;
  file->length = uint64_t(st.st_size);
  if (file->length > 0) {
    void *p =
        ::mmap(nullptr, size_t(file->length), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw Error("cannot map " + path + ": " + rt::errnoText(err));
    }
    file->bytes = static_cast<const uint8_t *>(p);
  }
  ::close(fd);
  return file;
}

MappedFile::~MappedFile() {
  if (bytes)
    ::munmap(const_cast<uint8_t *>(bytes), size_t(length));
}

int64_t vflow::model::detail::numElements(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > (int64_t(1) << 60))
      throw Error("tensor shape " + shapeText(shape) + " is too large");
  return n;
}

std::string vflow::model::detail::shapeText(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void vflow::model::detail::refuseOverlaps(std::vector<DataRange> ranges,
                                          const std::string &path,
                                          const std::string &where) {
  std::sort(ranges.begin(), ranges.end(),
            [](const DataRange &a, const DataRange &b) {
              return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
            });
  // Sorted by begin, a range overlaps an earlier one exactly when it starts
  // before the furthest end so far (empty ranges overlap nothing).
  const DataRange *furthest = nullptr;
  for (const DataRange &b : ranges) {
    if (b.begin == b.end)
      continue;
    if (furthest && b.begin < furthest->end) {
      const DataRange &a = *furthest;
      throw Error(path + ": tensors '" + a.name + "' [" +
                  std::to_string(a.begin) + ", " + std::to_string(a.end) +
                  ") and '" + b.name + "' [" + std::to_string(b.begin) + ", " +
                  std::to_string(b.end) + ") overlap " + where);
    }
    if (!furthest || b.end > furthest->end)
      furthest = &b;
  }
}

std::vector<Tensor>
vflow::model::detail::readSafetensors(const std::shared_ptr<MappedFile> &file) {
  const std::string &path = file->path();
  uint64_t size = file->size();
  if (size < 8)
    throw Error(path + ": truncated safetensors file: " + std::to_string(size) +
                " bytes, but the header length alone takes 8");
  uint64_t headerLen;
  std::memcpy(&headerLen, file->data(), 8);
  if (headerLen > size - 8)
    throw Error(path + ": the header length at byte 0 is " +
                std::to_string(headerLen) + " bytes, but only " +
                std::to_string(size - 8) + " bytes follow");
  if (headerLen > kMaxHeaderBytes)
    throw Error(path + ": the header length at byte 0 is " +
                std::to_string(headerLen) + " bytes, more than the " +
                std::to_string(kMaxHeaderBytes) + " safetensors allows");
  std::string text(reinterpret_cast<const char *>(file->data()) + 8,
                   size_t(headerLen));
  Json header = Json::parse(text, path + " (safetensors header at byte 8)");
  if (header.getKind() != Json::Kind::Object)
    throw Error(path + ": the safetensors header (at byte 8) must be a JSON "
                       "object");
  uint64_t dataStart = 8 + headerLen;
  uint64_t dataSize = size - dataStart;

  std::vector<Tensor> tensors;
  std::vector<DataRange> ranges;
  for (const auto &[name, info] : header.members()) {
    if (name == "__metadata__")
      continue;
    std::string what = path + ": tensor '" + name + "'";
    if (info.getKind() != Json::Kind::Object)
      throw Error(what + ": its header entry must be an object");
    Tensor t;
    t.storedName = name;
    t.file = file;
    const std::string &dtype = info.at("dtype", what).asString(what + " dtype");
    if (dtype == "F32")
      t.storage = Storage::F32;
    else if (dtype == "F16")
      t.storage = Storage::F16;
    else if (dtype == "BF16")
      t.storage = Storage::BF16;
    else
      throw Error(what + " has dtype '" + dtype +
                  "', which is not supported (supported: F32, F16, BF16)");
    for (const Json &d : info.at("shape", what).asArray(what + " shape")) {
      int64_t dim = d.asInt(what + " shape");
      if (dim < 0)
        throw Error(what + " has a negative dimension " + std::to_string(dim));
      t.shape.push_back(dim);
    }
    const std::vector<Json> &offsets =
        info.at("data_offsets", what).asArray(what + " data_offsets");
    if (offsets.size() != 2)
      throw Error(what + ": data_offsets must be [begin, end]");
    int64_t begin = offsets[0].asInt(what + " data_offsets");
    int64_t end = offsets[1].asInt(what + " data_offsets");
    if (begin < 0 || end < begin)
      throw Error(what + ": bad data_offsets [" + std::to_string(begin) + ", " +
                  std::to_string(end) + ")");
    if (uint64_t(end) > dataSize)
      throw Error(what + ": data_offsets [" + std::to_string(begin) + ", " +
                  std::to_string(end) + ") exceed the data section (" +
                  std::to_string(dataSize) + " bytes from byte " +
                  std::to_string(dataStart) + ")");
    int64_t elements, expected;
    try {
      elements = numElements(t.shape);
    } catch (const Error &e) {
      throw Error(what + ": " + e.what());
    }
    bool overflow =
        __builtin_mul_overflow(elements, blockBytes(t.storage), &expected);
    if (overflow || expected != end - begin)
      throw Error(what + ": data_offsets [" + std::to_string(begin) + ", " +
                  std::to_string(end) + ") hold " +
                  std::to_string(end - begin) + " bytes, but " + dtype + " " +
                  shapeText(t.shape) + " takes " +
                  (overflow ? "more than 2^63" : std::to_string(expected)));
    t.offset = dataStart + uint64_t(begin);
    t.bytes = uint64_t(end - begin);
    ranges.push_back({uint64_t(begin), uint64_t(end), name});
    tensors.push_back(std::move(t));
  }
  refuseOverlaps(std::move(ranges), path, "in the data section");
  return tensors;
}
