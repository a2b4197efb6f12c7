//===- ProgramGenerator.cpp - Random well-typed .vflow programs -----------===//
//
// Expressions are generated top-down against a required shape: gen(S) returns
// an expression whose axes are exactly S. Leaves are the values a stage sees
// (inputs, fields, states, consts, params, earlier lets); a leaf with axes
// outside S is reduced over them, and axes of S that a leaf lacks come from
// another operand, broadcast by name. Axes made by rename (twins) and split
// are derived from their base axis when no leaf has them. Every value
// carries a rough bound of its magnitude; values that could grow past it are
// squashed (tanh, clamp, scaling), and exp, log, sqrt, pow, division and
// normalize get arguments in their safe range.
//
//===----------------------------------------------------------------------===//

#include "ProgramGenerator.h"

#include "vflow/Runtime/Limits.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <set>
#include <stdexcept>

using namespace vflow::testing;

namespace {

/// Symbolic sizes, as the checker has them.
constexpr int64_t kSizeN = -1, kSizeG = -2, kSizeD = -3;
/// Sizes assumed for symbolic axes when bounding element counts and sums.
constexpr int64_t kAssumedBlocks = 12, kAssumedGroup = 4;
/// No intermediate value is made larger than this many elements.
constexpr double kMaxElements = 4096;
/// Magnitude bounds: any value, fields, states, consts.
constexpr double kMagLimit = 1000, kFieldLimit = 200, kStateLimit = 50,
                 kConstLimit = 20;

/// SplitMix64: the same sequence on every platform and standard library.
class Rng {
public:
  explicit Rng(uint64_t seed) : state(seed) {}
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi].
  int range(int lo, int hi) {
    return lo + static_cast<int>(next() % uint64_t(hi - lo + 1));
  }
  double real() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
  bool chance(double p) { return real() < p; }
  template <typename T> const T &pick(const std::vector<T> &v) {
    return v[next() % v.size()];
  }
  size_t weighted(const std::vector<double> &w) {
    double total = 0;
    for (double x : w)
      total += x;
    double r = real() * total;
    for (size_t i = 0; i < w.size(); ++i) {
      if (w[i] > 0 && r < w[i])
        return i;
      r -= w[i];
    }
    for (size_t i = w.size(); i-- > 0;)
      if (w[i] > 0)
        return i;
    return 0;
  }
  template <typename T> void shuffle(std::vector<T> &v) {
    for (size_t i = v.size(); i > 1; --i)
      std::swap(v[i - 1], v[next() % i]);
  }

private:
  uint64_t state;
};

struct Axis {
  std::string name;
  int64_t size;
};

/// A set of named axes (the order is irrelevant, as in the language).
struct Shape {
  std::vector<Axis> axes;

  const Axis *find(const std::string &n) const {
    for (const Axis &a : axes)
      if (a.name == n)
        return &a;
    return nullptr;
  }
  bool has(const std::string &n) const { return find(n) != nullptr; }
  void add(const Axis &a) {
    if (!has(a.name))
      axes.push_back(a);
  }
  void remove(const std::string &n) {
    axes.erase(std::remove_if(axes.begin(), axes.end(),
                              [&](const Axis &a) { return a.name == n; }),
               axes.end());
  }
  bool empty() const { return axes.empty(); }
  bool sameAs(const Shape &o) const {
    if (o.axes.size() != axes.size())
      return false;
    for (const Axis &a : axes) {
      const Axis *b = o.find(a.name);
      if (!b || b->size != a.size)
        return false;
    }
    return true;
  }
};

/// An expression, its axes and a rough bound of its magnitude.
struct Val {
  std::string text;
  Shape shape;
  double mag = 1;
};

enum class Stage { Const, Cache, Index };

/// An axis the program may use. Twins are made by rename, split axes by
/// split; both from their base axis.
struct AxisDef {
  enum Kind { Builtin, Declared, Twin, Split };
  std::string name;
  int64_t size;
  Kind kind;
  std::string base;
  int64_t factor = 0;
};

/// A value a stage can read.
struct Leaf {
  Val val;
  double weight = 1;
  std::string field; ///< Cache field it reads (index stage), or empty.
  std::string param; ///< Param it is, or empty.
};

struct ParamDef {
  std::string name;
  double value;
  char type; ///< 'i', 'f' or 'b'.
  bool compileTime = false;
  bool reserved = false;
  /// Bound of the value after a run-time override.
  double mag;
};

struct FieldDef {
  std::string name;
  Shape shape; ///< Without `block`.
  double mag;
};

struct StateDef {
  std::string name;
  Shape shape;
};

struct Literal {
  const char *text;
  double value;
};

const std::vector<Literal> kLiterals = {
    {"0.5", 0.5},   {".25", 0.25}, {"2", 2},        {"1.5", 1.5},
    {"1e-3", 1e-3}, {"3", 3},      {"0.125", .125}, {"2.5E-1", 0.25},
    {"1", 1},       {"4", 4},      {"0.75", 0.75},  {"1E1", 10}};

const char *const kDTypes[] = {"f32", "bf16", "f16", "fp8e4m3", "fp8e5m2"};

std::string formatNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", std::fabs(v));
  std::string s = buf;
  return v < 0 ? "(-" + s + ")" : s;
}

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

class Generator {
public:
  explicit Generator(const GeneratorOptions &options)
      : opt(options), rng(options.seed * 0x2545f4914f6cdd1dull + 0x1234567) {}

  GeneratedProgram run();

private:
  // Declarations.
  void makeParams();
  void makeAxes();
  void makeConsts();
  void makeCache();
  void makeStates();
  void makeIndex();

  // Axes.
  const AxisDef *def(const std::string &name) const;
  int64_t estimate(int64_t size) const;
  double elements(const Shape &s) const;
  /// Whether the checker's size model (limits::kMaxElements with G and D at
  /// their largest) accepts a value of shape `s`.
  bool fitsWorstCase(const Shape &s) const;
  Axis axis(const std::string &name) const;
  bool sourcedDirect(const std::string &name) const;
  bool derivable(const AxisDef &d) const;
  bool sourced(const std::string &name) const;
  std::vector<std::string> usableAxes() const;
  Shape randomShape(double blockChance, size_t maxAxes, bool allowToken,
                    bool allowBlock);
  std::string splitAxisFor(const std::string &base, int64_t factor);

  // Expressions.
  Val gen(const Shape &s, int depth);
  Val genRaw(const Shape &s, int depth);
  Val derive(const Shape &s, int depth);
  Val leafish(const Shape &s, int depth);
  Val fromLeaf(const Leaf &leaf, const Shape &s);
  Val constGenerator(const Shape &s);
  Val literal();
  Val reduce(Val v, std::vector<std::string> axes);
  Val bound(Val v, double limit);
  Val positive(Val v);
  Val unary(const Shape &s, int depth);
  Val binary(const Shape &s, int depth);
  Val compare(const Shape &s, int depth);
  Val maxMin(const Shape &s, int depth);
  Val power(const Shape &s, int depth);
  Val clampOf(const Shape &s, int depth);
  Val whereOf(const Shape &s, int depth);
  Val reduction(const Shape &s, int depth);
  Val blockOp(const Shape &s, int depth);
  const AxisDef *peerFor(const Shape &s, std::string &to);
  Val renamePeer(const Shape &s, int depth);
  Val splitAway(Val v, const std::string &axis, int64_t factor,
                const std::string &outer);
  Val kthLargest(const Shape &s, int depth);
  std::vector<Shape> partition(const Shape &s, int parts);
  std::string combine(const Val &a, const Val &b, double &mag);
  std::string budget(int depth);
  std::string compileTimeNumber(double &value);

