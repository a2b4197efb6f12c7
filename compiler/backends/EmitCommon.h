//===- EmitCommon.h - What the C++ and CUDA emitters share -------*- C++
//-*-===//
//
// Axis layouts of vt tensors, size and literal spelling, param values and
// the f64 host form of budget expressions, for the CPU (CppEmitter.cpp) and
// CUDA (CudaEmitter.cpp) backends.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_COMPILER_BACKENDS_EMITCOMMON_H
#define VFLOW_COMPILER_BACKENDS_EMITCOMMON_H

#include "vflow/Dialect/VT/VTOps.h"
#include "vflow/Runtime/Names.h"

#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/TypeSwitch.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace vflow::emit {

using mlir::Operation;
using mlir::Value;

[[noreturn]] inline void fail(const std::string &message) {
  throw std::runtime_error(message);
}

/// The ABI index of the `what` (param, const, field, state) named `name`;
/// fails when the flow declares none.
inline int symbolIndex(const std::map<std::string, int> &index,
                       const std::string &what, const std::string &name) {
  auto it = index.find(name);
  if (it == index.end())
    fail("unknown " + what + " " + name);
  return it->second;
}

/// `text` (an op as printed) on one line, cut after `limit` characters: the
/// text of a `// ...` comment in generated code.
inline std::string oneLineText(std::string text, size_t limit) {
  for (char &c : text)
    if (c == '\n')
      c = ' ';
  if (text.size() > limit)
    text = text.substr(0, limit) + " ...";
  return text;
}

/// How both backends spell a reduce kind: its accumulator ("Sum" for
/// vd::Sum and vk::accSum, ...) and its finish (NumericRules'
/// finishPlain, finishMean, finishL2).
struct ReduceSpelling {
  const char *acc, *finish;
};
inline ReduceSpelling reduceSpelling(vt::ReduceKind kind) {
  switch (kind) {
  case vt::ReduceKind::sum:
    return {"Sum", "finishPlain"};
  case vt::ReduceKind::mean:
    return {"Sum", "finishMean"};
  case vt::ReduceKind::max:
    return {"Max", "finishPlain"};
  case vt::ReduceKind::min:
    return {"Min", "finishPlain"};
  case vt::ReduceKind::l2norm:
    return {"Squares", "finishL2"};
  }
  fail("unknown reduce kind");
}

/// A value's axes in memory order.
struct Layout {
  std::vector<std::string> names;
  std::vector<int64_t> sizes;

  static Layout of(vt::TensorType type) {
    Layout l;
    for (vt::AxisAttr a : type.getAxes()) {
      l.names.push_back(a.getName().str());
      l.sizes.push_back(a.getSize());
    }
    return l;
  }
  static Layout of(Value v) { return of(v.getType().cast<vt::TensorType>()); }
  int index(const std::string &name) const {
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == name)
        return static_cast<int>(i);
    return -1;
  }
  bool operator==(const Layout &o) const {
    return names == o.names && sizes == o.sizes;
  }
};

/// A size in generated code: the number, or N, G or D, the generated code's
/// names for the symbolic sizes, which are spelled as vt spells them.
inline std::string sizeName(int64_t size) { return vt::formatAxisSize(size); }

/// The product of sizes[from..] as C++ ("1" when empty).
inline std::string product(const std::vector<int64_t> &sizes, size_t from = 0) {
  int64_t constant = 1;
  std::string symbols;
  for (size_t i = from; i < sizes.size(); ++i) {
    if (sizes[i] > 0) {
      constant *= sizes[i];
      continue;
    }
    symbols += (symbols.empty() ? "" : " * ") + sizeName(sizes[i]);
  }
  if (symbols.empty())
    return std::to_string(constant);
  if (constant == 1)
    return symbols;
  return std::to_string(constant) + " * " + symbols;
}

inline std::string paren(const std::string &s) {
  return s.find(' ') == std::string::npos ? s : "(" + s + ")";
}

