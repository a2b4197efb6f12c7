//===- CppEmitter.cpp - The CPU backend: vt IR to C++ ---------------------===//
//
// One loop nest per op over the axes of its result, in the order the IR's
// types list them; every value is a row-major f32 array named after its SSA
// value (%12 becomes v12, with a suffix where sibling regions reuse a
// number). Each entry point declares every value up front and runs its ops
// in chunks of at most kOpsPerChunk, each a noinline lambda, so the host
// compiler's time grows linearly with the program (one huge function is
// superlinear for it); a vector is released after its last use. Operands are
// read through strides found by axis name, so broadcasting, transposition,
// split and rename are index arithmetic. Sizes N, G and D are run-time
// variables; static sizes are literals. The math is the interpreter's: the
// element functions, the double accumulation of reductions and the selection
// rules come from KernelABI.h, and budgets are evaluated in f64 from their
// host-evaluable definition.
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/CppEmitter.h"
#include "EmitCommon.h"
#include "vflow/Compiler/Budgets.h"
#include "vflow/Compiler/ParamSpec.h"
#include "vflow/Compiler/StorageDType.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

using namespace vflow;
using namespace vflow::emit;
using mlir::Operation;
using mlir::Value;

namespace {

/// The offset in `l` of the element at the loop indices of `axes` (`rename`
/// maps a loop axis to the name it has in `l`); absent axes broadcast.
std::string offsetIn(const Layout &l, const std::vector<std::string> &axes,
                     const std::map<std::string, std::string> &rename = {}) {
  std::string out;
  for (const std::string &axis : axes) {
    auto r = rename.find(axis);
    int p = l.index(r == rename.end() ? axis : r->second);
    if (p < 0)
      continue;
    std::string stride = product(l.sizes, p + 1);
    std::string term =
        stride == "1" ? loopVar(axis) : loopVar(axis) + " * " + paren(stride);
    out += (out.empty() ? "" : " + ") + term;
  }
  return out.empty() ? "0" : out;
}

/// How a value is held in the generated code.
enum class Kind {
  Vector,    ///< std::vector<float> vX(size)
  Scalar,    ///< float vX[1]
  Pointer,   ///< const float *vX (an input read in place)
  Selection, ///< std::vector<int64_t> vX
};

struct Var {
  std::string name;
  Kind kind = Kind::Vector;
};

class Emitter : FlowSymbols, CodeWriter {
public:
  explicit Emitter(vt::FlowOp flow)
      : FlowSymbols(flow), flow(flow), asmState(flow) {}

  std::string run();

private:
  /// Ops per noinline chunk of an entry point.
  static constexpr int kOpsPerChunk = 48;
  /// The depth of the statements of a chunk (function, lambda).
  static constexpr int kChunkDepth = 2;

  vt::FlowOp flow;
  mlir::AsmState asmState;
  /// The current entry point: its chunks (CodeWriter::os) and its value
  /// macros (frame), with the number of slots of each kind.
  std::ostringstream frame;
  int frameCounts[4] = {0, 0, 0, 0};
  int opsInChunk = 0;
  std::string stage;
  llvm::DenseMap<Value, Var> vars;
  std::set<std::string> usedNames;
  /// Per op of the current entry point: the vectors whose last use it is.
  llvm::DenseMap<Operation *, std::vector<Value>> lastUses;

  /// A C++ name for `v`, unique in the entry point.
  std::string ssaName(Value v) {
    std::string text;
    llvm::raw_string_ostream s(text);
    v.printAsOperand(s, asmState);
    s.flush();
    std::string out = "v";
    for (char c : text)
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '_')
        out += c;
    if (out.size() == 1)
      out = "v_";
    std::string name = out;
    for (int i = 1; !usedNames.insert(name).second; ++i)
      name = out + "_" + std::to_string(i);
    return name;
  }

  const Var &var(Value v) {
    auto it = vars.find(v);
    if (it == vars.end())
      fail("internal: a value is used before it is emitted");
    return it->second;
  }
  std::string at(Value v, const std::string &offset) {
    return var(v).name + "[" + offset + "]";
  }
  std::string dataOf(Value v) {
    const Var &x = var(v);
    return x.kind == Kind::Vector ? x.name + ".data()" : x.name;
  }

  /// Declares `v` in the entry point's frame as a `kind` named `name`: one
  /// slot of an array per kind, with `name` a macro for the slot. (Arrays
  /// and macros keep the host compiler's time linear in the number of
  /// values; a local or a struct member per value does not.)
  const Var &declareIn(Value v, Kind kind, const std::string &name) {
    int &count = frameCounts[static_cast<int>(kind)];
    static const char *const arrays[] = {"vec_", "scalar_", "ptr_", "sel_"};
    std::string slot = std::string(arrays[static_cast<int>(kind)]) + "[" +
                       std::to_string(count++) + "]";
    if (kind == Kind::Scalar)
      slot = "(&" + slot + ")"; // read as a float[1]
    frame << "#define " << name << " " << slot << "\n";
    return vars[v] = Var{name, kind};
  }

