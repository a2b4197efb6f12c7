//===- GeneratorAxes.cpp - The axes model of the generator ----------------===//
//
// Which axes a value of the current stage may have and where they can come
// from (a leaf, a generator, or derived from a base axis by rename or
// split), random shapes within the size limits, and the expressions that
// make derived axes or cut an axis away.
//
//===----------------------------------------------------------------------===//

#include "GeneratorImpl.h"

#include "vflow/Runtime/Limits.h"

#include <stdexcept>

using namespace vflow::testing;
using namespace vflow::testing::generator;

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
// Derived axes: rename and split
//===----------------------------------------------------------------------===//

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
