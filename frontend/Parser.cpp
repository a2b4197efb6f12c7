//===- Parser.cpp - .vflow source to AST ----------------------------------===//
//
// Runs the ANTLR4-generated lexer and parser with vflow's own error strategy
// (so syntax errors read like a compiler's, not like ANTLR's), then turns the
// parse tree into the AST. Inputs that could make the parser slow or deeply
// recursive are rejected up front with a clear message.
//
//===----------------------------------------------------------------------===//

#include "vflow/Frontend/Parser.h"

#include "VFlowLexer.h"
#include "VFlowParser.h"
#include "antlr4-runtime.h"

#include <cmath>
#include <cstdlib>

using namespace vflow;
using namespace vflow::ast;
using vflow::grammar::VFlowLexer;
using vflow::grammar::VFlowParser;

namespace {

//===----------------------------------------------------------------------===//
// Input checks that run before ANTLR sees the text
//===----------------------------------------------------------------------===//

/// Returns the offset of the first byte that is not part of valid UTF-8, or
/// npos.
size_t findInvalidUTF8(const std::string &text) {
  for (size_t i = 0; i < text.size();) {
    size_t len = utf8SequenceLength(text, i);
    if (len == 0)
      return i;
    i += len;
  }
  return std::string::npos;
}

/// Finds an unterminated block comment (outside strings and line comments).
size_t findUnterminatedComment(const std::string &text) {
  size_t i = 0, n = text.size();
  while (i < n) {
    if (text[i] == '"') {
      ++i;
      while (i < n && text[i] != '"' && text[i] != '\n') {
        if (text[i] == '\\')
          ++i;
        ++i;
      }
      ++i;
    } else if (text.compare(i, 2, "//") == 0) {
      while (i < n && text[i] != '\n')
        ++i;
    } else if (text.compare(i, 2, "/*") == 0) {
      size_t end = text.find("*/", i + 2);
      if (end == std::string::npos)
        return i;
      i = end + 2;
    } else {
      ++i;
    }
  }
  return std::string::npos;
}

bool checkInput(const SourceBuffer &buffer, DiagnosticEngine &diags,
                const ParseLimits &limits) {
  const std::string &text = buffer.getText();
  if (text.size() > limits.maxBytes) {
    diags.error(DiagCode::InputFile, SourceRange(),
                "file is too large (" + std::to_string(text.size()) +
                    " bytes; the limit is " + std::to_string(limits.maxBytes) +
                    ")");
    return false;
  }
  size_t nul = text.find('\0');
  if (nul != std::string::npos) {
    diags.error(DiagCode::InputFile, SourceRange(nul, nul + 1),
                "file contains a NUL byte; is it a binary file?");
    return false;
  }
  size_t bad = findInvalidUTF8(text);
  if (bad != std::string::npos) {
    diags.error(
        DiagCode::InputFile, SourceRange(bad, bad + 1),
        "file is not valid UTF-8 text (bad byte 0x" +
            [&] {
              char buf[4];
              std::snprintf(buf, sizeof(buf), "%02x",
                            static_cast<unsigned char>(text[bad]));
              return std::string(buf);
            }() +
            ")");
    return false;
  }
  size_t comment = findUnterminatedComment(text);
  if (comment != std::string::npos) {
    diags.error(DiagCode::Syntax, SourceRange(comment, comment + 2),
                "unterminated '/*' comment");
    return false;
  }
  return true;
}

//===----------------------------------------------------------------------===//
// Token positions
//===----------------------------------------------------------------------===//

/// ANTLR indexes code points; diagnostics use byte offsets.
class OffsetMap {
public:
  explicit OffsetMap(const std::string &text) {
    bool ascii = true;
    for (char c : text)
      if (static_cast<unsigned char>(c) >= 0x80)
        ascii = false;
    if (ascii)
      return;
    for (uint32_t i = 0; i < text.size(); ++i)
      if ((static_cast<unsigned char>(text[i]) & 0xc0) != 0x80)
        cpToByte.push_back(i);
    cpToByte.push_back(text.size());
  }
  uint32_t byteOffset(size_t cp) const {
    if (cpToByte.empty())
      return cp;
    return cp < cpToByte.size() ? cpToByte[cp] : cpToByte.back();
  }
  SourceRange range(antlr4::Token *tok) const {
    if (!tok)
      return SourceRange();
    if (tok->getType() == antlr4::Token::EOF) {
      uint32_t at = byteOffset(tok->getStartIndex());
      return SourceRange(at, at);
    }
    return SourceRange(byteOffset(tok->getStartIndex()),
                       byteOffset(tok->getStopIndex() + 1));
  }
  SourceRange range(antlr4::ParserRuleContext *ctx) const {
    SourceRange r = range(ctx->getStart());
    antlr4::Token *stop = ctx->getStop();
    if (stop && stop->getType() != antlr4::Token::EOF &&
        stop->getStopIndex() + 1 >= ctx->getStart()->getStartIndex())
      r = r.merge(range(stop));
    return r;
  }

private:
  std::vector<uint32_t> cpToByte;
};

/// How a token is named in a message: 'flow', a name 'x', a number, ...
std::string describeToken(antlr4::Token *tok) {
  if (!tok || tok->getType() == antlr4::Token::EOF)
    return "end of file";
  std::string text = tok->getText();
  if (text.size() > 32)
    text = text.substr(0, 29) + "...";
  switch (tok->getType()) {
  case VFlowLexer::ID:
    return "'" + text + "'";
  case VFlowLexer::NUMBER:
    return "number " + text;
  case VFlowLexer::STRING:
    return "string " + text;
  default:
    break;
  }
  if (tok->getType() <= VFlowLexer::INF)
    return "keyword '" + text + "'";
  return "'" + text + "'";
}

/// How an expected token type is named: ';', a name, ...
std::string describeTokenType(size_t type,
                              const antlr4::dfa::Vocabulary &vocab) {
  switch (type) {
  case antlr4::Token::EOF:
    return "end of file";
  case VFlowLexer::ID:
    return "a name";
  case VFlowLexer::NUMBER:
    return "a number";
  case VFlowLexer::STRING:
    return "a string";
  default:
    return vocab.getLiteralName(type);
  }
}

std::string describeExpected(const antlr4::misc::IntervalSet &set,
                             const antlr4::dfa::Vocabulary &vocab) {
  std::vector<std::string> names;
  for (ssize_t t : set.toList()) {
    if (t == VFlowLexer::BAD_CHAR || t == VFlowLexer::UNTERMINATED_STRING)
      continue;
    std::string name = describeTokenType(t, vocab);
    if (!name.empty())
      names.push_back(name);
  }
  if (names.empty())
    return "";
  if (names.size() == 1)
    return names[0];
  if (names.size() > 6)
    return "";
  std::string out = "one of ";
  for (size_t i = 0; i < names.size(); ++i)
    out += (i ? ", " : "") + names[i];
  return out;
}

/// What the parser was looking for, by rule, when nothing fit.
std::string describeRule(size_t rule) {
  static const std::pair<size_t, const char *> described[] = {
      {VFlowParser::RuleFile, "'flow'"},
      {VFlowParser::RuleFlowItem,
       "a declaration (param, axis, const, cache, state or index)"},
      {VFlowParser::RuleFlowDecl,
       "a declaration (param, axis, const, cache, state or index) or '}'"},
      {VFlowParser::RuleCacheStmt,
       "a cache statement ('let NAME = ...;' or 'FIELD = ...;')"},
      {VFlowParser::RuleIndexStmt,
       "an index statement ('let', a state assignment or 'return')"},
      {VFlowParser::RuleExpr, "an expression"},
      {VFlowParser::RuleArg, "an argument"}};
  for (const auto &[ruleIndex, description] : described)
    if (ruleIndex == rule)
      return description;
  return "";
}

//===----------------------------------------------------------------------===//
// Error reporting
//===----------------------------------------------------------------------===//

class LexerErrors : public antlr4::BaseErrorListener {
public:
  void syntaxError(antlr4::Recognizer *, antlr4::Token *, size_t, size_t,
                   const std::string &, std::exception_ptr) override {
    // Every character matches BAD_CHAR, so the lexer never fails; bad tokens
    // are reported when the token stream is scanned.
  }
};

/// Reports syntax errors in vflow's words. Recovery is ANTLR's default
/// (single-token insertion and deletion, then resynchronization).
class VFlowErrorStrategy : public antlr4::DefaultErrorStrategy {
public:
  VFlowErrorStrategy(DiagnosticEngine &diags, const OffsetMap &offsets)
      : diags(diags), offsets(offsets) {}

protected:
  void
  reportNoViableAlternative(antlr4::Parser *parser,
                            const antlr4::NoViableAltException &e) override {
    antlr4::Token *tok = e.getOffendingToken();
    if (suppressed(parser, tok))
      return;
    if (keywordForName(parser, tok, e.getExpectedTokens()))
      return;
    std::string want;
    if (auto *ctx = dynamic_cast<antlr4::ParserRuleContext *>(e.getCtx()))
      want = describeRule(ctx->getRuleIndex());
    if (want.empty())
      want = describeRule(parser->getContext()->getRuleIndex());
    emit(tok, want.empty()
                  ? "unexpected " + describeToken(tok)
                  : "expected " + want + ", found " + describeToken(tok));
  }