  // The index stage's selection.
  std::string selection(int depth, std::vector<std::string> &lines);
  std::string scoreName(std::vector<std::string> &lines, bool forceLet);

  std::string fresh(const char *prefix) {
    return prefix + std::to_string(counter++);
  }

  const GeneratorOptions &opt;
  Rng rng;
  int counter = 0;
  int64_t blockSize = 16, headDim = 8, group = 1;
  bool staticDim = false;
  Stage stage = Stage::Const;

  /// A deque: AxisDef pointers stay valid while split axes are added.
  std::deque<AxisDef> axes;
  std::vector<ParamDef> params;
  std::vector<FieldDef> fields;
  std::vector<StateDef> states;
  std::vector<Leaf> leaves;
  std::set<std::string> fieldsRead;
  std::vector<std::pair<std::string, std::string>> files;
  /// Twins and split axes made while checking consts: states may use them.
  std::set<std::string> madeInConsts;
  /// A [block] let the selection must use as its first score.
  std::string pendingScore;

  std::vector<std::string> paramLines, axisLines, constLines, stateLines,
      cacheDecls, indexLines;
};

//===----------------------------------------------------------------------===//
// Axes
//===----------------------------------------------------------------------===//

const AxisDef *Generator::def(const std::string &name) const {
  for (const AxisDef &a : axes)
    if (a.name == name)
      return &a;
  return nullptr;
}

int64_t Generator::estimate(int64_t size) const {
  switch (size) {
  case kSizeN:
    return kAssumedBlocks;
  case kSizeG:
    return kAssumedGroup;
  case kSizeD:
    return headDim;
  default:
    return size;
  }
}

double Generator::elements(const Shape &s) const {
  double n = 1;
  for (const Axis &a : s.axes)
    n *= double(estimate(a.size));
  return n;
}

bool Generator::fitsWorstCase(const Shape &s) const {
  // The checker's size model: G and D at their largest, N not counted.
  double n = 1;
  for (const Axis &a : s.axes)
    n *= a.size == kSizeN   ? 1.0
         : a.size == kSizeG ? double(vflow::limits::kMaxGroup)
         : a.size == kSizeD ? double(vflow::limits::kMaxHeadDim)
                            : double(a.size);
  return n <= double(vflow::limits::kMaxElements);
}

Axis Generator::axis(const std::string &name) const {
  const AxisDef *d = def(name);
  if (!d)
    throw std::logic_error("generator: unknown axis " + name);
  return {name, d->size};
}

bool Generator::sourcedDirect(const std::string &name) const {
  const AxisDef *d = def(name);
  if (stage == Stage::Const && d &&
      (name == "dim" || d->kind == AxisDef::Declared))
    return true; // Generators make them.
  for (const Leaf &l : leaves)
    if (l.val.shape.has(name))
      return true;
  return false;
}

bool Generator::derivable(const AxisDef &d) const {
  if (d.kind == AxisDef::Twin)
    return opt.allowRename && sourcedDirect(d.base);
  if (d.kind == AxisDef::Split)
    return opt.allowSplit && sourcedDirect(d.base);
  return false;
}

bool Generator::sourced(const std::string &name) const {
  const AxisDef *d = def(name);
  return d && (sourcedDirect(name) || derivable(*d));
}

/// Axes a value of the current stage may have.
std::vector<std::string> Generator::usableAxes() const {
  std::vector<std::string> out;
  for (const AxisDef &a : axes) {
    std::string root =
        a.kind == AxisDef::Twin || a.kind == AxisDef::Split ? a.base : a.name;
    bool allowed = stage == Stage::Const   ? root != "token"
                   : stage == Stage::Cache ? true
                                           : root != "token";
    if (stage != Stage::Index && (root == "block" || root == "head"))
      allowed = false;
    if ((allowed && sourced(a.name)) || sourcedDirect(a.name))
      out.push_back(a.name);
  }
  return out;
}

/// A random set of usable axes of at most `maxAxes` axes and kMaxElements
/// elements.
Shape Generator::randomShape(double blockChance, size_t maxAxes,
                             bool allowToken, bool allowBlock) {
  Shape s;
  std::vector<std::string> names = usableAxes();
  rng.shuffle(names);
  if (allowBlock && stage == Stage::Index && rng.chance(blockChance))
    s.add(axis("block"));
  for (const std::string &n : names) {
    if (s.axes.size() >= maxAxes)
      break;
    if (n == "block" || (!allowToken && n == "token"))
      continue;
    if (!allowToken) {
      const AxisDef *d = def(n);
      if (d->base == "token" && !sourcedDirect(n))
        continue;
    }
    double p = n == "token" ? 0.6 : n == "head" ? 0.35 : 0.25;
    Shape t = s;
    t.add(axis(n));
    if (rng.chance(p) && elements(t) <= kMaxElements / 4 && fitsWorstCase(t))
      s = t;
  }
  return s;
}

/// The split axis that cuts `base` into `factor` parts, made on first use.
std::string Generator::splitAxisFor(const std::string &base, int64_t factor) {
  for (const AxisDef &a : axes)
    if (a.kind == AxisDef::Split && a.base == base && a.factor == factor)
      return a.name;
  std::string name = fresh("s");
  axes.push_back({name, factor, AxisDef::Split, base, factor});
  return name;
}

//===----------------------------------------------------------------------===//
// Expressions
//===----------------------------------------------------------------------===//

Val Generator::literal() {
  const Literal &l = rng.pick(kLiterals);
  Val v;
  v.text = l.text;
  v.mag = l.value;
  if (rng.chance(0.15)) {
    v.text = "(-" + v.text + ")";
  }
  return v;
}

/// Squashes a value whose bound exceeds `limit`.
Val Generator::bound(Val v, double limit) {
  if (v.mag <= limit)
    return v;
  switch (rng.range(0, 3)) {
  case 0:
    v.text = "tanh(" + v.text + ")";
    v.mag = 1;
    break;
  case 1: {
    double l = std::min(limit, double(rng.pick(std::vector<int>{1, 4, 10})));
    v.text = "clamp(" + v.text + ", -" + formatNumber(l) + ", " +
             formatNumber(l) + ")";
    v.mag = l;
    break;
  }
  default: {
    double m = std::pow(10.0, std::ceil(std::log10(v.mag / limit)) + 1);
    v.text = "(" + v.text +
             (rng.chance(0.5) ? " / " + formatNumber(m)
                              : " * " + formatNumber(1 / m)) +
             ")";
    v.mag /= m;
    break;
  }
  }
  return v;
}

/// A value of the same axes that is >= 0.5 (for log, pow, normalize).
Val Generator::positive(Val v) {
  switch (rng.range(0, 3)) {
  case 0:
    v.text = "(abs(" + v.text + ") + 1)";
    v.mag += 1;
    break;
  case 1:
    v.text = "(sigmoid(" + v.text + ") + 0.5)";
    v.mag = 1.5;
    break;
  case 2:
    v.text = "(relu(" + v.text + ") + 0.5)";
    v.mag += 0.5;
    break;
  default:
    v.text = "(" + v.text + " * " + v.text + " + 0.5)";
    v.mag = v.mag * v.mag + 0.5;
    break;
  }
  return v;
}

