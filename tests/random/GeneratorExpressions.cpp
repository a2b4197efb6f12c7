//===- GeneratorExpressions.cpp - Expressions of a required shape ---------===//
//
// gen(S) returns an expression whose axes are exactly S, with a bound of its
// magnitude: a leaf (reduced over its extra axes, broadcast with another
// operand for the axes it lacks), or an operator, builtin or reduction over
// smaller expressions. Values that could grow past their bound are squashed;
// exp, log, sqrt, pow, division and normalize get arguments in their safe
// range.
//
//===----------------------------------------------------------------------===//

#include "GeneratorImpl.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

using namespace vflow::testing;
using namespace vflow::testing::generator;

namespace {

struct Literal {
  const char *text;
  double value;
};

const std::vector<Literal> kLiterals = {
    {"0.5", 0.5},   {".25", 0.25}, {"2", 2},        {"1.5", 1.5},
    {"1e-3", 1e-3}, {"3", 3},      {"0.125", .125}, {"2.5E-1", 0.25},
    {"1", 1},       {"4", 4},      {"0.75", 0.75},  {"1E1", 10}};

/// A value's new bound from its old one.
using Bound = double (*)(double);
double sameBound(double mag) { return mag; }
double unitBound(double) { return 1; }
double plusOneBound(double mag) { return mag + 1; }

/// `v` between `open` and `close` (a function of it), bound by `mag`.
Val wrapped(Val v, const char *open, const char *close, Bound mag) {
  v.text = open + v.text + close;
  v.mag = mag(v.mag);
  return v;
}

} // namespace

namespace vflow::testing::generator {

std::string formatNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", std::fabs(v));
  std::string s = buf;
  return v < 0 ? "(-" + s + ")" : s;
}

} // namespace vflow::testing::generator

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
    return wrapped(v, "(abs(", ") + 1)", plusOneBound);
  case 1:
    return wrapped(v, "(sigmoid(", ") + 0.5)", [](double) { return 1.5; });
  case 2:
    return wrapped(v, "(relu(", ") + 0.5)",
                   [](double mag) { return mag + 0.5; });
  default:
    v.text = "(" + v.text + " * " + v.text + " + 0.5)";
    v.mag = v.mag * v.mag + 0.5;
    return v;
  }
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
  // Each kind of expression and its weight.
  using Make = Val (Generator::*)(const Shape &, int);
  const std::pair<double, Make> kinds[] = {
      {2, &Generator::leafish},
      {3, &Generator::unary},
      {4, &Generator::binary},
      {1, &Generator::compare},
      {1.5, &Generator::maxMin},
      {0.7, &Generator::power},
      {0.8, &Generator::clampOf},
      {0.8, &Generator::whereOf},
      {2.5, &Generator::reduction},
      {blockOk ? 2.0 : 0, &Generator::blockOp},
      {kthOk ? 0.6 : 0, &Generator::kthLargest},
      {peerOk ? 0.8 : 0, &Generator::renamePeer}};
  std::vector<double> w;
  for (const auto &kind : kinds)
    w.push_back(kind.first);
  return (this->*kinds[rng.weighted(w)].second)(s, depth);
}

std::string Generator::letLeaf(std::vector<std::string> &lines, const Shape &s,
                               const char *prefix, double weight) {
  Val v = gen(s, rng.range(1, opt.maxExprDepth));
  std::string name = fresh(prefix);
  lines.push_back("let " + name + " = " + v.text + ";");
  Leaf l;
  l.val = {name, v.shape, v.mag};
  l.weight = weight;
  leaves.push_back(l);
  return name;
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
  const int kind = rng.range(0, 10);
  switch (kind) {
  case 0: // exp of a bounded argument.
    if (a.mag > 4) {
      switch (rng.range(0, 2)) {
      case 0:
        a = wrapped(a, "tanh(", ")", unitBound);
        break;
      case 1:
        a = wrapped(a, "clamp(", ", -3, 3)", [](double) { return 3.0; });
        break;
      default: // exp(-|x|) <= 1.
        a = wrapped(a, "(-abs(", "))", [](double) { return 0.0; });
        break;
      }
    }
    return wrapped(a, "exp(", ")", [](double mag) { return std::exp(mag); });
  case 1:
    return wrapped(positive(a), "log(", ")",
                   [](double mag) { return std::max(std::log(mag + 1), 1.0); });
  case 2:
    return wrapped(a, "sqrt(abs(", "))",
                   [](double mag) { return std::sqrt(mag) + 1; });
  case 3:
    return wrapped(positive(a), "rsqrt(", ")", [](double) { return 1.5; });
  default: {
    // The rest wrap `a` in a function or an operator.
    const struct {
      const char *open, *close;
      Bound mag;
    } wraps[] = {{"abs(", ")", sameBound},     {"relu(", ")", sameBound},
                 {"sigmoid(", ")", unitBound}, {"silu(", ")", plusOneBound},
                 {"tanh(", ")", unitBound},    {"(-", ")", sameBound},
                 {"(not ", ")", unitBound}};
    const auto &wrap = wraps[kind - 4];
    return wrapped(a, wrap.open, wrap.close, wrap.mag);
  }
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
  if (rng.chance(0.25)) { // maximum / minimum of three values
    std::vector<Shape> p = partition(s, 3);
    Val a = gen(p[0], depth - 1), b = gen(p[1], depth - 1),
        c = gen(p[2], depth - 1);
    Val out;
    out.shape = s;
    out.mag = std::max(a.mag, std::max(b.mag, c.mag));
    out.text = std::string(fns[rng.range(0, 1)]) + "(" + a.text + ", " +
               b.text + ", " + c.text + ")";
    return out;
  }
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
  case 1:
    return wrapped(positive(a), "normalize(", ", block)", unitBound);
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