  /// Declares a tensor result (vector, or float[1] for a scalar) and sizes
  /// it here.
  const Var &declare(Value v) {
    Layout l = Layout::of(v);
    if (l.names.empty())
      return declareIn(v, Kind::Scalar, ssaName(v));
    const Var &x = declareIn(v, Kind::Vector, ssaName(v));
    line() << x.name << ".assign(" << product(l.sizes) << ", 0.0f);\n";
    return x;
  }

  /// Records, for every op of `region`'s entry point, the vectors it is the
  /// last user of (ops numbered in the order they are emitted).
  void computeLastUses(mlir::Operation *root) {
    lastUses.clear();
    // Values in the order they are first used, so the output (and the JIT
    // cache key) is the same on every run.
    llvm::DenseMap<Value, Operation *> last;
    std::vector<Value> order;
    root->walk<mlir::WalkOrder::PreOrder>([&](Operation *op) {
      if (op == root)
        return;
      for (Value operand : op->getOperands()) {
        if (!last.count(operand))
          order.push_back(operand);
        last[operand] = op;
      }
    });
    for (Value value : order)
      lastUses[last[value]].push_back(value);
  }

  /// Frees the vectors whose last use was `op`.
  void releaseAfter(Operation *op) {
    auto it = lastUses.find(op);
    if (it == lastUses.end())
      return;
    for (Value v : it->second) {
      auto x = vars.find(v);
      if (x != vars.end() && x->second.kind == Kind::Vector)
        line() << "std::vector<float>().swap(" << x->second.name << ");\n";
    }
  }

  /// Emits one entry point: `signature`, `prologue` (its sizes and params),
  /// every value's declaration, then what `body` emits, in noinline chunks,
  /// then `epilogue` (read after `body` ran, which may set it).
  void emitEntryPoint(const std::string &signature, const std::string &prologue,
                      const std::function<void()> &body,
                      const std::string &epilogue = "") {
    std::ostringstream saved;
    saved.swap(os);
    frame.str("");
    std::fill(std::begin(frameCounts), std::end(frameCounts), 0);
    vars.clear();
    usedNames.clear();
    depth = kChunkDepth;
    opsInChunk = 0;
    body();
    std::string chunks = os.str();
    os.swap(saved);
    depth = 0;
    auto slots = [&](Kind k) {
      return std::to_string(std::max(1, frameCounts[static_cast<int>(k)]));
    };
    os << signature << " {\n" << prologue;
    os << "  std::vector<float> vec_[" << slots(Kind::Vector) << "];\n";
    os << "  float scalar_[" << slots(Kind::Scalar) << "] = {};\n";
    os << "  const float *ptr_[" << slots(Kind::Pointer) << "] = {};\n";
    os << "  std::vector<int64_t> sel_[" << slots(Kind::Selection) << "];\n";
    os << "  (void)vec_;\n  (void)scalar_;\n  (void)ptr_;\n  (void)sel_;\n";
    std::string macros = frame.str();
    os << macros;
    os << "  VFLOW_CHUNK {\n" << chunks << "  }();\n";
    os << epilogue;
    // The value names are this entry point's only.
    for (size_t at = 0; (at = macros.find("#define ", at)) != std::string::npos;
         at += 8)
      os << "#undef "
         << macros.substr(at + 8, macros.find(' ', at + 8) - at - 8) << "\n";
    os << "}\n\n";
  }

  /// Starts a new chunk when the current one is full.
  void maybeSplitChunk() {
    if (depth != kChunkDepth || ++opsInChunk <= kOpsPerChunk)
      return;
    os << "  }();\n  VFLOW_CHUNK {\n";
    opsInChunk = 1;
  }

  /// Opens one `for` per axis of `l`; returns how many were opened.
  int openLoops(const Layout &l) {
    for (size_t i = 0; i < l.names.size(); ++i) {
      std::string v = loopVar(l.names[i]);
      open("for (int64_t " + v + " = 0; " + v + " < " + sizeName(l.sizes[i]) +
           "; ++" + v + ")");
    }
    return static_cast<int>(l.names.size());
  }
  void closeLoops(int n) {
    for (int i = 0; i < n; ++i)
      close();
  }

  void comment(Operation *op) {
    std::string text;
    llvm::raw_string_ostream s(text);
    // A kernel is a scope here: its GPU launch means nothing to this backend.
    if (auto k = llvm::dyn_cast<vt::KernelOp>(op)) {
      s << "vt.kernel " << vt::stringifyKernelKind(k.getKind());
    } else {
      op->print(s, asmState);
    }
    s.flush();
    line() << "// " << oneLineText(text, 200) << "\n";
  }