  void reportInputMismatch(antlr4::Parser *parser,
                           const antlr4::InputMismatchException &e) override {
    antlr4::Token *tok = e.getOffendingToken();
    if (suppressed(parser, tok))
      return;
    if (keywordForName(parser, tok, e.getExpectedTokens()))
      return;
    std::string want =
        describeExpected(e.getExpectedTokens(), parser->getVocabulary());
    if (want.empty()) {
      if (tok->getType() == antlr4::Token::EOF &&
          e.getExpectedTokens().contains(
              static_cast<size_t>(VFlowLexer::RBRACE)))
        want = "'}'";
      else
        want = describeRule(parser->getContext()->getRuleIndex());
    }
    emit(tok, want.empty()
                  ? "unexpected " + describeToken(tok)
                  : "expected " + want + ", found " + describeToken(tok));
  }

  void reportUnwantedToken(antlr4::Parser *parser) override {
    if (inErrorRecoveryMode(parser))
      return;
    beginErrorCondition(parser);
    antlr4::Token *tok = parser->getCurrentToken();
    if (suppressed(parser, tok))
      return;
    std::string want =
        describeExpected(getExpectedTokens(parser), parser->getVocabulary());
    if (want.empty())
      want = describeRule(parser->getContext()->getRuleIndex());
    emit(tok, "unexpected " + describeToken(tok) +
                  (want.empty() ? "" : "; expected " + want));
  }

