//===- Diagnostics.cpp - Source buffers and diagnostics -------------------===//

#include "vflow/Frontend/Diagnostics.h"
#include "vflow/Runtime/Names.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <iterator>
#include <sys/stat.h>
#include <unistd.h>

namespace vflow {

namespace {

/// The system's reason for `err`, starting lower case ("no such file or
/// directory").
std::string systemReason(int err) {
  std::string why = std::strerror(err);
  if (!why.empty() && why[0] >= 'A' && why[0] <= 'Z' &&
      !(why.size() > 1 && why[1] >= 'A' && why[1] <= 'Z'))
    why[0] = static_cast<char>(why[0] - 'A' + 'a');
  return why;
}

} // namespace

int openRegularFile(const std::string &path, uint64_t &size,
                    std::string &error) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    int err = errno;
    error = err == ENOENT ? "no such file '" + path + "'"
                          : "cannot open '" + path + "': " + systemReason(err);
    return -1;
  }
  if (S_ISDIR(st.st_mode)) {
    error = "'" + path + "' is a directory";
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    error = "'" + path + "' is not a regular file";
    return -1;
  }
  // O_NONBLOCK: should the path be swapped for a FIFO after stat, opening it
  // must not wait for a writer; fstat below then refuses it.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    error = "cannot open '" + path + "': " + systemReason(errno);
    return -1;
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    error = "'" + path + "' is not a regular file";
    return -1;
  }
  size = static_cast<uint64_t>(st.st_size);
  return fd;
}

