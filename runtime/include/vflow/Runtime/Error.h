//===- Error.h - The runtime's error type -----------------------*- C++ -*-===//
//
// Every error at the runtime's API boundary (bad configuration, bad argument,
// exhausted KV cache) is thrown as vflow::rt::Error with a message that says
// what went wrong and why. The runtime never aborts on user input.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_ERROR_H
#define VFLOW_RUNTIME_ERROR_H

#include <stdexcept>
#include <string>

namespace vflow {
namespace rt {

class Error : public std::runtime_error {
public:
  explicit Error(const std::string &message) : std::runtime_error(message) {}
};

} // namespace rt
} // namespace vflow

#endif // VFLOW_RUNTIME_ERROR_H