  /// Binds `v` to `ptr` (a row-major array of layout `abi`): in place when
  /// the layouts agree, else as a reordered copy.
  void bindArray(Value v, const Layout &abi, const std::string &ptr) {
    Layout l = Layout::of(v);
    if (l == abi) {
      const Var &x = declareIn(v, Kind::Pointer, ssaName(v));
      line() << x.name << " = " << ptr << ";\n";
      return;
    }
    copyFrom(v, abi, ptr);
  }

  void copyFrom(Value v, const Layout &abi, const std::string &ptr) {
    Layout l = Layout::of(v);
    declare(v);
    int n = openLoops(l);
    line() << at(v, offsetIn(l, l.names)) << " = " << ptr << "["
           << offsetIn(abi, l.names) << "];\n";
    closeLoops(n);
  }

  /// Writes `v` into `ptr` (layout `abi`) through `round`.
  void storeArray(Value v, const Layout &abi, const std::string &ptr,
                  const std::string &round) {
    int n = openLoops(abi);
    std::string value = at(v, offsetIn(Layout::of(v), abi.names));
    line() << ptr << "[" << offsetIn(abi, abi.names)
           << "] = " << (round.empty() ? value : round + "(" + value + ")")
           << ";\n";
    closeLoops(n);
  }

  /// The f64 host evaluation of a budget's definition.
  std::string hostExpr(Value v) {
    static const emit::HostInputs inputs{
        "double(N)", "double(args->contextLen)", "double(args->layer)",
        "double(args->kvHead)"};
    return emit::hostExprLinear(v, paramIndex, inputs, false);
  }

  void emitBlock(mlir::Block &block) {
    for (Operation &op : block)
      emitOp(&op);
  }
  void emitOp(Operation *op);
  void emitOpBody(Operation *op);
  /// param, const, field and state loads and stores: the entry point's
  /// arguments.
  void emitDeclarationAccess(Operation *op);
  /// Values made from nothing: constants, seeded random vectors, literals.
  void emitValue(Operation *op);
  /// Ops that run along the block axis of each line: softmax, normalize,
  /// conv, kth_largest.
  void emitLineOp(Operation *op);
  void emitSplit(vt::SplitOp op);
  void emitRename(vt::RenameOp op);
  void emitElementwise(Operation *op, const std::string &fn);
  void emitReduce(vt::ReduceOp op);
  void emitAlongBlock(Operation *op, const std::string &call);
  void emitInput(vt::InputOp op);
  void emitKernel(vt::KernelOp op);
  void emitSelection(Operation *op);

  void emitConsts();
  void emitCache();
  void emitIndex();

  std::string symbol(const std::string &what) {
    return "vflow_" + flow.getSymName().str() + "_" + what;
  }
};

void Emitter::emitElementwise(Operation *op, const std::string &fn) {
  Value result = op->getResult(0);
  Layout l = Layout::of(result);
  declare(result);
  int n = openLoops(l);
  std::string args;
  for (Value operand : op->getOperands())
    args += (args.empty() ? "" : ", ") +
            at(operand, offsetIn(Layout::of(operand), l.names));
  line() << at(result, offsetIn(l, l.names)) << " = " << fn << "(" << args
         << ");\n";
  closeLoops(n);
}

void Emitter::emitReduce(vt::ReduceOp op) {
  Layout in = Layout::of(op.getInput()), out = Layout::of(op.getResult());
  ReduceSpelling spelling = reduceSpelling(op.getKind());
  std::string acc = std::string("vk::acc") + spelling.acc;
  std::string finish = std::string("vk::") + spelling.finish;
  std::string init = op.getKind() == vt::ReduceKind::max   ? "vk::kMaxInit"
                     : op.getKind() == vt::ReduceKind::min ? "vk::kMinInit"
                                                           : "vk::kSumInit";
  std::vector<int64_t> reducedSizes;
  for (mlir::Attribute a : op.getAxes()) {
    int p = in.index(a.cast<mlir::StringAttr>().str());
    if (p < 0)
      fail("reduce over a missing axis");
    reducedSizes.push_back(in.sizes[p]);
  }
  declare(op.getResult());
  std::string size = product(out.sizes);
  open("");
  // The accumulation: NumericRules' f32 lanes for wide sums (element e of
  // the reduced ones, row major over the reduced axes in the input's order,
  // into lane e % kSumLanes), else one double per output element.
  std::string total;
  int n;
  if (op.sumsInLanes()) {
    Layout reduced;
    for (size_t i = 0; i < in.names.size(); ++i)
      if (out.index(in.names[i]) < 0) {
        reduced.names.push_back(in.names[i]);
        reduced.sizes.push_back(in.sizes[i]);
      }
    line() << "constexpr int64_t lanes = vk::kSumLanes;\n";
    line() << "std::vector<float> lane(" << paren(size) << " * lanes, 0.0f);\n";
    n = openLoops(in);
    line() << acc << "Lane(lane[" << paren(offsetIn(out, in.names))
           << " * lanes + " << paren(offsetIn(reduced, in.names))
           << " % lanes], " << at(op.getInput(), offsetIn(in, in.names))
           << ");\n";
    total = "vk::combineSumLanes(&lane[i * lanes])";
  } else {
    line() << "std::vector<double> acc(" << size << ", " << init << ");\n";
    n = openLoops(in);
    line() << acc << "(acc[" << offsetIn(out, in.names) << "], "
           << at(op.getInput(), offsetIn(in, in.names)) << ");\n";
    total = "acc[i]";
  }
  closeLoops(n);
  line() << "const double count = double(" << product(reducedSizes) << ");\n";
  line() << "for (int64_t i = 0; i < " << size << "; ++i)\n";
  line() << "  " << var(op.getResult()).name << "[i] = " << finish << "("
         << total << ", count);\n";
  close();
}

