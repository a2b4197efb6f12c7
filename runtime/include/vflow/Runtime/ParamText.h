//===- ParamText.h - Param overrides written as text ------------*- C++ -*-===//
//
// The one syntax of a param given as text: vflowc's and the vflow CLI's -p,
// Python's string params, and the checker's overrides all read it here.
// Part of VFlowText (with Json and DType names), which the front end links
// without the rest of the runtime.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_PARAMTEXT_H
#define VFLOW_RUNTIME_PARAMTEXT_H

#include <string>

namespace vflow::rt {

/// The names of the types a param may have, as artifacts record them (in
/// the order of the frontend's ParamType).
inline constexpr const char *kParamTypeNames[] = {"int", "float", "bool"};

/// The one syntax of a param override written as text, NAME=VALUE (vflowc
/// -p, the vflow CLI's -p, where VALUE may be a comma-separated sweep, and
/// string values in Python's params): the text splits at its first '=';
/// blanks (spaces and tabs, also newlines, vertical tabs, form feeds and
/// carriage returns) around NAME and around VALUE are ignored. Returns false
/// with `why` when there is no '='. Whether NAME is a valid name, a flow's
/// param, and VALUE one of its values is the compiler's to check.
bool splitParamSpec(const std::string &text, std::string &name,
                    std::string &value, std::string &why);

/// A param value as text, the syntax the compiler reads (blanks around it
/// ignored, as splitParamSpec): `true` or `false` (Bool); an integer, digits
/// with an optional sign (Int, exact; beyond 2^53 it is a Float, which an
/// int param refuses as out of range); or a finite decimal number as strtod
/// reads it, without hexadecimal, inf or nan (Float). Returns false with
/// `why` otherwise.
struct ParamValue {
  enum class Kind { Bool, Int, Float } kind = Kind::Float;
  double value = 0;
};
bool parseParamValue(const std::string &text, ParamValue &out,
                     std::string &why);

} // namespace vflow::rt

#endif // VFLOW_RUNTIME_PARAMTEXT_H