  void reportMissingToken(antlr4::Parser *parser) override {
    if (inErrorRecoveryMode(parser))
      return;
    beginErrorCondition(parser);
    if (suppressed(parser, parser->getCurrentToken()))
      return;
    std::string want =
        describeExpected(getExpectedTokens(parser), parser->getVocabulary());
    // Point just past the previous token, where the missing one belongs.
    antlr4::Token *prev = parser->getTokenStream()->LT(-1);
    SourceRange at = offsets.range(parser->getCurrentToken());
    std::string after;
    if (prev) {
      SourceRange p = offsets.range(prev);
      at = SourceRange(p.end, p.end);
      after = " after " + describeToken(prev);
    }
    diags.error(DiagCode::Syntax, at,
                "expected " + (want.empty() ? "more input" : want) + after);
  }

private:
  void emit(antlr4::Token *tok, std::string message) {
    SourceRange at = offsets.range(tok);
    diags.error(DiagCode::Syntax, at, std::move(message));
    // `x ** y` (Python's power) parses up to the second '*'.
    const SourceBuffer *buffer = diags.getBuffer();
    if (buffer && tok->getText() == "*" && at.isValid() && at.begin > 0 &&
        buffer->getText()[at.begin - 1] == '*')
      diags.hint(SourceRange(at.begin - 1, at.end),
                 "there is no ** operator: write pow(x, y)");
  }