void Emitter::emitAlongBlock(Operation *op, const std::string &call) {
  // call(src, srcStride, dst, dstStride, n, extra...)
  Value input = op->getOperand(0), result = op->getResult(0);
  Layout in = Layout::of(input), out = Layout::of(result);
  int bi = in.index("block"), bo = out.index("block");
  if (bi < 0 || bo < 0)
    fail(op->getName().getStringRef().str() + " needs a block axis");
  Layout outer;
  for (size_t i = 0; i < out.names.size(); ++i)
    if (out.names[i] != "block") {
      outer.names.push_back(out.names[i]);
      outer.sizes.push_back(out.sizes[i]);
    }
  declare(result);
  openLoops(outer);
  line() << call << dataOf(input) << " + " << paren(offsetIn(in, outer.names))
         << ", " << product(in.sizes, bi + 1) << ", " << dataOf(result) << " + "
         << paren(offsetIn(out, outer.names)) << ", "
         << product(out.sizes, bo + 1) << ", N";
}

void Emitter::emitInput(vt::InputOp op) {
  Value v = op.getResult();
  Layout l = Layout::of(v);
  auto axis = [&](const std::string &name) {
    int p = l.index(name);
    if (p < 0)
      fail("input without a '" + name + "' axis");
    return l.sizes[p];
  };
  bool index = stage == "index";
  switch (op.getKind()) {
  case vt::InputKind::K:
  case vt::InputKind::V: {
    std::string ptr = op.getKind() == vt::InputKind::K ? "args->K" : "args->V";
    Layout abi;
    if (index)
      abi = {{"block", "token", "dim"},
             {vt::kSizeBlocks, axis("token"), vt::kSizeHeadDim}};
    else
      abi = {{"token", "dim"}, {axis("token"), vt::kSizeHeadDim}};
    bindArray(v, abi, ptr);
    return;
  }
  case vt::InputKind::q:
    bindArray(v, {{"head", "dim"}, {vt::kSizeGroup, vt::kSizeHeadDim}},
              "args->q");
    return;
  case vt::InputKind::mass:
    bindArray(v, {{"block", "head"}, {vt::kSizeBlocks, vt::kSizeGroup}},
              "args->mass");
    return;
  case vt::InputKind::position: {
    declare(v);
    int n = openLoops(l);
    line() << at(v, "i_block") << " = static_cast<float>(i_block);\n";
    closeLoops(n);
    return;
  }
  case vt::InputKind::first_token: // CpuFlow always passes it
    bindArray(v, {{"block"}, {vt::kSizeBlocks}}, "args->firstToken");
    return;
  case vt::InputKind::num_blocks:
    declare(v);
    line() << at(v, "0") << " = static_cast<float>(N);\n";
    return;
  case vt::InputKind::context_len:
    declare(v);
    line() << at(v, "0") << " = static_cast<float>(args->contextLen);\n";
    return;
  case vt::InputKind::step:
    declare(v);
    line() << at(v, "0") << " = static_cast<float>(args->step);\n";
    return;
  case vt::InputKind::group:
    declare(v);
    line() << at(v, "0") << " = static_cast<float>(G);\n";
    return;
  case vt::InputKind::layer:
    declare(v);
    line() << at(v, "0") << " = static_cast<float>(args->layer);\n";
    return;
  case vt::InputKind::kv_head:
    declare(v);
    line() << at(v, "0") << " = static_cast<float>(args->kvHead);\n";
    return;
  }
}