Val Generator::reduce(Val v, std::vector<std::string> names) {
  static const char *const kinds[] = {"sum", "mean", "max", "min", "l2norm"};
  while (!names.empty()) {
    rng.shuffle(names);
    size_t take = names.size() == 1 || rng.chance(0.6)
                      ? names.size()
                      : static_cast<size_t>(rng.range(1, names.size() - 1));
    std::string kind = kinds[rng.range(0, 4)];
    double count = 1;
    std::string text = kind + "(" + v.text;
    for (size_t i = 0; i < take; ++i) {
      const Axis *a = v.shape.find(names[i]);
      count *= double(estimate(a->size));
      text += ", " + names[i];
      v.shape.remove(names[i]);
    }
    v.text = text + ")";
    if (kind == "sum")
      v.mag *= count;
    else if (kind == "l2norm")
      v.mag *= std::sqrt(count);
    names.erase(names.begin(), names.begin() + take);
  }
  return v;
}

/// Splits the axes of `s` among `parts` operands; each axis goes to at least
/// one of them.
std::vector<Shape> Generator::partition(const Shape &s, int parts) {
  std::vector<Shape> out(parts);
  for (const Axis &a : s.axes) {
    int mask = rng.range(1, (1 << parts) - 1);
    for (int i = 0; i < parts; ++i)
      if (mask & (1 << i))
        out[i].add(a);
  }
  return out;
}

/// a op b for + - * with the bound of the result.
std::string Generator::combine(const Val &a, const Val &b, double &mag) {
  int op = rng.range(0, 2);
  if (op == 2 && a.mag * b.mag > kMagLimit)
    op = 0;
  mag = op == 2 ? a.mag * b.mag : a.mag + b.mag;
  static const char *const ops[] = {" + ", " - ", " * "};
  return "(" + a.text + ops[op] + b.text + ")";
}

Val Generator::gen(const Shape &s, int depth) {
  Val v = bound(genRaw(s, depth), kMagLimit);
  if (!v.shape.sameAs(s))
    throw std::logic_error("generator: made the wrong shape for " + v.text);
  return v;
}

Val Generator::genRaw(const Shape &s, int depth) {
  for (const Axis &a : s.axes) {
    const AxisDef *d = def(a.name);
    if ((d->kind == AxisDef::Twin || d->kind == AxisDef::Split) &&
        !s.has(d->base) && derivable(*d) &&
        (!sourcedDirect(a.name) || rng.chance(0.25)))
      return derive(s, depth);
  }
  if (depth <= 0)
    return leafish(s, depth);
  bool index = stage == Stage::Index;
  bool blockOk = index && s.has("block");
  bool kthOk = index && !s.has("block") && sourced("block");
  std::string peerTo;
  bool peerOk = opt.allowRename && peerFor(s, peerTo);
  std::vector<double> w = {2,
                           3,
                           4,
                           1,
                           1.5,
                           0.7,
                           0.8,
                           0.8,
                           2.5,
                           blockOk ? 2.0 : 0,
                           kthOk ? 0.6 : 0,
                           peerOk ? 0.8 : 0};
  switch (rng.weighted(w)) {
  case 0:
    return leafish(s, depth);
  case 1:
    return unary(s, depth);
  case 2:
    return binary(s, depth);
  case 3:
    return compare(s, depth);
  case 4:
    return maxMin(s, depth);
  case 5:
    return power(s, depth);
  case 6:
    return clampOf(s, depth);
  case 7:
    return whereOf(s, depth);
  case 8:
    return reduction(s, depth);
  case 9:
    return blockOp(s, depth);
  case 10:
    return kthLargest(s, depth);
  default:
    return renamePeer(s, depth);
  }
}

/// An axis of `s` (returned in `to`) and another axis of the same size that
/// `s` lacks: dim of a fixed size and declared axes.
const AxisDef *Generator::peerFor(const Shape &s, std::string &to) {
  for (const Axis &a : s.axes) {
    const AxisDef *d = def(a.name);
    if (d->kind != AxisDef::Declared && !(a.name == "dim" && a.size > 0))
      continue;
    for (const AxisDef &p : axes)
      if (p.name != a.name && p.size == a.size && !s.has(p.name) &&
          (p.kind == AxisDef::Declared || (p.name == "dim" && p.size > 0)) &&
          sourcedDirect(p.name)) {
        to = a.name;
        return &p;
      }
  }
  return nullptr;
}

/// rename(x, a -> b) where a and b are both axes of the flow of one size.
Val Generator::renamePeer(const Shape &s, int depth) {
  std::string to;
  const AxisDef *from = peerFor(s, to);
  Shape t = s;
  t.remove(to);
  t.add(axis(from->name));
  Val v = gen(t, depth - 1);
  v.text = "rename(" + v.text + ", " + from->name + " -> " + to + ")";
  v.shape = s;
  return v;
}

/// Reduces `axis` of `v` by splitting it and reducing both parts.
Val Generator::splitAway(Val v, const std::string &name, int64_t f,
                         const std::string &outer) {
  const Axis *a = v.shape.find(name);
  Val cut = v;
  cut.text = "split(" + v.text + ", " + name + ", " + outer + " = " +
             std::to_string(f) + ")";
  cut.shape.remove(name);
  cut.shape.add({name, a->size / f});
  cut.shape.add(axis(outer));
  return reduce(cut, {name, outer});
}

/// Makes the derived axes of `s` (twins by rename, split axes by split) from
/// a value that has their base axes instead.
Val Generator::derive(const Shape &s, int depth) {
  Shape base = s;
  std::vector<const AxisDef *> twins;
  const AxisDef *split = nullptr;
  for (const Axis &a : s.axes) {
    const AxisDef *d = def(a.name);
    if (d->kind != AxisDef::Twin && d->kind != AxisDef::Split)
      continue;
    if (s.has(d->base) || !derivable(*d) || base.has(d->base))
      continue;
    if (d->kind == AxisDef::Twin && (twins.empty() || rng.chance(0.5))) {
      twins.push_back(d);
      base.remove(d->name);
      base.add(axis(d->base));
    } else if (d->kind == AxisDef::Split && !split && twins.empty()) {
      split = d;
      base.remove(d->name);
      base.add(axis(d->base));
      break;
    }
  }
  Val v = genRaw(base, depth - 1);
  if (stage == Stage::Const) {
    for (const AxisDef *d : twins)
      madeInConsts.insert(d->name);
    if (split)
      madeInConsts.insert(split->name);
  }
  if (split) {
    std::string factor = std::to_string(split->factor);
    for (ParamDef &p : params)
      if (p.type == 'i' && !p.reserved && p.value == split->factor &&
          (p.compileTime || rng.chance(0.3)) && rng.chance(0.5)) {
        factor = p.name;
        p.compileTime = true;
        break;
      }
    Val cut;
    cut.text = "split(" + v.text + ", " + split->base + ", " + split->name +
               " = " + factor + ")";
    cut.shape = v.shape;
    cut.shape.remove(split->base);
    cut.shape.add({split->base, def(split->base)->size == kSizeD
                                    ? headDim / split->factor
                                    : def(split->base)->size / split->factor});
    cut.shape.add(axis(split->name));
    cut.mag = v.mag;
    return reduce(cut, {split->base});
  }
  std::string text = "rename(" + v.text;
  for (const AxisDef *d : twins) {
    text += ", " + d->base + " -> " + d->name;
    v.shape.remove(d->base);
    v.shape.add(axis(d->name));
  }
  v.text = text + ")";
  return v;
}

