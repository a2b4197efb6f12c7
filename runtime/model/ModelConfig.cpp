//===- ModelConfig.cpp - Model hyperparameters from HF or GGUF ------------===//

#include "vflow/Model/ModelConfig.h"
#include "vflow/Runtime/Error.h"

#include <algorithm>
#include <cmath>

using namespace vflow;
using namespace vflow::model;
using vflow::rt::Error;
using vflow::rt::Json;

const char *vflow::model::ropeScalingName(RopeScaling::Type type) {
  switch (type) {
  case RopeScaling::Type::None:
    return "none";
  case RopeScaling::Type::Linear:
    return "linear";
  case RopeScaling::Type::Llama3:
    return "llama3";
  case RopeScaling::Type::FreqFactors:
    return "freq_factors";
  case RopeScaling::Type::Yarn:
    return "yarn";
  }
  return "?";
}

namespace {

[[noreturn]] void badField(const std::string &field, const std::string &why) {
  throw Error("model config: " + field + " " + why);
}

void checkSize(const char *field, int64_t value) {
  if (value < 1 || value > INT32_MAX)
    badField(field, "must be in [1, 2^31), not " + std::to_string(value));
}

void checkPositive(const char *field, double value) {
  if (!(value > 0) || !std::isfinite(value))
    badField(field, "must be positive and finite, not " + Json(value).dump());
}

/// Every entry of a list of layer indices lies in [0, numLayers).
void checkLayers(const char *field, const std::vector<int64_t> &layers,
                 int64_t numLayers) {
  for (int64_t l : layers)
    if (l < 0 || l >= numLayers)
      badField(field, "lists layer " + std::to_string(l) + " of " +
                          std::to_string(numLayers));
}

Json layerList(const std::vector<int64_t> &layers) {
  Json out = Json::array();
  for (int64_t l : layers)
    out.push(l);
  return out;
}

/// MLA's sizes: all or none, and the cache's row and head count theirs.
void validateLatent(const ModelConfig &c) {
  if (!c.mla()) {
    if (c.arch == "deepseek_v2" || c.arch == "deepseek_v3")
      badField("kvLoraRank", "must be positive for " + c.arch + " (MLA)");
    if (c.qLoraRank || c.qkNopeHeadDim || c.qkRopeHeadDim || c.vHeadDim)
      badField("kvLoraRank", "is 0, so the other MLA sizes must be too");
    return;
  }
  checkSize("kvLoraRank", c.kvLoraRank);
  checkSize("qkNopeHeadDim", c.qkNopeHeadDim);
  checkSize("qkRopeHeadDim", c.qkRopeHeadDim);
  checkSize("vHeadDim", c.vHeadDim);
  if (c.qLoraRank < 0)
    badField("qLoraRank", "must not be negative");
  if (c.headDim != c.kvLoraRank + c.qkRopeHeadDim)
    badField("headDim", "(" + std::to_string(c.headDim) +
                            ") must be kvLoraRank + qkRopeHeadDim (" +
                            std::to_string(c.kvLoraRank + c.qkRopeHeadDim) +
                            ") with MLA: the cached latent row");
  if (c.numKVHeads != 1)
    badField("numKVHeads", "must be 1 with MLA (one latent row a token)");
}

} // namespace

