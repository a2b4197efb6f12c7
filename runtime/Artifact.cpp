//===- Artifact.cpp - Compiled flows on disk (.vfa) -----------------------===//

#include "vflow/Runtime/Artifact.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Json.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <sys/stat.h>

using namespace vflow::rt;

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

Json tensorToJson(const ArtifactTensor &t, bool field, bool state) {
  Json out = Json::object();
  out.set("name", t.name);
  out.set("dtype", dtypeName(t.dtype));
  out.set("axes", axesToJson(t.axes));
  if (field) {
    out.set("merge", t.merge);
    out.set("finalize", t.finalize);
  }
  if (state) {
    out.set("per_block", t.perBlock);
    out.set("init", double(t.init));
  }
  return out;
}

ArtifactTensor tensorFromJson(const Json &json, const std::string &what,
                              bool field, bool state) {
  ArtifactTensor t;
  t.name = json.at("name", what).asString(what + ".name");
  std::string where = what + " '" + t.name + "'";
  const std::string &dtype = json.at("dtype", where).asString(where + ".dtype");
  std::optional<DType> parsed = parseDType(dtype);
  if (!parsed)
    throw Error(where + ": unknown dtype '" + dtype + "'");
  t.dtype = *parsed;
  t.axes = axesFromJson(json.at("axes", where), where + ".axes");
  if (field) {
    t.merge = json.at("merge", where).asString(where + ".merge");
    t.finalize = json.at("finalize", where).asBool(where + ".finalize");
  }
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
    kernel.set("grid", k.grid);
    kernel.set("threads", k.threads);
    kernel.set("plan_tile", k.planTile);
    Json perBlock = Json::array(), fixed = Json::array();
    for (const auto &s : k.perBlockShared)
      perBlock.push(sizesToJson(s));
    for (const auto &s : k.fixedShared)
      fixed.push(sizesToJson(s));
    kernel.set("per_block_shared", std::move(perBlock));
    kernel.set("fixed_shared", std::move(fixed));
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
    j.set("kv_dtype", b.kvDType);
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
    kernel.grid = k.at("grid", kw).asString(kw + ".grid");
    if (kernel.grid != "append" && kernel.grid != "fields" &&
        kernel.grid != "tile" && kernel.grid != "row" &&
        kernel.grid != "commit")
      throw Error(kw + ": unknown grid '" + kernel.grid + "'");
    kernel.planTile = k.at("plan_tile", kw).asInt(kw + ".plan_tile");
    kernel.threads = k.at("threads", kw).asInt(kw + ".threads");
    if (kernel.threads < 32 || kernel.threads > 1024 || kernel.threads % 32)
      throw Error(kw + ": threads must be a multiple of 32 in [32, 1024]");
    for (const Json &s :
         k.at("per_block_shared", kw).asArray(kw + ".per_block_shared"))
      kernel.perBlockShared.push_back(sizesFromJson(s, kw));
    for (const Json &s : k.at("fixed_shared", kw).asArray(kw + ".fixed_shared"))
      kernel.fixedShared.push_back(sizesFromJson(s, kw));
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
      binary.kvDType = b.at("kv_dtype", w).asString(w + " binary kv_dtype");
      binary.ptx = b.at("ptx", w).asString(w + " binary ptx");
      gpu.binaries.push_back(std::move(binary));
    }
  return gpu;
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
  auto list = [](const std::vector<ArtifactTensor> &ts, bool field,
                 bool state) {
    Json arr = Json::array();
    for (const ArtifactTensor &t : ts)
      arr.push(tensorToJson(t, field, state));
    return arr;
  };
  out.set("consts", list(f.consts, false, false));
  out.set("fields", list(f.fields, true, false));
  out.set("states", list(f.states, false, true));
  Json inputs = Json::array();
  for (const std::string &i : f.indexInputs)
    inputs.push(i);
  out.set("index_inputs", std::move(inputs));
  out.set("selection", f.selection);
  Json kernels = Json::array();
  for (const ArtifactKernel &k : f.kernels) {
    Json kernel = Json::object();
    kernel.set("stage", k.stage);
    kernel.set("kind", k.kind);
    kernel.set("plan", k.plan);
    kernel.set("buffers", k.buffers);
    kernels.push(std::move(kernel));
  }
  out.set("kernels", std::move(kernels));
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
    if (param.type != "int" && param.type != "float" && param.type != "bool")
      throw Error(pw + ": unknown type '" + param.type + "'");
    param.value = p.at("value", pw).asNumber(pw + ".value");
    param.compileTime = p.at("compile_time", pw).asBool(pw + ".compile_time");
    f.params.push_back(param);
  }
  for (const Json &c : json.at("consts", w).asArray(w + ".consts"))
    f.consts.push_back(tensorFromJson(c, w + " const", false, false));
  for (const Json &c : json.at("fields", w).asArray(w + ".fields"))
    f.fields.push_back(tensorFromJson(c, w + " field", true, false));
  for (const Json &c : json.at("states", w).asArray(w + ".states"))
    f.states.push_back(tensorFromJson(c, w + " state", false, true));
  for (const Json &i : json.at("index_inputs", w).asArray(w + ".index_inputs"))
    f.indexInputs.push_back(i.asString(w + ".index_inputs[]"));
  f.selection = json.at("selection", w).asString(w + ".selection");
  for (const Json &k : json.at("kernels", w).asArray(w + ".kernels")) {
    ArtifactKernel kernel;
    kernel.stage = k.at("stage", w + " kernel").asString(w + " kernel stage");
    kernel.kind = k.at("kind", w + " kernel").asString(w + " kernel kind");
    kernel.plan = k.at("plan", w + " kernel").asString(w + " kernel plan");
    kernel.buffers =
        k.at("buffers", w + " kernel").asString(w + " kernel buffers");
    f.kernels.push_back(kernel);
  }
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

