//===- Npy.h - Reading NumPy .npy files -------------------------*- C++ -*-===//

#ifndef VFLOW_FRONTEND_NPY_H
#define VFLOW_FRONTEND_NPY_H

#include <cstdint>
#include <string>
#include <vector>

namespace vflow {

/// A .npy array converted to f32, row-major (C order).
struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

/// Reads a .npy file (format 1.0-3.0; little- or big-endian f2/f4/f8, signed
/// and unsigned integers up to 8 bytes, bool; C or Fortran order). Returns
/// false with a one-line reason in `error`.
bool readNpy(const std::string &path, NpyArray &out, std::string &error);

} // namespace vflow

#endif // VFLOW_FRONTEND_NPY_H
