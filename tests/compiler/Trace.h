//===- Trace.h - Run a flow on a random workload and record it --*- C++ -*-===//
//
// Differential tests compare what the reference interpreter computes for
// two versions of a flow (before and after a pass, or two backends): the
// fields of every block, the selection and the states after every step.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_TESTS_COMPILER_TRACE_H
#define VFLOW_TESTS_COMPILER_TRACE_H

#include "vflow/Compiler/Interpreter.h"

#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace vflow::trace {

struct Trace {
  std::vector<std::map<std::string, interp::Tensor>> fields; // per block
  std::vector<std::vector<int64_t>> selections;              // per step
  std::vector<int64_t> budgets;                              // per step
  std::vector<interp::StateValues> states;                   // per step
  std::string error; // an exception from the interpreter, if any
};

/// Field `name` of the first `n` blocks of `perBlock` stacked into one
/// tensor with a leading "block" axis (an empty tensor when `n` is 0).
inline interp::Tensor
stackBlocks(const std::vector<std::map<std::string, interp::Tensor>> &perBlock,
            const std::string &name, int64_t n) {
  interp::Tensor stacked;
  for (int64_t b = 0; b < n; ++b) {
    const interp::Tensor &f = perBlock[b].at(name);
    if (b == 0) {
      stacked.names = f.names;
      stacked.names.insert(stacked.names.begin(), "block");
      stacked.sizes = f.sizes;
      stacked.sizes.insert(stacked.sizes.begin(), n);
    }
    stacked.data.insert(stacked.data.end(), f.data.begin(), f.data.end());
  }
  return stacked;
}

/// Runs `flow` on `numBlocks` random blocks for `steps` decode steps (the
/// sequence grows by one block per step). Deterministic for a seed.
inline Trace runTrace(vt::FlowOp flow, int64_t headDim, int64_t group,
                      unsigned seed, int64_t numBlocks = 12, int steps = 3,
                      const std::map<std::string, double> &params = {}) {
  Trace trace;
  std::string error;
  auto fi =
      interp::FlowInterpreter::create(flow, headDim, group, params, error);
  if (!fi) {
    trace.error = error;
    return trace;
  }
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  int64_t p = fi->blockSize(), d = headDim;
  int64_t total = numBlocks + steps;
  auto random = [&](std::vector<std::string> names,
                    std::vector<int64_t> sizes) {
    interp::Tensor t(std::move(names), std::move(sizes));
    for (float &x : t.data)
      x = normal(rng);
    return t;
  };
  try {
    std::vector<interp::Tensor> ks, vs;
    for (int64_t b = 0; b < total; ++b) {
      ks.push_back(random({"token", "dim"}, {p, d}));
      vs.push_back(random({"token", "dim"}, {p, d}));
      trace.fields.push_back(fi->runCacheStage(ks.back(), vs.back()));
    }
    interp::StateValues states = fi->initialStates(numBlocks);
    for (int step = 0; step < steps; ++step) {
      int64_t n = numBlocks + step;
      fi->growStates(states, n);
      interp::IndexInputs in;
      in.q = random({"head", "dim"}, {group, d});
      in.mass = interp::Tensor({"block", "head"}, {n, group});
      for (float &m : in.mass.data)
        m = unit(rng);
      in.K = interp::Tensor({"block", "token", "dim"}, {n, p, d});
      in.V = in.K;
      for (int64_t b = 0; b < n; ++b) {
        std::copy(ks[b].data.begin(), ks[b].data.end(),
                  in.K.data.begin() + b * p * d);
        std::copy(vs[b].data.begin(), vs[b].data.end(),
                  in.V.data.begin() + b * p * d);
      }
      for (const std::string &name : fi->getFieldNames())
        in.fields[name] = stackBlocks(trace.fields, name, n);
      in.numBlocks = n;
      in.contextLen = n * p + step % p;
      in.step = step;
      trace.selections.push_back(fi->runIndexStage(in, states).blocks);
      trace.budgets.push_back(fi->budget(n, in.contextLen));
      trace.states.push_back(states);
    }
  } catch (const std::exception &e) {
    trace.error = e.what();
  }
  return trace;
}

/// Empty when the traces agree: selections exactly, values to `rtol`
/// (NaN equals NaN). Otherwise the first difference.
inline std::string compareTraces(const Trace &a, const Trace &b,
                                 double rtol = 1e-5) {
  if (a.error != b.error)
    return "errors differ: '" + a.error + "' vs '" + b.error + "'";
  auto close = [&](const interp::Tensor &x, const interp::Tensor &y,
                   const std::string &what) -> std::string {
    if (x.names != y.names || x.sizes != y.sizes)
      return what + ": shapes differ " + x.shapeString() + " vs " +
             y.shapeString();
    for (size_t i = 0; i < x.data.size(); ++i) {
      float u = x.data[i], v = y.data[i];
      if (std::isnan(u) && std::isnan(v))
        continue;
      if (u == v)
        continue;
      double scale = std::max(std::fabs(u), std::fabs(v));
      if (!(std::fabs(u - v) <= rtol * scale + 1e-30)) {
        std::ostringstream os;
        os << what << "[" << i << "]: " << u << " vs " << v;
        return os.str();
      }
    }
    return "";
  };
  if (a.fields.size() != b.fields.size())
    return "different numbers of blocks";
  for (size_t blk = 0; blk < a.fields.size(); ++blk)
    for (const auto &entry : a.fields[blk]) {
      auto it = b.fields[blk].find(entry.first);
      if (it == b.fields[blk].end())
        return "field " + entry.first + " missing";
      std::string diff =
          close(entry.second, it->second,
                "field " + entry.first + " of block " + std::to_string(blk));
      if (!diff.empty())
        return diff;
    }
  if (a.selections != b.selections)
    return "selections differ";
  if (a.budgets != b.budgets)
    return "budgets differ";
  for (size_t s = 0; s < a.states.size(); ++s)
    for (const auto &entry : a.states[s]) {
      std::string diff =
          close(entry.second, b.states[s].at(entry.first),
                "state " + entry.first + " at step " + std::to_string(s));
      if (!diff.empty())
        return diff;
    }
  return "";
}

} // namespace vflow::trace

#endif // VFLOW_TESTS_COMPILER_TRACE_H