/// The value of a leaf with its axes outside `s` reduced.
Val Generator::fromLeaf(const Leaf &leaf, const Shape &s) {
  if (!leaf.field.empty())
    fieldsRead.insert(leaf.field);
  if (!leaf.param.empty() && stage == Stage::Const)
    for (ParamDef &p : params)
      if (p.name == leaf.param)
        p.compileTime = true;
  Val v = leaf.val;
  std::vector<std::string> extra;
  for (const Axis &a : v.shape.axes)
    if (!s.has(a.name))
      extra.push_back(a.name);
  if (!extra.empty() && opt.allowSplit && rng.chance(0.15)) {
    // Split an axis and reduce both of its parts.
    const Axis *a = v.shape.find(extra[0]);
    const AxisDef *d = def(a->name);
    if (a->size > 2 && a->size % 2 == 0 &&
        (d->kind == AxisDef::Declared || a->name == "token" ||
         a->name == "dim")) {
      int64_t f = a->size % 4 == 0 && rng.chance(0.5) ? 4 : 2;
      std::string outer = splitAxisFor(a->name, f);
      if (!s.has(outer) && !v.shape.has(outer)) {
        v = splitAway(v, a->name, f, outer);
        extra.erase(extra.begin());
      }
    }
  }
  if (!extra.empty())
    v = reduce(v, extra);
  return v;
}

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
                         : std::round((rng.real() * 4 - 2) * 64) / 64;
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

Val Generator::leafish(const Shape &s, int depth) {
  // Candidates: leaves sharing an axis with `s` (any leaf for a scalar).
  std::vector<const Leaf *> cands;
  std::vector<double> weights;
  for (const Leaf &l : leaves) {
    int covers = 0;
    for (const Axis &a : l.val.shape.axes)
      covers += s.has(a.name);
    if (!s.empty() && covers == 0)
      continue;
    if (s.empty() && rng.chance(0.5) && !l.val.shape.empty() &&
        elements(l.val.shape) > 512)
      continue;
    cands.push_back(&l);
    weights.push_back(l.weight * (1 + covers));
  }
  bool generator = stage == Stage::Const && !s.empty();
  if (generator) {
    bool any = false;
    for (const Axis &a : s.axes)
      any |= a.name == "dim" || def(a.name)->kind == AxisDef::Declared;
    generator = any && (cands.empty() || rng.chance(0.6));
  }
  Val v;
  if (generator) {
    v = constGenerator(s);
    std::vector<std::string> extra;
    for (const Axis &a : v.shape.axes)
      if (!s.has(a.name))
        extra.push_back(a.name);
    if (!extra.empty())
      v = reduce(v, extra);
  } else if (s.empty() && (cands.empty() || rng.chance(0.3))) {
    return literal();
  } else if (!cands.empty()) {
    v = fromLeaf(*cands[rng.weighted(weights)], s);
  } else {
    // Only derived axes whose base is also wanted: make them apart.
    for (const Axis &a : s.axes) {
      const AxisDef *d = def(a.name);
      if ((d->kind == AxisDef::Twin || d->kind == AxisDef::Split) &&
          derivable(*d)) {
        Shape rest = s, one;
        rest.remove(a.name);
        one.add(a);
        Val l = gen(rest, depth - 1), r = gen(one, depth - 1);
        Val out;
        out.text = combine(l, r, out.mag);
        out.shape = s;
        return out;
      }
    }
    throw std::logic_error("generator: no source for a shape");
  }
  // Axes the leaf did not give come from another operand.
  Shape rest;
  for (const Axis &a : s.axes)
    if (!v.shape.has(a.name))
      rest.add(a);
  if (rest.empty())
    return v;
  Val w = gen(rest, depth - 1);
  Val out;
  out.text = combine(v, w, out.mag);
  out.shape = s;
  return out;
}

Val Generator::unary(const Shape &s, int depth) {
  Val a = gen(s, depth - 1);
  switch (rng.range(0, 10)) {
  case 0: { // exp of a bounded argument.
    if (a.mag > 4) {
      switch (rng.range(0, 2)) {
      case 0:
        a.text = "tanh(" + a.text + ")";
        a.mag = 1;
        break;
      case 1:
        a.text = "clamp(" + a.text + ", -3, 3)";
        a.mag = 3;
        break;
      default:
        a.text = "(-abs(" + a.text + "))";
        a.mag = 0; // exp(-|x|) <= 1.
        break;
      }
    }
    a.text = "exp(" + a.text + ")";
    a.mag = std::exp(a.mag);
    return a;
  }
  case 1: {
    Val p = positive(a);
    p.text = "log(" + p.text + ")";
    p.mag = std::max(std::log(p.mag + 1), 1.0);
    return p;
  }
  case 2:
    a.text = "sqrt(abs(" + a.text + "))";
    a.mag = std::sqrt(a.mag) + 1;
    return a;
  case 3: {
    Val p = positive(a);
    p.text = "rsqrt(" + p.text + ")";
    p.mag = 1.5;
    return p;
  }
  case 4:
    a.text = "abs(" + a.text + ")";
    return a;
  case 5:
    a.text = "relu(" + a.text + ")";
    return a;
  case 6:
    a.text = "sigmoid(" + a.text + ")";
    a.mag = 1;
    return a;
  case 7:
    a.text = "silu(" + a.text + ")";
    a.mag += 1;
    return a;
  case 8:
    a.text = "tanh(" + a.text + ")";
    a.mag = 1;
    return a;
  case 9:
    a.text = "(-" + a.text + ")";
    return a;
  default:
    a.text = "(not " + a.text + ")";
    a.mag = 1;
    return a;
  }
}

Val Generator::binary(const Shape &s, int depth) {
  std::vector<Shape> p = partition(s, 2);
  Val a = gen(p[0], depth - 1), b = gen(p[1], depth - 1);
  Val out;
  out.shape = s;
  if (rng.chance(0.25)) {
    // Division by something at least 0.5 away from zero.
    Val d = positive(b);
    out.text = "(" + a.text + " / " + d.text + ")";
    out.mag = a.mag * 2;
    return out;
  }
  if (a.mag * b.mag > kMagLimit) {
    a = bound(a, 30);
    b = bound(b, 30);
  }
  out.text = combine(a, b, out.mag);
  return out;
}

Val Generator::compare(const Shape &s, int depth) {
  static const char *const ops[] = {" < ",  " <= ", " > ",
                                    " >= ", " == ", " != "};
  auto cmp = [&](const Shape &t) {
    std::vector<Shape> p = partition(t, 2);
    Val a = gen(p[0], depth - 1), b = gen(p[1], depth - 1);
    return "(" + a.text + ops[rng.range(0, 5)] + b.text + ")";
  };
  Val out;
  out.shape = s;
  out.mag = 1;
  if (rng.chance(0.6)) {
    out.text = cmp(s);
    return out;
  }
  std::vector<Shape> p = partition(s, 2);
  std::string l = rng.chance(0.7) ? cmp(p[0]) : gen(p[0], depth - 1).text;
  std::string r = rng.chance(0.7) ? cmp(p[1]) : gen(p[1], depth - 1).text;
  out.text = "(" + l + (rng.chance(0.5) ? " and " : " or ") + r + ")";
  if (rng.chance(0.2))
    out.text = "(not " + out.text + ")";
  return out;
}

