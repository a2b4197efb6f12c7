//===- LongFlowTest.cpp - Long programs through the CUDA backend ----------===//
//
// The CUDA emitter must be linear in a flow's size and must not recurse
// deeply: a long chain of lets is cut into materialized values (no emitted
// expression holds more than a constant number of ops), memory offsets are
// named constants, and a dead value's slot is reused. Checked beyond the
// driver's op limit (the programs are lowered without it and emitted on a
// thread with a small stack), and at that limit through the whole compiler
// and NVRTC.
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/ASTToVT.h"
#include "vflow/Compiler/Compile.h"
#include "vflow/Compiler/CudaEmitter.h"
#include "vflow/Compiler/Driver.h"
#include "vflow/Compiler/Passes.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/cuda/Jit.h"

#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <pthread.h>
#include <sstream>

using namespace vflow;

namespace {

/// A flow whose index block is a chain of `n` lets of one of these kinds:
/// "affine" (x * 1.001 + kmax: single use), "twice" (x * 1.001 + x: each
/// let used twice, so each is materialized), "sigmoid" (one op per let),
/// "budget" (a scalar of params used twice per let, in the score and the
/// budget: host-evaluable, outside every kernel).
std::string chainProgram(int n, const std::string &kind) {
  std::ostringstream s;
  s << "flow lets {\n  param budget = 8;\n  cache kmax = max(K, token);\n"
    << "  index {\n";
  if (kind == "budget")
    s << "    let x0 = budget * 0.5;\n";
  else
    s << "    let x0 = q * kmax;\n";
  for (int i = 1; i < n; ++i) {
    std::string x = "x" + std::to_string(i - 1);
    s << "    let x" << i << " = ";
    if (kind == "affine")
      s << x << " * 1.001 + kmax";
    else if (kind == "twice" || kind == "budget")
      s << x << " * 1.001 + " << x;
    else
      s << "sigmoid(" << x << ")";
    s << ";\n";
  }
  std::string last = "x" + std::to_string(n - 1);
  if (kind == "budget")
    s << "    return topk(max(sum(q * kmax, dim), head) * " << last << ", "
      << last << ");\n";
  else
    s << "    return topk(max(sum(" << last << ", dim), head), budget);\n";
  s << "  }\n}\n";
  return s.str();
}

struct EmitJob {
  vt::FlowOp flow;
  rt::GpuFlowInfo info;
  std::string error;
  bool ok = false;
  double seconds = 0;
};

void *runEmitJob(void *raw) {
  auto *job = static_cast<EmitJob *>(raw);
  auto start = std::chrono::steady_clock::now();
  job->ok = emitCuda(job->flow, job->info, job->error);
  job->seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return nullptr;
}

/// Lowers and plans `source` without the driver's op limit (on a large
/// stack: the front end is not under test here), then runs emitCuda alone
/// on a thread with a 1 MiB stack.
EmitJob emitWithoutOpLimit(const std::string &source) {
  EmitJob job;
  mlir::MLIRContext context;
  registerCompilerDialects(context);
  context.disableMultithreading();
  Compilation c(std::make_unique<SourceBuffer>("long.vflow", source));
  bool planned = false;
  runWithLargeStack([&] {
    c.ast = parseSource(*c.buffer, c.diags);
    if (!c.ast || !analyzeModule(*c.ast, SemaOptions(), c.diags, c.checked))
      return;
    c.vt = lowerToVT(context, *c.ast, c.checked, *c.buffer);
    mlir::PassManager pm(&context);
    buildCompilerPipeline(pm);
    planned = mlir::succeeded(pm.run(*c.vt));
  });
  if (!planned) {
    job.error = "the front end or the pass pipeline failed";
    return job;
  }
  job.flow = *c.vt->getBody()->getOps<vt::FlowOp>().begin();
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, size_t(1) << 20);
  pthread_t thread;
  if (pthread_create(&thread, &attr, runEmitJob, &job) != 0) {
    job.error = "pthread_create failed";
    return job;
  }
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
  return job;
}

size_t longestLine(const std::string &text) {
  size_t longest = 0, start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos)
      end = text.size();
    longest = std::max(longest, end - start);
    start = end + 1;
  }
  return longest;
}

/// Emission of 1,000 and 4,000 lets: no crash on a 1 MiB stack (the old
/// emitter recursed once per let), output linear in the lets (the old
/// offsets were quadratic), no line (expression) longer than a constant,
/// and the runtime's shared-memory view fits a thread block (dead slots are
/// reused).
class CudaLongChain : public ::testing::TestWithParam<const char *> {};

