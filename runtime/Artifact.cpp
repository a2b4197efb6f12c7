//===- Artifact.cpp - Compiled flows on disk (.vfa) -----------------------===//

#include "vflow/Runtime/Artifact.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Files.h"
#include "vflow/Runtime/Json.h"
#include "vflow/Runtime/Limits.h"
#include "vflow/Runtime/Names.h"
#include "vflow/Runtime/Params.h"
#include "vflow/Runtime/Sha256.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <sys/stat.h>

using namespace vflow::rt;
namespace limits = vflow::limits;

namespace {

constexpr const char *kMagic = "vflow-artifact";

Json axesToJson(const std::vector<ArtifactAxis> &axes) {
  Json out = Json::array();
  for (const ArtifactAxis &a : axes) {
    Json axis = Json::object();
    axis.set("name", a.name);
    axis.set("size", a.size);
    out.push(std::move(axis));
  }
  return out;
}

std::vector<ArtifactAxis> axesFromJson(const Json &json,
                                       const std::string &what) {
  std::vector<ArtifactAxis> axes;
  for (const Json &a : json.asArray(what)) {
    ArtifactAxis axis;
    axis.name = a.at("name", what).asString(what + ".name");
    axis.size = a.at("size", what).asInt(what + ".size");
    if (axis.size == 0 || axis.size < -3)
      throw Error(what + ": bad size " + std::to_string(axis.size) +
                  " for axis '" + axis.name + "'");
    axes.push_back(axis);
  }
  return axes;
}

Json tensorToJson(const ArtifactTensor &t, bool state) {
  Json out = Json::object();
  out.set("name", t.name);
  out.set("dtype", dtypeName(t.dtype));
  out.set("axes", axesToJson(t.axes));
  if (state) {
    out.set("per_block", t.perBlock);
    out.set("init", double(t.init));
  }
  return out;
}

ArtifactTensor tensorFromJson(const Json &json, const std::string &what,
                              bool state) {
  ArtifactTensor t;
  t.name = json.at("name", what).asString(what + ".name");
  std::string where = what + " '" + t.name + "'";
  const std::string &dtype = json.at("dtype", where).asString(where + ".dtype");
  std::optional<DType> parsed = parseDType(dtype);
  if (!parsed)
    throw Error(where + ": unknown dtype '" + dtype + "'");
  if (*parsed == DType::INT8)
    throw Error(where + ": dtype int8 is for the KV cache only, not for "
                        "fields and states");
  t.dtype = *parsed;
  t.axes = axesFromJson(json.at("axes", where), where + ".axes");
  if (state) {
    t.perBlock = json.at("per_block", where).asBool(where + ".per_block");
    t.init =
        static_cast<float>(json.at("init", where).asNumber(where + ".init"));
  }
  return t;
}

Json sizesToJson(const std::vector<int64_t> &sizes) {
  Json arr = Json::array();
  for (int64_t s : sizes)
    arr.push(s);
  return arr;
}

std::vector<int64_t> sizesFromJson(const Json &json, const std::string &w) {
  std::vector<int64_t> sizes;
  for (const Json &s : json.asArray(w)) {
    int64_t n = s.asInt(w + "[]");
    if (n < -3 || n == -1 || n == 0)
      throw Error(w + ": size " + std::to_string(n) + " is out of range");
    sizes.push_back(n);
  }
  return sizes;
}

Json gpuToJson(const GpuFlowInfo &gpu) {
  Json out = Json::object();
  out.set("source", gpu.source);
  Json kernels = Json::array();
  for (const GpuKernelInfo &k : gpu.kernels) {
    Json kernel = Json::object();
    kernel.set("symbol", k.symbol);
    kernel.set("grid", gpuGridName(k.grid));
    kernel.set("threads", k.threads);
    kernel.set("plan_tile", k.planTile);
    Json perBlock = Json::array(), fixed = Json::array();
    for (const auto &s : k.perBlockShared)
      perBlock.push(sizesToJson(s));
    for (const auto &s : k.fixedShared)
      fixed.push(sizesToJson(s));
    kernel.set("per_block_shared", std::move(perBlock));
    kernel.set("fixed_shared", std::move(fixed));
    kernel.set("appends", k.appends);
    kernels.push(std::move(kernel));
  }
  out.set("kernels", std::move(kernels));
  Json workspace = Json::array();
  for (const GpuWorkspaceSlot &slot : gpu.workspace) {
    Json j = Json::object();
    j.set("per_block", slot.perBlock);
    j.set("sizes", sizesToJson(slot.sizes));
    workspace.push(std::move(j));
  }
  out.set("workspace", std::move(workspace));
  Json binaries = Json::array();
  for (const GpuBinary &b : gpu.binaries) {
    Json j = Json::object();
    j.set("target", b.target);
    j.set("group", b.group);
    j.set("head_dim", b.headDim);
    j.set("kv_dtype", dtypeName(b.kvDType));
    j.set("ptx", b.ptx);
    binaries.push(std::move(j));
  }
  out.set("binaries", std::move(binaries));
  return out;
}

GpuFlowInfo gpuFromJson(const Json &json, const std::string &w) {
  GpuFlowInfo gpu;
  gpu.source = json.at("source", w).asString(w + ".source");
  for (const Json &k : json.at("kernels", w).asArray(w + ".kernels")) {
    GpuKernelInfo kernel;
    kernel.symbol = k.at("symbol", w + " kernel").asString(w + " kernel");
    std::string kw = w + " kernel '" + kernel.symbol + "'";
    const std::string &grid = k.at("grid", kw).asString(kw + ".grid");
    std::optional<GpuGrid> parsed = parseGpuGrid(grid);
    if (!parsed)
      throw Error(kw + ": unknown grid '" + grid +
                  "' (expected append, fields, tile, row or commit)");
    kernel.grid = *parsed;
    kernel.planTile = k.at("plan_tile", kw).asInt(kw + ".plan_tile");
    kernel.threads = k.at("threads", kw).asInt(kw + ".threads");
    if (kernel.threads < 32 || kernel.threads > 1024 || kernel.threads % 32)
      throw Error(kw + ": threads must be a multiple of 32 in [32, 1024]");
    for (const Json &s :
         k.at("per_block_shared", kw).asArray(kw + ".per_block_shared"))
      kernel.perBlockShared.push_back(sizesFromJson(s, kw));
    for (const Json &s : k.at("fixed_shared", kw).asArray(kw + ".fixed_shared"))
      kernel.fixedShared.push_back(sizesFromJson(s, kw));
    kernel.appends = k.at("appends", kw).asBool(kw + ".appends");
    gpu.kernels.push_back(std::move(kernel));
  }
  for (const Json &s : json.at("workspace", w).asArray(w + ".workspace")) {
    GpuWorkspaceSlot slot;
    slot.perBlock = s.at("per_block", w).asBool(w + " workspace per_block");
    slot.sizes = sizesFromJson(s.at("sizes", w), w + " workspace sizes");
    gpu.workspace.push_back(std::move(slot));
  }
  if (const Json *binaries = json.find("binaries"))
    for (const Json &b : binaries->asArray(w + ".binaries")) {
      GpuBinary binary;
      binary.target = b.at("target", w).asString(w + " binary target");
      binary.group = b.at("group", w).asInt(w + " binary group");
      binary.headDim = b.at("head_dim", w).asInt(w + " binary head_dim");
      const std::string kv =
          b.at("kv_dtype", w).asString(w + " binary kv_dtype");
      std::optional<DType> kvType = parseDType(kv);
      if (!kvType)
        throw Error(w + " binary kv_dtype: '" + kv + "' is not a dtype");
      binary.kvDType = *kvType;
      binary.ptx = b.at("ptx", w).asString(w + " binary ptx");
      gpu.binaries.push_back(std::move(binary));
    }
  return gpu;
}

const char *const kBudgetKinds[] = {
    "const", "param", "num_blocks", "context_len", "group", "layer", "kv_head",
    "add",   "sub",   "mul",        "div",         "min",   "max"};
static_assert(coversEnum(kBudgetKinds, BudgetNode::Kind::Max),
              "one name per budget node kind");

Json budgetsToJson(const FlowArtifact &f) {
  Json out = Json::array();
  for (const BudgetExpr &b : f.budgets) {
    Json nodes = Json::array();
    for (const BudgetNode &n : b.nodes) {
      Json node = Json::object();
      node.set("k", kBudgetKinds[int(n.kind)]);
      if (n.kind == BudgetNode::Kind::Const)
        node.set("v", n.value);
      else if (n.kind == BudgetNode::Kind::Param)
        node.set("p", f.params.at(size_t(n.param)).name);
      else if (n.kind >= BudgetNode::Kind::Add) {
        node.set("a", n.a);
        node.set("b", n.b);
      }
      nodes.push(std::move(node));
    }
    Json budget = Json::object();
    budget.set("what", b.what);
    budget.set("nodes", std::move(nodes));
    out.push(std::move(budget));
  }
  return out;
}

Json selectionBudgetToJson(const FlowArtifact &f) {
  Json out = Json::array();
  for (const SelectionNode &n : f.selectionBudget) {
    Json node = Json::object();
    switch (n.kind) {
    case SelectionNode::Kind::Budget:
      node.set("k", "budget");
      node.set("i", n.budget);
      break;
    case SelectionNode::Kind::TopK:
      node.set("k", "topk");
      node.set("i", n.budget);
      break;
    case SelectionNode::Kind::Union:
      node.set("k", "union");
      node.set("a", n.a);
      node.set("b", n.b);
      break;
    case SelectionNode::Kind::All:
      node.set("k", "all");
      break;
    }
    out.push(std::move(node));
  }
  return out;
}

void budgetsFromJson(const Json &json, FlowArtifact &f, const std::string &w) {
  for (const Json &b : json.at("budgets", w).asArray(w + ".budgets")) {
    BudgetExpr expr;
    expr.what = b.at("what", w + " budget").asString(w + " budget what");
    std::string bw = w + " budget '" + expr.what + "'";
    for (const Json &n : b.at("nodes", bw).asArray(bw + ".nodes")) {
      BudgetNode node;
      const std::string &kind = n.at("k", bw).asString(bw + " node kind");
      auto known =
          std::find(std::begin(kBudgetKinds), std::end(kBudgetKinds), kind);
      if (known == std::end(kBudgetKinds))
        throw Error(bw + ": unknown node kind '" + kind + "'");
      node.kind = BudgetNode::Kind(known - std::begin(kBudgetKinds));
      if (node.kind == BudgetNode::Kind::Const) {
        node.value = n.at("v", bw).asNumber(bw + " node value");
      } else if (node.kind == BudgetNode::Kind::Param) {
        const std::string &name = n.at("p", bw).asString(bw + " node param");
        node.param = -1;
        for (size_t i = 0; i < f.params.size(); ++i)
          if (f.params[i].name == name)
            node.param = int64_t(i);
        if (node.param < 0)
          throw Error(bw + ": reads unknown param '" + name + "'");
      } else if (node.kind >= BudgetNode::Kind::Add) {
        node.a = n.at("a", bw).asInt(bw + " node a");
        node.b = n.at("b", bw).asInt(bw + " node b");
      }
      expr.nodes.push_back(node);
    }
    validateBudget(expr, f.params.size(), bw);
    f.budgets.push_back(std::move(expr));
  }
  for (const Json &n :
       json.at("selection_budget", w).asArray(w + ".selection_budget")) {
    SelectionNode node;
    const std::string &kind = n.at("k", w).asString(w + " selection kind");
    if (kind == "budget" || kind == "topk") {
      node.kind = kind == "topk" ? SelectionNode::Kind::TopK
                                 : SelectionNode::Kind::Budget;
      node.budget = n.at("i", w).asInt(w + " selection budget");
    } else if (kind == "union") {
      node.kind = SelectionNode::Kind::Union;
      node.a = n.at("a", w).asInt(w + " selection a");
      node.b = n.at("b", w).asInt(w + " selection b");
    } else if (kind == "all") {
      node.kind = SelectionNode::Kind::All;
    } else {
      throw Error(w + ": unknown selection node kind '" + kind + "'");
    }
    f.selectionBudget.push_back(node);
  }
  validateSelection(f.selectionBudget, f.budgets.size(), w);
  if (const Json *r = json.find("retain")) {
    const std::string rw = w + ".retain";
    f.retainBudget = r->at("budget", rw).asInt(rw + ".budget");
    if (f.retainBudget < 0 || f.retainBudget >= int64_t(f.budgets.size()))
      throw Error(rw + ": budget " + std::to_string(f.retainBudget) +
                  " is not one of the flow's " +
                  std::to_string(f.budgets.size()) + " budgets");
    f.retainCombine = r->at("combine", rw).asString(rw + ".combine");
    if (f.retainCombine != "sum" && f.retainCombine != "max")
      throw Error(rw + ": combine must be \"sum\" or \"max\", not \"" +
                  f.retainCombine + "\"");
    f.retainScore = r->at("score", rw).asString(rw + ".score");
    const std::string grain =
        r->find("grain") ? r->at("grain", rw).asString(rw + ".grain") : "block";
    if (grain != "block" && grain != "token")
      throw Error(rw + ": grain must be \"block\" or \"token\", not \"" +
                  grain + "\"");
    f.retainTokens = grain == "token";
  }
}

const char kBase64[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// f32 values as base64 of their little-endian bytes.
std::string encodeFloats(const std::vector<float> &values) {
  std::string bytes(values.size() * 4, '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], 4);
    for (int b = 0; b < 4; ++b)
      bytes[i * 4 + b] = char((bits >> (8 * b)) & 0xff);
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t n = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size())
      n |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size())
      n |= uint32_t(uint8_t(bytes[i + 2]));
    out += kBase64[(n >> 18) & 63];
    out += kBase64[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? kBase64[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kBase64[n & 63] : '=';
  }
  return out;
}

std::vector<float> decodeFloats(const std::string &text,
                                const std::string &what) {
  auto value = [&](char c) -> uint32_t {
    const char *at = std::strchr(kBase64, c);
    if (!at || c == '\0')
      throw Error(what + ": invalid base64");
    return uint32_t(at - kBase64);
  };
  if (text.size() % 4 != 0)
    throw Error(what + ": invalid base64 length");
  std::string bytes;
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t n = (value(text[i]) << 18) | (value(text[i + 1]) << 12);
    bytes += char((n >> 16) & 0xff);
    if (text[i + 2] != '=') {
      n |= value(text[i + 2]) << 6;
      bytes += char((n >> 8) & 0xff);
      if (text[i + 3] != '=') {
        n |= value(text[i + 3]);
        bytes += char(n & 0xff);
      }
    } else if (text[i + 3] != '=') {
      throw Error(what + ": invalid base64 padding");
    }
  }
  if (bytes.size() % 4 != 0)
    throw Error(what + ": not a whole number of f32 values");
  std::vector<float> values(bytes.size() / 4);
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits = 0;
    for (int b = 0; b < 4; ++b)
      bits |= uint32_t(uint8_t(bytes[i * 4 + b])) << (8 * b);
    std::memcpy(&values[i], &bits, 4);
  }
  return values;
}

