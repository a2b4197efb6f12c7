//===- TestUtil.h - Helpers for the runtime tests ---------------*- C++ -*-===//

#ifndef VFLOW_TESTS_RUNTIME_TESTUTIL_H
#define VFLOW_TESTS_RUNTIME_TESTUTIL_H

#include "vflow/Runtime/Error.h"

#include <gtest/gtest.h>

#include <string>

namespace vflow {
namespace rt {
namespace test {

/// Runs `body` and checks that it throws vflow::rt::Error whose message
/// contains every one of `fragments`.
template <typename Body, typename... Fragments>
void expectError(Body &&body, const Fragments &...fragments) {
  try {
    body();
  } catch (const Error &error) {
    std::string message = error.what();
    for (const std::string &fragment : {std::string(fragments)...})
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message '" << message << "' lacks '" << fragment << "'";
    return;
  } catch (const std::exception &other) {
    ADD_FAILURE() << "threw a non-vflow exception: " << other.what();
    return;
  }
  ADD_FAILURE() << "did not throw vflow::rt::Error";
}

} // namespace test
} // namespace rt
} // namespace vflow

#endif // VFLOW_TESTS_RUNTIME_TESTUTIL_H