Val Generator::maxMin(const Shape &s, int depth) {
  static const char *const fns[] = {"maximum", "minimum", "max", "min"};
  std::vector<Shape> p = partition(s, 2);
  Val a = gen(p[0], depth - 1), b = gen(p[1], depth - 1);
  Val out;
  out.shape = s;
  out.mag = std::max(a.mag, b.mag);
  out.text =
      std::string(fns[rng.range(0, 3)]) + "(" + a.text + ", " + b.text + ")";
  return out;
}

Val Generator::power(const Shape &s, int depth) {
  std::vector<Shape> p = partition(s, 2);
  Val base = gen(p[0], depth - 1);
  Val out;
  out.shape = s;
  if (rng.chance(0.3)) {
    // A sigmoid base in [0, 1] and an exponent in [0, 1].
    Val e = gen(p[1], depth - 1);
    out.text = "pow(sigmoid(" + base.text + "), abs(tanh(" + e.text + ")))";
    out.mag = 1;
    return out;
  }
  base = positive(bound(base, 30));
  static const double exps[] = {0.5, 2, 1.5, -1, 3, 0.25, -0.5};
  double e = exps[rng.range(0, 6)];
  std::string et = formatNumber(e);
  if (e >= 2 && base.mag > 10)
    e = 0.5, et = "0.5";
  out.text = "pow(" + base.text + ", " + et + ")";
  // The base is >= 0.5, so a negative power is at most 2^|e|.
  out.mag = std::max(std::pow(std::max(base.mag, 2.0), std::fabs(e)), 1.0);
  if (!p[1].empty()) {
    // The exponent's axes come from a second factor.
    Val b = bound(gen(p[1], depth - 1), 10);
    out.text = "(" + out.text + " * " + b.text + ")";
    out.mag *= b.mag;
  }
  return out;
}

Val Generator::clampOf(const Shape &s, int depth) {
  Val a = gen(s, depth - 1);
  static const char *const ranges[][2] = {{"-1", "1"},   {"0", "2"},
                                          {"-3", "0.5"}, {"-inf", "4"},
                                          {"-2", "inf"}, {"(-0.5)", "0.5"}};
  int r = rng.range(0, 5);
  std::string lo = ranges[r][0], hi = ranges[r][1];
  double mag = r == 4 ? a.mag : 4;
  for (ParamDef &p : params)
    if (p.type == 'f' && !p.reserved && rng.chance(0.1)) {
      lo = "(-" + p.name + ")";
      hi = p.name;
      mag = p.mag;
      p.compileTime |= stage == Stage::Const;
    }
  a.text = "clamp(" + a.text + ", " + lo + ", " + hi + ")";
  a.mag = std::min(a.mag, mag);
  return a;
}

Val Generator::whereOf(const Shape &s, int depth) {
  std::vector<Shape> p = partition(s, 3);
  Val c = rng.chance(0.3) ? gen(p[0], depth - 1) : compare(p[0], depth - 1);
  Val a = gen(p[1], depth - 1), b = gen(p[2], depth - 1);
  Val out;
  out.shape = s;
  out.mag = std::max(a.mag, b.mag);
  out.text = "where(" + c.text + ", " + a.text + ", " + b.text + ")";
  return out;
}

Val Generator::reduction(const Shape &s, int depth) {
  std::vector<std::string> names = usableAxes();
  rng.shuffle(names);
  Shape t = s;
  std::vector<std::string> extra;
  for (const std::string &n : names) {
    if (t.has(n) || extra.size() >= 2)
      continue;
    const AxisDef *d = def(n);
    // A derived axis and its base cannot meet in one value unless a leaf
    // already has both.
    if ((d->kind == AxisDef::Twin || d->kind == AxisDef::Split) &&
        t.has(d->base) && !sourcedDirect(n))
      continue;
    Shape u = t;
    u.add(axis(n));
    if (elements(u) > kMaxElements || !fitsWorstCase(u))
      continue;
    t = u;
    extra.push_back(n);
  }
  if (extra.empty())
    return leafish(s, depth);
  return reduce(gen(t, depth - 1), extra);
}

Val Generator::blockOp(const Shape &s, int depth) {
  Val a = gen(s, depth - 1);
  switch (rng.range(0, 2)) {
  case 0: {
    std::string scale;
    double mag = 1;
    switch (rng.range(0, 3)) {
    case 0:
      break;
    case 1:
      scale = literal().text;
      break;
    case 2:
      for (const ParamDef &p : params)
        if (p.type == 'f' && !p.reserved)
          scale = p.name;
      break;
    default:
      scale = "tanh(" + gen(Shape(), depth - 1).text + ")";
      break;
    }
    (void)mag;
    a.text = "softmax(" + a.text + ", block" +
             (scale.empty() ? "" : ", scale = " + scale) + ")";
    a.mag = 1;
    return a;
  }
  case 1: {
    Val p = positive(a);
    p.text = "normalize(" + p.text + ", block)";
    p.mag = 1;
    return p;
  }
  default: {
    int n = 2 * rng.range(0, 3) + 1;
    std::string w = "[";
    double sum = 0;
    for (int i = 0; i < n; ++i) {
      double x = 0;
      w += (i ? ", " : "") + compileTimeNumber(x);
      sum += std::fabs(x);
    }
    a.text = "conv(" + a.text + ", block, " + w + "])";
    a.mag *= std::max(sum, 1.0);
    return a;
  }
  }
}

Val Generator::kthLargest(const Shape &s, int depth) {
  Shape t = s;
  t.add(axis("block"));
  Val a = gen(t, depth - 1);
  std::string k = budget(1);
  a.text = "kth_largest(" + a.text + ", " +
           (rng.chance(0.5) ? "max(1, " + k + ")" : "maximum(" + k + ", 1)") +
           ")";
  a.shape = s;
  return a;
}

/// A host-evaluable budget expression.
std::string Generator::budget(int depth) {
  auto leaf = [&]() -> std::string {
    std::vector<std::string> opts = {
        std::to_string(rng.range(1, 6)), "num_blocks", "(num_blocks / 2)",
        "(context_len / " + std::to_string(blockSize * 2) + ")"};
    // Budgets are never negative (the checker refuses one that is): no
    // leaf with a negative value, and subtractions are clamped.
    for (const ParamDef &p : params)
      if (!p.reserved && p.type != 'b' && p.value >= 0) {
        opts.push_back(p.name);
        if (p.type == 'i')
          opts.push_back(p.name);
        if (p.type == 'f')
          opts.push_back("(" + p.name + " * num_blocks)");
      }
    return rng.pick(opts);
  };
  if (depth <= 0 || rng.chance(0.35))
    return leaf();
  std::string a = budget(depth - 1), b = budget(depth - 1);
  switch (rng.range(0, 8)) {
  case 0:
    return "(" + a + " + " + b + ")";
  case 1:
    return "max(0, " + a + " - " + std::to_string(rng.range(0, 2)) + ")";
  case 2:
    return "(" + std::to_string(rng.range(1, 3)) + " * " + a + ")";
  case 3:
    return "(" + a + " / " + std::to_string(rng.range(1, 3)) + ")";
  case 4:
    return "min(" + a + ", " + b + ")";
  case 5:
    return "max(" + a + ", " + b + ")";
  case 6:
    return "minimum(" + a + ", " + b + ")";
  case 7:
    return "maximum(" + a + ", " + b + ")";
  default:
    return "(-(-" + a + "))";
  }
}

