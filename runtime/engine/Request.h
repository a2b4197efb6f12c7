//===- Request.h - One request of the serving engine ------------*- C++ -*-===//

#ifndef VFLOW_RUNTIME_ENGINE_REQUEST_H
#define VFLOW_RUNTIME_ENGINE_REQUEST_H

#include "vflow/Model/Sampling.h"
#include "vflow/Runtime/PageTable.h"
#include "vflow/Runtime/Session.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace vflow::model::engine {

struct Request {
  int64_t id = 0;
  std::vector<int32_t> tokens; ///< the prompt, then what was generated
  int64_t promptLen = 0;
  SamplingParams params;
  uint64_t seed = 0; ///< the request's sampling stream
  /// Its sequence in the session while it holds pages (running, or waiting
  /// after a prefix hit it could not run yet: none then).
  std::optional<rt::SeqId> seq;
  int64_t computed = 0; ///< tokens whose K/V the sequence holds
  std::string error;    ///< set: finishes with this error at the next step
  /// With params.logprobs >= 0: one per generated token.
  std::vector<TokenLogprobs> logprobs;
  /// What the decodes of the sequences it left (preempted) attended.
  rt::SequenceStats attended;
  /// Adds what `seq`'s decodes attended (before it is released).
  void countAttended(const rt::Session &session, rt::SeqId seq) {
    const rt::SequenceStats s = session.sequenceStats(seq);
    attended.listsAttended += s.listsAttended;
    attended.blocksAttended += s.blocksAttended;
    attended.blocksAvailable += s.blocksAvailable;
    attended.blocksEvicted += s.blocksEvicted;
    attended.tokensEvicted += s.tokensEvicted;
  }
  int64_t generated() const { return int64_t(tokens.size()) - promptLen; }
};

} // namespace vflow::model::engine

#endif // VFLOW_RUNTIME_ENGINE_REQUEST_H
