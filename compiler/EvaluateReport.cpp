//===- EvaluateReport.cpp - vflowc run's report ---------------------------===//
//
// What `vflowc run` and vflow.run print from the flows' reports: the text
// table and the JSON document (docs/json.md, Run results), the rows' labels,
// the paired differences against a baseline flow, the points of a sweep and
// a compile failure in brief.
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/Evaluate.h"
#include "vflow/Runtime/Json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

using namespace vflow;
using namespace vflow::eval;

namespace {

/// The three metrics a selection is judged by, with their JSON names.
const std::pair<const char *, double Metrics::*> kJudged[] = {
    {"mass_recall", &Metrics::recall},
    {"needle_hit", &Metrics::needleHit},
    {"output_rel_error", &Metrics::relError}};

} // namespace

std::string vflow::eval::errorsInBrief(const DiagnosticEngine &diags) {
  for (const Diagnostic &d : diags.getDiagnostics()) {
    if (d.severity != Severity::Error)
      continue;
    std::string text;
    if (d.range.isValid() && diags.getBuffer()) {
      LineCol at = diags.getBuffer()->getLineCol(d.range.begin);
      text = std::to_string(at.line) + ":" + std::to_string(at.column) + ": ";
    }
    text += d.message + " [" + diagCodeName(d.code) + "]";
    unsigned n = diags.getNumErrors();
    if (n > 1)
      text += " (and " + std::to_string(n - 1) + " more error" +
              (n > 2 ? "s" : "") + "; all of them: --diagnostics=json)";
    return text;
  }
  return "the program has errors";
}

std::vector<std::vector<std::pair<std::string, std::string>>>
vflow::eval::sweepPoints(const std::vector<Sweep> &sweeps) {
  std::vector<std::vector<std::pair<std::string, std::string>>> points(1);
  for (const Sweep &sweep : sweeps) {
    std::vector<std::vector<std::pair<std::string, std::string>>> next;
    for (const auto &point : points)
      for (const std::string &value : sweep.values) {
        next.push_back(point);
        next.back().push_back({sweep.name, value});
      }
    points = std::move(next);
  }
  return points;
}

std::string vflow::eval::rowLabel(const FlowReport &r) {
  if (r.params.empty())
    return r.flow;
  std::string label = r.flow + "[";
  for (size_t i = 0; i < r.params.size(); ++i)
    label += (i ? "," : "") + r.params[i].first + "=" + r.params[i].second;
  return label + "]";
}

int vflow::eval::baselineRow(const std::vector<FlowReport> &reports, size_t row,
                             const std::string &baseline, std::string &why) {
  int same = -1, named = -1, count = 0;
  for (size_t i = 0; i < reports.size(); ++i) {
    if (reports[i].flow != baseline)
      continue;
    ++count;
    named = int(i);
    if (reports[i].params == reports[row].params)
      same = int(i);
  }
  if (same >= 0)
    return same;
  if (count == 1)
    return named;
  why = count == 0 ? "no flow '" + baseline + "' ran"
                   : "flow '" + baseline +
                         "' ran with several params and "
                         "none equal to this row's";
  return -1;
}

PairedDifference vflow::eval::pairedDifference(const FlowReport &flow,
                                               const FlowReport &baseline) {
  PairedDifference d;
  d.baseline = rowLabel(baseline);
  const size_t n = std::min(flow.perSeed.size(), baseline.perSeed.size());
  if (n == 0)
    return d;
  for (auto [key, what] : kJudged) {
    (void)key;
    double sum = 0, sq = 0;
    for (size_t s = 0; s < n; ++s)
      sum += flow.perSeed[s].*what - baseline.perSeed[s].*what;
    const double m = sum / double(n);
    for (size_t s = 0; s < n; ++s) {
      const double x = flow.perSeed[s].*what - baseline.perSeed[s].*what - m;
      sq += x * x;
    }
    d.mean.*what = m;
    d.se.*what = n > 1 ? std::sqrt(sq / double(n - 1) / double(n)) : 0;
  }
  return d;
}