//===----------------------------------------------------------------------===//
// Declarations
//===----------------------------------------------------------------------===//

void Generator::makeParams() {
  auto add = [&](const std::string &name, double value, char type,
                 const std::string &line, double mag) {
    ParamDef p;
    p.name = name;
    p.value = value;
    p.type = type;
    p.mag = mag;
    params.push_back(p);
    paramLines.push_back(line);
  };
  paramLines.push_back("param block_size = " + std::to_string(blockSize) + ";");
  if (staticDim)
    paramLines.push_back("param head_dim = " + std::to_string(headDim) + ";");
  if (rng.chance(0.4))
    paramLines.push_back(
        "param keep_first = " + std::to_string(rng.range(0, 2)) + ";");
  if (rng.chance(0.4))
    paramLines.push_back(
        "param keep_last = " + std::to_string(rng.range(0, 2)) + ";");
  for (const char *r : {"block_size", "head_dim", "keep_first", "keep_last"}) {
    ParamDef p;
    p.name = r;
    p.reserved = true;
    p.type = 'i';
    params.push_back(p);
  }
  int nInt = rng.range(1, 2);
  for (int i = 0; i < nInt; ++i) {
    std::string name = fresh("budget");
    int v = rng.range(1, 6);
    add(name, v, 'i',
        "param " + name + (rng.chance(0.3) ? ": int" : "") + " = " +
            std::to_string(v) + ";",
        8);
  }
  if (rng.chance(0.3)) {
    std::string name = fresh("twice");
    // A param read by another param's value is baked in: compile-time.
    params.back().compileTime = true;
    add(name, params.back().value * 2, 'i',
        "param " + name + " = " + params.back().name + " * 2;", 16);
  }
  int nFloat = rng.range(0, 2);
  for (int i = 0; i < nFloat; ++i) {
    std::string name = fresh("alpha");
    int q = rng.range(1, 8);
    if (rng.chance(0.3)) {
      add(name, q, 'f',
          "param " + name + ": float = " + std::to_string(q) + ";", 12);
    } else {
      add(name, q / 8.0, 'f',
          "param " + name + " = " + formatNumber(q / 8.0) + ";", 1.5);
    }
  }
  if (nFloat > 0 && rng.chance(0.3)) {
    params.back().compileTime = true; // read by beta's value
    const ParamDef &a = params.back();
    std::string name = fresh("beta");
    add(name, 1 - a.value, 'f', "param " + name + " = 1 - " + a.name + ";",
        std::fabs(1 - a.value) + 2);
  }
  if (rng.chance(0.35)) {
    std::string name = fresh("flag");
    bool v = rng.chance(0.5);
    add(name, v, 'b',
        rng.chance(0.5) ? "param " + name + " = " + (v ? "true" : "false") + ";"
                        : "param " + name + ": bool = " + (v ? "1" : "0") + ";",
        1);
  }
}

void Generator::makeAxes() {
  axes.push_back({"block", kSizeN, AxisDef::Builtin, "", 0});
  axes.push_back({"head", kSizeG, AxisDef::Builtin, "", 0});
  axes.push_back({"token", blockSize, AxisDef::Builtin, "", 0});
  axes.push_back(
      {"dim", staticDim ? headDim : kSizeD, AxisDef::Builtin, "", 0});
  int n = opt.allowConsts ? rng.range(0, 2) : 0;
  for (int i = 0; i < n; ++i) {
    std::string name = fresh("m");
    int size = rng.range(2, 4);
    std::string sizeText = std::to_string(size);
    if (rng.chance(0.3)) {
      // Sized by a param, which becomes compile-time.
      std::string p = fresh("sketch");
      ParamDef def;
      def.name = p;
      def.value = size;
      def.type = 'i';
      def.compileTime = true;
      def.mag = size;
      params.push_back(def);
      paramLines.push_back("param " + p + " = " + sizeText + ";");
      sizeText = p;
    }
    axes.push_back({name, size, AxisDef::Declared, "", 0});
    axisLines.push_back("axis " + name + " = " + sizeText + ";");
  }
  // Twins (rename targets) and split axes.
  std::vector<std::string> bases = {"dim", "head"};
  for (const AxisDef &a : std::vector<AxisDef>(axes.begin(), axes.end()))
    if (a.kind == AxisDef::Declared)
      bases.push_back(a.name);
  for (const std::string &b : bases)
    axes.push_back({fresh(b == "dim"    ? "d"
                          : b == "head" ? "h"
                                        : "n"),
                    def(b)->size, AxisDef::Twin, b, 0});
  if (opt.allowSplit) {
    for (int f : {2, 4})
      if (blockSize % f == 0 && blockSize > f && rng.chance(0.7))
        splitAxisFor("token", f);
    if (staticDim && headDim % 2 == 0 && rng.chance(0.6))
      splitAxisFor("dim", headDim % 4 == 0 && rng.chance(0.5) ? 4 : 2);
    for (const std::string &b : bases)
      if (def(b)->kind == AxisDef::Declared && def(b)->size % 2 == 0 &&
          rng.chance(0.5))
        splitAxisFor(b, 2);
  }
}

void Generator::makeConsts() {
  stage = Stage::Const;
  leaves.clear();
  for (const ParamDef &p : params)
    if (!p.reserved) {
      Leaf l;
      l.val = {p.name, Shape(), p.mag};
      l.param = p.name;
      l.weight = 0.5;
      leaves.push_back(l);
    }
  int n = opt.allowConsts ? rng.range(0, 2) : 0;
  // Every declared axis needs a const to be usable later.
  std::vector<std::string> declared;
  for (const AxisDef &a : axes)
    if (a.kind == AxisDef::Declared)
      declared.push_back(a.name);
  if (!declared.empty())
    n = std::max<int>(n, 1);
  for (int i = 0; i < n; ++i) {
    Shape s;
    for (const std::string &d : declared)
      if (i == 0 || rng.chance(0.5))
        s.add(axis(d));
    if (rng.chance(0.6) || s.empty())
      s.add(axis("dim"));
    if (rng.chance(0.15))
      for (const AxisDef &a : axes)
        if (a.kind == AxisDef::Twin && s.has(a.base) && opt.allowRename) {
          s.add(axis(a.name));
          break;
        }
    Val v = bound(gen(s, rng.range(0, 2)), kConstLimit);
    std::string name = fresh("c");
    constLines.push_back("const " + name + " = " + v.text + ";");
    Leaf l;
    l.val = {name, v.shape, v.mag};
    leaves.push_back(l);
  }
}

