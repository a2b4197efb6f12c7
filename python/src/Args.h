//===- Args.h - Python arguments checked in C++ -----------------*- C++ -*-===//
//
// The bindings' checks of Python values, with the messages of
// vflow/_check.py (which checks the Python API's own arguments): a
// TypeError for the wrong type, a ValueError for a value out of range,
// each naming the argument.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_PYTHON_ARGS_H
#define VFLOW_PYTHON_ARGS_H

#include "vflow/Runtime/DType.h"

#include <pybind11/pybind11.h>

#include <limits>
#include <string>

namespace vflow::python {

namespace py = pybind11;

/// "float 2.5": the type and value of `v`, as messages show it.
inline std::string describe(const py::handle &v) {
  return std::string(py::str(py::type::of(v).attr("__name__"))) + " " +
         std::string(py::repr(v)).substr(0, 40);
}

/// The integer `v` names (`name` in the messages): a Python int or an
/// object with __index__ (numpy's integers), not a bool, float or string
/// (TypeError), within [lo, hi] (ValueError). The messages are those of
/// vflow/_check.py's integer(), which checks the Python API's other ints.
template <typename T>
T intArg(const py::handle &v, const std::string &name,
         T lo = std::numeric_limits<T>::min(),
         T hi = std::numeric_limits<T>::max()) {
  if (py::isinstance<py::bool_>(v) || !PyIndex_Check(v.ptr()))
    throw py::type_error(name + ": expected an int, got " + describe(v));
  py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(v.ptr()));
  if (!i)
    throw py::error_already_set();
  const py::int_ low(lo), high(hi);
  if (i < low || i > high) {
    const std::string range = hi == std::numeric_limits<T>::max() && i < low
                                  ? "must be >= " + std::to_string(lo)
                                  : "must be between " + std::to_string(lo) +
                                        " and " + std::to_string(hi);
    throw py::value_error(name + ": " + std::string(py::str(i)) +
                          " is out of range (" + range + ")");
  }
  return i.cast<T>();
}

/// A real number (int or float, not a bool): TypeError otherwise.
inline double floatArg(const py::handle &v, const std::string &name) {
  if (py::isinstance<py::bool_>(v) ||
      !(py::isinstance<py::float_>(v) || PyIndex_Check(v.ptr())))
    throw py::type_error(name + ": expected a number, got " + describe(v));
  const double d = PyFloat_AsDouble(v.ptr());
  if (d == -1.0 && PyErr_Occurred())
    throw py::error_already_set(); // an int too large for a double
  return d;
}

inline bool boolArg(const py::handle &v, const std::string &name) {
  if (!py::isinstance<py::bool_>(v))
    throw py::type_error(name + ": expected a bool, got " + describe(v));
  return v.cast<bool>();
}

/// A dtype by its name (the language's: f32, bf16, f16, fp8e4m3,
/// fp8e5m2); which of them a backend stores K/V in is the session's check.
inline rt::DType dtypeArg(const py::handle &v, const std::string &name) {
  if (!py::isinstance<py::str>(v))
    throw py::type_error(name + ": expected a str, got " + describe(v));
  const std::string text = v.cast<std::string>();
  std::optional<rt::DType> t = rt::parseDType(text);
  if (!t)
    throw py::value_error(name + ": '" + text +
                          "' is not a dtype (f32, bf16, f16, fp8e4m3, "
                          "fp8e5m2 or int8)");
  return *t;
}

/// Whether `text` names the CUDA device ("cuda") rather than the CPU
/// ("cpu"); anything else is a ValueError naming `name`.
inline bool isCuda(const std::string &text, const std::string &name) {
  if (text != "cpu" && text != "cuda")
    throw py::value_error(name + ": '" + text + "' is not a " + name +
                          " (cpu or cuda)");
  return text == "cuda";
}

} // namespace vflow::python

#endif // VFLOW_PYTHON_ARGS_H