void ModelConfig::validate() const {
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" &&
      arch != "qwen3_moe" && arch != "mixtral" && arch != "gemma3" &&
      arch != "deepseek_v2" && arch != "deepseek_v3")
    badField("arch", "must be llama, qwen2, qwen3, qwen3_moe, mixtral, "
                     "gemma3, deepseek_v2 or deepseek_v3, not '" +
                         arch + "'");
  validateLatent(*this);
  if (activation != "silu" && activation != "gelu_tanh")
    badField("activation",
             "must be silu or gelu_tanh, not '" + activation + "'");
  if (!std::isfinite(normWeightOffset))
    badField("normWeightOffset", "must be finite");
  checkPositive("embedScale", embedScale);
  if (!(attentionScale >= 0) || !std::isfinite(attentionScale))
    badField("attentionScale", "must be 0 (1/sqrt(headDim)) or positive");
  if (!(ropeLocalTheta >= 0) || !std::isfinite(ropeLocalTheta))
    badField("ropeLocalTheta", "must be 0 (ropeTheta) or positive");
  checkLayers("fullAttentionLayers", fullAttentionLayers, numLayers);
  if (numExperts != 0 || arch == "qwen3_moe" || arch == "mixtral") {
    checkSize("numExperts", numExperts);
    checkSize("expertsPerToken", expertsPerToken);
    checkSize("expertIntermediateSize", expertIntermediateSize);
    if (expertsPerToken > numExperts)
      badField("expertsPerToken", "(" + std::to_string(expertsPerToken) +
                                      ") must be at most numExperts (" +
                                      std::to_string(numExperts) + ")");
    checkLayers("denseMlpLayers", denseMlpLayers, numLayers);
    if (numSharedExperts < 0)
      badField("numSharedExperts", "must not be negative");
    checkPositive("routedScalingFactor", routedScalingFactor);
    if (sigmoidRouter && expertGroups == 0)
      badField("expertGroups", "must be positive with a sigmoid router");
    if (expertGroups != 0) {
      checkSize("expertGroups", expertGroups);
      if (numExperts % expertGroups != 0)
        badField("expertGroups", "(" + std::to_string(expertGroups) +
                                     ") must divide numExperts (" +
                                     std::to_string(numExperts) + ")");
      if (topkGroups < 1 || topkGroups > expertGroups ||
          topkGroups * (numExperts / expertGroups) < expertsPerToken)
        badField("topkGroups", "(" + std::to_string(topkGroups) +
                                   ") must be in [1, expertGroups] and hold "
                                   "expertsPerToken experts");
    }
  }
  checkSize("vocabSize", vocabSize);
  checkSize("hiddenSize", hiddenSize);
  checkSize("intermediateSize", intermediateSize);
  checkSize("numLayers", numLayers);
  checkSize("numHeads", numHeads);
  checkSize("numKVHeads", numKVHeads);
  checkSize("headDim", headDim);
  checkSize("maxPositions", maxPositions);
  if (numHeads % numKVHeads != 0)
    badField("numKVHeads", "(" + std::to_string(numKVHeads) +
                               ") must divide numHeads (" +
                               std::to_string(numHeads) + ")");
  if (ropeDim() % 2 != 0)
    badField(mla() ? "qkRopeHeadDim" : "headDim",
             "(" + std::to_string(ropeDim()) + ") must be even for RoPE");
  if (slidingWindow < 0)
    badField("slidingWindow", "must not be negative");
  checkPositive("rmsNormEps", rmsNormEps);
  checkPositive("ropeTheta", ropeTheta);
  const RopeScaling &rs = ropeScaling;
  switch (rs.type) {
  case RopeScaling::Type::None:
    break;
  case RopeScaling::Type::Linear:
    checkPositive("ropeScaling.factor", rs.factor);
    break;
  case RopeScaling::Type::Llama3:
    checkPositive("ropeScaling.factor", rs.factor);
    checkPositive("ropeScaling.lowFreqFactor", rs.lowFreqFactor);
    checkPositive("ropeScaling.highFreqFactor", rs.highFreqFactor);
    if (!(rs.highFreqFactor > rs.lowFreqFactor))
      badField("ropeScaling.highFreqFactor",
               "must be greater than lowFreqFactor");
    checkSize("ropeScaling.originalMaxPositions", rs.originalMaxPositions);
    break;
  case RopeScaling::Type::FreqFactors:
    if (int64_t(rs.freqFactors.size()) != headDim / 2)
      badField("ropeScaling.freqFactors",
               "must have headDim / 2 = " + std::to_string(headDim / 2) +
                   " entries, not " + std::to_string(rs.freqFactors.size()));
    for (float f : rs.freqFactors)
      checkPositive("ropeScaling.freqFactors", f);
    break;
  case RopeScaling::Type::Yarn:
    checkPositive("ropeScaling.factor", rs.factor);
    checkSize("ropeScaling.originalMaxPositions", rs.originalMaxPositions);
    checkPositive("ropeScaling.betaFast", rs.betaFast);
    checkPositive("ropeScaling.betaSlow", rs.betaSlow);
    if (!(rs.mscale >= 0) || !(rs.mscaleAllDim >= 0) ||
        !std::isfinite(rs.mscale) || !std::isfinite(rs.mscaleAllDim))
      badField("ropeScaling.mscale", "must be finite and not negative");
    if (rs.attentionFactor >= 0 || !std::isfinite(rs.attentionFactor))
      checkPositive("ropeScaling.attentionFactor", rs.attentionFactor);
    break;
  }
  if (bosTokenId < -1 || bosTokenId >= vocabSize)
    badField("bosTokenId", "(" + std::to_string(bosTokenId) +
                               ") is outside the vocabulary (" +
                               std::to_string(vocabSize) + " tokens)");
  for (int64_t id : eosTokenIds)
    if (id < 0 || id >= vocabSize)
      badField("eosTokenIds", "(" + std::to_string(id) +
                                  ") is outside the vocabulary (" +
                                  std::to_string(vocabSize) + " tokens)");
}