Json constValuesToJson(const FlowArtifact &f) {
  Json out = Json::array();
  for (const FlowArtifact::ConstValues &c : f.constValues) {
    Json entry = Json::object();
    entry.set("head_dim", c.headDim);
    Json values = Json::array();
    for (const std::vector<float> &v : c.values)
      values.push(encodeFloats(v));
    entry.set("values", std::move(values));
    out.push(std::move(entry));
  }
  return out;
}

void constValuesFromJson(const Json &json, FlowArtifact &f,
                         const std::string &w) {
  const Json *list = json.find("const_values");
  if (!list)
    return;
  for (const Json &c : list->asArray(w + ".const_values")) {
    FlowArtifact::ConstValues entry;
    entry.headDim = c.at("head_dim", w).asInt(w + " const_values head_dim");
    std::string cw =
        w + " const values for head dim " + std::to_string(entry.headDim);
    for (const Json &v : c.at("values", cw).asArray(cw + ".values"))
      entry.values.push_back(decodeFloats(v.asString(cw), cw));
    f.constValues.push_back(std::move(entry));
  }
}

Json flowToJson(const FlowArtifact &f) {
  Json out = Json::object();
  out.set("name", f.name);
  out.set("block_size", f.blockSize);
  out.set("keep_first", f.keepFirst);
  out.set("keep_last", f.keepLast);
  out.set("head_dim", f.headDim);
  Json params = Json::array();
  for (const ArtifactParam &p : f.params) {
    Json param = Json::object();
    param.set("name", p.name);
    param.set("type", p.type);
    param.set("value", p.value);
    param.set("compile_time", p.compileTime);
    params.push(std::move(param));
  }
  out.set("params", std::move(params));
  auto list = [](const std::vector<ArtifactTensor> &ts, bool state) {
    Json arr = Json::array();
    for (const ArtifactTensor &t : ts)
      arr.push(tensorToJson(t, state));
    return arr;
  };
  out.set("consts", list(f.consts, false));
  out.set("fields", list(f.fields, false));
  out.set("states", list(f.states, true));
  Json inputs = Json::array();
  for (const std::string &i : f.indexInputs)
    inputs.push(i);
  out.set("index_inputs", std::move(inputs));
  out.set("selection", f.selection);
  out.set("budgets", budgetsToJson(f));
  out.set("selection_budget", selectionBudgetToJson(f));
  if (f.retains()) {
    Json retain = Json::object();
    retain.set("budget", f.retainBudget);
    retain.set("combine", f.retainCombine);
    retain.set("score", f.retainScore);
    retain.set("grain", f.retainTokens ? "token" : "block");
    out.set("retain", std::move(retain));
  }
  Json entries = Json::object();
  for (const auto &e : f.entryPoints)
    entries.set(e.first, e.second);
  out.set("entry_points", std::move(entries));
  Json sources = Json::array();
  for (const ArtifactSource &s : f.sources) {
    Json source = Json::object();
    source.set("name", s.name);
    source.set("language", s.language);
    source.set("text", s.text);
    sources.push(std::move(source));
  }
  out.set("sources", std::move(sources));
  if (!f.gpu.source.empty())
    out.set("cuda", gpuToJson(f.gpu));
  if (!f.constValues.empty())
    out.set("const_values", constValuesToJson(f));
  return out;
}

