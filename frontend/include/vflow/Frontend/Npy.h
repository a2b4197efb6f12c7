//===- Npy.h - Reading NumPy .npy files -------------------------*- C++ -*-===//

#ifndef VFLOW_FRONTEND_NPY_H
#define VFLOW_FRONTEND_NPY_H

#include "vflow/Runtime/Limits.h"

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
/// and unsigned integers up to 8 bytes, bool; C or Fortran order). The header
/// must be the Python dict literal of the NPY format with exactly the keys
/// 'descr', 'fortran_order' and 'shape' (a tuple of non-negative ints); the
/// element count must be at most `maxElements` (checked before anything is
/// allocated) and the file must hold exactly the bytes the header describes.
/// Bool entries must be 0 or 1. Returns false with a one-line reason that
/// names the file in `error`. Time and memory are linear in the file size.
bool readNpy(const std::string &path, NpyArray &out, std::string &error,
             int64_t maxElements = limits::kMaxLiteralElements);

/// The header check alone, for tests: parses the header text of a .npy file
/// (the dict literal and its padding). Returns false with the reason.
struct NpyHeader {
  char byteOrder = '<'; ///< '<', '>' or '|'.
  char kind = 'f';      ///< 'f', 'i', 'u' or 'b'.
  int itemSize = 4;
  bool fortranOrder = false;
  std::vector<int64_t> shape;
};
bool parseNpyHeader(const std::string &header, NpyHeader &out,
                    std::string &error);

} // namespace vflow

#endif // VFLOW_FRONTEND_NPY_H
