//===- VTTypes.cpp - vTensor types and attributes -------------------------===//
//
// Parsing, printing and verification of `#vt.axis`, `!vt.tensor` and
// `!vt.selection`, and the TensorType helpers.
//
//===----------------------------------------------------------------------===//

#include "vflow/Dialect/VT/VTOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallSet.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;

#include "vflow/Dialect/VT/VTEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "vflow/Dialect/VT/VTAttrs.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "vflow/Dialect/VT/VTTypes.cpp.inc"

namespace vflow::vt {

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

bool isValidElementType(Type type) {
  return type && (type.isF32() || type.isBF16() || type.isF16() ||
                  type.isFloat8E4M3FN() || type.isFloat8E5M2());
}

/// Parses a positive integer or one of N, G, D.
static ParseResult parseAxisSize(AsmParser &parser, int64_t &size) {
  OptionalParseResult intResult = parser.parseOptionalInteger(size);
  if (intResult.has_value())
    return *intResult;
  SMLoc loc = parser.getCurrentLocation();
  StringRef keyword;
  if (succeeded(parser.parseOptionalKeyword(&keyword))) {
    if (keyword == "N") {
      size = kSizeBlocks;
      return success();
    }
    if (keyword == "G") {
      size = kSizeGroup;
      return success();
    }
    if (keyword == "D") {
      size = kSizeHeadDim;
      return success();
    }
  }
  return parser.emitError(
      loc, "expected an axis size: a positive integer, N, G or D");
}

/// True when `name` would not lex back as a bare keyword (integer type
/// names such as `i8` lex as types).
static bool needsQuotes(StringRef name) {
  if (name.empty())
    return true;
  if (!(llvm::isAlpha(name.front()) || name.front() == '_'))
    return true;
  if (!llvm::all_of(name, [](char c) {
        return llvm::isAlnum(c) || c == '_' || c == '$' || c == '.';
      }))
    return true;
  StringRef digits = name;
  if (digits.consume_front("si") || digits.consume_front("ui") ||
      digits.consume_front("i"))
    return !digits.empty() && llvm::all_of(digits, llvm::isDigit);
  return false;
}

void printAxisName(AsmPrinter &printer, StringRef name) {
  if (!needsQuotes(name)) {
    printer << name;
    return;
  }
  printer << '"';
  llvm::printEscapedString(name, printer.getStream());
  printer << '"';
}

//===----------------------------------------------------------------------===//
// AxisAttr
//===----------------------------------------------------------------------===//

LogicalResult AxisAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                               StringRef name, int64_t size) {
  if (name.empty())
    return emitError() << "axis name must not be empty";
  if (!isValidAxisSize(size))
    return emitError() << "invalid size " << size << " of axis '" << name
                       << "': expected a positive integer, N, G or D";
  return success();
}

Attribute AxisAttr::parse(AsmParser &parser, Type) {
  SMLoc loc = parser.getCurrentLocation();
  std::string name;
  int64_t size = 0;
  if (parser.parseLess() || parser.parseString(&name) || parser.parseComma() ||
      parseAxisSize(parser, size) || parser.parseGreater())
    return {};
  return AxisAttr::getChecked([&] { return parser.emitError(loc); },
                              parser.getContext(), name, size);
}

void AxisAttr::print(AsmPrinter &printer) const {
  printer << "<\"";
  llvm::printEscapedString(getName(), printer.getStream());
  printer << "\", " << formatAxisSize(getSize()) << '>';
}

//===----------------------------------------------------------------------===//
// LaunchAttr
//===----------------------------------------------------------------------===//

LogicalResult LaunchAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                 LaunchGrid grid, int64_t threads,
                                 int64_t tileBlocks) {
  if (threads < 32 || threads > 1024 || threads % 32 != 0)
    return emitError() << "threads must be a multiple of 32 in 32..1024, got "
                       << threads;
  if (grid == LaunchGrid::tile && tileBlocks < 1)
    return emitError() << "a tile launch needs tile_blocks >= 1, got "
                       << tileBlocks;
  if (grid != LaunchGrid::tile && tileBlocks != 0)
    return emitError() << "tile_blocks is only for a tile launch, not "
                       << stringifyLaunchGrid(grid);
  return success();
}

//===----------------------------------------------------------------------===//
// TensorType
//===----------------------------------------------------------------------===//