FlowArtifact flowFromJson(const Json &json) {
  FlowArtifact f;
  f.name = json.at("name", "flow").asString("flow.name");
  std::string w = "flow '" + f.name + "'";
  f.blockSize = json.at("block_size", w).asInt(w + ".block_size");
  f.keepFirst = json.at("keep_first", w).asInt(w + ".keep_first");
  f.keepLast = json.at("keep_last", w).asInt(w + ".keep_last");
  f.headDim = json.at("head_dim", w).asInt(w + ".head_dim");
  if (f.blockSize < 1 || f.keepFirst < 0 || f.keepLast < 0 || f.headDim < 0)
    throw Error(w + ": block_size, keep_first, keep_last or head_dim is out "
                    "of range");
  for (const Json &p : json.at("params", w).asArray(w + ".params")) {
    ArtifactParam param;
    param.name = p.at("name", w + " param").asString(w + " param name");
    std::string pw = w + " param '" + param.name + "'";
    param.type = p.at("type", pw).asString(pw + ".type");
    if (!isOneOf(kParamTypeNames, param.type))
      throw Error(pw + ": unknown type '" + param.type + "'");
    param.value = p.at("value", pw).asNumber(pw + ".value");
    param.compileTime = p.at("compile_time", pw).asBool(pw + ".compile_time");
    f.params.push_back(param);
  }
  for (const Json &c : json.at("consts", w).asArray(w + ".consts"))
    f.consts.push_back(tensorFromJson(c, w + " const", false));
  for (const Json &c : json.at("fields", w).asArray(w + ".fields"))
    f.fields.push_back(tensorFromJson(c, w + " field", false));
  for (const Json &c : json.at("states", w).asArray(w + ".states"))
    f.states.push_back(tensorFromJson(c, w + " state", true));
  for (const Json &i : json.at("index_inputs", w).asArray(w + ".index_inputs"))
    f.indexInputs.push_back(i.asString(w + ".index_inputs[]"));
  f.selection = json.at("selection", w).asString(w + ".selection");
  budgetsFromJson(json, f, w);
  for (const auto &e : json.at("entry_points", w).members())
    f.entryPoints[e.first] = e.second.asString(w + " entry point");
  for (const Json &s : json.at("sources", w).asArray(w + ".sources")) {
    ArtifactSource source;
    source.name = s.at("name", w + " source").asString(w + " source name");
    source.language =
        s.at("language", w + " source").asString(w + " source language");
    source.text = s.at("text", w + " source").asString(w + " source text");
    f.sources.push_back(source);
  }
  if (const Json *cuda = json.find("cuda"))
    f.gpu = gpuFromJson(*cuda, w + " cuda");
  constValuesFromJson(json, f, w);
  return f;
}

} // namespace