Json ModelConfig::toJson() const {
  Json j = Json::object();
  j.set("arch", arch);
  j.set("vocabSize", vocabSize);
  j.set("hiddenSize", hiddenSize);
  j.set("intermediateSize", intermediateSize);
  j.set("numLayers", numLayers);
  j.set("numHeads", numHeads);
  j.set("numKVHeads", numKVHeads);
  j.set("headDim", headDim);
  if (numExperts > 0) {
    j.set("numExperts", numExperts);
    j.set("expertsPerToken", expertsPerToken);
    j.set("expertIntermediateSize", expertIntermediateSize);
    j.set("normTopKProb", normTopKProb);
    j.set("denseMlpLayers", layerList(denseMlpLayers));
    if (numSharedExperts > 0)
      j.set("numSharedExperts", numSharedExperts);
    if (routedScalingFactor != 1)
      j.set("routedScalingFactor", routedScalingFactor);
    if (sigmoidRouter)
      j.set("sigmoidRouter", true);
    if (mtpLayers > 0)
      j.set("mtpLayers", mtpLayers);
    if (expertGroups > 0) {
      j.set("expertGroups", expertGroups);
      j.set("topkGroups", topkGroups);
    }
  }
  if (mla()) {
    j.set("kvLoraRank", kvLoraRank);
    j.set("qLoraRank", qLoraRank);
    j.set("qkNopeHeadDim", qkNopeHeadDim);
    j.set("qkRopeHeadDim", qkRopeHeadDim);
    j.set("vHeadDim", vHeadDim);
  }
  if (ropeInterleaved)
    j.set("ropeInterleaved", true);
  if (slidingWindow > 0)
    j.set("slidingWindow", slidingWindow);
  if (!fullAttentionLayers.empty())
    j.set("fullAttentionLayers", layerList(fullAttentionLayers));
  if (ropeLocalTheta > 0)
    j.set("ropeLocalTheta", ropeLocalTheta);
  j.set("activation", activation);
  if (normWeightOffset != 0)
    j.set("normWeightOffset", normWeightOffset);
  if (sandwichNorms)
    j.set("sandwichNorms", true);
  if (embedScale != 1)
    j.set("embedScale", embedScale);
  if (attentionScale > 0)
    j.set("attentionScale", attentionScale);
  j.set("rmsNormEps", rmsNormEps);
  j.set("ropeTheta", ropeTheta);
  Json rs = Json::object();
  rs.set("type", ropeScalingName(ropeScaling.type));
  if (ropeScaling.type == RopeScaling::Type::Linear ||
      ropeScaling.type == RopeScaling::Type::Llama3 ||
      ropeScaling.type == RopeScaling::Type::Yarn)
    rs.set("factor", ropeScaling.factor);
  if (ropeScaling.type == RopeScaling::Type::Yarn) {
    rs.set("originalMaxPositions", ropeScaling.originalMaxPositions);
    rs.set("betaFast", ropeScaling.betaFast);
    rs.set("betaSlow", ropeScaling.betaSlow);
    rs.set("attentionFactor", ropeAttentionFactor(*this));
  }
  if (ropeScaling.type == RopeScaling::Type::Llama3) {
    rs.set("lowFreqFactor", ropeScaling.lowFreqFactor);
    rs.set("highFreqFactor", ropeScaling.highFreqFactor);
    rs.set("originalMaxPositions", ropeScaling.originalMaxPositions);
  }
  if (ropeScaling.type == RopeScaling::Type::FreqFactors) {
    Json factors = Json::array();
    for (float f : ropeScaling.freqFactors)
      factors.push(double(f));
    rs.set("freqFactors", std::move(factors));
  }
  j.set("ropeScaling", std::move(rs));
  j.set("maxPositions", maxPositions);
  j.set("tieEmbeddings", tieEmbeddings);
  j.set("attentionBias", attentionBias);
  j.set("qkNorm", qkNorm);
  j.set("bosTokenId", bosTokenId);
  Json eos = Json::array();
  for (int64_t id : eosTokenIds)
    eos.push(id);
  j.set("eosTokenIds", std::move(eos));
  return j;
}

namespace {

/// Validates `c`, prefixing errors with where it came from.
ModelConfig validated(ModelConfig c, const std::string &source) {
  try {
    c.validate();
  } catch (const Error &e) {
    throw Error(source + ": " + e.what());
  }
  return c;
}

/// A config.json's members, with errors naming the file and the key.
struct HFReader {
  const Json &config;
  const std::string &source;