void Emitter::emitKernel(vt::KernelOp op) {
  mlir::Block &body = op.getBody().front();
  auto yield = llvm::cast<vt::YieldOp>(body.getTerminator());
  for (Value r : op.getResults()) {
    if (r.getType().isa<vt::SelectionType>())
      declareIn(r, Kind::Selection, ssaName(r));
    else if (Layout::of(r).names.empty())
      declare(r);
    else
      declareIn(r, Kind::Vector, ssaName(r));
  }
  // The body's values live in the entry point's frame like the others, so
  // that a long kernel can span chunks.
  emitBlock(body);
  for (auto [r, y] : llvm::zip(op.getResults(), yield.getValues())) {
    const Var &dst = var(r), &src = var(y);
    unsigned uses = 0;
    for (Value other : yield.getValues())
      uses += other == y;
    if (dst.kind == Kind::Selection || dst.kind == Kind::Scalar) {
      if (dst.kind == Kind::Scalar)
        line() << dst.name << "[0] = " << src.name << "[0];\n";
      else
        line() << dst.name << " = " << src.name << ";\n";
    } else if (src.kind == Kind::Vector && uses == 1) {
      line() << dst.name << " = std::move(" << src.name << ");\n";
    } else {
      Layout l = Layout::of(r);
      line() << dst.name << ".assign(" << dataOf(y) << ", " << dataOf(y)
             << " + " << paren(product(l.sizes)) << ");\n";
    }
  }
}

void Emitter::emitSelection(Operation *op) {
  std::string value;
  if (auto u = llvm::dyn_cast<vt::UnionOp>(op)) {
    value = "vk::selectUnion(" + var(u.getLhs()).name + ", " +
            var(u.getRhs()).name + ")";
  } else {
    Value score = op->getOperand(0);
    Layout l = Layout::of(score);
    if (l.names != std::vector<std::string>{"block"})
      fail("a selection's score must have exactly the axes [block]");
    // threshold's and topp's optional max; -1: no bound.
    auto maxOf = [&](Value max) {
      return max ? "vk::roundBudget(" + hostExpr(max) + ")" : std::string("-1");
    };
    if (auto t = llvm::dyn_cast<vt::ThresholdOp>(op)) {
      value = "vk::selectThreshold(" + dataOf(score) + ", kept, " +
              at(t.getThreshold(), "0") + ", " + maxOf(t.getMax()) + ")";
    } else if (auto t = llvm::dyn_cast<vt::TopPOp>(op)) {
      value = "vk::selectTopP(" + dataOf(score) + ", kept, " +
              at(t.getP(), "0") + ", " + maxOf(t.getMax()) + ")";
    } else {
      value = "vk::selectTopK(" + dataOf(score) + ", kept, vk::roundBudget(" +
              hostExpr(op->getOperand(1)) + "))";
    }
  }
  const Var &x =
      declareIn(op->getResult(0), Kind::Selection, ssaName(op->getResult(0)));
  line() << x.name << " = " << value << ";\n";
}

void Emitter::emitOp(Operation *op) {
  if (llvm::isa<vt::YieldOp, vt::ReturnOp>(op))
    return;
  if (!llvm::isa<vt::KernelOp>(op))
    maybeSplitChunk();
  comment(op);
  emitOpBody(op);
  releaseAfter(op);
}

void Emitter::emitOpBody(Operation *op) {
  std::string fn = elementFunction(op);
  if (!fn.empty()) {
    emitElementwise(op, "vk::" + fn);
    return;
  }
  llvm::TypeSwitch<Operation *>(op)
      .Case<vt::InputOp>([&](vt::InputOp in) { emitInput(in); })
      .Case<vt::ParamLoadOp, vt::ConstLoadOp, vt::FieldLoadOp, vt::FieldStoreOp,
            vt::StateLoadOp, vt::StateStoreOp>(
          [&](auto) { emitDeclarationAccess(op); })
      .Case<vt::ConstantOp, vt::RademacherOp, vt::GaussianOp, vt::LiteralOp>(
          [&](auto) { emitValue(op); })
      .Case<vt::ReduceOp>([&](vt::ReduceOp r) { emitReduce(r); })
      .Case<vt::SoftmaxOp, vt::NormalizeOp, vt::ConvOp, vt::KthLargestOp>(
          [&](auto) { emitLineOp(op); })
      .Case<vt::SplitOp>([&](vt::SplitOp s) { emitSplit(s); })
      .Case<vt::RenameOp>([&](vt::RenameOp r) { emitRename(r); })
      .Case<vt::TopKOp, vt::ApproxTopKOp, vt::ThresholdOp, vt::TopPOp,
            vt::UnionOp>([&](auto) { emitSelection(op); })
      .Case<vt::KernelOp>([&](vt::KernelOp k) { emitKernel(k); })
      .Default([](Operation *o) {
        fail("the CPU backend does not know op " +
             o->getName().getStringRef().str());
      });
}

