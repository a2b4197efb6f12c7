//===- Diagnostics.cpp - Source buffers and diagnostics -------------------===//

#include "vflow/Frontend/Diagnostics.h"

#include <algorithm>
#include <cstdio>

namespace vflow {

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

Diagnostic &DiagnosticEngine::report(Severity severity, SourceRange range,
                                     std::string message) {
  if (severity == Severity::Error) {
    if (numErrors++ >= errorLimit) {
      dropped = Diagnostic();
      return dropped;
    }
  } else if (severity == Severity::Warning) {
    ++numWarnings;
  }
  diags.push_back({severity, range, std::move(message), {}});
  return diags.back();
}

void DiagnosticEngine::note(SourceRange range, std::string message) {
  if (numErrors > errorLimit || diags.empty())
    return;
  diags.back().notes.push_back({range, std::move(message)});
}

namespace {

const char *severityName(Severity severity) {
  switch (severity) {
  case Severity::Error:
    return "error";
  case Severity::Warning:
    return "warning";
  case Severity::Note:
    return "note";
  }
  return "error";
}

/// Makes a line printable: tabs become spaces (so the caret lines up) and
/// control bytes become '?'.
std::string printableLine(const std::string &line) {
  std::string out;
  for (char c : line) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '\t')
      out += ' ';
    else if (u < 0x20 || u == 0x7f)
      out += '?';
    else
      out += c;
  }
  return out;
}

/// Lines longer than this are shown as a window around the caret.
constexpr unsigned kMaxShownLine = 160;

void renderOne(std::string &out, const SourceBuffer *buffer,
               Severity severity, SourceRange range,
               const std::string &message, bool color) {
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
  out += bold + message + reset + "\n";
  if (!located)
    return;

  LineCol begin = buffer->getLineCol(range.begin);
  std::string line = printableLine(buffer->getLineText(begin.line));
  unsigned caretCol = begin.column - 1;
  unsigned caretLen = 1;
  if (range.end > range.begin) {
    LineCol end = buffer->getLineCol(range.end);
    caretLen = end.line == begin.line
                   ? end.column - begin.column
                   : std::max<unsigned>(1, line.size() - caretCol);
  }
  // Long lines: show a window that holds the caret.
  unsigned shift = 0;
  if (line.size() > kMaxShownLine) {
    shift = caretCol > kMaxShownLine / 2 ? caretCol - kMaxShownLine / 2 : 0;
    line = line.substr(shift, kMaxShownLine);
    caretCol -= shift;
    caretLen = std::min<unsigned>(caretLen, kMaxShownLine - caretCol);
  }
  caretCol = std::min<unsigned>(caretCol, line.size());
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

void appendJSONLocation(std::string &out, const SourceBuffer *buffer,
                        SourceRange range) {
  if (!buffer || !range.isValid()) {
    out += "\"line\":null,\"column\":null";
    return;
  }
  LineCol b = buffer->getLineCol(range.begin);
  LineCol e = buffer->getLineCol(std::max(range.end, range.begin));
  out += "\"line\":" + std::to_string(b.line) +
         ",\"column\":" + std::to_string(b.column) +
         ",\"end_line\":" + std::to_string(e.line) +
         ",\"end_column\":" + std::to_string(e.column);
}

} // namespace

std::string DiagnosticEngine::renderText(bool color) const {
  std::string out;
  for (const Diagnostic &diag : diags) {
    renderOne(out, buffer, diag.severity, diag.range, diag.message, color);
    for (const DiagnosticNote &note : diag.notes)
      renderOne(out, buffer, Severity::Note, note.range, note.message, color);
  }
  if (numErrors > errorLimit)
    out += "note: " + std::to_string(numErrors - errorLimit) +
           " more errors not shown\n";
  return out;
}

std::string jsonEscape(const std::string &text) {
  std::string out;
  for (char c : text) {
    unsigned char u = static_cast<unsigned char>(c);
    switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\t':
      out += "\\t";
      break;
    case '\r':
      out += "\\r";
      break;
    default:
      if (u < 0x20 || u == 0x7f) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", u);
        out += buf;
      } else if (u >= 0x80) {
        // Input bytes are validated as UTF-8 before parsing; anything else
        // (a message quoting junk) is replaced so the JSON stays valid.
        out += c;
      } else {
        out += c;
      }
    }
  }
  return out;
}

std::string DiagnosticEngine::renderJSON() const {
  std::string out = "{\"file\":";
  out += buffer ? "\"" + jsonEscape(buffer->getName()) + "\"" : "null";
  out += ",\"errors\":" + std::to_string(numErrors);
  out += ",\"warnings\":" + std::to_string(numWarnings);
  out += ",\"diagnostics\":[";
  bool first = true;
  for (const Diagnostic &diag : diags) {
    if (!first)
      out += ",";
    first = false;
    out += "{\"severity\":\"";
    out += severityName(diag.severity);
    out += "\",";
    appendJSONLocation(out, buffer, diag.range);
    out += ",\"message\":\"" + jsonEscape(diag.message) + "\"";
    if (buffer && diag.range.isValid())
      out += ",\"source_line\":\"" +
             jsonEscape(buffer->getLineText(
                 buffer->getLineCol(diag.range.begin).line)) +
             "\"";
    out += ",\"notes\":[";
    bool firstNote = true;
    for (const DiagnosticNote &note : diag.notes) {
      if (!firstNote)
        out += ",";
      firstNote = false;
      out += "{";
      appendJSONLocation(out, buffer, note.range);
      out += ",\"message\":\"" + jsonEscape(note.message) + "\"}";
    }
    out += "]}";
  }
  out += "]}";
  return out;
}

std::optional<std::string>
closestName(const std::string &name,
            const std::vector<std::string> &candidates) {
  auto distance = [](const std::string &a, const std::string &b) {
    std::vector<unsigned> prev(b.size() + 1), cur(b.size() + 1);
    for (unsigned j = 0; j <= b.size(); ++j)
      prev[j] = j;
    for (unsigned i = 1; i <= a.size(); ++i) {
      cur[0] = i;
      for (unsigned j = 1; j <= b.size(); ++j)
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1,
                           prev[j - 1] + (a[i - 1] != b[j - 1] ? 1u : 0u)});
      std::swap(prev, cur);
    }
    return prev[b.size()];
  };
  if (name.size() > 64)
    return std::nullopt;
  std::optional<std::string> best;
  unsigned bestDist = ~0u;
  for (const std::string &cand : candidates) {
    if (cand == name || cand.size() > 64)
      continue;
    unsigned d = distance(name, cand);
    if (d < bestDist) {
      bestDist = d;
      best = cand;
    }
  }
  unsigned allowed = std::max<unsigned>(1, name.size() / 3);
  if (best && bestDist <= allowed)
    return best;
  return std::nullopt;
}

} // namespace vflow
