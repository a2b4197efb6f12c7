//===- CudaBlas.h - cuBLAS, loaded at run time -----------------*- C++ -*-===//
//
// Private to the engine's GPU runner (CudaModel.cu, CudaMoe.cu): cuBLAS's
// entry points the runner uses, found with dlopen when the first CUDA
// model is made (as NVRTC is), so the package imports on machines without
// it.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_MODEL_CUDABLAS_H
#define VFLOW_MODEL_CUDABLAS_H

#include "vflow/Runtime/Error.h"

#include <cublas_v2.h>
#include <dlfcn.h>

#include <string>

namespace vflow::model::detail {

struct Blas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) setStream = nullptr;
  cublasStatus_t (*gemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                           int, int, int, const void *, const void *,
                           cudaDataType, int, const void *, cudaDataType, int,
                           const void *, void *, cudaDataType, int,
                           cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  cublasStatus_t (*gemmBatched)(cublasHandle_t, cublasOperation_t,
                                cublasOperation_t, int, int, int, const void *,
                                const void *, cudaDataType, int, long long,
                                const void *, cudaDataType, int, long long,
                                const void *, void *, cudaDataType, int,
                                long long, int, cublasComputeType_t,
                                cublasGemmAlgo_t) = nullptr;

  static const Blas &get() {
    static Blas blas = load();
    return blas;
  }

private:
  static Blas load() {
    void *lib = nullptr;
    for (const char *name :
         {"libcublas.so.13", "libcublas.so.12", "libcublas.so"})
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)))
        break;
    if (!lib)
      throw rt::Error("model runner (CUDA): cuBLAS (libcublas.so) was not "
                      "found; install the CUDA toolkit's cuBLAS or add its "
                      "directory to LD_LIBRARY_PATH");
    Blas b;
    auto sym = [&](const char *name) {
      void *f = dlsym(lib, name);
      if (!f)
        throw rt::Error(std::string("model runner (CUDA): cuBLAS lacks ") +
                        name);
      return f;
    };
    b.create = reinterpret_cast<decltype(b.create)>(sym("cublasCreate_v2"));
    b.destroy = reinterpret_cast<decltype(b.destroy)>(sym("cublasDestroy_v2"));
    b.setStream =
        reinterpret_cast<decltype(b.setStream)>(sym("cublasSetStream_v2"));
    b.gemmEx = reinterpret_cast<decltype(b.gemmEx)>(sym("cublasGemmEx"));
    b.gemmBatched = reinterpret_cast<decltype(b.gemmBatched)>(
        sym("cublasGemmStridedBatchedEx"));
    return b;
  }
};

inline void checkBlas(cublasStatus_t status, const char *what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw rt::Error(std::string("model runner (cuBLAS): ") + what +
                    ": status " + std::to_string(int(status)));
}

} // namespace vflow::model::detail

#endif // VFLOW_MODEL_CUDABLAS_H