  /// After an error, the rest of its statement is not reported: recovery
  /// there mostly produces follow-on noise. Returns true for a token inside
  /// the statement of the last reported error, and otherwise marks the
  /// statement of `tok` as reported.
  bool suppressed(antlr4::Parser *parser, antlr4::Token *tok) {
    size_t index = tok ? tok->getTokenIndex() : 0;
    if (haveSuppressed && index <= suppressUntil)
      return true;
    // A stray '}' or the end of file after an earlier error is almost always
    // that error's echo (recovery closed a block too early).
    if (haveSuppressed && tok &&
        (tok->getType() == VFlowLexer::RBRACE ||
         tok->getType() == antlr4::Token::EOF))
      return true;
    auto *stream = parser->getTokenStream();
    size_t end = index;
    for (size_t n = stream->size(); end < n; ++end) {
      size_t type = stream->get(end)->getType();
      if (type == VFlowLexer::SEMI || type == VFlowLexer::RBRACE ||
          type == VFlowLexer::LBRACE || type == antlr4::Token::EOF)
        break;
    }
    suppressUntil = end;
    haveSuppressed = true;
    return false;
  }

  /// A keyword where a name belongs gets its own message.
  bool keywordForName(antlr4::Parser *parser, antlr4::Token *tok,
                      const antlr4::misc::IntervalSet &expected) {
    if (!tok || tok->getType() > VFlowLexer::INF ||
        !expected.contains(static_cast<size_t>(VFlowLexer::ID)))
      return false;
    emit(tok,
         "'" + tok->getText() + "' is a keyword and cannot be used as a name");
    return true;
  }

  size_t suppressUntil = 0;
  bool haveSuppressed = false;
  DiagnosticEngine &diags;
  const OffsetMap &offsets;
};

//===----------------------------------------------------------------------===//
// Parse tree to AST
//===----------------------------------------------------------------------===//

class ASTBuilder {
public:
  explicit ASTBuilder(const OffsetMap &offsets, DiagnosticEngine &diags)
      : offsets(offsets), diags(diags) {}

  std::unique_ptr<Module> build(VFlowParser::FileContext *file) {
    auto module = std::make_unique<Module>();
    for (auto *flowCtx : file->flowDecl())
      module->flows.push_back(buildFlow(flowCtx));
    return module;
  }

private:
  Ident ident(antlr4::Token *tok) {
    return {tok ? tok->getText() : std::string(), offsets.range(tok)};
  }

  Flow buildFlow(VFlowParser::FlowDeclContext *ctx) {
    Flow flow;
    flow.name = ident(ctx->name);
    flow.range = offsets.range(ctx);
    for (auto *item : ctx->flowItem())
      flow.decls.push_back(buildDecl(item));
    return flow;
  }

  Decl buildDecl(VFlowParser::FlowItemContext *item) {
    Decl decl;
    decl.range = offsets.range(item);
    decl.keywordRange = offsets.range(item->getStart());
    if (auto *c = dynamic_cast<VFlowParser::ParamDeclContext *>(item)) {
      decl.kind = DeclKind::Param;
      decl.name = ident(c->name);
      if (c->ty)
        decl.type = ident(c->ty);
      decl.value = buildExpr(c->expr());
    } else if (auto *c = dynamic_cast<VFlowParser::AxisDeclContext *>(item)) {
      decl.kind = DeclKind::Axis;
      decl.name = ident(c->name);
      decl.value = buildExpr(c->expr());
    } else if (auto *c = dynamic_cast<VFlowParser::ConstDeclContext *>(item)) {
      decl.kind = DeclKind::Const;
      decl.name = ident(c->name);
      decl.value = buildExpr(c->expr());
    } else if (auto *c =
                   dynamic_cast<VFlowParser::CacheFieldDeclContext *>(item)) {
      decl.kind = DeclKind::CacheField;
      decl.name = ident(c->name);
      if (c->ty)
        decl.type = ident(c->ty);
      decl.value = buildExpr(c->expr());
    } else if (auto *c =
                   dynamic_cast<VFlowParser::CacheBlockDeclContext *>(item)) {
      decl.kind = DeclKind::CacheBlock;
      for (auto *s : c->cacheStmt())
        decl.body.push_back(buildCacheStmt(s));
      decl.closeBrace = offsets.range(c->RBRACE()->getSymbol());
    } else if (auto *c = dynamic_cast<VFlowParser::StateDeclContext *>(item)) {
      decl.kind = DeclKind::State;
      decl.name = ident(c->name);
      decl.hasAxisList = c->LBRACK() != nullptr;
      if (auto *list = c->idList())
        for (auto *id : list->ID())
          decl.axes.push_back(ident(id->getSymbol()));
      if (c->ty)
        decl.type = ident(c->ty);
      decl.value = buildExpr(c->expr());
    } else if (auto *c = dynamic_cast<VFlowParser::IndexDeclContext *>(item)) {
      decl.kind = DeclKind::Index;
      for (auto *s : c->indexStmt())
        decl.body.push_back(buildIndexStmt(s));
      decl.closeBrace = offsets.range(c->RBRACE()->getSymbol());
    } else if (auto *c = dynamic_cast<VFlowParser::RetainDeclContext *>(item)) {
      decl.kind = DeclKind::Retain;
      for (auto *a : c->arg())
        decl.args.push_back(buildArg(a));
      for (auto *s : c->indexStmt())
        decl.body.push_back(buildIndexStmt(s));
      decl.closeBrace = offsets.range(c->RBRACE()->getSymbol());
    }
    return decl;
  }

