//===- Types.cpp - Named-axis shapes and storage dtypes -------------------===//

#include "vflow/Frontend/Types.h"
#include "vflow/Runtime/Limits.h"

#include <algorithm>
#include <cmath>

namespace vflow {

Shape::Shape(std::vector<Axis> axes)
    : axes(axes.empty()
               ? nullptr
               : std::make_shared<const std::vector<Axis>>(std::move(axes))) {}

const std::vector<Axis> &Shape::getAxes() const {
  static const std::vector<Axis> none;
  return axes ? *axes : none;
}

std::vector<Axis> &Shape::mutableAxes() {
  // Copy on write: other shapes may share these axes.
  auto copy = std::make_shared<std::vector<Axis>>(getAxes());
  std::vector<Axis> &out = *copy;
  axes = std::move(copy);
  return out;
}

const Axis *Shape::find(const std::string &name) const {
  for (const Axis &a : getAxes())
    if (a.name == name)
      return &a;
  return nullptr;
}

std::vector<std::string> Shape::names() const {
  std::vector<std::string> out;
  for (const Axis &a : getAxes())
    out.push_back(a.name);
  return out;
}

bool Shape::operator==(const Shape &o) const {
  if (axes == o.axes)
    return true;
  const std::vector<Axis> &mine = getAxes();
  if (mine.size() != o.getAxes().size())
    return false;
  for (const Axis &a : mine) {
    const Axis *b = o.find(a.name);
    if (!b || b->size != a.size)
      return false;
  }
  return true;
}

std::string Shape::str() const {
  const std::vector<Axis> &all = getAxes();
  std::string out = "[";
  for (size_t i = 0; i < all.size(); ++i) {
    if (i)
      out += ", ";
    out += all[i].name + ":" + formatAxisSize(all[i].size);
  }
  return out + "]";
}

void Shape::insert(Axis axis, const std::vector<std::string> &order) {
  auto rank = [&](const std::string &name) {
    auto it = std::find(order.begin(), order.end(), name);
    return it == order.end() ? order.size() : size_t(it - order.begin());
  };
  insert(std::move(axis), rank);
}

void Shape::insert(Axis axis,
                   const std::function<size_t(const std::string &)> &rank) {
  size_t r = rank(axis.name);
  std::vector<Axis> &all = mutableAxes();
  auto pos = std::find_if(all.begin(), all.end(),
                          [&](const Axis &a) { return rank(a.name) > r; });
  all.insert(pos, std::move(axis));
}

void Shape::remove(const std::string &name) {
  if (!find(name))
    return;
  std::vector<Axis> &all = mutableAxes();
  all.erase(std::remove_if(all.begin(), all.end(),
                           [&](const Axis &a) { return a.name == name; }),
            all.end());
}

std::string intRangeRule() {
  return "an int must be between -2^53 and 2^53 (" +
         std::to_string(limits::kMaxExactInt) + ")";
}

std::string parseIntValue(const std::string &text, int64_t &value) {
  size_t i = 0;
  bool negative = false;
  if (i < text.size() && (text[i] == '+' || text[i] == '-'))
    negative = text[i++] == '-';
  if (i == text.size())
    return "expected an integer";
  int64_t magnitude = 0;
  bool tooLarge = false;
  for (; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9')
      return "expected an integer";
    // Stops growing past the limit, so that any number of digits is fine.
    if (!tooLarge) {
      magnitude = magnitude * 10 + (text[i] - '0');
      tooLarge = magnitude > limits::kMaxExactInt;
    }
  }
  if (tooLarge)
    return "out of range: " + intRangeRule();
  value = negative ? -magnitude : magnitude;
  return "";
}

bool isExactInt(double value) {
  return value == std::floor(value) &&
         std::abs(value) <= double(limits::kMaxExactInt);
}

} // namespace vflow