bool readExactly(int fd, char *data, size_t size, const std::string &path,
                 std::string &error) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = read(fd, data + done, size - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      error = "cannot read '" + path + "': " + systemReason(errno);
      return false;
    }
    if (n == 0) {
      error = "cannot read '" + path + "': it ended early (did it change?)";
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

bool readFileText(const std::string &path, size_t maxBytes, std::string &text,
                  std::string &error) {
  uint64_t size = 0;
  int fd = openRegularFile(path, size, error);
  if (fd < 0)
    return false;
  if (size > maxBytes) {
    close(fd);
    error = "'" + path + "' is too large (" + std::to_string(size) +
            " bytes; the limit is " + std::to_string(maxBytes) + ")";
    return false;
  }
  text.assign(static_cast<size_t>(size), '\0');
  bool ok = readExactly(fd, &text[0], text.size(), path, error);
  close(fd);
  return ok;
}

SourceRange SourceRange::merge(SourceRange other) const {
  if (!isValid())
    return other;
  if (!other.isValid())
    return *this;
  return SourceRange(std::min(begin, other.begin), std::max(end, other.end));
}

SourceBuffer::SourceBuffer(std::string name, std::string text)
    : name(std::move(name)), text(std::move(text)) {
  lineStarts.push_back(0);
  for (uint32_t i = 0, e = this->text.size(); i < e; ++i)
    if (this->text[i] == '\n')
      lineStarts.push_back(i + 1);
}

LineCol SourceBuffer::getLineCol(uint32_t offset) const {
  offset = std::min<uint32_t>(offset, text.size());
  auto it = std::upper_bound(lineStarts.begin(), lineStarts.end(), offset);
  unsigned line = it - lineStarts.begin();
  return {line, offset - lineStarts[line - 1] + 1};
}

std::string SourceBuffer::getLineText(unsigned line) const {
  if (line == 0 || line > lineStarts.size())
    return {};
  uint32_t begin = lineStarts[line - 1];
  uint32_t end = line < lineStarts.size() ? lineStarts[line] : text.size();
  while (end > begin && (text[end - 1] == '\n' || text[end - 1] == '\r'))
    --end;
  return text.substr(begin, end - begin);
}

std::string SourceBuffer::getRangeText(SourceRange range) const {
  if (!range.isValid() || range.begin >= text.size())
    return {};
  return text.substr(range.begin,
                     std::min<uint32_t>(range.end, text.size()) - range.begin);
}

namespace {
struct DiagCodeInfo {
  const char *code, *summary, *fix;
};
const DiagCodeInfo kDiagCodes[] = {
#define VFLOW_DIAG(Name, Code, Summary, Fix) {Code, Summary, Fix},
#include "vflow/Frontend/DiagnosticCodes.def"
};
} // namespace

const char *diagCodeName(DiagCode code) {
  return kDiagCodes[size_t(code)].code;
}

const char *diagCodeSummary(DiagCode code) {
  return kDiagCodes[size_t(code)].summary;
}

const char *diagCodeFix(DiagCode code) { return kDiagCodes[size_t(code)].fix; }

const std::vector<DiagCode> &allDiagCodes() {
  static const std::vector<DiagCode> all = [] {
    std::vector<DiagCode> out;
    for (size_t i = 0; i < std::size(kDiagCodes); ++i)
      out.push_back(DiagCode(i));
    return out;
  }();
  return all;
}

std::optional<DiagCode> diagCodeFromName(const std::string &name) {
  for (DiagCode c : allDiagCodes())
    if (name == diagCodeName(c))
      return c;
  return std::nullopt;
}

Diagnostic &DiagnosticEngine::report(Severity severity, DiagCode code,
                                     SourceRange range, std::string message) {
  droppedLast = false;
  if (severity == Severity::Error) {
    if (numErrors++ >= errorLimit) {
      dropped = Diagnostic();
      droppedLast = true;
      return dropped;
    }
  } else if (severity == Severity::Warning) {
    if (numWarnings++ >= errorLimit) {
      dropped = Diagnostic();
      droppedLast = true;
      return dropped;
    }
  }
  diags.push_back({severity, code, range, std::move(message), {}});
  return diags.back();
}

void DiagnosticEngine::note(SourceRange range, std::string message) {
  // Notes follow the diagnostic they explain; drop them with it.
  if (diags.empty() || lastDropped())
    return;
  diags.back().notes.push_back({range, std::move(message), false});
}

void DiagnosticEngine::hint(SourceRange range, std::string message) {
  note(range, std::move(message));
  if (!diags.empty() && !lastDropped())
    diags.back().notes.back().hint = true;
}

namespace {

const char *const kSeverityNames[] = {"error", "warning", "note"};
static_assert(rt::coversEnum(kSeverityNames, Severity::Note),
              "one name per Severity");

const char *severityName(Severity severity) {
  return rt::nameOf(kSeverityNames, severity, "error");
}

/// Makes a line printable: tabs become spaces (so the caret lines up) and
/// control bytes become '?'.
std::string printableLine(const std::string &line) {
  std::string out;
  for (size_t i = 0; i < line.size();) {
    unsigned char u = static_cast<unsigned char>(line[i]);
    size_t len = utf8SequenceLength(line, i);
    if (line[i] == '\t') {
      out += ' ';
    } else if (len == 0 || u < 0x20 || u == 0x7f) {
      out += '?';
      len = 1;
    } else {
      out += line.substr(i, len);
    }
    i += len ? len : 1;
  }
  return out;
}

/// Display columns of line[0, bytes): one per character, counted the way
/// printableLine shows them (a byte that is not valid UTF-8 is one '?').
unsigned displayWidth(const std::string &line, size_t bytes) {
  unsigned width = 0;
  size_t i = 0;
  for (; i < bytes && i < line.size(); ++width)
    i += std::max<size_t>(1, utf8SequenceLength(line, i));
  return width + (bytes > line.size() ? bytes - line.size() : 0);
}

} // namespace

LineExcerpt excerptLine(const std::string &line, size_t caret) {
  LineExcerpt out;
  if (line.size() <= kMaxExcerptBytes) {
    out.text = line;
    return out;
  }
  size_t start =
      caret > kMaxExcerptBytes / 3 ? caret - kMaxExcerptBytes / 3 : 0;
  start = std::min(start, line.size() - kMaxExcerptBytes);
  auto continuation = [&](size_t i) {
    return i < line.size() &&
           (static_cast<unsigned char>(line[i]) & 0xc0) == 0x80;
  };
  // Cut between characters, never inside one.
  for (unsigned k = 0; k < 3 && start > 0 && continuation(start); ++k)
    --start;
  size_t end = std::min(line.size(), start + kMaxExcerptBytes);
  for (unsigned k = 0; k < 3 && end > start && continuation(end); ++k)
    --end;
  out.text = line.substr(start, end - start);
  out.offset = start;
  out.cut = true;
  return out;
}

namespace {

/// One diagnostic or note as text; `code` (errors and warnings) follows the
/// message in brackets, as clang shows a warning's flag.
void renderOne(std::string &out, const SourceBuffer *buffer, Severity severity,
               SourceRange range, const std::string &message, bool color,
               const char *code = nullptr) {
  const char *bold = color ? "\033[1m" : "";
  const char *reset = color ? "\033[0m" : "";
  const char *sevColor = "";
  if (color)
    sevColor = severity == Severity::Error     ? "\033[1;31m"
               : severity == Severity::Warning ? "\033[1;35m"
                                               : "\033[1;36m";
  bool located = buffer && range.isValid();
  out += bold;
  if (located) {
    LineCol lc = buffer->getLineCol(range.begin);
    out += buffer->getName() + ":" + std::to_string(lc.line) + ":" +
           std::to_string(lc.column) + ": ";
  } else if (buffer) {
    out += buffer->getName() + ": ";
  }
  out += reset;
  out += sevColor;
  out += severityName(severity);
  out += ": ";
  out += reset;
  out += bold + message + reset;
  if (code)
    out += std::string(" [") + code + "]";
  out += "\n";
  if (!located)
    return;

  LineCol begin = buffer->getLineCol(range.begin);
  std::string whole = buffer->getLineText(begin.line);
  size_t caretByte = begin.column - 1;
  size_t endByte = whole.size();
  if (range.end > range.begin) {
    LineCol end = buffer->getLineCol(range.end);
    if (end.line == begin.line)
      endByte = end.column - 1;
  } else {
    endByte = caretByte + 1;
  }
  // A long line is shown as a window around the caret, marked with "...".
  LineExcerpt excerpt = excerptLine(whole, caretByte);
  const std::string &raw = excerpt.text;
  size_t from = caretByte - std::min(caretByte, excerpt.offset);
  size_t to = std::min(endByte - std::min(endByte, excerpt.offset), raw.size());
  // Carets count characters, not bytes, so they line up under UTF-8 text.
  std::string line = printableLine(raw);
  unsigned caretCol = displayWidth(raw, from);
  unsigned caretLen = to > from ? displayWidth(raw, to) - caretCol : 1u;
  if (excerpt.cut && excerpt.offset > 0) {
    line = "..." + line;
    caretCol += 3;
  }
  if (excerpt.cut && excerpt.offset + raw.size() < whole.size())
    line += "...";
  caretLen = std::max(1u, caretLen);
  out += "  " + line + "\n";
  out += "  " + std::string(caretCol, ' ');
  if (color)
    out += "\033[1;32m";
  out += '^';
  if (caretLen > 1)
    out += std::string(caretLen - 1, '~');
  out += reset;
  out += "\n";
}

/// The location members of a diagnostic or note: all four, or "line" and
/// "column" null when there is no location.
void setJSONLocation(rt::Json &out, const SourceBuffer *buffer,
                     SourceRange range) {
  if (!buffer || !range.isValid()) {
    out.set("line", rt::Json());
    out.set("column", rt::Json());
    return;
  }
  LineCol b = buffer->getLineCol(range.begin);
  LineCol e = buffer->getLineCol(std::max(range.end, range.begin));
  out.set("line", b.line);
  out.set("column", b.column);
  out.set("end_line", e.line);
  out.set("end_column", e.column);
}

} // namespace

std::string DiagnosticEngine::renderText(bool color) const {
  std::string out;
  for (const Diagnostic &diag : diags) {
    renderOne(out, buffer, diag.severity, diag.range, diag.message, color,
              diagCodeName(diag.code));
    for (const DiagnosticNote &note : diag.notes)
      renderOne(out, buffer, Severity::Note, note.range, note.message, color);
  }
  std::string prefix = buffer ? buffer->getName() + ": " : "";
  if (numErrors > errorLimit)
    out += prefix + "note: " + std::to_string(numErrors - errorLimit) +
           " more errors not shown\n";
  else if (stopped)
    out += prefix + "note: too many errors (" + std::to_string(errorLimit) +
           "); stopped checking here\n";
  if (numWarnings > errorLimit)
    out += prefix + "note: " + std::to_string(numWarnings - errorLimit) +
           " more warnings not shown\n";
  return out;
}

std::string withArticle(const std::string &noun) {
  bool vowel =
      !noun.empty() && std::string("aeiou").find(noun[0]) != std::string::npos;
  return (vowel ? "an " : "a ") + noun;
}

std::string collapseWhitespace(const std::string &text) {
  std::string out;
  bool space = false;
  for (char ch : text) {
    if (ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r') {
      space = true;
      continue;
    }
    if (space && !out.empty())
      out += ' ';
    space = false;
    out += ch;
  }
  return out;
}

std::string shortName(const std::string &name) {
  return name.size() > 48 ? name.substr(0, 45) + "..." : name;
}

rt::Json DiagnosticEngine::toJSON() const {
  rt::Json out = rt::Json::object();
  out.set("file", buffer ? rt::Json(buffer->getName()) : rt::Json());
  out.set("errors", numErrors);
  // True when "diagnostics" is not the whole story: some were dropped, or
  // checking stopped at the limit.
  out.set("truncated",
          numErrors > errorLimit || numWarnings > errorLimit || stopped);
  out.set("warnings", numWarnings);
  rt::Json list = rt::Json::array();
  for (const Diagnostic &diag : diags) {
    rt::Json d = rt::Json::object();
    d.set("severity", severityName(diag.severity));
    d.set("code", diagCodeName(diag.code));
    setJSONLocation(d, buffer, diag.range);
    d.set("message", diag.message);
    if (buffer && diag.range.isValid()) {
      LineCol at = buffer->getLineCol(diag.range.begin);
      LineExcerpt excerpt =
          excerptLine(buffer->getLineText(at.line), at.column - 1);
      d.set("source_line", std::move(excerpt.text));
      if (excerpt.cut)
        d.set("source_line_offset", excerpt.offset);
    }
    rt::Json notes = rt::Json::array();
    for (const DiagnosticNote &note : diag.notes) {
      rt::Json n = rt::Json::object();
      setJSONLocation(n, buffer, note.range);
      n.set("message", note.message);
      n.set("hint", note.hint);
      notes.push(std::move(n));
    }
    d.set("notes", std::move(notes));
    list.push(std::move(d));
  }
  out.set("diagnostics", std::move(list));
  return out;
}

rt::Json unreadableFileJSON(const std::string &path,
                            const std::string &reason) {
  SourceBuffer buffer(path, "");
  DiagnosticEngine diags(&buffer);
  diags.error(DiagCode::InputFile, SourceRange(), reason);
  return diags.toJSON();
}

std::optional<std::string>
closestName(const std::string &name,
            const std::vector<std::string> &candidates) {
  if (name.size() > 64)
    return std::nullopt;
  // One-letter names are too short to guess from.
  unsigned allowed =
      name.size() < 2 ? 0 : std::max<unsigned>(1, name.size() / 3);
  // Rows of the edit-distance table, reused for every candidate (a flow may
  // declare tens of thousands of names).
  std::vector<unsigned> prev, cur, prevPrev;
  auto distance = [&](const std::string &a, const std::string &b) {
    prev.assign(b.size() + 1, 0);
    cur.assign(b.size() + 1, 0);
    prevPrev.assign(b.size() + 1, 0);
    for (unsigned j = 0; j <= b.size(); ++j)
      prev[j] = j;
    for (unsigned i = 1; i <= a.size(); ++i) {
      cur[0] = i;
      for (unsigned j = 1; j <= b.size(); ++j) {
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1,
                           prev[j - 1] + (a[i - 1] != b[j - 1] ? 1u : 0u)});
        // A swap of two neighbouring letters counts as one edit.
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
          cur[j] = std::min(cur[j], prevPrev[j - 2] + 1);
      }
      prevPrev = prev;
      std::swap(prev, cur);
    }
    return prev[b.size()];
  };
  std::optional<std::string> best;
  unsigned bestDist = ~0u;
  for (const std::string &cand : candidates) {
    if (cand == name || cand.size() > 64)
      continue;
    // The distance is at least the difference in length.
    size_t gap = cand.size() > name.size() ? cand.size() - name.size()
                                           : name.size() - cand.size();
    if (gap > allowed || gap >= bestDist)
      continue;
    unsigned d = distance(name, cand);
    if (d < bestDist) {
      bestDist = d;
      best = cand;
    }
  }
  if (best && bestDist <= allowed)
    return best;
  return std::nullopt;
}

} // namespace vflow