  Stmt buildCacheStmt(VFlowParser::CacheStmtContext *ctx) {
    Stmt stmt;
    stmt.range = offsets.range(ctx);
    if (auto *c = dynamic_cast<VFlowParser::CacheLetContext *>(ctx)) {
      stmt.kind = StmtKind::Let;
      stmt.name = ident(c->name);
      stmt.value = buildExpr(c->expr());
    } else if (auto *c = dynamic_cast<VFlowParser::CacheFieldContext *>(ctx)) {
      stmt.kind = StmtKind::Field;
      stmt.name = ident(c->name);
      if (c->ty)
        stmt.dtype = ident(c->ty);
      stmt.value = buildExpr(c->expr());
    }
    return stmt;
  }

  Stmt buildIndexStmt(VFlowParser::IndexStmtContext *ctx) {
    Stmt stmt;
    stmt.range = offsets.range(ctx);
    if (auto *c = dynamic_cast<VFlowParser::IndexLetContext *>(ctx)) {
      stmt.kind = StmtKind::Let;
      stmt.name = ident(c->name);
      stmt.value = buildExpr(c->expr());
    } else if (auto *c = dynamic_cast<VFlowParser::IndexAssignContext *>(ctx)) {
      stmt.kind = StmtKind::Assign;
      stmt.name = ident(c->name);
      stmt.value = buildExpr(c->expr());
    } else if (auto *c = dynamic_cast<VFlowParser::IndexReturnContext *>(ctx)) {
      stmt.kind = StmtKind::Return;
      stmt.value = buildExpr(c->expr());
    }
    return stmt;
  }

  ExprPtr buildExpr(VFlowParser::ExprContext *ctx) {
    SourceRange r = offsets.range(ctx);
    if (auto *c = dynamic_cast<VFlowParser::ParenExprContext *>(ctx)) {
      ExprPtr inner = buildExpr(c->expr());
      inner->range = r;
      inner->parenthesized = true;
      return inner;
    }
    if (auto *c = dynamic_cast<VFlowParser::NumberExprContext *>(ctx))
      return buildNumber(c->NUMBER()->getSymbol(), r);
    if (auto *c = dynamic_cast<VFlowParser::StringExprContext *>(ctx))
      return std::make_unique<StringExpr>(r, unquote(c->STRING()->getText()));
    if (auto *c = dynamic_cast<VFlowParser::KeywordExprContext *>(ctx)) {
      if (c->INF())
        return std::make_unique<InfExpr>(r);
      return std::make_unique<BoolExpr>(r, c->TRUE() != nullptr);
    }
    if (auto *c = dynamic_cast<VFlowParser::NameExprContext *>(ctx))
      return std::make_unique<NameExpr>(r, c->ID()->getText());
    if (auto *c = dynamic_cast<VFlowParser::ListExprContext *>(ctx)) {
      std::vector<ExprPtr> elems;
      for (auto *e : c->expr())
        elems.push_back(buildExpr(e));
      return std::make_unique<ListExpr>(r, std::move(elems));
    }
    if (auto *c = dynamic_cast<VFlowParser::NegExprContext *>(ctx))
      return std::make_unique<UnaryExpr>(r, UnaryOp::Neg, buildExpr(c->expr()));
    if (auto *c = dynamic_cast<VFlowParser::NotExprContext *>(ctx))
      return std::make_unique<UnaryExpr>(r, UnaryOp::Not, buildExpr(c->expr()));
    if (auto *c = dynamic_cast<VFlowParser::CallExprContext *>(ctx)) {
      std::vector<CallArg> args;
      for (auto *a : c->arg())
        args.push_back(buildArg(a));
      return std::make_unique<CallExpr>(
          r, c->callee->getText(), offsets.range(c->callee), std::move(args));
    }
    if (auto *c = dynamic_cast<VFlowParser::MulExprContext *>(ctx))
      return binary(r, c->op, c->lhs, c->rhs);
    if (auto *c = dynamic_cast<VFlowParser::AddExprContext *>(ctx))
      return binary(r, c->op, c->lhs, c->rhs);
    if (auto *c = dynamic_cast<VFlowParser::CmpExprContext *>(ctx))
      return binary(r, c->op, c->lhs, c->rhs);
    if (auto *c = dynamic_cast<VFlowParser::AndExprContext *>(ctx))
      return binary(r, c->op, c->lhs, c->rhs);
    if (auto *c = dynamic_cast<VFlowParser::OrExprContext *>(ctx))
      return binary(r, c->op, c->lhs, c->rhs);
    // Unreachable for a tree without syntax errors; keep a node so that the
    // caller never sees null.
    return std::make_unique<InfExpr>(r);
  }