void Emitter::emitDeclarationAccess(Operation *op) {
  // A field or state store: `value`, rounded to the storage dtype of the
  // symbol `name`, into args-><array>[its index].
  auto store = [&](Value value, const std::string &name,
                   const std::map<std::string, vt::TensorType> &types,
                   const std::map<std::string, int> &index,
                   const std::string &array) {
    vt::TensorType type = types.at(name);
    storeArray(value, Layout::of(type),
               "args->" + array + "[" + std::to_string(index.at(name)) + "]",
               roundFunction(type.getElementType()));
  };
  llvm::TypeSwitch<Operation *>(op)
      .Case<vt::ParamLoadOp>([&](vt::ParamLoadOp p) {
        int i = symbolIndex(paramIndex, "param", p.getParam().str());
        declare(p.getResult());
        line() << at(p.getResult(), "0") << " = static_cast<float>(P[" << i
               << "]);\n";
      })
      .Case<vt::ConstLoadOp>([&](vt::ConstLoadOp c) {
        std::string name = c.getName().str();
        int i = symbolIndex(constIndex, "const", name);
        bindArray(c.getResult(), Layout::of(constTypes.at(name)),
                  "args->consts[" + std::to_string(i) + "]");
      })
      .Case<vt::FieldStoreOp>([&](vt::FieldStoreOp s) {
        store(s.getValue(), s.getField().str(), fieldTypes, fieldIndex,
              "fields");
      })
      .Case<vt::FieldLoadOp>([&](vt::FieldLoadOp l) {
        std::string name = l.getField().str();
        int i = symbolIndex(fieldIndex, "field", name);
        Layout abi = Layout::of(fieldTypes.at(name));
        abi.names.insert(abi.names.begin(), "block");
        abi.sizes.insert(abi.sizes.begin(), vt::kSizeBlocks);
        bindArray(l.getResult(), abi,
                  "args->fields[" + std::to_string(i) + "]");
      })
      .Case<vt::StateLoadOp>([&](vt::StateLoadOp l) {
        std::string name = l.getState().str();
        int i = symbolIndex(stateIndex, "state", name);
        // A copy: a later store must not change what this load read.
        copyFrom(l.getResult(), Layout::of(stateTypes.at(name)),
                 "args->states[" + std::to_string(i) + "]");
      })
      .Case<vt::StateStoreOp>([&](vt::StateStoreOp s) {
        store(s.getValue(), s.getState().str(), stateTypes, stateIndex,
              "states");
      });
}

void Emitter::emitValue(Operation *op) {
  llvm::TypeSwitch<Operation *>(op)
      .Case<vt::ConstantOp>([&](vt::ConstantOp c) {
        declare(c.getResult());
        line() << at(c.getResult(), "0") << " = "
               << floatLiteral(c.getValue().convertToFloat()) << ";\n";
      })
      .Case<vt::RademacherOp, vt::GaussianOp>([&](auto g) {
        const Var &x =
            declareIn(g.getResult(), Kind::Vector, ssaName(g.getResult()));
        const char *fn = llvm::isa<vt::RademacherOp>(op)
                             ? "vflow::rt::rademacherValues"
                             : "vflow::rt::gaussianValues";
        line() << x.name << " = " << fn << "(" << g.getSeed()
               << "ull, static_cast<size_t>("
               << product(Layout::of(g.getResult()).sizes) << "));\n";
      })
      .Case<vt::LiteralOp>([&](vt::LiteralOp l) {
        llvm::ArrayRef<float> values = l.getValues();
        Layout layout = Layout::of(l.getResult());
        if (product(layout.sizes) != std::to_string(values.size()))
          fail("literal size does not match its type");
        const Var &x =
            declareIn(l.getResult(), Kind::Vector, ssaName(l.getResult()));
        std::string table = x.name + "_values";
        line() << "static const float " << table << "[] = {";
        for (size_t i = 0; i < values.size(); ++i)
          os << (i ? ", " : "") << (i % 8 == 0 ? "\n    " : "")
             << floatLiteral(values[i]);
        os << "};\n";
        line() << x.name << ".assign(" << table << ", " << table << " + "
               << values.size() << ");\n";
      });
}