std::string
vflow::eval::formatReportText(const std::vector<FlowReport> &reports,
                              const WorkloadSpec &spec,
                              const std::string &baseline) {
  std::string out;
  char line[512];
  std::string lengths;
  for (int64_t l : spec.lengths)
    lengths += (lengths.empty() ? "" : ",") + std::to_string(l);
  out += "workload: seeds " + std::to_string(spec.seed) +
         (spec.seeds > 1
              ? ".." + std::to_string(spec.seed + uint64_t(spec.seeds) - 1)
              : std::string()) +
         ", " + std::to_string(spec.lengths.size()) + " sequences of " +
         lengths + " tokens, ";
  std::snprintf(line, sizeof(line),
                "%d KV heads x %d query heads, head dim %d, %d decode steps, "
                "%d needles per KV head, key outliers %g\n",
                spec.numKVHeads, spec.group, spec.headDim, spec.steps,
                spec.needles, spec.outlier);
  out += line;
  const bool paired = !baseline.empty();
  // The flow column fits the longest label (sweep points make long ones).
  size_t width = 16;
  for (const FlowReport &r : reports)
    width = std::max(width, rowLabel(r).size() + (r.readsMass ? 1 : 0) +
                                (r.readsLayer ? 1 : 0) + (r.evicts ? 1 : 0));
  out += std::string("flow") + std::string(width - 4, ' ');
  std::snprintf(line, sizeof(line), " %5s %13s %6s %27s %25s %27s %9s %9s%s\n",
                "P", "blocks", "share", "mass recall", "needle hits",
                "output error", "index ms", "attend ms",
                paired ? "   recall - baseline" : "");
  out += line + std::string(width, ' ');
  std::snprintf(line, sizeof(line), " %5s %13s %6s %27s %25s %27s %9s %9s%s\n",
                "", "attended/all", "", "flow+-se random oracle",
                "flow+-se random oracle", "flow+-se random oracle", "per step",
                "per step", paired ? "    paired diff+-se" : "");
  out += line;
  bool readsMass = false, readsLayer = false, evicts = false;
  for (size_t i = 0; i < reports.size(); ++i) {
    const FlowReport &r = reports[i];
    char blocks[32], recall[64], needles[64], err[64], vs[64] = "";
    std::snprintf(blocks, sizeof(blocks), "%.0f/%.0f", r.blocksAttended,
                  r.blocksTotal);
    std::snprintf(recall, sizeof(recall), "%.3f+-%.3f %.3f %.3f",
                  r.flowMetrics.recall, r.flowSE.recall, r.randomMetrics.recall,
                  r.oracleMetrics.recall);
    std::snprintf(needles, sizeof(needles), "%.2f+-%.2f %.2f %.2f",
                  r.flowMetrics.needleHit, r.flowSE.needleHit,
                  r.randomMetrics.needleHit, r.oracleMetrics.needleHit);
    std::snprintf(err, sizeof(err), "%.3f+-%.3f %.3f %.3f",
                  r.flowMetrics.relError, r.flowSE.relError,
                  r.randomMetrics.relError, r.oracleMetrics.relError);
    if (paired) {
      std::string why;
      int b = baselineRow(reports, i, baseline, why);
      if (b == int(i))
        std::snprintf(vs, sizeof(vs), "   %19s", "(baseline)");
      else if (b >= 0) {
        PairedDifference d = pairedDifference(r, reports[b]);
        std::snprintf(vs, sizeof(vs), "   %+9.4f+-%.4f", d.mean.recall,
                      d.se.recall);
      } else
        std::snprintf(vs, sizeof(vs), "   %19s", "-");
    }
    // The name is not formatted into the fixed buffer: it can be long.
    std::string name = rowLabel(r) + (r.readsMass ? "*" : "") +
                       (r.readsLayer ? "^" : "") + (r.evicts ? "~" : "");
    readsMass = readsMass || r.readsMass;
    readsLayer = readsLayer || r.readsLayer;
    evicts = evicts || r.evicts;
    name.resize(width, ' ');
    std::snprintf(line, sizeof(line),
                  " %5lld %13s %6.3f %27s %25s %27s %9.2f %9.2f%s\n",
                  (long long)r.blockSize, blocks,
                  r.blocksTotal > 0 ? r.blocksAttended / r.blocksTotal : 0.0,
                  recall, needles, err, r.indexMs, r.sparseMs, vs);
    out += name + line;
  }
  if (readsMass)
    out += "* reads `mass`: on this workload the needles stay put, so the "
           "prompt's and the last step's attention predict the next step's "
           "better than on a model; rank such flows on a model (vflow "
           "eval)\n";
  if (readsLayer)
    out += "^ reads `layer`: this workload is one layer (layer 0), so a "
           "budget or score that changes with depth is measured at layer 0 "
           "only; rank such flows on a model (vflow eval)\n";
  if (evicts)
    out += "~ has a retain block: sequences past its capacity evict blocks, "
           "and every column compares with attention over all their tokens "
           "(what eviction lost counts against the flow)\n";
  out += spec.backend == WorkloadSpec::Backend::Cpu
             ? "(index ms: the CPU backend's generated C++, one thread; "
               "attend ms: host sparse attention)\n"
             : "(attend ms: the GPU's whole decode step (index, select, "
               "attention) with host copies in and out, per step)\n";
  return out;
}