int64_t ArtifactTensor::elements(int64_t headDim, int64_t group) const {
  int64_t n = 1;
  for (const ArtifactAxis &a : axes) {
    if (a.name == "block")
      continue;
    n *= a.size == -3 ? headDim : a.size == -2 ? group : a.size;
  }
  return n;
}

namespace {

/// The first element of `items` that `match` accepts, or null.
template <typename T, typename Match>
const T *findIn(const std::vector<T> &items, Match match) {
  auto it = std::find_if(items.begin(), items.end(), match);
  return it == items.end() ? nullptr : &*it;
}

} // namespace

const ArtifactParam *FlowArtifact::findParam(const std::string &n) const {
  return findIn(params, [&](const ArtifactParam &p) { return p.name == n; });
}

bool FlowArtifact::readsInput(const std::string &n) const {
  return std::find(indexInputs.begin(), indexInputs.end(), n) !=
         indexInputs.end();
}

const FlowArtifact::ConstValues *
FlowArtifact::findConstValues(int64_t d) const {
  return findIn(constValues,
                [&](const ConstValues &c) { return c.headDim == d; });
}

const FlowArtifact *Artifact::findFlow(const std::string &n) const {
  return findIn(flows, [&](const FlowArtifact &f) { return f.name == n; });
}

namespace {

/// Parses a run of decimal digits at `text[pos]` (at most `maxDigits`, no
/// sign); false when there is none or it is too long. `leadingZero` tells
/// whether it starts with a 0 and goes on (the header is written one way:
/// "08" is not 8).
bool parseDigits(const std::string &text, size_t &pos, size_t maxDigits,
                 uint64_t &value, bool &leadingZero) {
  size_t start = pos;
  value = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9' &&
         pos - start < maxDigits)
    value = value * 10 + uint64_t(text[pos++] - '0');
  leadingZero = pos - start > 1 && text[start] == '0';
  return pos > start &&
         (pos >= text.size() || text[pos] < '0' || text[pos] > '9');
}