void Emitter::emitLineOp(Operation *op) {
  llvm::TypeSwitch<Operation *>(op)
      .Case<vt::SoftmaxOp>([&](vt::SoftmaxOp s) {
        emitAlongBlock(op, "vk::softmaxLine(");
        os << ", " << at(s.getScale(), "0") << ");\n";
        closeLoops(static_cast<int>(Layout::of(s.getResult()).names.size()) -
                   1);
      })
      .Case<vt::NormalizeOp>([&](vt::NormalizeOp n) {
        emitAlongBlock(op, "vk::normalizeLine(");
        os << ");\n";
        closeLoops(static_cast<int>(Layout::of(n.getResult()).names.size()) -
                   1);
      })
      .Case<vt::ConvOp>([&](vt::ConvOp c) {
        std::string name = ssaName(c.getResult()) + "_weights";
        line() << "static const float " << name << "[] = {";
        llvm::ArrayRef<float> w = c.getWeights();
        for (size_t i = 0; i < w.size(); ++i)
          os << (i ? ", " : "") << floatLiteral(w[i]);
        os << "};\n";
        emitAlongBlock(op, "vk::convLine(");
        os << ", " << name << ", " << w.size() << ");\n";
        closeLoops(static_cast<int>(Layout::of(c.getResult()).names.size()) -
                   1);
      })
      .Case<vt::KthLargestOp>([&](vt::KthLargestOp k) {
        Layout in = Layout::of(k.getInput()), out = Layout::of(k.getResult());
        int b = in.index("block");
        if (b < 0)
          fail("kth_largest needs a block axis");
        declare(k.getResult());
        open("");
        line() << "const int64_t k = vk::roundBudget(" << hostExpr(k.getK())
               << ");\n";
        int n = openLoops(out);
        line() << at(k.getResult(), offsetIn(out, out.names))
               << " = vk::kthLargestLine(" << dataOf(k.getInput()) << " + "
               << paren(offsetIn(in, out.names)) << ", "
               << product(in.sizes, b + 1) << ", N, k);\n";
        closeLoops(n);
        close();
      });
}

void Emitter::emitSplit(vt::SplitOp s) {
  Layout in = Layout::of(s.getInput()), out = Layout::of(s.getResult());
  std::string axis = s.getAxis().str(), outer = s.getOuter().str();
  int pa = in.index(axis), po = out.index(axis);
  if (pa < 0 || po < 0 || out.sizes[po] <= 0)
    fail("split of a missing or symbolic axis");
  std::string stride = product(in.sizes, pa + 1);
  std::vector<std::string> others;
  for (const std::string &name : out.names)
    if (name != axis && name != outer)
      others.push_back(name);
  std::string src = "(" + loopVar(outer) + " * " +
                    std::to_string(out.sizes[po]) + " + " + loopVar(axis) + ")";
  if (stride != "1")
    src += " * " + paren(stride);
  std::string rest = offsetIn(in, others);
  if (rest != "0")
    src = rest + " + " + src;
  declare(s.getResult());
  int n = openLoops(out);
  line() << at(s.getResult(), offsetIn(out, out.names)) << " = "
         << at(s.getInput(), src) << ";\n";
  closeLoops(n);
}

void Emitter::emitRename(vt::RenameOp r) {
  Layout out = Layout::of(r.getResult());
  declare(r.getResult());
  int n = openLoops(out);
  line() << at(r.getResult(), offsetIn(out, out.names)) << " = "
         << at(r.getInput(), offsetIn(Layout::of(r.getInput()), out.names,
                                      {{r.getTo().str(), r.getFrom().str()}}))
         << ";\n";
  closeLoops(n);
}

void Emitter::emitConsts() {
  stage = "const";
  std::string prologue = "  const int64_t D = args->headDim, G = args->group;\n"
                         "  const double *P = args->params;\n"
                         "  (void)D;\n  (void)G;\n  (void)P;\n";
  emitEntryPoint(
      "extern \"C\" void " + symbol("consts") + "(const VflowConstArgs *args)",
      prologue, [&] {
        for (auto c : flow.getBody()->getOps<vt::ConstOp>()) {
          std::string name = c.getSymName().str();
          std::string type;
          llvm::raw_string_ostream ts(type);
          ts << c.getTensorType();
          ts.flush();
          line() << "// const @" << name << " : " << type << "\n";
          computeLastUses(c);
          mlir::Block &body = c.getBody().front();
          emitBlock(body);
          auto yield = llvm::cast<vt::YieldOp>(body.getTerminator());
          storeArray(
              yield.getValues().front(), Layout::of(c.getTensorType()),
              "args->consts[" + std::to_string(constIndex.at(name)) + "]", "");
        }
      });
}

void Emitter::emitCache() {
  stage = "cache";
  std::string prologue = "  const int64_t D = args->headDim, G = args->group;\n"
                         "  const double *P = args->params;\n"
                         "  (void)D;\n  (void)G;\n  (void)P;\n";
  emitEntryPoint("extern \"C\" void " + symbol("cache") +
                     "(const VflowCacheArgs *args)",
                 prologue, [&] {
                   if (vt::CacheStageOp cache = flow.getCacheStage()) {
                     computeLastUses(cache);
                     emitBlock(cache.getBody().front());
                   }
                 });
}