  ExprPtr binary(SourceRange r, antlr4::Token *opTok,
                 VFlowParser::ExprContext *lhs, VFlowParser::ExprContext *rhs) {
    // The grammar's operator tokens are the spellings the AST prints.
    BinaryOp op = binaryOpSpelled(opTok->getText()).value_or(BinaryOp::Add);
    return std::make_unique<BinaryExpr>(r, op, offsets.range(opTok),
                                        buildExpr(lhs), buildExpr(rhs));
  }

  CallArg buildArg(VFlowParser::ArgContext *ctx) {
    CallArg arg;
    arg.range = offsets.range(ctx);
    if (auto *c = dynamic_cast<VFlowParser::RenameArgContext *>(ctx)) {
      arg.kind = CallArg::Kind::Rename;
      arg.name = c->from->getText();
      arg.nameRange = offsets.range(c->from);
      arg.to = c->to->getText();
      arg.toRange = offsets.range(c->to);
    } else if (auto *c = dynamic_cast<VFlowParser::NamedArgContext *>(ctx)) {
      arg.kind = CallArg::Kind::Named;
      arg.name = c->name->getText();
      arg.nameRange = offsets.range(c->name);
      arg.value = buildExpr(c->expr());
    } else if (auto *c =
                   dynamic_cast<VFlowParser::PositionalArgContext *>(ctx)) {
      arg.value = buildExpr(c->expr());
    }
    return arg;
  }

  ExprPtr buildNumber(antlr4::Token *tok, SourceRange r) {
    std::string text = tok->getText();
    bool isInteger = text.find_first_of(".eE") == std::string::npos;
    std::string shown = text.size() > 32 ? text.substr(0, 29) + "..." : text;
    double value = 0;
    if (isInteger) {
      // An integer literal is an int or an error, never a float.
      int64_t exact = 0;
      std::string why = parseIntValue(text, exact);
      if (!why.empty())
        diags.error(DiagCode::NumberRange, r,
                    "integer " + shown + " is " + why +
                        " (write it with a '.' or an exponent, e.g. 1e19, "
                        "for a float)");
      value = double(exact);
    } else {
      value = std::strtod(text.c_str(), nullptr);
      if (!std::isfinite(value)) {
        diags.error(DiagCode::NumberRange, r,
                    "number " + shown + " is out of range");
        value = 0;
      }
    }
    return std::make_unique<NumberExpr>(r, value, isInteger, text);
  }

  static std::string unquote(const std::string &text) {
    std::string out;
    for (size_t i = 1; i + 1 < text.size(); ++i) {
      char c = text[i];
      if (c == '\\' && i + 2 < text.size()) {
        char n = text[++i];
        out += n == 'n' ? '\n' : n == 't' ? '\t' : n;
      } else {
        out += c;
      }
    }
    return out;
  }

