//===- GeneratorDeclarations.cpp - Params, axes, consts, cache, states ----===//
//
// The declarations of a program in the order they are made: params (some
// reserved, some computed from others), declared axes with their twins and
// split axes, consts over them, the cache stage's fields (alone or in blocks
// with lets) and states (made once the index stage's inputs are known).
//
//===----------------------------------------------------------------------===//

#include "GeneratorImpl.h"

#include "vflow/Runtime/Limits.h"

#include <cmath>

using namespace vflow::testing;
using namespace vflow::testing::generator;

namespace {

const char *const kDTypes[] = {"f32", "bf16", "f16", "fp8e4m3", "fp8e5m2"};

} // namespace

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
      // A float literal even when the value is whole ("1.0", not "1",
      // which would make an int param).
      std::string text = formatNumber(q / 8.0);
      if (text.find_first_of(".e") == std::string::npos)
        text += ".0";
      add(name, q / 8.0, 'f', "param " + name + " = " + text + ";", 1.5);
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
  // The checker's bound on all consts together (limits::kMaxConstElements,
  // D at the largest head dimension an artifact carries).
  double room = double(vflow::limits::kMaxConstElements);
  auto constElements = [&](const Shape &shape) {
    double e = 1;
    for (const Axis &a : shape.axes)
      e *= a.size == kSizeD
               ? double(std::end(vflow::limits::kConstValueHeadDims)[-1])
               : double(a.size);
    return e;
  };
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
    // A const drawn again forgets the twins and split axes the drawings
    // it replaces made (states may only use those its text makes).
    const std::set<std::string> madeBefore = madeInConsts;
    Val v = bound(gen(s, rng.range(0, 2)), kConstLimit);
    // Too large with the consts before it (each may take half the room
    // left, so the later ones fit): a smaller one, at worst a leaf of its
    // shape without dim (the declared axes are small).
    for (int tries = 0; constElements(v.shape) > room / 2 && tries < 8;
         ++tries) {
      madeInConsts = madeBefore;
      v = bound(gen(s, 0), kConstLimit);
    }
    if (constElements(v.shape) > room / 2) {
      Shape small;
      for (const Axis &a : s.axes)
        if (a.size != kSizeD)
          small.add(a);
      madeInConsts = madeBefore;
      v = bound(gen(small, 0), kConstLimit);
    }
    room -= constElements(v.shape);
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
        letLeaf(body, s, "y", 4);
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