  std::string what(const std::string &key) const {
    return source + ": '" + key + "'";
  }
  /// The member, or null when absent or JSON null.
  const Json *find(const std::string &key) const {
    const Json *v = config.find(key);
    return v && !v->isNull() ? v : nullptr;
  }
  int64_t integer(const std::string &key) const {
    return config.at(key, source).asInt(what(key));
  }
  double number(const std::string &key, double fallback) const {
    const Json *v = find(key);
    return v ? v->asNumber(what(key)) : fallback;
  }
  bool flag(const std::string &key) const {
    const Json *v = find(key);
    return v && v->asBool(what(key));
  }
};

void readRopeScaling(const Json &rs, const std::string &what, ModelConfig &c) {
  const Json *t = rs.find("rope_type");
  if (!t || t->isNull())
    t = rs.find("type");
  std::string type = t && !t->isNull() ? t->asString(what + ".rope_type")
                                       : std::string("default");
  auto number = [&](const char *key) {
    return rs.at(key, what).asNumber(what + "." + key);
  };
  RopeScaling &s = c.ropeScaling;
  if (type == "default") {
    s = RopeScaling();
  } else if (type == "linear") {
    s.type = RopeScaling::Type::Linear;
    s.factor = number("factor");
  } else if (type == "llama3") {
    s.type = RopeScaling::Type::Llama3;
    s.factor = number("factor");
    s.lowFreqFactor = number("low_freq_factor");
    s.highFreqFactor = number("high_freq_factor");
    s.originalMaxPositions = rs.at("original_max_position_embeddings", what)
                                 .asInt(what + ".original_max_position_"
                                               "embeddings");
  } else if (type == "yarn") {
    s.type = RopeScaling::Type::Yarn;
    s.factor = number("factor");
    s.originalMaxPositions = rs.at("original_max_position_embeddings", what)
                                 .asInt(what + ".original_max_position_"
                                               "embeddings");
    auto optional = [&](const char *key, double fallback) {
      const Json *v = rs.find(key);
      return v && !v->isNull() ? v->asNumber(what + "." + key) : fallback;
    };
    // transformers' _compute_yarn_parameters: 0 or absent betas take the
    // defaults; the ramp's bounds are truncated (floor, ceil).
    s.betaFast = optional("beta_fast", 0) ? optional("beta_fast", 0) : 32;
    s.betaSlow = optional("beta_slow", 0) ? optional("beta_slow", 0) : 1;
    s.mscale = optional("mscale", 0);
    s.mscaleAllDim = optional("mscale_all_dim", 0);
    s.attentionFactor = optional("attention_factor", -1);
    if (const Json *t = rs.find("truncate"))
      if (!t->isNull() && !t->asBool(what + ".truncate"))
        throw Error(what + ".truncate: false is not supported");
  } else {
    throw Error(what + ": rope scaling '" + type +
                "' is not supported (supported: default, linear, llama3, "
                "yarn)");
  }
}

/// The mixture of experts of a qwen3_moe or mixtral config.
/// rope_theta and rope_scaling, or Transformers 5's rope_parameters (for
/// Gemma 3 one per layer type: the full layers' is the model's, the
/// sliding layers' base is ropeLocalTheta).
void readRope(const HFReader &r, ModelConfig &c) {
  // Transformers 5 keeps rope_theta and the scaling in rope_parameters.
  const Json *params = r.find("rope_parameters");
  if (params && params->getKind() != Json::Kind::Object)
    throw Error(r.what("rope_parameters") + " must be an object");
  // Gemma 3's are per layer type: the full layers' is the model's.
  const Json *localParams = nullptr;
  if (params && params->find("full_attention")) {
    localParams = params->find("sliding_attention");
    params = params->find("full_attention");
    if (params->getKind() != Json::Kind::Object ||
        (localParams && localParams->getKind() != Json::Kind::Object))
      throw Error(r.what("rope_parameters") +
                  " must map each layer type to an object");
  }
  c.ropeTheta = r.number("rope_theta", 10000.0);
  if (!r.find("rope_theta") && params && params->find("rope_theta"))
    c.ropeTheta = params->find("rope_theta")
                      ->asNumber(r.what("rope_parameters") + ".rope_theta");
  if (c.arch == "gemma3") {
    c.ropeLocalTheta = r.number("rope_local_base_freq", 10000.0);
    if (localParams && localParams->find("rope_theta"))
      c.ropeLocalTheta = localParams->find("rope_theta")
                             ->asNumber(r.what("rope_parameters") +
                                        ".sliding_attention.rope_theta");
  }
  if (const Json *rs = r.find("rope_scaling")) {
    if (rs->getKind() != Json::Kind::Object)
      throw Error(r.what("rope_scaling") + " must be an object");
    readRopeScaling(*rs, r.what("rope_scaling"), c);
  } else if (params) {
    readRopeScaling(*params, r.what("rope_parameters"), c);
  }
}

/// Gemma 3 as llama.cpp runs it from a GGUF: the norms' (1 + w) is in the
/// file already, the scale is 1/sqrt(head dim) (query_pre_attn_scalar is
/// not kept; it equals the head dim but for the 27B), the sliding layers'
/// RoPE base is 10000 and every sixth layer attends fully.
void gemma3FromGGUF(const Json &metadata, const std::string &source,
                    ModelConfig &c) {
  c.activation = "gelu_tanh";
  c.sandwichNorms = true;
  c.embedScale = std::sqrt(double(c.hiddenSize));
  c.ropeLocalTheta = 10000.0;
  const std::string key = "gemma3.attention.sliding_window";
  if (const Json *w = metadata.find(key))
    c.slidingWindow = w->asInt(source + ": metadata key '" + key + "'");
  if (c.slidingWindow >= c.maxPositions)
    c.slidingWindow = 0;
  for (int64_t i = 0; i < c.numLayers; ++i)
    if ((i + 1) % 6 == 0)
      c.fullAttentionLayers.push_back(i);
}

/// Gemma 3's text model (model_type gemma3_text): its activation, norms,
/// scales, soft caps (refused) and which layers slide; the sliding window
/// itself and the RoPE bases are read with the other types'.
void readGemma3(const HFReader &r, ModelConfig &c) {
  for (const char *key : {"hidden_activation", "hidden_act"})
    if (const Json *act = r.find(key)) {
      const std::string name = act->asString(r.what(key));
      if (name != "gelu_pytorch_tanh" && name != "gelu_tanh")
        throw Error(r.what(key) + ": '" + name +
                    "' is not supported for gemma3_text (only "
                    "gelu_pytorch_tanh)");
    }
  for (const char *key : {"attn_logit_softcapping", "final_logit_softcapping"})
    if (r.find(key))
      throw Error(r.what(key) + ": logit soft-capping is not supported "
                                "(Gemma 3 has none; Gemma 2 has)");
  c.activation = "gelu_tanh";
  c.normWeightOffset = 1.0;
  c.sandwichNorms = true;
  c.embedScale = std::sqrt(double(r.integer("hidden_size")));
  const double scalar =
      r.number("query_pre_attn_scalar",
               double(r.find("head_dim") ? r.integer("head_dim") : 256));
  if (!(scalar > 0) || !std::isfinite(scalar))
    throw Error(r.what("query_pre_attn_scalar") + " must be positive");
  c.attentionScale = 1.0 / std::sqrt(scalar);
  const int64_t layers = r.integer("num_hidden_layers");
  if (const Json *types = r.find("layer_types")) {
    const auto &list = types->asArray(r.what("layer_types"));
    if (int64_t(list.size()) != layers)
      throw Error(r.what("layer_types") + " has " +
                  std::to_string(list.size()) + " entries for " +
                  std::to_string(layers) + " layers");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string t = list[i].asString(r.what("layer_types"));
      if (t == "full_attention")
        c.fullAttentionLayers.push_back(int64_t(i));
      else if (t != "sliding_attention")
        throw Error(r.what("layer_types") + "[" + std::to_string(i) + "]: '" +
                    t + "' is not sliding_attention or full_attention");
    }
  } else {
    // Older configs: every sliding_window_pattern-th layer is full.
    const int64_t pattern = r.find("sliding_window_pattern")
                                ? r.integer("sliding_window_pattern")
                                : 6;
    if (pattern < 1)
      throw Error(r.what("sliding_window_pattern") + " must be positive");
    for (int64_t i = 0; i < layers; ++i)
      if ((i + 1) % pattern == 0)
        c.fullAttentionLayers.push_back(i);
  }
}