void Generator::makeCache() {
  // Consts and params stay visible; K and V are [token, dim].
  stage = Stage::Cache;
  std::vector<Leaf> base;
  for (const Leaf &l : leaves)
    base.push_back(l);
  for (const char *kv : {"K", "V"}) {
    Leaf l;
    l.val.text = kv;
    l.val.shape.add(axis("token"));
    l.val.shape.add(axis("dim"));
    l.val.mag = 4;
    l.weight = 3;
    base.push_back(l);
  }
  leaves = base;
  int n = rng.range(0, opt.maxFields);
  if (n == 0 && rng.chance(0.7))
    n = std::min(1, opt.maxFields);
  int made = 0;
  while (made < n) {
    bool block = rng.chance(0.5);
    std::vector<std::string> body;
    size_t keep = leaves.size();
    int inBlock = block ? std::min(n - made, rng.range(1, 2)) : 1;
    if (block && rng.chance(0.6)) {
      int lets = rng.range(1, 2);
      for (int i = 0; i < lets; ++i) {
        Shape s = randomShape(0, 3, true, false);
        if (!s.has("token") && rng.chance(0.7))
          s.add(axis("token"));
        Val v = gen(s, rng.range(1, opt.maxExprDepth));
        std::string name = fresh("y");
        body.push_back("let " + name + " = " + v.text + ";");
        Leaf l;
        l.val = {name, v.shape, v.mag};
        l.weight = 4;
        leaves.push_back(l);
      }
    }
    for (int i = 0; i < inBlock; ++i) {
      Shape s = randomShape(0, 2, false, false);
      Val v = bound(gen(s, rng.range(1, opt.maxExprDepth)), kFieldLimit);
      std::string name = fresh("f");
      std::string dtype;
      if (rng.chance(0.75))
        dtype = std::string(": ") + kDTypes[rng.range(0, 4)];
      body.push_back(name + dtype + " = " + v.text + ";");
      fields.push_back({name, v.shape, v.mag});
      ++made;
    }
    // Lets are local to their block; fields stay readable.
    leaves.resize(keep);
    for (size_t i = fields.size() - inBlock; i < fields.size(); ++i) {
      Leaf l;
      l.val = {fields[i].name, fields[i].shape, fields[i].mag};
      l.weight = 2;
      leaves.push_back(l);
    }
    if (!block) {
      cacheDecls.push_back("cache " + body[0]);
    } else {
      std::string text = "cache {\n";
      for (const std::string &line : body)
        text += "    " + line + "\n";
      cacheDecls.push_back(text + "  }");
    }
  }
}

void Generator::makeStates() {
  int n = opt.allowStates ? rng.range(0, opt.maxStates) : 0;
  for (int i = 0; i < n; ++i) {
    Shape s;
    std::vector<std::string> cands = {"head", "dim"};
    for (const AxisDef &a : axes)
      if (a.kind == AxisDef::Declared || madeInConsts.count(a.name))
        cands.push_back(a.name);
    bool perBlock = rng.chance(0.6);
    if (perBlock)
      s.add(axis("block"));
    for (const std::string &c : cands)
      if (rng.chance(perBlock ? 0.15 : 0.35) && sourced(c))
        s.add(axis(c));
    std::string name = fresh("st");
    std::string line = "state " + name;
    if (!s.empty() || rng.chance(0.5)) {
      line += "[";
      for (size_t j = 0; j < s.axes.size(); ++j)
        line += (j ? ", " : "") + s.axes[j].name;
      line += "]";
    }
    if (rng.chance(0.6))
      line += std::string(": ") + kDTypes[rng.range(0, 4)];
    static const char *const inits[] = {"0",    "0.5",  "1",
                                        "(-1)", "0.25", "2 * 0.5"};
    line += std::string(" = ") + inits[rng.range(0, 5)] + ";";
    stateLines.push_back(line);
    states.push_back({name, s});
  }
}

/// A name bound to a [block] score: an existing let or a new one.
std::string Generator::scoreName(std::vector<std::string> &lines,
                                 bool forceLet) {
  std::vector<std::string> have;
  Shape b;
  b.add(axis("block"));
  for (const Leaf &l : leaves)
    if (l.val.shape.sameAs(b) && l.field.empty() && l.val.text[0] == 'l')
      have.push_back(l.val.text);
  if (!pendingScore.empty()) {
    std::string name = pendingScore;
    pendingScore.clear();
    return name;
  }
  if (!have.empty() && rng.chance(0.6) && !forceLet)
    return rng.pick(have);
  Val v = gen(b, rng.range(1, opt.maxExprDepth));
  std::string name = fresh("l");
  lines.push_back("let " + name + " = " + v.text + ";");
  Leaf l;
  l.val = {name, v.shape, v.mag};
  l.weight = 3;
  leaves.push_back(l);
  return name;
}

std::string Generator::selection(int depth, std::vector<std::string> &lines) {
  Shape b;
  b.add(axis("block"));
  int kind = rng.weighted({3, 1.5, 2.5, depth > 0 ? 3.0 : 0.0});
  auto score = [&]() {
    return rng.chance(0.5) || !pendingScore.empty()
               ? scoreName(lines, false)
               : gen(b, rng.range(1, opt.maxExprDepth)).text;
  };
  std::string sel;
  switch (kind) {
  case 0:
    sel = "topk(" + score() + ", " + budget(rng.range(0, 2)) + ")";
    break;
  case 1: {
    sel = "approx_topk(" + score() + ", " + budget(rng.range(0, 2));
    if (rng.chance(0.6)) {
      std::string recall =
          rng.pick(std::vector<std::string>{"0.9", "0.95", "1", "0.5", ".99"});
      for (ParamDef &p : params)
        if (p.type == 'f' && !p.reserved && p.value > 0 && p.value <= 1 &&
            rng.chance(0.3)) {
          recall = p.name;
          p.compileTime = true;
          break;
        }
      sel += ", recall = " + recall;
    }
    sel += ")";
    break;
  }
  case 2: {
    std::string s = scoreName(lines, false);
    std::string t;
    switch (rng.range(0, 6)) {
    case 0:
      t = "mean(" + s + ", block)";
      break;
    case 1: {
      std::string mu = fresh("mu"), sd = fresh("sd");
      lines.push_back("let " + mu + " = mean(" + s + ", block);");
      lines.push_back("let " + sd + " = sqrt(mean((" + s + " - " + mu +
                      ") * (" + s + " - " + mu + "), block));");
      t = "(" + mu + " + " + literal().text + " * " + sd + ")";
      break;
    }
    case 2:
      t = "(kth_largest(" + s + ", max(1, " + budget(1) + ")) / 1.1)";
      break;
    case 3:
      t = "(max(" + s + ", block) * 0.5)";
      break;
    case 4:
      t = rng.chance(0.5) ? "(-inf)" : "inf";
      break;
    default:
      t = gen(Shape(), rng.range(0, 2)).text;
      break;
    }
    sel = "threshold(" + s + ", " + t;
    if (rng.chance(0.6))
      sel += ", max = " + budget(rng.range(0, 2));
    sel += ")";
    break;
  }
  default: {
    int n = rng.range(2, 3);
    sel = "union(";
    for (int i = 0; i < n; ++i)
      sel += (i ? ", " : "") + selection(depth - 1, lines);
    sel += ")";
    break;
  }
  }
  if (rng.chance(0.3)) {
    std::string name = fresh("sel");
    lines.push_back("let " + name + " = " + sel + ";");
    return name;
  }
  return sel;
}