  const OffsetMap &offsets;
  DiagnosticEngine &diags;
};

/// Scans the tokens for bad characters, unterminated strings, too deep
/// nesting and too long statements.
bool checkTokens(antlr4::CommonTokenStream &tokens, const OffsetMap &offsets,
                 DiagnosticEngine &diags, const ParseLimits &limits) {
  bool ok = true;
  unsigned depth = 0, statementTokens = 0;
  std::vector<antlr4::Token *> open;
  for (antlr4::Token *tok : tokens.getTokens()) {
    if (diags.shouldStop())
      return false;
    switch (tok->getType()) {
    case VFlowLexer::BAD_CHAR: {
      std::string text = tok->getText();
      std::string shown = text;
      if (text.size() == 1 &&
          (static_cast<unsigned char>(text[0]) < 0x20 || text[0] == 0x7f)) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "0x%02x",
                      static_cast<unsigned char>(text[0]));
        shown = buf;
      }
      diags.error(DiagCode::Syntax, offsets.range(tok),
                  "unexpected character '" + shown + "'");
      if (text == "%")
        diags.hint(offsets.range(tok),
                   "there is no % operator; to act every N steps, count in "
                   "a state: `state phase[]: f32 = 0;`, then in the index "
                   "`phase = where(phase + 1 >= N, 0, phase + 1);` and "
                   "test `phase == 0`");
      ok = false;
      break;
    }
    case VFlowLexer::UNTERMINATED_STRING:
      diags.error(DiagCode::Syntax, offsets.range(tok),
                  "unterminated string literal");
      ok = false;
      break;
    case VFlowLexer::ID: {
      // Names are copied into every shape that has them as axes: a bound
      // keeps the checker's and the lowering's memory linear in the input.
      size_t length = tok->getStopIndex() + 1 - tok->getStartIndex();
      if (length > limits.maxNameLength) {
        diags.error(DiagCode::Limit, offsets.range(tok),
                    "name is too long (" + std::to_string(length) +
                        " characters; the limit is " +
                        std::to_string(limits.maxNameLength) + ")");
        ok = false;
      }
      break;
    }
    case VFlowLexer::LPAREN:
    case VFlowLexer::LBRACK:
    case VFlowLexer::LBRACE:
      if (++depth > limits.maxNesting) {
        diags.error(DiagCode::Limit, offsets.range(tok),
                    "nesting is too deep (more than " +
                        std::to_string(limits.maxNesting) + " levels)");
        return false;
      }
      break;
    case VFlowLexer::RPAREN:
    case VFlowLexer::RBRACK:
    case VFlowLexer::RBRACE:
      if (depth)
        --depth;
      break;
    default:
      break;
    }
    if (tok->getType() == VFlowLexer::SEMI ||
        tok->getType() == VFlowLexer::LBRACE ||
        tok->getType() == VFlowLexer::RBRACE) {
      statementTokens = 0;
    } else if (++statementTokens > limits.maxStatementTokens) {
      diags.error(DiagCode::Limit, offsets.range(tok),
                  "statement is too long (more than " +
                      std::to_string(limits.maxStatementTokens) + " tokens)");
      return false;
    }
  }
  return ok;
}

} // namespace

std::unique_ptr<Module> vflow::parseSource(const SourceBuffer &buffer,
                                           DiagnosticEngine &diags,
                                           const ParseLimits &limits) {
  if (!checkInput(buffer, diags, limits))
    return nullptr;

  OffsetMap offsets(buffer.getText());
  antlr4::ANTLRInputStream input(buffer.getText());
  VFlowLexer lexer(&input);
  LexerErrors lexerErrors;
  lexer.removeErrorListeners();
  lexer.addErrorListener(&lexerErrors);
  antlr4::CommonTokenStream tokens(&lexer);
  tokens.fill();
  if (!checkTokens(tokens, offsets, diags, limits))
    return nullptr;

  VFlowParser parser(&tokens);
  parser.removeErrorListeners();
  auto strategy = std::make_shared<VFlowErrorStrategy>(diags, offsets);
  parser.setErrorHandler(strategy);
  VFlowParser::FileContext *tree = parser.file();
  if (diags.hasErrors())
    return nullptr;
  ASTBuilder builder(offsets, diags);
  auto module = builder.build(tree);
  if (diags.hasErrors())
    return nullptr;
  return module;
}
