//===- Sema.cpp - Semantic analysis of .vflow programs --------------------===//
//
// The checker's entry points: -p overrides, FlowInfo's tables of declared
// names, and the module driver, which checks each flow with one FlowChecker.
// SemaImpl.h lists the files of the checking phases.
//
//===----------------------------------------------------------------------===//

#include "SemaImpl.h"
#include "vflow/Runtime/Names.h"
#include "vflow/Runtime/ParamText.h"

#include <cctype>
#include <map>
#include <set>

using namespace vflow;
using namespace vflow::ast;
using namespace vflow::sema;

//===----------------------------------------------------------------------===//
// Small helpers
//===----------------------------------------------------------------------===//

namespace {

bool isIdentifier(const std::string &text) {
  if (text.empty() || std::isdigit(static_cast<unsigned char>(text[0])))
    return false;
  for (char c : text)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_')
      return false;
  return true;
}

} // namespace

std::string vflow::checkParamOverrideName(const std::string &name) {
  const char *form = "; write NAME=VALUE or FLOW.NAME=VALUE, e.g. budget=32 "
                     "or quest.budget=32";
  if (name.empty())
    return std::string("the param name before '=' is missing") + form;
  size_t dot = name.find('.');
  if (dot != std::string::npos) {
    if (name.find('.', dot + 1) != std::string::npos)
      return "'" + shortName(name) + "' has more than one '.'" + form;
    std::string flowName = name.substr(0, dot);
    std::string paramName = name.substr(dot + 1);
    if (flowName.empty())
      return "the flow name before '.' is missing" + std::string(form);
    if (paramName.empty())
      return "the param name after '.' is missing" + std::string(form);
    if (!isIdentifier(flowName))
      return "'" + shortName(flowName) +
             "' is not a valid flow name (letters, digits and '_', not "
             "starting with a digit)";
    if (!isIdentifier(paramName))
      return "'" + shortName(paramName) +
             "' is not a valid param name (letters, digits and '_', not "
             "starting with a digit)";
    return "";
  }
  if (!isIdentifier(name))
    return "'" + shortName(name) +
           "' is not a valid param name (letters, digits and '_', not "
           "starting with a digit)";
  return "";
}

bool vflow::parseParamOverride(const std::string &text, ParamOverride &out,
                               std::string &error) {
  size_t eq = text.find('=');
  if (eq == std::string::npos) {
    error = "expected NAME=VALUE or FLOW.NAME=VALUE, e.g. budget=32 or "
            "quest.budget=32";
    return false;
  }
  std::string name = text.substr(0, eq);
  error = checkParamOverrideName(name);
  if (!error.empty())
    return false;
  out.name = name;
  out.value = text.substr(eq + 1);
  return true;
}

bool vflow::parseParamOverride(const std::string &text, ParamOverride &out) {
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    return false;
  out.name = text.substr(0, eq);
  out.value = text.substr(eq + 1);
  return true;
}

// ParamType's names are the ones artifacts record.
static_assert(rt::coversEnum(rt::kParamTypeNames, ParamType::Bool),
              "one name per ParamType");

const char *vflow::paramTypeName(ParamType type) {
  return rt::nameOf(rt::kParamTypeNames, type, "int");
}

std::optional<ParamType> vflow::paramTypeNamed(std::string_view name) {
  return rt::enumNamed<ParamType>(rt::kParamTypeNames, name);
}

template <typename T>
static T &addByName(std::vector<T> &items,
                    std::unordered_map<std::string, size_t> &index, T item) {
  index.emplace(item.name, items.size());
  items.push_back(std::move(item));
  return items.back();
}

template <typename T>
static const T *findByName(const std::vector<T> &items,
                           const std::unordered_map<std::string, size_t> &index,
                           const std::string &name) {
  auto it = index.find(name);
  return it == index.end() ? nullptr : &items[it->second];
}

ParamInfo &FlowInfo::addParam(ParamInfo p) {
  return addByName(params, paramIndex, std::move(p));
}
AxisInfo &FlowInfo::addAxis(AxisInfo a) {
  return addByName(axes, axisIndex, std::move(a));
}
ConstInfo &FlowInfo::addConst(ConstInfo c) {
  return addByName(consts, constIndex, std::move(c));
}
FieldInfo &FlowInfo::addField(FieldInfo f) {
  return addByName(fields, fieldIndex, std::move(f));
}
StateInfo &FlowInfo::addState(StateInfo s) {
  return addByName(states, stateIndex, std::move(s));
}

const ParamInfo *FlowInfo::findParam(const std::string &n) const {
  return findByName(params, paramIndex, n);
}
const AxisInfo *FlowInfo::findAxis(const std::string &n) const {
  return findByName(axes, axisIndex, n);
}
const ConstInfo *FlowInfo::findConst(const std::string &n) const {
  return findByName(consts, constIndex, n);
}
const FieldInfo *FlowInfo::findField(const std::string &n) const {
  return findByName(fields, fieldIndex, n);
}
const StateInfo *FlowInfo::findState(const std::string &n) const {
  return findByName(states, stateIndex, n);
}
std::vector<std::string> FlowInfo::axisOrder() const {
  std::vector<std::string> order;
  for (const AxisInfo &a : axes)
    order.push_back(a.name);
  return order;
}
size_t FlowInfo::axisRank(const std::string &name) const {
  auto it = axisIndex.find(name);
  return it == axisIndex.end() ? axes.size() : it->second;
}
int64_t FlowInfo::blockSize() const {
  const ParamInfo *p = findParam("block_size");
  return p ? static_cast<int64_t>(p->value) : 16;
}

