//===- CudaModelAbsent.cpp - CudaModel in a build without CUDA ------------===//
//
// A build without the CUDA toolkit (VFLOW_ENABLE_CUDA off) has no
// CudaModel.cu; ModelRunner refuses device "cuda" before it would make one,
// so none of these runs. They exist so the runner links (its calls into the
// GPU half are compiled in every build) and say why if one ever did run.
//
//===----------------------------------------------------------------------===//

#include "CudaModel.h"

#include "vflow/Runtime/Error.h"

using namespace vflow;
using namespace vflow::model;

namespace {

[[noreturn]] void absent() {
  throw rt::Error("model runner: this build has no CUDA; use device \"cpu\"");
}

} // namespace

struct CudaModel::Impl {};

CudaModel::CudaModel(const ModelWeights &, const ModelConfig &, int) {
  absent();
}

CudaModel::~CudaModel() = default;

void *CudaModel::stream() const { absent(); }

void CudaModel::forward(const std::vector<int32_t> &,
                        const std::vector<int64_t> &,
                        const std::vector<int64_t> &, const Attend &,
                        ForwardTimes &, const std::vector<RowSampling> *,
                        std::vector<float> *, std::vector<int32_t> *) {
  absent();
}

bool CudaModel::decodeStep(const std::vector<int32_t> &,
                           const std::vector<int64_t> &,
                           const std::vector<RowSampling> &,
                           const rt::StepKey &, const Attend &, ForwardTimes &,
                           std::vector<int32_t> &) {
  absent();
}
