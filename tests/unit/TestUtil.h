//===- TestUtil.h - Helpers for front-end unit tests ------------*- C++ -*-===//

#ifndef VFLOW_TESTS_UNIT_TESTUTIL_H
#define VFLOW_TESTS_UNIT_TESTUTIL_H

#include "vflow/Frontend/Parser.h"
#include "vflow/Frontend/Sema.h"

#include <fstream>
#include <sstream>

namespace vflow::test {

/// Parses and checks `text`; keeps everything alive for inspection.
struct Checked {
  SourceBuffer buffer;
  DiagnosticEngine diags;
  std::unique_ptr<ast::Module> module;
  CheckedModule checked;
  bool ok = false;

  Checked(std::string text, std::vector<ParamOverride> overrides = {},
          std::string baseDir = ".")
      : buffer("test.vflow", std::move(text)), diags(&buffer) {
    module = parseSource(buffer, diags);
    if (!module)
      return;
    SemaOptions options;
    options.overrides = std::move(overrides);
    options.baseDir = std::move(baseDir);
    ok = analyzeModule(*module, options, diags, checked);
  }

  std::string errors() const { return diags.renderText(); }
  /// The message of the first error, or "".
  std::string firstError() const {
    for (const Diagnostic &d : diags.getDiagnostics())
      if (d.severity == Severity::Error)
        return d.message;
    return "";
  }
  const FlowInfo &flow(size_t i = 0) const { return checked.flows.at(i); }
};

inline std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

} // namespace vflow::test

#endif // VFLOW_TESTS_UNIT_TESTUTIL_H
