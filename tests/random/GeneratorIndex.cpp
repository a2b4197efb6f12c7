//===- GeneratorIndex.cpp - The index stage and its selection -------------===//
//
// The index stage: its inputs and the fields and states it reads, lets and
// state updates, a read of every field, and the returned selection (topk,
// approx_topk, threshold, topp or a union of them) with host-evaluable budgets
// that are never negative.
//
//===----------------------------------------------------------------------===//

#include "GeneratorImpl.h"

using namespace vflow::testing;
using namespace vflow::testing::generator;

/// A host-evaluable budget expression.
std::string Generator::budget(int depth) {
  auto leaf = [&]() -> std::string {
    std::vector<std::string> opts = {
        std::to_string(rng.range(1, 6)),
        "num_blocks",
        "(num_blocks / 2)",
        "(context_len / " + std::to_string(blockSize * 2) + ")",
        "(" + std::to_string(rng.range(1, 3)) + " * group)",
        "(layer + 1)",
        "(2 * kv_head + 1)"};
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
  return letLeaf(lines, b, "l", 3);
}

Val Generator::blockValueOf(const FieldDef &f) {
  Val v;
  v.text = f.name;
  v.shape = f.shape;
  v.shape.add(axis("block"));
  std::vector<std::string> extra;
  for (const Axis &a : f.shape.axes)
    extra.push_back(a.name);
  return extra.empty() ? v : reduce(v, extra);
}

std::string Generator::selection(int depth, std::vector<std::string> &lines) {
  Shape b;
  b.add(axis("block"));
  int kind = rng.weighted({3, 1.5, 2.5, 2, depth > 0 ? 3.0 : 0.0});
  auto score = [&]() {
    return rng.chance(0.5) || !pendingScore.empty()
               ? scoreName(lines, false)
               : gen(b, rng.range(1, opt.maxExprDepth)).text;
  };
  // `call` closed, at times (`chance`) with a budget as its `max`.
  auto withMax = [&](std::string call, double chance) {
    if (rng.chance(chance))
      call += ", max = " + budget(rng.range(0, 2));
    return call + ")";
  };
  std::string sel;
  switch (kind) {
  case 0:
    if (rng.chance(0.25)) { // each query head's own top k
      Shape bh;
      bh.add(axis("block"));
      bh.add(axis("head"));
      sel = "topk(" + gen(bh, rng.range(1, opt.maxExprDepth)).text + ", " +
            budget(rng.range(0, 2)) + ", per = head)";
      break;
    }
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
    sel = withMax("threshold(" + s + ", " + t, 0.6);
    break;
  }
  case 3: {
    // A p known on the host must be in (0, 1]; one the device computes
    // may be anything (<= 0 keeps none, >= 1 every weighted block).
    std::string s = score(), p;
    switch (rng.range(0, 3)) {
    case 0:
      p = rng.pick(std::vector<std::string>{"0.9", "0.5", "0.99", "1", "0.1"});
      break;
    case 1:
      p = "clamp(" + gen(Shape(), rng.range(0, 2)).text + ", 0.05, 1)";
      break;
    default: // On the device, at times <= 0 or >= 1.
      p = "(mean(" + s + ", block) - max(" + s + ", block) + " +
          rng.pick(std::vector<std::string>{"1", "1.5", "0.5"}) + ")";
      break;
    }
    sel = withMax("topp(" + s + ", " + p, 0.7);
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
  input("group", {}, 4, 0.3);
  input("layer", {}, 8, 0.2);
  input("kv_head", {}, 2, 0.2);
  // hash of integers only (exact on every backend; hash of a computed value
  // would turn one rounding difference into a different number).
  input("hash(position + num_blocks * step)", {"block"}, 1, 0.3);
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
    letLeaf(lines, randomShape(0.75, 3, false, true), "l", 3);
  }
  // Make sure every field is read (an unread one is only a warning).
  std::string unread;
  for (const FieldDef &f : fields) {
    if (fieldsRead.count(f.name))
      continue;
    Val v = blockValueOf(f);
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