void Emitter::emitIndex() {
  stage = "index";
  vt::IndexStageOp index = flow.getIndexStage();
  if (!index)
    fail("the flow has no index stage");
  std::string prologue = "  const int64_t D = args->headDim, G = args->group, "
                         "N = args->numBlocks;\n"
                         "  const double *P = args->params;\n"
                         "  // Kept first/last blocks are never candidates.\n"
                         "  const vk::Kept kept{N, static_cast<int64_t>(P[" +
                         std::to_string(paramIndex.at("keep_first")) +
                         "]), static_cast<int64_t>(P[" +
                         std::to_string(paramIndex.at("keep_last")) +
                         "])};\n"
                         "  (void)D;\n  (void)G;\n  (void)kept;\n";
  mlir::Block &body = index.getBody().front();
  auto ret = llvm::cast<vt::ReturnOp>(body.getTerminator());
  // The epilogue names the returned selection, known once the body ran.
  std::string epilogue;
  emitEntryPoint(
      "extern \"C\" void " + symbol("index") + "(const VflowIndexArgs *args)",
      prologue,
      [&] {
        computeLastUses(index);
        emitBlock(body);
        // The retain block's score, when the runtime asks for it.
        if (Value score = ret.getRetainScore()) {
          line() << "if (args->retainScore) {\n";
          storeArray(score, Layout::of(score), "args->retainScore", "");
          line() << "}\n";
        }
        epilogue = "  // vt.return\n  vk::storeSelection(" +
                   var(ret.getSelection()).name + ", args);\n";
      },
      epilogue);
}

std::string Emitter::run() {
  os << "// Generated by vflow's CPU backend (vflow::emitCpp) from vt.flow @"
     << flow.getSymName().str() << ".\n";
  os << "// Every value is a row-major f32 array over its IR type's axes;\n";
  os << "// N, G and D are the blocks, the group and the head dimension.\n";
  os << "// params (P):";
  for (auto p : flow.getBody()->getOps<vt::ParamOp>())
    os << " [" << paramIndex.at(p.getSymName().str()) << "] "
       << p.getSymName().str() << (p.getCompileTime() ? " (compile-time)" : "");
  os << "\n";
  os << "#include \"vflow/Runtime/KernelABI.h\"\n";
  os << "#include \"vflow/Runtime/Random.h\"\n\n";
  os << "namespace vk = vflow::kabi;\n\n";
  os << "// A chunk of an entry point's ops: compiled as its own function.\n";
  os << "#define VFLOW_CHUNK [&]() __attribute__((noinline))\n\n";
  emitConsts();
  emitCache();
  emitIndex();
  return os.str();
}

} // namespace

std::string vflow::emitCpp(vt::FlowOp flow, std::string &error) {
  try {
    Emitter emitter(flow);
    return emitter.run();
  } catch (const std::exception &e) {
    error = "cannot emit C++ for flow '" + flow.getSymName().str() +
            "': " + e.what();
    return "";
  }
}

bool vflow::describeCpuFlow(vt::FlowOp flow, rt::CpuFlowInfo &info,
                            std::string &error) {
  info = rt::CpuFlowInfo();
  info.flowName = flow.getSymName().str();
  auto spec = [](const std::string &name, vt::TensorType type) {
    rt::CpuTensorSpec s;
    s.name = name;
    s.dtype = storageDType(type.getElementType());
    Layout l = Layout::of(type);
    s.axes = l.names;
    s.sizes = l.sizes;
    return s;
  };
  for (auto p : flow.getBody()->getOps<vt::ParamOp>())
    info.params.push_back(paramSpecOf(p));
  for (auto c : flow.getBody()->getOps<vt::ConstOp>())
    info.consts.push_back(spec(c.getSymName().str(), c.getTensorType()));
  for (auto f : flow.getBody()->getOps<vt::CacheFieldOp>())
    info.fields.push_back(spec(f.getSymName().str(), f.getTensorType()));
  for (auto s : flow.getBody()->getOps<vt::StateOp>()) {
    rt::CpuTensorSpec state = spec(s.getSymName().str(), s.getTensorType());
    state.init = s.getInit().convertToFloat();
    if (state.axes.size() > 0 && state.axes.front() != "block" &&
        std::find(state.axes.begin(), state.axes.end(), "block") !=
            state.axes.end()) {
      error = "state '" + state.name + "' does not have its block axis first";
      return false;
    }
    info.states.push_back(state);
  }
  vt::IndexStageOp index = flow.getIndexStage();
  if (!index) {
    error = "flow '" + info.flowName + "' has no index stage";
    return false;
  }
  index.walk([&](vt::InputOp in) {
    if (in.getKind() == vt::InputKind::mass)
      info.readsMass = true;
    if (in.getKind() == vt::InputKind::K || in.getKind() == vt::InputKind::V)
      info.readsKV = true;
  });
  FlowBudgets budgets;
  if (!describeBudgets(flow, budgets, error))
    return false;
  info.budgets = std::move(budgets.budgets);
  info.selection = std::move(budgets.selection);
  info.retainBudget = budgets.retainBudget;
  auto ret = llvm::cast<vt::ReturnOp>(index.getBody().front().getTerminator());
  if (auto combine = ret.getCombine()) {
    info.retainCombine = combine->str();
    info.retainTokens =
        llvm::cast<vt::TensorType>(ret.getRetainScore().getType())
            .hasAxis("token");
  }
  return true;
}