//===----------------------------------------------------------------------===//
// The checker of one flow
//===----------------------------------------------------------------------===//

void FlowChecker::run() {
  info.flow = &flow;
  info.name = flow.name.name;
  // Builtin axes in canonical order; sizes of token and dim follow params.
  info.addAxis({"block", kSizeBlocks, AxisOrigin::Builtin, {}});
  info.addAxis({"head", kSizeGroup, AxisOrigin::Builtin, {}});
  info.addAxis({"token", 16, AxisOrigin::Builtin, {}});
  info.addAxis({"dim", kSizeHeadDim, AxisOrigin::Builtin, {}});

  // Each phase stops at the error limit: past it nothing more is shown, and
  // checking on would cost time for nothing (a file of 40,000 bad
  // declarations would look for a suggestion for each).
  registerNames();
  checkParams();
  if (diags.shouldStop())
    return;
  info.axes[2].size = info.blockSize();
  if (const ParamInfo *hd = info.findParam("head_dim"))
    if (hd->value > 0)
      info.axes[3].size = static_cast<int64_t>(hd->value);
  // Then the rest in order (states after the cache stage, so they may use
  // axes made there).
  for (void (FlowChecker::*phase)() :
       {&FlowChecker::checkAxes, &FlowChecker::checkConsts,
        &FlowChecker::checkCache, &FlowChecker::checkStates,
        &FlowChecker::checkIndex, &FlowChecker::checkRetain}) {
    (this->*phase)();
    if (diags.shouldStop())
      return;
  }
}

//===----------------------------------------------------------------------===//
// Entry points
//===----------------------------------------------------------------------===//

bool vflow::analyzeModule(Module &module, const SemaOptions &options,
                          DiagnosticEngine &diags, CheckedModule &out) {
  unsigned errorsBefore = diags.getNumErrors();
  if (module.flows.empty()) {
    diags.error(DiagCode::NoFlow, SourceRange(0, 0),
                "no flow in this file; a program is 'flow NAME { ... }'");
    return false;
  }
  // Overrides from a caller that did not parse them with the reason
  // (parseParamOverride's short form) are checked here.
  std::set<std::string> malformed;
  for (const ParamOverride &ov : options.overrides) {
    std::string why = checkParamOverrideName(ov.name);
    if (why.empty())
      continue;
    malformed.insert(ov.name);
    diags.error(DiagCode::ParamOverride, SourceRange(),
                "-p " + shortName(ov.name) + "=" + shortName(ov.value) + ": " +
                    why);
  }
  std::map<std::string, SourceRange> flowNames;
  std::set<std::string> usedOverrides;
  out.flows.clear();
  out.flows.reserve(module.flows.size());
  for (Flow &flow : module.flows) {
    auto prev = flowNames.find(flow.name.name);
    if (prev != flowNames.end()) {
      diags.error(DiagCode::Redefinition, flow.name.range,
                  "redefinition of flow '" + flow.name.name + "'");
      diags.note(prev->second, "previous definition is here");
      continue;
    }
    flowNames[flow.name.name] = flow.name.range;
    out.flows.emplace_back();
    FlowChecker checker(flow, out.flows.back(), options, diags, usedOverrides);
    checker.run();
    if (diags.shouldStop())
      break;
  }
  if (options.usedOverrides)
    options.usedOverrides->insert(usedOverrides.begin(), usedOverrides.end());
  for (const ParamOverride &ov : options.overrides) {
    if (!options.reportUnusedOverrides)
      break;
    if (usedOverrides.count(ov.name) || malformed.count(ov.name))
      continue;
    std::string where = "-p " + ov.name + "=" + ov.value + ": ";
    std::string flowName, paramName = ov.name;
    size_t dot = ov.name.find('.');
    if (dot != std::string::npos) {
      flowName = ov.name.substr(0, dot);
      paramName = ov.name.substr(dot + 1);
    }
    std::vector<std::string> names;
    const FlowInfo *target = nullptr;
    for (const FlowInfo &f : out.flows) {
      if (f.name == flowName)
        target = &f;
      if (flowName.empty() || f.name == flowName)
        for (const ParamInfo &p : f.params)
          names.push_back(p.name);
    }
    if (!flowName.empty() && !target) {
      std::vector<std::string> flows;
      for (const FlowInfo &f : out.flows)
        flows.push_back(f.name);
      diags.error(DiagCode::ParamOverride, SourceRange(),
                  where + "there is no flow '" + shortName(flowName) +
                      "' in this file");
      if (auto close = closestName(flowName, flows))
        diags.hint(SourceRange(), "did you mean '" + *close + "'?");
      continue;
    }
    diags.error(DiagCode::ParamOverride, SourceRange(),
                where +
                    (target ? "flow '" + target->name + "' has"
                            : std::string("no flow in this file has")) +
                    (target ? " no param '" : " a param '") +
                    shortName(paramName) + "'");
    if (auto close = closestName(paramName, names))
      diags.hint(SourceRange(), "did you mean '" + *close + "'?");
  }
  return diags.getNumErrors() == errorsBefore;
}