std::string
vflow::eval::formatReportJSON(const std::vector<FlowReport> &reports,
                              const std::vector<FlowFailure> &failures,
                              const WorkloadSpec &spec,
                              const std::string &baseline) {
  using rt::Json;
  Json workload = Json::object();
  workload.set("seed", double(spec.seed));
  workload.set("seeds", spec.seeds);
  Json lengths = Json::array();
  for (int64_t l : spec.lengths)
    lengths.push(l);
  workload.set("lengths", std::move(lengths));
  workload.set("kv_heads", spec.numKVHeads);
  workload.set("group", spec.group);
  workload.set("head_dim", spec.headDim);
  workload.set("steps", spec.steps);
  workload.set("needles", spec.needles);
  workload.set("distractors", spec.distractors);
  workload.set("head_spread", spec.headSpread);
  workload.set("backend",
               spec.backend == WorkloadSpec::Backend::Cpu ? "cpu" : "cuda");
  workload.set("outlier", spec.outlier);
  // Means over the seeds, with their standard errors (*_se).
  auto metrics = [](const Metrics &m, const Metrics &se) {
    Json out = Json::object();
    for (auto [key, field] : kJudged) {
      out.set(key, m.*field);
      out.set(std::string(key) + "_se", se.*field);
    }
    out.set("max_output_rel_error", m.maxRelError);
    return out;
  };
  Json flows = Json::array();
  for (size_t i = 0; i < reports.size(); ++i) {
    const FlowReport &r = reports[i];
    Json row = Json::object();
    row.set("flow", r.flow);
    row.set("file", r.file.empty() ? Json() : Json(r.file));
    Json params = Json::object();
    for (const auto &[name, value] : r.params) {
      char *end = nullptr;
      double number = std::strtod(value.c_str(), &end);
      bool whole = !value.empty() && end && *end == '\0';
      params.set(name, value == "true"    ? Json(true)
                       : value == "false" ? Json(false)
                       : whole            ? Json(number)
                                          : Json(value));
    }
    row.set("params", std::move(params));
    row.set("block_size", r.blockSize);
    row.set("seeds", r.seeds);
    row.set("blocks_attended", r.blocksAttended);
    row.set("blocks_total", r.blocksTotal);
    row.set("attended_share",
            r.blocksTotal > 0 ? r.blocksAttended / r.blocksTotal : 0.0);
    row.set("reads_mass", r.readsMass);
    row.set("reads_layer", r.readsLayer);
    row.set("evicts", r.evicts);
    row.set("index_ms_per_step", r.indexMs);
    row.set("sparse_ms_per_step", r.sparseMs);
    row.set("dense_ms_per_step", r.denseMs);
    row.set("cache_stage_ms", r.cacheStageMs);
    Json selection = metrics(r.flowMetrics, r.flowSE);
    Json perSeed = Json::array();
    for (size_t s = 0; s < r.perSeed.size(); ++s) {
      Json one = Json::object();
      one.set("seed", double(spec.seed + s));
      for (auto [key, field] : kJudged)
        one.set(key, r.perSeed[s].*field);
      perSeed.push(std::move(one));
    }
    selection.set("per_seed", std::move(perSeed));
    row.set("selection", std::move(selection));
    row.set("random", metrics(r.randomMetrics, r.randomSE));
    row.set("oracle", metrics(r.oracleMetrics, r.oracleSE));
    if (!baseline.empty()) {
      std::string why;
      int b = baselineRow(reports, i, baseline, why);
      Json vs = Json::object();
      if (b < 0) {
        vs.set("baseline", baseline);
        vs.set("error", why);
      } else {
        PairedDifference d = pairedDifference(r, reports[b]);
        vs.set("baseline", d.baseline);
        for (auto [key, field] : kJudged) {
          vs.set(std::string(key) + "_diff", d.mean.*field);
          vs.set(std::string(key) + "_diff_se", d.se.*field);
        }
      }
      row.set("vs_baseline", std::move(vs));
    }
    flows.push(std::move(row));
  }
  Json errors = Json::array();
  for (const FlowFailure &f : failures) {
    Json e = Json::object();
    e.set("file", f.file);
    e.set("flow", f.flow.empty() ? Json() : Json(f.flow));
    e.set("message", f.message);
    errors.push(std::move(e));
  }
  Json doc = Json::object();
  doc.set("workload", std::move(workload));
  doc.set("flows", std::move(flows));
  doc.set("errors", std::move(errors));
  return doc.dump();
}