bool consume(const std::string &text, size_t &pos, const char *word) {
  size_t n = std::strlen(word);
  if (text.compare(pos, n, word) != 0)
    return false;
  pos += n;
  return true;
}

} // namespace

std::string vflow::rt::flowSignature(const FlowArtifact &flow) {
  FlowArtifact meta = flow;
  meta.sources.clear();
  meta.gpu.source = meta.gpu.source.empty() ? "" : "cuda";
  meta.gpu.binaries.clear();
  return sha256Hex("vflow-signature 1\n" + flowToJson(meta).dump());
}

void vflow::rt::stampSignature(FlowArtifact &flow) {
  std::string line = kSignaturePrefix + flowSignature(flow) + "\n";
  for (ArtifactSource &src : flow.sources)
    src.text = line + src.text;
  if (!flow.gpu.source.empty())
    flow.gpu.source = line + flow.gpu.source;
}

std::string vflow::rt::serializeArtifact(const Artifact &artifact) {
  Json body = Json::object();
  body.set("compiler", artifact.compiler);
  Json flows = Json::array();
  for (const FlowArtifact &f : artifact.flows)
    flows.push(flowToJson(f));
  body.set("flows", std::move(flows));
  std::string text = body.dump();
  return std::string(kMagic) + " " + std::to_string(kArtifactVersion) +
         " sha256=" + sha256Hex(text) +
         " bytes=" + std::to_string(text.size()) + "\n" + text;
}