const ArtifactParam *FlowArtifact::findParam(const std::string &n) const {
  for (const ArtifactParam &p : params)
    if (p.name == n)
      return &p;
  return nullptr;
}

bool FlowArtifact::readsInput(const std::string &n) const {
  for (const std::string &i : indexInputs)
    if (i == n)
      return true;
  return false;
}

const FlowArtifact *Artifact::findFlow(const std::string &n) const {
  for (const FlowArtifact &f : flows)
    if (f.name == n)
      return &f;
  return nullptr;
}

uint64_t vflow::rt::fnv1a64(const std::string &bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string vflow::rt::serializeArtifact(const Artifact &artifact) {
  Json body = Json::object();
  body.set("compiler", artifact.compiler);
  Json flows = Json::array();
  for (const FlowArtifact &f : artifact.flows)
    flows.push(flowToJson(f));
  body.set("flows", std::move(flows));
  std::string text = body.dump();
  char header[128];
  std::snprintf(header, sizeof(header), "%s %d fnv1a64=%016llx bytes=%zu\n",
                kMagic, kArtifactVersion, (unsigned long long)fnv1a64(text),
                text.size());
  return header + text;
}

Artifact vflow::rt::parseArtifact(const std::string &bytes,
                                  const std::string &source) {
  size_t newline = bytes.find('\n');
  std::string header = bytes.substr(0, newline == std::string::npos
                                           ? std::min<size_t>(bytes.size(), 128)
                                           : newline);
  if (bytes.compare(0, std::strlen(kMagic), kMagic) != 0)
    throw Error(source + ": not a vflow artifact (it does not start with '" +
                kMagic + "')");
  int version = 0;
  unsigned long long checksum = 0;
  size_t size = 0;
  if (newline == std::string::npos ||
      std::sscanf(header.c_str(), "vflow-artifact %d fnv1a64=%llx bytes=%zu",
                  &version, &checksum, &size) != 3)
    throw Error(source + ": malformed artifact header '" + header + "'");
  if (version != kArtifactVersion)
    throw Error(source + ": artifact version " + std::to_string(version) +
                " is not supported by this runtime (it reads version " +
                std::to_string(kArtifactVersion) +
                "); recompile the program with this vflowc");
  std::string body = bytes.substr(newline + 1);
  if (body.size() != size)
    throw Error(source + ": artifact is truncated or padded: the header says " +
                std::to_string(size) + " bytes, the file holds " +
                std::to_string(body.size()));
  if (fnv1a64(body) != checksum)
    throw Error(source + ": artifact is corrupt (checksum mismatch)");
  Json json = Json::parse(body, source);
  Artifact artifact;
  artifact.version = version;
  artifact.compiler = json.at("compiler", source).asString("compiler");
  for (const Json &f : json.at("flows", source).asArray("flows"))
    artifact.flows.push_back(flowFromJson(f));
  if (artifact.flows.empty())
    throw Error(source + ": artifact holds no flow");
  return artifact;
}

Artifact vflow::rt::loadArtifact(const std::string &path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0)
    throw Error("no such artifact '" + path + "'");
  if (!S_ISREG(st.st_mode))
    throw Error("'" + path + "' is not a regular file");
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in && !in.eof())
    throw Error("cannot read '" + path + "'");
  return parseArtifact(ss.str(), path);
}

void vflow::rt::saveArtifact(const Artifact &artifact,
                             const std::string &path) {
  std::string bytes = serializeArtifact(artifact);
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out)
      throw Error("cannot write '" + path + "'");
    out << bytes;
    if (!out)
      throw Error("cannot write '" + path + "'");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw Error("cannot write '" + path + "'");
}
