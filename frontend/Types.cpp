//===- Types.cpp - Named-axis shapes and storage dtypes -------------------===//

#include "vflow/Frontend/Types.h"

#include <algorithm>

namespace vflow {

std::string formatAxisSize(int64_t size) {
  switch (size) {
  case kSizeBlocks:
    return "N";
  case kSizeGroup:
    return "G";
  case kSizeHeadDim:
    return "D";
  default:
    return std::to_string(size);
  }
}

const Axis *Shape::find(const std::string &name) const {
  for (const Axis &a : axes)
    if (a.name == name)
      return &a;
  return nullptr;
}

std::vector<std::string> Shape::names() const {
  std::vector<std::string> out;
  for (const Axis &a : axes)
    out.push_back(a.name);
  return out;
}

bool Shape::operator==(const Shape &o) const {
  if (axes.size() != o.axes.size())
    return false;
  for (const Axis &a : axes) {
    const Axis *b = o.find(a.name);
    if (!b || b->size != a.size)
      return false;
  }
  return true;
}

std::string Shape::str() const {
  std::string out = "[";
  for (size_t i = 0; i < axes.size(); ++i) {
    if (i)
      out += ", ";
    out += axes[i].name + ":" + formatAxisSize(axes[i].size);
  }
  return out + "]";
}

void Shape::insert(Axis axis, const std::vector<std::string> &order) {
  auto rank = [&](const std::string &name) {
    auto it = std::find(order.begin(), order.end(), name);
    return it == order.end() ? order.size() : size_t(it - order.begin());
  };
  size_t r = rank(axis.name);
  auto pos = std::find_if(axes.begin(), axes.end(),
                          [&](const Axis &a) { return rank(a.name) > r; });
  axes.insert(pos, std::move(axis));
}

void Shape::remove(const std::string &name) {
  axes.erase(std::remove_if(axes.begin(), axes.end(),
                            [&](const Axis &a) { return a.name == name; }),
             axes.end());
}

std::optional<DType> parseDType(const std::string &name) {
  if (name == "f32")
    return DType::F32;
  if (name == "bf16")
    return DType::BF16;
  if (name == "f16")
    return DType::F16;
  if (name == "fp8e4m3")
    return DType::FP8E4M3;
  if (name == "fp8e5m2")
    return DType::FP8E5M2;
  return std::nullopt;
}

const char *dtypeName(DType dtype) {
  switch (dtype) {
  case DType::F32:
    return "f32";
  case DType::BF16:
    return "bf16";
  case DType::F16:
    return "f16";
  case DType::FP8E4M3:
    return "fp8e4m3";
  case DType::FP8E5M2:
    return "fp8e5m2";
  }
  return "f32";
}

} // namespace vflow