/// DeepSeek-V2's router (transformers' DeepseekV2TopkRouter): softmax,
/// greedy or group-limited by each group's best, never renormalized.
void readV2Router(const HFReader &r, ModelConfig &c) {
  c.normTopKProb = false;
  // DeepSeek's own code renormalizes when norm_topk_prob; transformers'
  // router never does: the two disagree, so it is refused.
  if (r.flag("norm_topk_prob"))
    throw Error(r.what("norm_topk_prob") +
                " = true is not supported for deepseek_v2");
  if (const Json *f = r.find("scoring_func"))
    if (f->asString(r.what("scoring_func")) != "softmax")
      throw Error(r.what("scoring_func") + ": '" + f->asString("") +
                  "' is not supported for deepseek_v2 (softmax; DeepSeek-V3's "
                  "sigmoid router is model_type deepseek_v3)");
  const std::string method =
      r.find("topk_method")
          ? r.find("topk_method")->asString(r.what("topk_method"))
          : std::string("greedy");
  if (method == "group_limited_greedy") {
    c.expertGroups = r.integer("n_group");
    c.topkGroups = r.integer("topk_group");
  } else if (method != "greedy") {
    throw Error(r.what("topk_method") + ": '" + method +
                "' is not supported for deepseek_v2 (greedy, "
                "group_limited_greedy)");
  }
}

/// DeepSeek-V3's router (transformers' DeepseekV3TopkRouter): sigmoid
/// scores, a correction bias for the choice, n_group groups ranked by their
/// two best (n_group 1: one group), norm_topk_prob.
void readV3Router(const HFReader &r, ModelConfig &c) {
  c.sigmoidRouter = true;
  c.normTopKProb = r.find("norm_topk_prob") ? r.flag("norm_topk_prob") : true;
  if (const Json *f = r.find("scoring_func"))
    if (f->asString(r.what("scoring_func")) != "sigmoid")
      throw Error(r.what("scoring_func") + ": '" + f->asString("") +
                  "' is not supported for deepseek_v3 (sigmoid)");
  if (const Json *m = r.find("topk_method"))
    if (m->asString(r.what("topk_method")) != "noaux_tc")
      throw Error(r.what("topk_method") + ": '" + m->asString("") +
                  "' is not supported for deepseek_v3 (noaux_tc)");
  c.expertGroups = r.find("n_group") ? r.integer("n_group") : 1;
  c.topkGroups = r.find("topk_group") ? r.integer("topk_group") : 1;
}

/// DeepSeek-V2/V3's attention (MLA) and mixture of experts, as
/// transformers' DeepseekV2Attention / DeepseekV3Attention and their MoE
/// blocks run them.
void readDeepseek(const HFReader &r, ModelConfig &c) {
  c.kvLoraRank = r.integer("kv_lora_rank");
  c.qLoraRank = r.find("q_lora_rank") ? r.integer("q_lora_rank") : 0;
  c.qkNopeHeadDim = r.integer("qk_nope_head_dim");
  c.qkRopeHeadDim = r.integer("qk_rope_head_dim");
  c.vHeadDim = r.integer("v_head_dim");
  c.numKVHeads = 1;
  c.headDim = c.kvLoraRank + c.qkRopeHeadDim;
  // V3 may rotate halves (rope_interleave false); the layout changes
  // nothing else.
  c.ropeInterleaved = c.arch != "deepseek_v3" || !r.find("rope_interleave") ||
                      r.flag("rope_interleave");
  c.mtpLayers = r.find("num_nextn_predict_layers")
                    ? r.integer("num_nextn_predict_layers")
                    : 0;
  if (c.mtpLayers < 0)
    throw Error(r.what("num_nextn_predict_layers") + " must not be negative");
  if (!r.find("n_routed_experts"))
    return;
  c.numExperts = r.integer("n_routed_experts");
  c.expertsPerToken = r.integer("num_experts_per_tok");
  c.expertIntermediateSize = r.integer("moe_intermediate_size");
  c.numSharedExperts =
      r.find("n_shared_experts") ? r.integer("n_shared_experts") : 0;
  c.routedScalingFactor = r.number("routed_scaling_factor", 1.0);
  if (c.arch == "deepseek_v3") {
    readV3Router(r, c);
  } else {
    readV2Router(r, c);
  }
  if (r.find("moe_layer_freq") && r.integer("moe_layer_freq") != 1)
    throw Error(r.what("moe_layer_freq") + " must be 1 (transformers runs "
                                           "every layer from "
                                           "first_k_dense_replace on as "
                                           "experts)");
  const int64_t dense =
      r.find("first_k_dense_replace") ? r.integer("first_k_dense_replace") : 0;
  if (dense < 0)
    throw Error(r.what("first_k_dense_replace") + " must not be negative");
  for (int64_t l = 0; l < std::min(dense, c.numLayers); ++l)
    c.denseMlpLayers.push_back(l);
}

