//===- Files.h - Writing user files without losing what was there -*- C++
//-*-===//
//
// Every file vflow writes for a user (vflowc -o, saveArtifact) goes through
// writeFileAtomically: the bytes go to a fresh temporary file in the same
// directory, which is flushed and then renamed over the target. A failure at
// any point leaves the old file untouched, and no reader ever sees a
// half-written one.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_FILES_H
#define VFLOW_RUNTIME_FILES_H

#include <string>

namespace vflow::rt {

/// Throws Error when `path` cannot name a file: it is empty or holds a NUL
/// byte (the operating system would read the name only up to the NUL: a
/// different file). `what` names the argument in the message ("artifact
/// path: ..."). Every path that reaches the runtime from a caller that can
/// pass any bytes (the Python bindings) goes through it, and so does
/// writeFileAtomically.
void checkPathText(const std::string &path, const std::string &what);

/// Replaces `path` with `bytes` atomically. An existing file keeps its
/// permission bits; a new one gets 0666 minus the umask. Throws Error naming
/// the file and the reason (the old file, if any, is unchanged).
void writeFileAtomically(const std::string &path, const std::string &bytes);

/// True when both paths name the same existing file (same device and inode,
/// after following symbolic links).
bool sameFile(const std::string &a, const std::string &b);

/// strerror() of `errnum` as a string ("Too many levels of symbolic links").
std::string errnoText(int errnum);

} // namespace vflow::rt

#endif // VFLOW_RUNTIME_FILES_H