LogicalResult TensorType::verify(function_ref<InFlightDiagnostic()> emitError,
                                 ArrayRef<AxisAttr> axes, Type elementType) {
  llvm::SmallSet<StringRef, 8> seen;
  for (AxisAttr axis : axes) {
    if (!axis)
      return emitError() << "null axis";
    if (failed(AxisAttr::verify(emitError, axis.getName(), axis.getSize())))
      return failure();
    if (!seen.insert(axis.getName()).second)
      return emitError() << "duplicate axis name '" << axis.getName() << "'";
  }
  if (!isValidElementType(elementType))
    return emitError()
           << "element type must be f32, bf16, f16, f8E4M3FN or f8E5M2, got "
           << elementType;
  return success();
}

Type TensorType::parse(AsmParser &parser) {
  MLIRContext *context = parser.getContext();
  SMLoc typeLoc = parser.getCurrentLocation();
  SmallVector<AxisAttr> axes;
  if (parser.parseLess() || parser.parseLSquare())
    return {};
  if (failed(parser.parseOptionalRSquare())) {
    do {
      SMLoc loc = parser.getCurrentLocation();
      std::string name;
      int64_t size = 0;
      if (parser.parseKeywordOrString(&name) || parser.parseColon() ||
          parseAxisSize(parser, size))
        return {};
      AxisAttr axis = AxisAttr::getChecked(
          [&] { return parser.emitError(loc); }, context, name, size);
      if (!axis)
        return {};
      axes.push_back(axis);
    } while (succeeded(parser.parseOptionalComma()));
    if (parser.parseRSquare())
      return {};
  }
  Type elementType;
  if (parser.parseComma() || parser.parseType(elementType))
    return {};
  if (parser.parseGreater())
    return {};
  return TensorType::getChecked([&] { return parser.emitError(typeLoc); },
                                context, axes, elementType);
}

void TensorType::print(AsmPrinter &printer) const {
  printer << "<[";
  llvm::interleaveComma(getAxes(), printer, [&](AxisAttr axis) {
    printAxisName(printer, axis.getName());
    printer << ':' << formatAxisSize(axis.getSize());
  });
  printer << "], " << getElementType() << '>';
}

AxisAttr TensorType::getAxis(StringRef name) const {
  for (AxisAttr axis : getAxes())
    if (axis.getName() == name)
      return axis;
  return {};
}

bool TensorType::hasAxis(StringRef name) const {
  return static_cast<bool>(getAxis(name));
}

std::optional<int64_t> TensorType::getAxisSize(StringRef name) const {
  if (AxisAttr axis = getAxis(name))
    return axis.getSize();
  return std::nullopt;
}

SmallVector<StringRef> TensorType::getAxisNames() const {
  return llvm::to_vector(
      llvm::map_range(getAxes(), [](AxisAttr axis) { return axis.getName(); }));
}

bool TensorType::hasStaticShape() const {
  return llvm::all_of(getAxes(), [](AxisAttr axis) { return axis.isStatic(); });
}

int64_t TensorType::getNumElements() const {
  int64_t count = 1;
  for (AxisAttr axis : getAxes())
    count *= axis.getSize();
  return count;
}

bool TensorType::hasSameAxes(TensorType other) const {
  if (getRank() != other.getRank())
    return false;
  return llvm::all_of(getAxes(), [&](AxisAttr axis) {
    return other.getAxisSize(axis.getName()) == axis.getSize();
  });
}

TensorType TensorType::withElementType(Type elementType) const {
  return get(getContext(), getAxes(), elementType);
}

TensorType TensorType::withAxes(ArrayRef<AxisAttr> axes) const {
  return get(getContext(), axes, getElementType());
}

TensorType TensorType::withoutAxes(ArrayRef<StringRef> names) const {
  SmallVector<AxisAttr> kept;
  for (AxisAttr axis : getAxes())
    if (!llvm::is_contained(names, axis.getName()))
      kept.push_back(axis);
  return withAxes(kept);
}

TensorType TensorType::getScalar(MLIRContext *context, Type elementType) {
  if (!elementType)
    elementType = Float32Type::get(context);
  return get(context, {}, elementType);
}

//===----------------------------------------------------------------------===//
// Registration
//===----------------------------------------------------------------------===//

void VTDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "vflow/Dialect/VT/VTAttrs.cpp.inc"
      >();
}

void VTDialect::registerTypes() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "vflow/Dialect/VT/VTTypes.cpp.inc"
      >();
}

} // namespace vflow::vt
