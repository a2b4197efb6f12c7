//===- Diagnostics.h - Source buffers and diagnostics -----------*- C++ -*-===//
//
// A source buffer with line tables, and a diagnostic engine that renders
// clang-style text (file:line:col, message, the source line with a caret
// under the range, notes) or JSON for agents.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_FRONTEND_DIAGNOSTICS_H
#define VFLOW_FRONTEND_DIAGNOSTICS_H

#include "vflow/Runtime/Json.h"
#include "vflow/Runtime/Utf8.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace vflow {

/// Reads a whole regular file of at most `maxBytes`. Directories, devices,
/// missing and oversized files give false with a one-line reason (the
/// system's for files that cannot be opened, e.g. "too many levels of
/// symbolic links").
bool readFileText(const std::string &path, size_t maxBytes, std::string &text,
                  std::string &error);

/// Opens a regular file for reading (never blocking on a FIFO or device).
/// Returns its descriptor and sets `size`, or returns -1 with a one-line
/// reason as readFileText gives it. The caller closes the descriptor.
int openRegularFile(const std::string &path, uint64_t &size,
                    std::string &error);

/// Reads exactly `size` bytes from `fd` into `data` (retrying short reads);
/// false with a reason naming `path` on an error or an early end of file.
bool readExactly(int fd, char *data, size_t size, const std::string &path,
                 std::string &error);

/// A half-open byte range [begin, end) in one source buffer. An invalid range
/// (begin == UINT32_MAX) has no location, e.g. a command-line parameter.
struct SourceRange {
  static constexpr uint32_t kInvalid = UINT32_MAX;
  uint32_t begin = kInvalid;
  uint32_t end = kInvalid;

  SourceRange() = default;
  SourceRange(uint32_t begin, uint32_t end) : begin(begin), end(end) {}
  bool isValid() const { return begin != kInvalid; }
  /// The smallest range that covers both.
  SourceRange merge(SourceRange other) const;
};

/// A line and column, both 1-based; columns count bytes.
struct LineCol {
  unsigned line = 0;
  unsigned column = 0;
};

/// One source file held in memory.
class SourceBuffer {
public:
  SourceBuffer(std::string name, std::string text);

  const std::string &getName() const { return name; }
  const std::string &getText() const { return text; }
  LineCol getLineCol(uint32_t offset) const;
  /// The text of the line holding `offset`, without its line break.
  std::string getLineText(unsigned line) const;
  /// The exact source text of a range.
  std::string getRangeText(SourceRange range) const;

private:
  std::string name;
  std::string text;
  std::vector<uint32_t> lineStarts;
};

enum class Severity { Error, Warning, Note };

/// The kind of a diagnostic, with a stable code (DiagnosticCodes.def).
enum class DiagCode : uint16_t {
#define VFLOW_DIAG(Name, Code, Summary, Fix) Name,
#include "vflow/Frontend/DiagnosticCodes.def"
};

/// The stable code ("E301") and the one-line summary of a kind.
const char *diagCodeName(DiagCode code);
const char *diagCodeSummary(DiagCode code);
/// How to fix a diagnostic of this kind, in general.
const char *diagCodeFix(DiagCode code);
/// The kind with this code, if any.
std::optional<DiagCode> diagCodeFromName(const std::string &name);
/// Every kind, in code order.
const std::vector<DiagCode> &allDiagCodes();

struct DiagnosticNote {
  SourceRange range;
  std::string message;
  /// A fix: what to write instead (JSON "hint": true).
  bool hint = false;
};

struct Diagnostic {
  Severity severity = Severity::Error;
  DiagCode code = DiagCode::Internal;
  SourceRange range;
  std::string message;
  std::vector<DiagnosticNote> notes;
};

/// Collects the diagnostics of one compilation. Errors past the limit are
/// counted but dropped, so junk input cannot produce unbounded output.
class DiagnosticEngine {
public:
  explicit DiagnosticEngine(const SourceBuffer *buffer = nullptr,
                            unsigned errorLimit = 20)
      : buffer(buffer), errorLimit(errorLimit) {}

  void setBuffer(const SourceBuffer *newBuffer) { buffer = newBuffer; }
  const SourceBuffer *getBuffer() const { return buffer; }

  /// Reports a diagnostic; returns it so that notes can be attached.
  Diagnostic &report(Severity severity, DiagCode code, SourceRange range,
                     std::string message);
  Diagnostic &error(DiagCode code, SourceRange range, std::string message) {
    return report(Severity::Error, code, range, std::move(message));
  }
  Diagnostic &warning(DiagCode code, SourceRange range, std::string message) {
    return report(Severity::Warning, code, range, std::move(message));
  }
  /// Adds a note to the most recent diagnostic (dropped if that was dropped).
  void note(SourceRange range, std::string message);
  /// Adds a note that is a fix: what to write instead.
  void hint(SourceRange range, std::string message);

  unsigned getNumErrors() const { return numErrors; }
  unsigned getNumWarnings() const { return numWarnings; }
  bool hasErrors() const { return numErrors != 0; }
  /// True once the error limit is reached. Callers that stop early because
  /// of it make the rendered output say so.
  bool reachedLimit() const { return numErrors >= errorLimit; }
  bool shouldStop() {
    if (reachedLimit())
      stopped = true;
    return stopped;
  }
  const std::vector<Diagnostic> &getDiagnostics() const { return diags; }

  /// Renders every diagnostic as text; `color` adds ANSI colors.
  std::string renderText(bool color = false) const;
  /// Every diagnostic as one file entry of the diagnostics document
  /// (docs/json.md): {"file", "errors", "truncated", "warnings",
  /// "diagnostics": [...]}; "file" is null without a buffer.
  rt::Json toJSON() const;
  /// toJSON() as compact JSON text.
  std::string renderJSON() const { return toJSON().dump(); }

private:
  const SourceBuffer *buffer;
  unsigned errorLimit;
  unsigned numErrors = 0;
  unsigned numWarnings = 0;
  bool stopped = false;
  bool droppedLast = false;
  bool lastDropped() const { return droppedLast; }
  std::vector<Diagnostic> diags;
  Diagnostic dropped;
};

/// The most bytes of a source line a diagnostic shows.
constexpr size_t kMaxExcerptBytes = 160;

/// What a diagnostic shows of a source line: all of it, or, when it is longer
/// than kMaxExcerptBytes, a window of at most that many bytes around the
/// byte offset `caret`, cut between UTF-8 characters. `offset` is where the
/// window starts in the line (its columns are offset + 1 onwards).
struct LineExcerpt {
  std::string text;
  size_t offset = 0;
  bool cut = false;
};
LineExcerpt excerptLine(const std::string &line, size_t caret);

/// The diagnostics file entry of a file that could not be read: one error,
/// `reason`, without a location.
rt::Json unreadableFileJSON(const std::string &path, const std::string &reason);

/// "a axis" vs "an axis".
std::string withArticle(const std::string &noun);

/// `text` on one line: every run of spaces, tabs and line breaks becomes
/// one space, and leading and trailing ones go.
std::string collapseWhitespace(const std::string &text);

/// A name shortened for a message (long names are cut with "...").
std::string shortName(const std::string &name);

/// The closest candidate to `name` by edit distance, if one is close enough
/// to be a plausible typo.
std::optional<std::string>
closestName(const std::string &name,
            const std::vector<std::string> &candidates);

} // namespace vflow

#endif // VFLOW_FRONTEND_DIAGNOSTICS_H
