//===- Driver.cpp - Source to verified vt IR ------------------------------===//

#include "vflow/Compiler/Driver.h"
#include "vflow/Compiler/ASTToVT.h"
#include "vflow/Dialect/VT/VTOps.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"

#include <pthread.h>

using namespace vflow;

bool vflow::readSourceFile(const std::string &path, std::string &text,
                           std::string &error) {
  // Larger than any program; the parser's own limit gives the message.
  return readFileText(path, size_t(16) << 20, text, error);
}

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
    c.diags.error(SourceRange(),
                  "internal error: the generated vt IR does not verify: " +
                      messages);
    return false;
  }
  return true;
}

namespace {
struct ThreadArgs {
  const std::function<void()> *fn;
};
void *threadMain(void *raw) {
  auto *args = static_cast<ThreadArgs *>(raw);
  (*args->fn)();
  return nullptr;
}
} // namespace

void vflow::runWithLargeStack(const std::function<void()> &fn) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, size_t(256) << 20);
  ThreadArgs args{&fn};
  pthread_t thread;
  if (pthread_create(&thread, &attr, threadMain, &args) != 0) {
    pthread_attr_destroy(&attr);
    fn();
    return;
  }
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
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