inline std::string loopVar(const std::string &axis) {
  std::string out = "i_";
  for (char c : axis)
    out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

/// A float as an exact C++ literal.
/// `device`: spelled for FlowDevice.cuh (vd::) rather than KernelABI.h.
inline std::string floatLiteral(float f, bool device = false) {
  if (std::isnan(f))
    return device ? "vd::nan()" : "vk::kNaN";
  if (std::isinf(f))
    return device ? (f > 0 ? "vd::inf()" : "-vd::inf()")
                  : (f > 0 ? "vk::kInf" : "-vk::kInf");
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.9g", double(f));
  std::string s = buffer;
  if (s.find_first_of(".e") == std::string::npos)
    s += ".0";
  return s + "f";
}

inline std::string roundFunction(mlir::Type type) {
  if (type.isBF16())
    return "vk::roundBF16";
  if (type.isF16())
    return "vk::roundF16";
  if (type.isFloat8E4M3FN())
    return "vk::roundFP8E4M3";
  if (type.isFloat8E5M2())
    return "vk::roundFP8E5M2";
  return "";
}

inline double paramValue(vt::ParamOp param) {
  mlir::Attribute a = param.getValue();
  if (auto i = a.dyn_cast<mlir::IntegerAttr>())
    return i.getType().isInteger(1) ? double(i.getValue().getBoolValue())
                                    : double(i.getInt());
  if (auto f = a.dyn_cast<mlir::FloatAttr>())
    return f.getValueAsDouble();
  if (auto b = a.dyn_cast<mlir::BoolAttr>())
    return b.getValue();
  return 0;
}

/// The element function (KernelABI.h's vk::, FlowDevice.cuh's vd::) that
/// computes an elementwise op, or "" for other ops.
inline std::string elementFunction(Operation *op) {
  if (auto c = llvm::dyn_cast<vt::CmpOp>(op)) {
    // The function of each predicate, in CmpPredicate's order.
    static const char *const compare[] = {"cmpLt", "cmpLe", "cmpGt",
                                          "cmpGe", "cmpEq", "cmpNe"};
    static_assert(std::size(compare) == vt::getMaxEnumValForCmpPredicate() + 1,
                  "one function per CmpPredicate");
    return rt::nameOf(compare, c.getPredicate(), "");
  }
  return llvm::TypeSwitch<Operation *, std::string>(op)
      .Case<vt::AddOp>([](auto) { return "add"; })
      .Case<vt::SubOp>([](auto) { return "sub"; })
      .Case<vt::MulOp>([](auto) { return "mul"; })
      .Case<vt::DivOp>([](auto) { return "div"; })
      .Case<vt::PowOp>([](auto) { return "pow"; })
      .Case<vt::MaximumOp>([](auto) { return "maximum"; })
      .Case<vt::MinimumOp>([](auto) { return "minimum"; })
      .Case<vt::AndOp>([](auto) { return "logicalAnd"; })
      .Case<vt::OrOp>([](auto) { return "logicalOr"; })
      .Case<vt::NegOp>([](auto) { return "neg"; })
      .Case<vt::NotOp>([](auto) { return "logicalNot"; })
      .Case<vt::ExpOp>([](auto) { return "exp"; })
      .Case<vt::LogOp>([](auto) { return "log"; })
      .Case<vt::SqrtOp>([](auto) { return "sqrt"; })
      .Case<vt::RsqrtOp>([](auto) { return "rsqrt"; })
      .Case<vt::AbsOp>([](auto) { return "abs"; })
      .Case<vt::ReluOp>([](auto) { return "relu"; })
      .Case<vt::SigmoidOp>([](auto) { return "sigmoid"; })
      .Case<vt::SiluOp>([](auto) { return "silu"; })
      .Case<vt::TanhOp>([](auto) { return "tanh"; })
      .Case<vt::HashOp>([](auto) { return "hash01"; })
      .Case<vt::ClampOp>([](auto) { return "clamp"; })
      .Case<vt::WhereOp>([](auto) { return "where"; })
      .Default([](Operation *) { return ""; });
}

/// An emitter's generated source, written a line at a time at the current
/// nesting depth (two spaces per level).
struct CodeWriter {
  std::ostringstream os;
  int depth = 0;

  /// Starts a line at the current depth.
  std::ostream &line() {
    for (int i = 0; i < depth; ++i)
      os << "  ";
    return os;
  }
  /// Writes `text {` (or `{` when text is empty) and goes one level deeper.
  void open(const std::string &text) {
    line() << text << (text.empty() ? "{\n" : " {\n");
    ++depth;
  }
  /// Comes back one level and writes `}` and `suffix`.
  void close(const std::string &suffix = "") {
    --depth;
    line() << "}" << suffix << "\n";
  }
};

/// A flow's symbols in declaration order (their index in the ABI's arrays)
/// and their types; fails unless the flow has keep_first and keep_last.
struct FlowSymbols {
  std::map<std::string, int> paramIndex, constIndex, fieldIndex, stateIndex;
  std::map<std::string, vt::TensorType> constTypes, fieldTypes, stateTypes;

  explicit FlowSymbols(vt::FlowOp flow) {
    int i = 0;
    for (auto p : flow.getBody()->getOps<vt::ParamOp>())
      paramIndex[p.getSymName().str()] = i++;
    i = 0;
    for (auto c : flow.getBody()->getOps<vt::ConstOp>()) {
      constIndex[c.getSymName().str()] = i++;
      constTypes[c.getSymName().str()] = c.getTensorType();
    }
    i = 0;
    for (auto f : flow.getBody()->getOps<vt::CacheFieldOp>()) {
      fieldIndex[f.getSymName().str()] = i++;
      fieldTypes[f.getSymName().str()] = f.getTensorType();
    }
    i = 0;
    for (auto s : flow.getBody()->getOps<vt::StateOp>()) {
      stateIndex[s.getSymName().str()] = i++;
      stateTypes[s.getSymName().str()] = s.getTensorType();
    }
    for (const char *name : {"keep_first", "keep_last"})
      if (!paramIndex.count(name))
        fail(std::string("the flow has no '") + name + "' param");
  }
};

/// How the generated code spells the host inputs a budget reads (the group
/// is `G` on both backends).
struct HostInputs {
  std::string numBlocks, contextLen, layer, kvHead;
};

/// The f64 host evaluation of a budget's definition (params read from
/// `P[i]`); `device` spells it for FlowDevice.cuh, which evaluates the same
/// expression on the GPU with the same IEEE f64 operations. `named`, if
/// given, names values computed elsewhere ("" for the others): the
/// expression stops there.
inline std::string
hostExpr(Value v, const std::map<std::string, int> &paramIndex,
         const HostInputs &inputs, bool device,
         const std::function<std::string(Value)> &named = nullptr) {
  if (named) {
    std::string name = named(v);
    if (!name.empty())
      return name;
  }
  Operation *op = v.getDefiningOp();
  if (!op)
    fail("a budget is not defined by an op");
  if (auto k = llvm::dyn_cast<vt::KernelOp>(op)) {
    auto yield = llvm::cast<vt::YieldOp>(k.getBody().front().getTerminator());
    unsigned i = v.cast<mlir::OpResult>().getResultNumber();
    return hostExpr(yield.getValues()[i], paramIndex, inputs, device, named);
  }
  auto bin = [&](const char *fmt) {
    std::string a =
        hostExpr(op->getOperand(0), paramIndex, inputs, device, named);
    std::string b =
        hostExpr(op->getOperand(1), paramIndex, inputs, device, named);
    std::string f = fmt;
    if (f.size() == 1)
      return "(" + a + " " + f + " " + b + ")";
    return f + "(" + a + ", " + b + ")";
  };
  return llvm::TypeSwitch<Operation *, std::string>(op)
      .Case<vt::ConstantOp>([&](vt::ConstantOp c) {
        return "double(" + floatLiteral(c.getValue().convertToFloat(), device) +
               ")";
      })
      .Case<vt::ParamLoadOp>([&](vt::ParamLoadOp p) {
        return "P[" +
               std::to_string(
                   symbolIndex(paramIndex, "param", p.getParam().str())) +
               "]";
      })
      .Case<vt::InputOp>([&](vt::InputOp in) {
        if (in.getKind() == vt::InputKind::num_blocks)
          return inputs.numBlocks;
        if (in.getKind() == vt::InputKind::context_len)
          return inputs.contextLen;
        if (in.getKind() == vt::InputKind::layer)
          return inputs.layer;
        if (in.getKind() == vt::InputKind::kv_head)
          return inputs.kvHead;
        if (in.getKind() == vt::InputKind::group)
          return std::string("double(G)"); // both backends' group size
        fail("a budget reads a device input");
      })
      .Case<vt::AddOp>([&](auto) { return bin("+"); })
      .Case<vt::SubOp>([&](auto) { return bin("-"); })
      .Case<vt::MulOp>([&](auto) { return bin("*"); })
      .Case<vt::DivOp>([&](auto) { return bin("/"); })
      .Case<vt::MaximumOp>(
          [&](auto) { return bin(device ? "vd::dmax" : "std::max<double>"); })
      .Case<vt::MinimumOp>(
          [&](auto) { return bin(device ? "vd::dmin" : "std::min<double>"); })
      .Default([](Operation *o) -> std::string {
        fail("a budget uses " + o->getName().getStringRef().str() +
             ", which the host cannot evaluate");
      });
}

/// hostExpr(v, ...) with text linear in the size of v's definition: when the
/// definition shares values (a let read twice) or is long, it becomes an
/// immediately called lambda with one `const double` per value, in
/// dependency order (as a plain expression, sharing would repeat each shared
/// value's text, exponentially in the number of lets). Small trees stay
/// plain expressions.
inline std::string hostExprLinear(Value v,
                                  const std::map<std::string, int> &paramIndex,
                                  const HostInputs &inputs, bool device) {
  // Kernel results stand for what their kernel yields.
  auto through = [](Value x) {
    while (auto k = llvm::dyn_cast_or_null<vt::KernelOp>(x.getDefiningOp())) {
      auto yield = llvm::cast<vt::YieldOp>(k.getBody().front().getTerminator());
      x = yield.getValues()[x.cast<mlir::OpResult>().getResultNumber()];
    }
    return x;
  };
  // Post-order of the definition, without recursion.
  std::vector<Value> order;
  llvm::DenseMap<Value, int> uses;
  std::vector<std::pair<Value, bool>> stack = {{through(v), false}};
  while (!stack.empty()) {
    auto [x, expanded] = stack.back();
    stack.pop_back();
    if (expanded) {
      order.push_back(x);
      continue;
    }
    if (uses[x]++ > 0)
      continue;
    stack.push_back({x, true});
    if (Operation *op = x.getDefiningOp())
      if (!llvm::isa<vt::ConstantOp, vt::ParamLoadOp, vt::InputOp>(op))
        for (Value operand : op->getOperands())
          stack.push_back({through(operand), false});
  }
  bool shared = false;
  for (auto &entry : uses)
    shared |= entry.second > 1;
  if (!shared && order.size() <= 32)
    return hostExpr(v, paramIndex, inputs, device);
  llvm::DenseMap<Value, std::string> names;
  std::string body;
  for (Value x : order) {
    std::string text = hostExpr(x, paramIndex, inputs, device, [&](Value y) {
      y = through(y);
      auto it = names.find(y);
      return it == names.end() ? std::string() : it->second;
    });
    std::string name = "h" + std::to_string(names.size());
    body += "const double " + name + " = " + text + "; ";
    names[x] = name;
  }
  return "([&]() { " + body + "return " + names[through(v)] + "; }())";
}

} // namespace vflow::emit

#endif // VFLOW_COMPILER_BACKENDS_EMITCOMMON_H