/// YaRN's mscale: 0.1 m ln(s) + 1 for a factor s > 1, else 1.
double yarnMscale(double factor, double m) {
  return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

void readExperts(const HFReader &r, ModelConfig &c) {
  if (c.arch == "qwen3_moe") {
    c.numExperts = r.integer("num_experts");
    c.expertsPerToken = r.integer("num_experts_per_tok");
    c.expertIntermediateSize = r.integer("moe_intermediate_size");
    c.normTopKProb = r.flag("norm_topk_prob");
    // A layer is sparse when it is not in mlp_only_layers and (l + 1) is a
    // multiple of decoder_sparse_step (transformers' Qwen3MoeDecoderLayer).
    const int64_t step =
        r.find("decoder_sparse_step") ? r.integer("decoder_sparse_step") : 1;
    if (step < 1)
      throw Error(r.what("decoder_sparse_step") + " must be >= 1");
    std::vector<int64_t> only;
    if (const Json *o = r.find("mlp_only_layers"))
      for (const Json &l : o->asArray(r.what("mlp_only_layers")))
        only.push_back(l.asInt(r.what("mlp_only_layers")));
    for (int64_t l = 0; l < c.numLayers; ++l)
      if (std::find(only.begin(), only.end(), l) != only.end() ||
          (l + 1) % step != 0)
        c.denseMlpLayers.push_back(l);
  } else if (c.arch == "mixtral") {
    c.numExperts = r.integer("num_local_experts");
    c.expertsPerToken = r.integer("num_experts_per_tok");
    c.expertIntermediateSize = c.intermediateSize;
    c.normTopKProb = true;
  }
}

} // namespace

bool ModelConfig::moeLayer(int64_t layer) const {
  return numExperts > 0 &&
         std::find(denseMlpLayers.begin(), denseMlpLayers.end(), layer) ==
             denseMlpLayers.end();
}

bool ModelConfig::slidingLayer(int64_t layer) const {
  return slidingWindow > 0 &&
         std::find(fullAttentionLayers.begin(), fullAttentionLayers.end(),
                   layer) == fullAttentionLayers.end();
}

ModelConfig vflow::model::configFromHF(const Json &config,
                                       const std::string &source) {
  if (config.getKind() != Json::Kind::Object)
    throw Error(source + ": a model config must be a JSON object");
  HFReader r{config, source};
  ModelConfig c;
  std::string type =
      config.at("model_type", source).asString(r.what("model_type"));
  if (type == "llama" || type == "mistral")
    c.arch = "llama";
  else if (type == "qwen2" || type == "qwen3" || type == "qwen3_moe" ||
           type == "mixtral")
    c.arch = type;
  else if (type == "gemma3_text")
    c.arch = "gemma3";
  else if (type == "deepseek_v2" || type == "deepseek_v3")
    c.arch = type;
  else
    throw Error(source + ": model_type '" + type +
                "' is not supported (supported: llama, mistral, qwen2, "
                "qwen3, qwen3_moe, mixtral, gemma3_text, deepseek_v2, "
                "deepseek_v3" +
                (type == "gemma3" ? "; a multimodal Gemma 3's text model is "
                                    "its text_config: gemma3_text"
                                  : "") +
                ")");

  // What these model types can ask for that the engine does not do.
  if (c.arch == "gemma3") {
    readGemma3(r, c);
  } else if (const Json *act = r.find("hidden_act")) {
    if (act->asString(r.what("hidden_act")) != "silu")
      throw Error(source + ": hidden_act '" + act->asString("") +
                  "' is not supported (only silu)");
  }
  if (type != "qwen2" && r.flag("attention_bias"))
    throw Error(source +
                ": attention_bias = true (biases on q/k/v and "
                "o_proj) is not supported for model_type '" +
                type + "'");
  if (r.flag("mlp_bias"))
    throw Error(source + ": mlp_bias = true is not supported");
  if (r.flag("use_sliding_window"))
    throw Error(source + ": use_sliding_window = true is not supported");

  c.vocabSize = r.integer("vocab_size");
  c.hiddenSize = r.integer("hidden_size");
  c.intermediateSize = r.integer("intermediate_size");
  c.numLayers = r.integer("num_hidden_layers");
  c.numHeads = r.integer("num_attention_heads");
  c.numKVHeads = r.find("num_key_value_heads")
                     ? r.integer("num_key_value_heads")
                     : c.numHeads;
  if (c.arch == "deepseek_v2" || c.arch == "deepseek_v3") {
    readDeepseek(r, c);
  } else if (r.find("head_dim")) {
    c.headDim = r.integer("head_dim");
  } else {
    if (c.numHeads < 1 || c.hiddenSize % c.numHeads != 0)
      throw Error(source + ": hidden_size (" + std::to_string(c.hiddenSize) +
                  ") is not divisible by num_attention_heads (" +
                  std::to_string(c.numHeads) + ") and there is no head_dim");
    c.headDim = c.hiddenSize / c.numHeads;
  }
  c.maxPositions = r.integer("max_position_embeddings");
  // Mistral and Mixtral slide every layer's attention over the last
  // sliding_window tokens; other types only with use_sliding_window (refused
  // above), so their sliding_window is unused.
  if ((type == "mistral" || type == "mixtral" || type == "gemma3_text") &&
      r.find("sliding_window") && r.integer("sliding_window") < c.maxPositions)
    c.slidingWindow = r.integer("sliding_window");
  else if (type != "qwen2" && type != "mistral" && type != "mixtral" &&
           type != "gemma3_text" && r.find("sliding_window") &&
           r.integer("sliding_window") < c.maxPositions &&
           r.flag("use_sliding_window"))
    throw Error(source + ": sliding_window (" +
                std::to_string(r.integer("sliding_window")) +
                " < max_position_embeddings) is not supported");
  c.rmsNormEps = r.number("rms_norm_eps", 1e-6);

  readRope(r, c);
  if (c.mla()) {
    // transformers' yarn_apply_mscale: the softmax scale of the full
    // query-key width, times mscale(factor, mscale_all_dim)^2.
    c.attentionScale =
        1.0 / std::sqrt(double(c.qkNopeHeadDim + c.qkRopeHeadDim));
    const RopeScaling &rs = c.ropeScaling;
    if (rs.type != RopeScaling::Type::None && rs.mscaleAllDim > 0) {
      const double m = yarnMscale(rs.factor, rs.mscaleAllDim);
      c.attentionScale *= m * m;
    }
  }

  // Gemma 3 ties them unless it says otherwise.
  c.tieEmbeddings = r.find("tie_word_embeddings")
                        ? r.flag("tie_word_embeddings")
                        : c.arch == "gemma3";
  c.attentionBias = c.arch == "qwen2";
  c.qkNorm = c.arch == "qwen3" || c.arch == "qwen3_moe" || c.arch == "gemma3";
  if (!c.mla())
    readExperts(r, c);
  if (r.find("bos_token_id"))
    c.bosTokenId = r.integer("bos_token_id");
  if (const Json *eos = r.find("eos_token_id")) {
    if (eos->getKind() == Json::Kind::Array) {
      for (const Json &id : eos->asArray(""))
        c.eosTokenIds.push_back(id.asInt(r.what("eos_token_id")));
    } else {
      c.eosTokenIds.push_back(eos->asInt(r.what("eos_token_id")));
    }
  }
  return validated(std::move(c), source);
}

