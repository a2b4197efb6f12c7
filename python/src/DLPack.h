//===- DLPack.h - The DLPack tensor ABI, as the bindings read it -*- C++
//-*-===//
//
// The C structs of the DLPack exchange format (unversioned DLManagedTensor,
// what `__dlpack__()` returns in a "dltensor" capsule by default), written
// out from the public specification: numpy, torch and CuPy all export it.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_PYTHON_DLPACK_H
#define VFLOW_PYTHON_DLPACK_H

#include <cstdint>

namespace vflow::python::dlpack {

enum DeviceType : int32_t {
  kCPU = 1,
  kCUDA = 2,
  kCUDAHost = 3,
  kCUDAManaged = 13,
};

struct Device {
  int32_t deviceType;
  int32_t deviceId;
};

enum TypeCode : uint8_t {
  kInt = 0,
  kUInt = 1,
  kFloat = 2,
  kOpaqueHandle = 3,
  kBfloat = 4,
  kComplex = 5,
  kBool = 6,
};

struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct Tensor {
  void *data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t *shape;
  int64_t *strides; ///< In elements; null means compact row-major.
  uint64_t byteOffset;
};

struct ManagedTensor {
  Tensor tensor;
  void *managerContext;
  void (*deleter)(ManagedTensor *self);
};

} // namespace vflow::python::dlpack

#endif // VFLOW_PYTHON_DLPACK_H
