//===- GeneratorImpl.h - The random program generator ----------*- C++ -*-===//
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
// The generator's files:
//   ProgramGenerator.cpp       a program's parts in order, the source text
//   GeneratorDeclarations.cpp  params, axes, consts, the cache stage, states
//   GeneratorAxes.cpp          the axes model: usable axes, random shapes,
//                              rename and split
//   GeneratorExpressions.cpp   expressions of a required shape
//   GeneratorConstData.cpp     rademacher, gaussian, tensor and load (.npy)
//   GeneratorIndex.cpp         the index stage: lets, state updates, the
//                              selection and its budgets
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_TESTS_RANDOM_GENERATORIMPL_H
#define VFLOW_TESTS_RANDOM_GENERATORIMPL_H

#include "ProgramGenerator.h"
#include "vflow/Runtime/Random.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace vflow::testing::generator {

/// Symbolic sizes, as the checker has them.
constexpr int64_t kSizeN = -1, kSizeG = -2, kSizeD = -3;
/// Sizes assumed for symbolic axes when bounding element counts and sums.
constexpr int64_t kAssumedBlocks = 12, kAssumedGroup = 4;
/// No intermediate value is made larger than this many elements.
constexpr double kMaxElements = 4096;
/// Magnitude bounds: any value, fields, states, consts.
constexpr double kMagLimit = 1000, kFieldLimit = 200, kStateLimit = 50,
                 kConstLimit = 20;

/// The runtime's SplitMix64 (the same sequence on every platform and
/// standard library), with the draws the generator makes.
class Rng : public vflow::rt::SplitMix64 {
public:
  using SplitMix64::SplitMix64;
  /// Uniform in [lo, hi].
  int range(int lo, int hi) {
    return lo + static_cast<int>(next() % uint64_t(hi - lo + 1));
  }
  bool chance(double p) { return uniform() < p; }
  template <typename T> const T &pick(const std::vector<T> &v) {
    return v[next() % v.size()];
  }
  size_t weighted(const std::vector<double> &w) {
    double total = 0;
    for (double x : w)
      total += x;
    double r = uniform() * total;
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

/// "2", "0.25", or "(-1.5)" for a negative value (%g).
std::string formatNumber(double v);

class Generator {
public:
  explicit Generator(const GeneratorOptions &options)
      : opt(options), rng(options.seed * 0x2545f4914f6cdd1dull + 0x1234567) {}

  GeneratedProgram run();
  /// A retain block for the end of the flow, or "" (ProgramGenerator.cpp).
  std::string retainBlock();

private:
  // Declarations (GeneratorDeclarations.cpp).
  void makeParams();
  void makeAxes();
  void makeConsts();
  void makeCache();
  void makeStates();

  // Axes (GeneratorAxes.cpp).
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
  Val derive(const Shape &s, int depth);
  const AxisDef *peerFor(const Shape &s, std::string &to);
  Val renamePeer(const Shape &s, int depth);
  Val splitAway(Val v, const std::string &axis, int64_t factor,
                const std::string &outer);

  // Expressions (GeneratorExpressions.cpp).
  Val gen(const Shape &s, int depth);
  Val genRaw(const Shape &s, int depth);
  Val leafish(const Shape &s, int depth);
  Val fromLeaf(const Leaf &leaf, const Shape &s);
  /// Appends `let <name> = <a value of shape s>;` to `lines`, with a fresh
  /// name starting with `prefix`, and makes the name a leaf of `weight`.
  std::string letLeaf(std::vector<std::string> &lines, const Shape &s,
                      const char *prefix, double weight);
  Val literal();
  Val reduce(Val v, std::vector<std::string> axes);
  /// Field `f` over all blocks with its own axes reduced: a [block] value.
  Val blockValueOf(const FieldDef &f);
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
  Val kthLargest(const Shape &s, int depth);
  std::vector<Shape> partition(const Shape &s, int parts);
  std::string combine(const Val &a, const Val &b, double &mag);

  // Constant tensors (GeneratorConstData.cpp).
  Val constGenerator(const Shape &s);
  std::string compileTimeNumber(double &value);

  // The index stage, its selection and budgets (GeneratorIndex.cpp).
  void makeIndex();
  std::string selection(int depth, std::vector<std::string> &lines);
  std::string scoreName(std::vector<std::string> &lines, bool forceLet);
  std::string budget(int depth);

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

} // namespace vflow::testing::generator

#endif // VFLOW_TESTS_RANDOM_GENERATORIMPL_H