ModelConfig vflow::model::configFromGGUF(const Json &metadata,
                                         const std::string &source,
                                         int64_t embedRows,
                                         bool hasOutputWeight) {
  auto what = [&](const std::string &key) {
    return source + ": metadata key '" + key + "'";
  };
  auto find = [&](const std::string &key) { return metadata.find(key); };
  auto integer = [&](const std::string &key) {
    const Json *v = find(key);
    if (!v)
      throw Error(source + ": missing metadata key '" + key + "'");
    return v->asInt(what(key));
  };
  ModelConfig c;
  const Json *archValue = find("general.architecture");
  if (!archValue)
    throw Error(source + ": missing metadata key 'general.architecture'");
  c.arch = archValue->asString(what("general.architecture"));
  if (c.arch != "llama" && c.arch != "qwen2" && c.arch != "qwen3" &&
      c.arch != "gemma3")
    throw Error(source + ": general.architecture '" + c.arch +
                "' is not supported (supported: llama, qwen2, qwen3, "
                "gemma3)");
  std::string p = c.arch + ".";

  c.numLayers = integer(p + "block_count");
  c.hiddenSize = integer(p + "embedding_length");
  c.intermediateSize = integer(p + "feed_forward_length");
  c.numHeads = integer(p + "attention.head_count");
  c.numKVHeads = find(p + "attention.head_count_kv")
                     ? integer(p + "attention.head_count_kv")
                     : c.numHeads;
  if (find(p + "attention.key_length")) {
    c.headDim = integer(p + "attention.key_length");
  } else {
    if (c.numHeads < 1 || c.hiddenSize % c.numHeads != 0)
      throw Error(source + ": " + p + "embedding_length (" +
                  std::to_string(c.hiddenSize) + ") is not divisible by " + p +
                  "attention.head_count (" + std::to_string(c.numHeads) +
                  ") and there is no " + p + "attention.key_length");
    c.headDim = c.hiddenSize / c.numHeads;
  }
  if (find(p + "attention.value_length") &&
      integer(p + "attention.value_length") != c.headDim)
    throw Error(what(p + "attention.value_length") +
                ": a value head size other than the key's (" +
                std::to_string(c.headDim) + ") is not supported");
  if (find(p + "rope.dimension_count") &&
      integer(p + "rope.dimension_count") != c.headDim)
    throw Error(what(p + "rope.dimension_count") +
                ": partial rotary embeddings (fewer dims than the head's " +
                std::to_string(c.headDim) + ") are not supported");
  if (!find(p + "attention.layer_norm_rms_epsilon"))
    throw Error(source + ": missing metadata key '" + p +
                "attention.layer_norm_rms_epsilon'");
  c.rmsNormEps = find(p + "attention.layer_norm_rms_epsilon")
                     ->asNumber(what(p + "attention.layer_norm_rms_epsilon"));
  if (const Json *base = find(p + "rope.freq_base"))
    c.ropeTheta = base->asNumber(what(p + "rope.freq_base"));
  c.maxPositions = integer(p + "context_length");

  std::string scaling = "none";
  if (const Json *t = find(p + "rope.scaling.type"))
    scaling = t->asString(what(p + "rope.scaling.type"));
  else if (const Json *f = find(p + "rope.scale_linear")) // older files
    if (f->asNumber(what(p + "rope.scale_linear")) != 1.0)
      scaling = "linear";
  if (scaling == "linear") {
    c.ropeScaling.type = RopeScaling::Type::Linear;
    const Json *f = find(p + "rope.scaling.factor");
    if (!f)
      f = find(p + "rope.scale_linear");
    if (!f)
      throw Error(source + ": missing metadata key '" + p +
                  "rope.scaling.factor'");
    c.ropeScaling.factor = f->asNumber(what(p + "rope.scaling.factor"));
  } else if (scaling == "yarn") {
    throw Error(what(p + "rope.scaling.type") +
                ": rope scaling 'yarn' is not supported");
  } else if (scaling != "none") {
    throw Error(what(p + "rope.scaling.type") + ": rope scaling '" + scaling +
                "' is not supported (supported: none, linear)");
  }

  if (find(p + "vocab_size"))
    c.vocabSize = integer(p + "vocab_size");
  else if (const Json *tokens = find("tokenizer.ggml.tokens"))
    c.vocabSize =
        int64_t(tokens->asArray(what("tokenizer.ggml.tokens")).size());
  else
    c.vocabSize = embedRows;
  c.tieEmbeddings = !hasOutputWeight;
  c.attentionBias = c.arch == "qwen2";
  c.qkNorm = c.arch == "qwen3" || c.arch == "gemma3";
  if (c.arch == "gemma3")
    gemma3FromGGUF(metadata, source, c);
  if (find("tokenizer.ggml.bos_token_id"))
    c.bosTokenId = integer("tokenizer.ggml.bos_token_id");
  for (const char *key :
       {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id"}) {
    if (!find(key))
      continue;
    int64_t id = integer(key);
    bool seen = false;
    for (int64_t e : c.eosTokenIds)
      seen |= e == id;
    if (!seen)
      c.eosTokenIds.push_back(id);
  }
  return validated(std::move(c), source);
}

double vflow::model::ropeAttentionFactor(const ModelConfig &c) {
  const RopeScaling &s = c.ropeScaling;
  if (s.type != RopeScaling::Type::Yarn)
    return 1.0;
  if (s.attentionFactor >= 0)
    return s.attentionFactor;
  if (s.mscale > 0 && s.mscaleAllDim > 0)
    return yarnMscale(s.factor, s.mscale) /
           yarnMscale(s.factor, s.mscaleAllDim);
  return yarnMscale(s.factor, 1.0);
}

std::vector<float> vflow::model::ropeInverseFrequencies(const ModelConfig &c) {
  c.validate();
  const int64_t dim = c.ropeDim();
  std::vector<float> out(static_cast<size_t>(dim / 2));
  const RopeScaling &s = c.ropeScaling;
  const double pi = 3.14159265358979323846;
  // YaRN's ramp (transformers' find_correction_range, truncated): the
  // dimensions below `low` extrapolate, above `high` interpolate.
  double low = 0, high = 0;
  if (s.type == RopeScaling::Type::Yarn) {
    auto correction = [&](double rotations) {
      return double(dim) *
             std::log(double(s.originalMaxPositions) / (rotations * 2 * pi)) /
             (2 * std::log(c.ropeTheta));
    };
    low = std::max(std::floor(correction(s.betaFast)), 0.0);
    high = std::min(std::ceil(correction(s.betaSlow)), double(dim - 1));
    if (low == high)
      high += 0.001;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    double inv = 1.0 / std::pow(c.ropeTheta, double(2 * i) / double(dim));
    switch (s.type) {
    case RopeScaling::Type::None:
      break;
    case RopeScaling::Type::Linear:
      inv /= s.factor;
      break;
    case RopeScaling::Type::Llama3: {
      // Hugging Face's _compute_llama3_parameters.
      double old = double(s.originalMaxPositions);
      double lowWavelen = old / s.lowFreqFactor;
      double highWavelen = old / s.highFreqFactor;
      double wavelen = 2 * pi / inv;
      if (wavelen > lowWavelen) {
        inv /= s.factor;
      } else if (wavelen >= highWavelen) {
        double smooth = (old / wavelen - s.lowFreqFactor) /
                        (s.highFreqFactor - s.lowFreqFactor);
        inv = (1 - smooth) * inv / s.factor + smooth * inv;
      }
      break;
    }
    case RopeScaling::Type::FreqFactors:
      inv /= double(s.freqFactors[i]);
      break;
    case RopeScaling::Type::Yarn: {
      const double ramp =
          std::min(std::max((double(i) - low) / (high - low), 0.0), 1.0);
      const double extrapolate = 1 - ramp;
      inv = inv / s.factor * (1 - extrapolate) + inv * extrapolate;
      break;
    }
    }
    out[i] = float(inv);
  }
  return out;
}

std::vector<float>
vflow::model::ropeLocalInverseFrequencies(const ModelConfig &c) {
  if (c.ropeLocalTheta <= 0)
    return ropeInverseFrequencies(c);
  ModelConfig local = c;
  local.ropeTheta = c.ropeLocalTheta;
  local.ropeScaling = RopeScaling();
  return ropeInverseFrequencies(local);
}