TEST_P(CudaLongChain, EmitsLinearlyOnASmallStack) {
  std::string kind = GetParam();
  size_t bytes[2] = {0, 0};
  const int lets[2] = {1000, 4000};
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(std::to_string(lets[i]) + " lets");
    EmitJob job = emitWithoutOpLimit(chainProgram(lets[i], kind));
    ASSERT_TRUE(job.ok) << job.error;
    const std::string &source = job.info.source;
    bytes[i] = source.size();
    std::printf("%s, %d lets: %zu bytes of CUDA in %.3f s, longest line %zu\n",
                kind.c_str(), lets[i], source.size(), job.seconds,
                longestLine(source));
    EXPECT_LT(source.size(), size_t(lets[i]) * 600);
    EXPECT_LT(longestLine(source), size_t(16384));
    EXPECT_LT(job.seconds, 10.0);
    EXPECT_NO_THROW(
        rt::gpuSpecializationMacros(job.info, 4, 128, rt::DType::BF16));
  }
  // Four times the lets: about four times the text.
  EXPECT_LT(double(bytes[1]), 4.5 * double(bytes[0]));
}

INSTANTIATE_TEST_SUITE_P(Kinds, CudaLongChain,
                         ::testing::Values("affine", "twice", "sigmoid",
                                           "budget"),
                         [](const auto &info) {
                           return std::string(info.param);
                         });

/// Scalars that are each used twice double their inlined text at every
/// let: 20 lets used to give 50 MB of CUDA.
TEST(CudaLongChainScalars, DoNotGrowExponentially) {
  EmitJob job = emitWithoutOpLimit(chainProgram(20, "budget"));
  ASSERT_TRUE(job.ok) << job.error;
  EXPECT_LT(job.info.source.size(), size_t(64) << 10);
  // The budget is computed in f64 from named locals, as the host does.
  EXPECT_NE(job.info.source.find("const double hb"), std::string::npos);
  EXPECT_NE(job.info.source.find("const float hs"), std::string::npos);
}

/// Programs at the driver's op limit (about 2,048 ops in the index stage)
/// through the whole compiler and NVRTC, in bounded time: 2,000 chained
/// one-op lets to PTX (the old emitter's 2,000-deep expression took 7 s,
/// ptxas takes about 20 s more on such a kernel either way), and 500 lets of
/// three ops to a cubin (the old 1,000-deep expression took NVRTC 62 s).
TEST(CudaLongChainNvrtc, ChainsAtTheOpLimitCompile) {
  std::string why;
  bool nvrtc = rt::cuda::nvrtcAvailable(&why);
  std::string cache = ::testing::TempDir() + "/vflow-long-cuda";
  std::filesystem::remove_all(cache);
  for (auto [lets, kind] :
       {std::pair<int, const char *>{2000, "sigmoid"}, {500, "affine"}}) {
    bool cubin = lets < 1000;
    SCOPED_TRACE(std::to_string(lets) + " " + kind + " lets");
    CompileResult c = compileProgram(chainProgram(lets, kind), "long.vflow");
    ASSERT_TRUE(c.ok) << c.diagnosticsText.substr(0, 2000);
    const rt::GpuFlowInfo &gpu = c.artifact.flows.at(0).gpu;
    EXPECT_LT(gpu.source.size(), size_t(lets) * 200);
    EXPECT_LT(longestLine(gpu.source), size_t(16384));
    if (!nvrtc)
      continue;
    rt::cuda::NvrtcOptions options;
    options.arch = "sm_90";
    options.cubin = cubin;
    options.cacheDir = cache;
    options.quiet = true;
    options.extra = rt::gpuSpecializationMacros(gpu, 4, 128, rt::DType::BF16);
    auto start = std::chrono::steady_clock::now();
    rt::cuda::CudaBinary bin =
        rt::cuda::compileCuda("long", gpu.source, options);
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    EXPECT_FALSE(cubin ? bin.cubin.empty() : bin.ptx.empty());
    std::printf("%d %s lets: %zu bytes of CUDA, NVRTC to sm_90 %s in %.2f s\n",
                lets, kind, gpu.source.size(), cubin ? "cubin" : "PTX",
                seconds);
    EXPECT_LT(seconds, 30.0);
  }
  std::filesystem::remove_all(cache);
  if (!nvrtc)
    GTEST_SKIP() << why;
}

} // namespace