void Generator::makeIndex() {
  stage = Stage::Index;
  std::vector<Leaf> base;
  for (const Leaf &l : leaves)
    if (l.val.text != "K" && l.val.text != "V" &&
        !std::any_of(fields.begin(), fields.end(),
                     [&](const FieldDef &f) { return f.name == l.val.text; }))
      base.push_back(l); // Consts and params.
  auto input = [&](const char *name, std::vector<std::string> shape, double mag,
                   double weight) {
    Leaf l;
    l.val.text = name;
    for (const std::string &a : shape)
      l.val.shape.add(axis(a));
    l.val.mag = mag;
    l.weight = weight;
    base.push_back(l);
  };
  input("q", {"head", "dim"}, 4, 2);
  input("mass", {"block", "head"}, 1, 1.5);
  input("position", {"block"}, 16, 1);
  input("num_blocks", {}, 16, 0.3);
  input("context_len", {}, double(17 * blockSize), 0.2);
  input("step", {}, 4, 0.3);
  if (opt.allowIndexKV && rng.chance(0.3)) {
    input("K", {"block", "token", "dim"}, 4, 0.4);
    input("V", {"block", "token", "dim"}, 4, 0.4);
  }
  for (const FieldDef &f : fields) {
    Leaf l;
    l.val = {f.name, f.shape, f.mag};
    l.val.shape.add(axis("block"));
    l.field = f.name;
    l.weight = 4;
    base.push_back(l);
  }
  if (rng.chance(0.2))
    input("block_size", {}, double(blockSize), 0.3);
  leaves = base;
  // States are declared against the index stage's inputs.
  makeStates();
  for (const StateDef &s : states) {
    Leaf l;
    l.val = {s.name, s.shape, kStateLimit};
    l.weight = 3;
    leaves.push_back(l);
  }

  std::vector<std::string> &lines = indexLines;
  int nLets = rng.range(1, std::max(1, opt.maxLets));
  std::vector<int> storeAt;
  for (size_t i = 0; i < states.size(); ++i)
    storeAt.push_back(rng.range(0, nLets));
  for (int i = 0; i <= nLets; ++i) {
    for (size_t j = 0; j < states.size(); ++j) {
      if (storeAt[j] != i)
        continue;
      const StateDef &st = states[j];
      Val v = gen(st.shape, rng.range(1, opt.maxExprDepth));
      if (rng.chance(0.5)) {
        std::string c = rng.pick(std::vector<std::string>{"0.5", "0.9", ".75"});
        double cmag = 0.9;
        for (const ParamDef &p : params)
          if (p.type == 'f' && !p.reserved && rng.chance(0.3)) {
            c = p.name;
            cmag = p.mag;
          }
        v.text = "(" + st.name + " * " + c + " + " + v.text + ")";
        v.mag += kStateLimit * cmag;
      }
      if (v.mag > kStateLimit) {
        v.text = "clamp(" + v.text + ", -50, 50)";
        v.mag = kStateLimit;
      }
      lines.push_back(st.name + " = " + v.text + ";");
    }
    if (i == nLets)
      break;
    Shape s = randomShape(0.75, 3, false, true);
    Val v = gen(s, rng.range(1, opt.maxExprDepth));
    std::string name = fresh("l");
    lines.push_back("let " + name + " = " + v.text + ";");
    Leaf l;
    l.val = {name, v.shape, v.mag};
    l.weight = 3;
    leaves.push_back(l);
  }
  // Make sure every field is read (an unread one is only a warning).
  std::string unread;
  for (const FieldDef &f : fields) {
    if (fieldsRead.count(f.name))
      continue;
    Val v;
    v.text = f.name;
    v.shape = f.shape;
    v.shape.add(axis("block"));
    std::vector<std::string> extra;
    for (const Axis &a : f.shape.axes)
      extra.push_back(a.name);
    if (!extra.empty())
      v = reduce(v, extra);
    unread += (unread.empty() ? "" : " + ") + ("tanh(" + v.text + ")");
    fieldsRead.insert(f.name);
  }
  if (!unread.empty()) {
    std::string name = fresh("l");
    lines.push_back("let " + name + " = " + unread + ";");
    Leaf l;
    l.val.text = name;
    l.val.shape.add(axis("block"));
    l.val.mag = double(fields.size());
    l.weight = 3;
    leaves.push_back(l);
    // The first score of the selection reads it.
    pendingScore = name;
  }
  std::string sel = selection(rng.chance(0.35) ? 2 : 1, lines);
  lines.push_back("return " + sel + ";");
}

GeneratedProgram Generator::run() {
  static const int blockSizes[] = {4, 8, 16};
  blockSize = blockSizes[rng.range(0, 2)];
  if (opt.blockSize > 0)
    blockSize = opt.blockSize;
  staticDim = rng.chance(0.4);
  if (staticDim) {
    static const int dims[] = {4, 8, 12, 16, 6};
    headDim = dims[rng.range(0, 4)];
  } else {
    headDim = rng.range(4, 16);
  }
  if (opt.headDim > 0)
    headDim = opt.headDim;
  group = rng.range(1, 4);
  makeParams();
  makeAxes();
  makeConsts();
  makeCache();
  makeIndex();

  GeneratedProgram out;
  out.flowName = "gen" + std::to_string(opt.seed);
  out.headDim = headDim;
  out.group = group;
  out.files = files;
  for (const ParamDef &p : params) {
    if (p.reserved || p.compileTime)
      continue;
    if (p.type == 'b')
      out.runtimeParams[p.name] = 1 - p.value;
    else if (p.type == 'i')
      out.runtimeParams[p.name] = rng.range(1, 8);
    else
      out.runtimeParams[p.name] = std::min(p.mag, p.value * (0.5 + rng.real()));
  }

  std::string &src = out.source;
  src = "// Generated by vflow::testing::generateProgram, seed " +
        std::to_string(opt.seed) + ".\n";
  src += "flow " + out.flowName + " {\n";
  auto emit = [&](const std::vector<std::string> &lines) {
    for (const std::string &line : lines)
      src += "  " + line + "\n";
  };
  emit(paramLines);
  emit(axisLines);
  emit(constLines);
  std::string index = "index {\n";
  for (const std::string &line : indexLines)
    index += "    " + line + "\n";
  index += "  }";
  // Fields and states may be declared anywhere, even after the index.
  std::vector<std::string> rest = stateLines;
  for (const std::string &c : cacheDecls)
    rest.push_back(c);
  size_t at = rng.chance(0.2) ? rng.range(0, rest.size()) : rest.size();
  rest.insert(rest.begin() + at, index);
  if (rng.chance(0.2))
    src += "  /* stages */\n";
  emit(rest);
  src += "}\n";
  return out;
}

} // namespace

GeneratedProgram
vflow::testing::generateProgram(const GeneratorOptions &options) {
  return Generator(options).run();
}

std::string vflow::testing::writeProgramFiles(const GeneratedProgram &program,
                                              const std::string &dir,
                                              const std::string &sourceName) {
  auto write = [&](const std::string &path, const std::string &bytes) {
    std::ofstream out(path, std::ios::binary);
    out << bytes;
    if (!out)
      throw std::runtime_error("cannot write " + path);
  };
  for (const auto &file : program.files)
    write(dir + "/" + file.first, file.second);
  if (sourceName.empty())
    return "";
  write(dir + "/" + sourceName, program.source);
  return dir + "/" + sourceName;
}

vflow::testing::SeedRange
vflow::testing::seedRangeFromEnv(const std::string &prefix, uint64_t count,
                                 uint64_t first) {
  if (const char *env = std::getenv((prefix + "_SEEDS").c_str()))
    count = std::strtoull(env, nullptr, 10);
  if (const char *env = std::getenv((prefix + "_FIRST").c_str()))
    first = std::strtoull(env, nullptr, 10);
  return {first, count};
}