Artifact vflow::rt::parseArtifact(const std::string &bytes,
                                  const std::string &source) {
  if (bytes.compare(0, std::strlen(kMagic), kMagic) != 0)
    throw Error(source + ": not a vflow artifact (it does not start with '" +
                kMagic + "')");
  size_t newline = bytes.find('\n');
  std::string header =
      bytes.substr(0, std::min<size_t>(newline, 160)); // for messages
  auto malformed = [&](const std::string &why = "") {
    return Error(source + ": malformed artifact header '" + header + "'" +
                 (why.empty() ? "" : ": " + why) +
                 " (expected 'vflow-artifact " +
                 std::to_string(kArtifactVersion) +
                 " sha256=<64 hex digits> bytes=<n>')");
  };
  if (newline == std::string::npos)
    throw malformed();
  size_t pos = std::strlen(kMagic);
  uint64_t version = 0;
  bool leadingZero = false;
  if (!consume(bytes, pos, " ") ||
      !parseDigits(bytes, pos, 9, version, leadingZero))
    throw malformed();
  if (leadingZero)
    throw malformed("the version has a leading zero");
  if (version != uint64_t(kArtifactVersion))
    throw Error(source + ": artifact version " + std::to_string(version) +
                " is not supported by this runtime (it reads version " +
                std::to_string(kArtifactVersion) +
                "); recompile the program with this vflowc");
  if (!consume(bytes, pos, " sha256=") || pos + 64 > newline)
    throw malformed();
  std::string checksum = bytes.substr(pos, 64);
  for (char c : checksum)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
      throw malformed();
  pos += 64;
  uint64_t size = 0;
  if (!consume(bytes, pos, " bytes=") ||
      !parseDigits(bytes, pos, 12, size, leadingZero) || pos != newline)
    throw malformed();
  if (leadingZero)
    throw malformed("the byte count has a leading zero");
  std::string body = bytes.substr(newline + 1);
  if (body.size() != size)
    throw Error(source + ": artifact is truncated or padded: the header says " +
                std::to_string(size) + " bytes, the file holds " +
                std::to_string(body.size()));
  if (sha256Hex(body) != checksum)
    throw Error(source + ": artifact is corrupt (checksum mismatch); "
                         "artifacts are code: load only ones you trust");
  Json json = Json::parse(body, source);
  Artifact artifact;
  artifact.version = static_cast<int>(version);
  artifact.compiler = json.at("compiler", source).asString("compiler");
  for (const Json &f : json.at("flows", source).asArray("flows"))
    artifact.flows.push_back(flowFromJson(f));
  if (artifact.flows.empty())
    throw Error(source + ": artifact holds no flow");
  std::set<std::string> names;
  for (const FlowArtifact &f : artifact.flows) {
    if (!names.insert(f.name).second)
      throw Error(source + ": artifact holds flow '" + f.name + "' twice");
    validateFlowArtifact(f, source);
  }
  return artifact;
}

Artifact vflow::rt::loadArtifact(const std::string &path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw Error("cannot open artifact '" + path + "': " + errnoText(errno));
  if (!S_ISREG(st.st_mode))
    throw Error("'" + path + "' is not a regular file");
  if (st.st_size > kMaxArtifactBytes)
    throw Error("'" + path + "' is too large for an artifact (" +
                std::to_string(st.st_size) + " bytes; the limit is " +
                std::to_string(kMaxArtifactBytes) + ")");
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in && !in.eof())
    throw Error("cannot read '" + path + "'");
  return parseArtifact(ss.str(), path);
}

void vflow::rt::saveArtifact(const Artifact &artifact,
                             const std::string &path) {
  writeFileAtomically(path, serializeArtifact(artifact));
}
