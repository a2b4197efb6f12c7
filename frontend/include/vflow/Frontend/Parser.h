//===- Parser.h - .vflow source to AST --------------------------*- C++ -*-===//

#ifndef VFLOW_FRONTEND_PARSER_H
#define VFLOW_FRONTEND_PARSER_H

#include "vflow/Frontend/AST.h"

namespace vflow {

/// Limits that keep any input fast to reject (no input may take more than a
/// second or exhaust the stack).
struct ParseLimits {
  size_t maxBytes = 1 << 20;
  unsigned maxNesting = 64;
  unsigned maxStatementTokens = 4096;
  unsigned maxNameLength = 64;
};

/// Parses one buffer. Lexical and syntax errors go to `diags`; the module is
/// returned only when there were none.
std::unique_ptr<ast::Module> parseSource(const SourceBuffer &buffer,
                                         DiagnosticEngine &diags,
                                         const ParseLimits &limits = {});

} // namespace vflow

#endif // VFLOW_FRONTEND_PARSER_H
