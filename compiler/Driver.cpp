//===- Driver.cpp - Source to verified vt IR ------------------------------===//

#include "vflow/Compiler/Driver.h"
#include "vflow/Compiler/ASTToVT.h"
#include "vflow/Dialect/VT/VTOps.h"
#include "vflow/Runtime/Limits.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"

#include <algorithm>
#include <exception>
#include <pthread.h>

using namespace vflow;

SourceRange vflow::flowNameRange(const Compilation &c, llvm::StringRef name) {
  for (const FlowInfo &f : c.checked.flows)
    if (f.name == name && f.flow)
      return f.flow->name.range;
  return SourceRange();
}

bool vflow::readSourceFile(const std::string &path, std::string &text,
                           std::string &error) {
  // Larger than any program; the parser's own limit gives the message.
  return readFileText(path, size_t(16) << 20, text, error);
}

namespace {

struct StageOps {
  int64_t consts = 0, cache = 0, index = 0;
  int64_t largest() const { return std::max({consts, cache, index}); }
};

StageOps countStageOps(vt::FlowOp flow) {
  StageOps n;
  flow.walk([&](mlir::Operation *op) {
    for (mlir::Operation *p = op->getParentOp(); p && p != flow;
         p = p->getParentOp()) {
      if (llvm::isa<vt::ConstOp>(p)) {
        ++n.consts;
        return;
      }
      if (llvm::isa<vt::CacheStageOp>(p)) {
        ++n.cache;
        return;
      }
      if (llvm::isa<vt::IndexStageOp>(p)) {
        ++n.index;
        return;
      }
    }
  });
  return n;
}

/// Refuses a flow whose consts, cache stage or index stage has more than
/// limits::kMaxOpsPerStage ops once canonicalized (a long program is
/// canonicalized here, so that what folds away, such as -(-x), is not
/// counted).
bool checkStageSizes(Compilation &c, mlir::MLIRContext &context) {
  bool over = false;
  for (auto flow : c.vt->getBody()->getOps<vt::FlowOp>())
    over |= countStageOps(flow).largest() > limits::kMaxOpsPerStage;
  if (!over)
    return true;
  mlir::PassManager pm(&context);
  pm.addPass(mlir::createCanonicalizerPass());
  if (mlir::failed(pm.run(*c.vt))) {
    c.diags.error(DiagCode::Internal, SourceRange(),
                  "internal error: canonicalization failed");
    return false;
  }
  bool ok = true;
  for (auto flow : c.vt->getBody()->getOps<vt::FlowOp>()) {
    StageOps n = countStageOps(flow);
    SourceRange where;
    for (const FlowInfo &f : c.checked.flows)
      if (f.name == flow.getSymName() && f.flow)
        where = f.flow->name.range;
    for (auto [stage, count] :
         {std::pair<const char *, int64_t>{"consts", n.consts},
          {"cache stage", n.cache},
          {"index stage", n.index}}) {
      if (count <= limits::kMaxOpsPerStage)
        continue;
      c.diags.error(DiagCode::Limit, where,
                    "flow '" + flow.getSymName().str() + "': its " + stage +
                        " has " + std::to_string(count) +
                        " operations; the limit is " +
                        std::to_string(limits::kMaxOpsPerStage));
      c.diags.note(where, "each stage compiles to one function, and the host "
                          "and device compilers slow down on huge ones");
      ok = false;
    }
  }
  return ok;
}

} // namespace

bool vflow::compileSource(Compilation &c, mlir::MLIRContext &context,
                          const SemaOptions &options, CompileStage until) {
  c.ast = parseSource(*c.buffer, c.diags);
  if (!c.ast)
    return false;
  if (until == CompileStage::Parse)
    return true;
  if (!analyzeModule(*c.ast, options, c.diags, c.checked))
    return false;
  if (until == CompileStage::Check)
    return true;

  c.vt = lowerToVT(context, *c.ast, c.checked, *c.buffer);
  if (!checkStageSizes(c, context))
    return false;
  // A checked program must lower to valid IR; if it does not, that is a
  // compiler bug, reported with the verifier's words.
  std::string messages;
  mlir::ScopedDiagnosticHandler handler(&context, [&](mlir::Diagnostic &d) {
    std::string text;
    llvm::raw_string_ostream os(text);
    os << d.getLocation() << ": " << d;
    messages += (messages.empty() ? "" : "; ") + os.str();
    return mlir::success();
  });
  if (mlir::failed(mlir::verify(*c.vt))) {
    c.diags.error(DiagCode::Internal, SourceRange(),
                  "internal error: the generated vt IR does not verify: " +
                      messages);
    return false;
  }
  return true;
}

namespace {
struct ThreadArgs {
  const std::function<void()> *fn;
  std::exception_ptr error;
};
void *threadMain(void *raw) {
  auto *args = static_cast<ThreadArgs *>(raw);
  try {
    (*args->fn)();
  } catch (...) {
    args->error = std::current_exception();
  }
  return nullptr;
}
} // namespace

void vflow::runWithLargeStack(const std::function<void()> &fn) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, size_t(256) << 20);
  ThreadArgs args{&fn, nullptr};
  pthread_t thread;
  if (pthread_create(&thread, &attr, threadMain, &args) != 0) {
    pthread_attr_destroy(&attr);
    fn();
    return;
  }
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
  // An exception thrown on the thread continues in the caller.
  if (args.error)
    std::rethrow_exception(args.error);
}

std::map<std::string, std::map<std::string, unsigned>>
vflow::countOps(mlir::Operation *flowOp) {
  std::map<std::string, std::map<std::string, unsigned>> counts;
  flowOp->walk([&](mlir::Operation *op) {
    if (op == flowOp)
      return;
    std::string region = "flow";
    for (mlir::Operation *p = op->getParentOp(); p && p != flowOp;
         p = p->getParentOp()) {
      if (llvm::isa<vt::CacheStageOp>(p))
        region = "cache_stage";
      else if (llvm::isa<vt::IndexStageOp>(p))
        region = "index_stage";
      else if (llvm::isa<vt::ConstOp>(p))
        region = "const";
    }
    counts[region][op->getName().getStringRef().str()]++;
  });
  return counts;
}
