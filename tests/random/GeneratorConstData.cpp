//===- GeneratorConstData.cpp - Constant tensors and .npy files -----------===//
//
// The generators of const declarations (rademacher, gaussian, tensor
// literals of nested lists, and load of a .npy file made here in one of
// several dtypes and orders), and the compile-time numbers of tensor
// literals and conv weights.
//
//===----------------------------------------------------------------------===//

#include "GeneratorImpl.h"

#include <cmath>
#include <functional>

using namespace vflow::testing;
using namespace vflow::testing::generator;

namespace {

/// Builds the bytes of a .npy file of `shape` whose values in C order are
/// `values`, stored as `descr` ('<f4', '<f8', '<i4' or '|b1'), in Fortran
/// order if asked.
std::string makeNpy(const std::string &descr, bool fortran,
                    const std::vector<int64_t> &shape,
                    const std::vector<double> &values) {
  std::string dict = "{'descr': '" + descr +
                     "', 'fortran_order': " + (fortran ? "True" : "False") +
                     ", 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i)
    dict += std::to_string(shape[i]) + (shape.size() == 1 ? "," : "") +
            (i + 1 < shape.size() ? ", " : "");
  dict += "), }";
  size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  out += dict;
  // The order in which the file stores the elements.
  std::vector<int64_t> order(values.size());
  if (!fortran || shape.size() < 2) {
    for (size_t i = 0; i < order.size(); ++i)
      order[i] = static_cast<int64_t>(i);
  } else {
    std::vector<int64_t> idx(shape.size(), 0), strides(shape.size(), 1);
    for (size_t d = shape.size() - 1; d-- > 0;)
      strides[d] = strides[d + 1] * shape[d + 1];
    for (size_t i = 0; i < order.size(); ++i) {
      int64_t off = 0;
      for (size_t d = 0; d < shape.size(); ++d)
        off += idx[d] * strides[d];
      order[i] = off;
      for (size_t d = 0; d < shape.size(); ++d) { // First index fastest.
        if (++idx[d] < shape[d])
          break;
        idx[d] = 0;
      }
    }
  }
  auto put = [&](const void *p, size_t n) {
    out.append(static_cast<const char *>(p), n); // Little-endian host.
  };
  for (int64_t i : order) {
    double v = values[i];
    if (descr == "<f4") {
      float f = static_cast<float>(v);
      put(&f, 4);
    } else if (descr == "<f8") {
      put(&v, 8);
    } else if (descr == "<i4") {
      int32_t x = static_cast<int32_t>(v);
      put(&x, 4);
    } else {
      out += static_cast<char>(v != 0);
    }
  }
  return out;
}

} // namespace

/// rademacher, gaussian, tensor or load over the generator-made axes of `s`
/// (possibly with one more axis that is reduced away).
Val Generator::constGenerator(const Shape &s) {
  Shape g;
  for (const Axis &a : s.axes) {
    const AxisDef *d = def(a.name);
    if (a.name == "dim" || d->kind == AxisDef::Declared)
      g.add(a);
  }
  if (rng.chance(0.2)) {
    std::vector<std::string> more = {"dim"};
    for (const AxisDef &a : axes)
      if (a.kind == AxisDef::Declared)
        more.push_back(a.name);
    const std::string &n = rng.pick(more);
    Shape t = g;
    t.add(axis(n));
    if (elements(t) <= 64)
      g = t;
  }
  if (g.empty())
    g.add(axis("dim"));
  std::vector<std::string> listed;
  for (const Axis &a : g.axes)
    listed.push_back(a.name);
  rng.shuffle(listed);
  std::string list = "[";
  for (size_t i = 0; i < listed.size(); ++i)
    list += (i ? ", " : "") + listed[i];
  list += "]";
  bool isStatic = true;
  for (const Axis &a : g.axes)
    isStatic &= a.size > 0;
  Val v;
  v.shape = g;
  int kind = rng.range(0, 3);
  if (!isStatic || elements(g) > 64)
    kind = rng.range(0, 1);
  if (kind == 3 && !opt.allowLoad)
    kind = 2;
  if (kind <= 1) {
    v.text = std::string(kind == 0 ? "rademacher(" : "gaussian(") + list;
    v.mag = kind == 0 ? 1 : 4;
    if (rng.chance(0.75)) {
      int seed = rng.range(0, 1000);
      std::string seedText = std::to_string(seed);
      for (ParamDef &p : params)
        if (p.type == 'i' && !p.reserved && p.value >= 0 && rng.chance(0.15)) {
          seedText = p.name + " + " + seedText;
          p.compileTime = true;
          break;
        }
      if (rng.chance(0.1))
        seedText = "4294967295";
      v.text += ", seed = " + seedText;
    }
    v.text += ")";
    return v;
  }
  std::vector<int64_t> sizes;
  for (const std::string &n : listed)
    sizes.push_back(g.find(n)->size);
  std::vector<double> values(static_cast<size_t>(elements(g)));
  if (kind == 2) {
    // tensor([axes], nested lists) in the listed order.
    v.mag = 0;
    std::vector<std::string> entries;
    for (double &x : values) {
      entries.push_back(compileTimeNumber(x));
      v.mag = std::max(v.mag, std::fabs(x));
    }
    size_t next = 0;
    std::function<std::string(size_t)> nest = [&](size_t depth) {
      std::string out = "[";
      for (int64_t i = 0; i < sizes[depth]; ++i) {
        out += i ? ", " : "";
        out += depth + 1 == sizes.size() ? entries[next++] : nest(depth + 1);
      }
      return out + "]";
    };
    v.text = "tensor(" + list + ", " + nest(0) + ")";
    return v;
  }
  // load("cN.npy", [axes]).
  static const char *const descrs[] = {"<f4", "<f8", "<i4", "|b1"};
  std::string descr = descrs[rng.range(0, 3)];
  v.mag = 0;
  for (double &x : values) {
    x = descr == "|b1"   ? rng.range(0, 1)
        : descr == "<i4" ? rng.range(-3, 3)
                         : std::round((rng.uniform() * 4 - 2) * 64) / 64;
    v.mag = std::max(v.mag, std::fabs(x));
  }
  std::string file = fresh("data") + ".npy";
  files.push_back({file, makeNpy(descr, rng.chance(0.4), sizes, values)});
  v.text = "load(\"" + file + "\", " + list + ")";
  return v;
}

/// A compile-time number for a tensor literal or conv weight: a literal, a
/// param or a little arithmetic on them. Params used become compile-time.
std::string Generator::compileTimeNumber(double &value) {
  int kind = rng.range(0, 9);
  if (kind == 0)
    for (ParamDef &p : params)
      if (!p.reserved && p.type != 'b' && rng.chance(0.5)) {
        p.compileTime = true;
        value = p.value;
        return p.name;
      }
  if (kind == 1) {
    value = 0.5;
    return "1 / 2";
  }
  int n = rng.range(-8, 8);
  value = n / 4.0;
  return formatNumber(value);
}
