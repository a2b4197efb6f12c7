//===- ModelConfig.h - A Llama-family model's hyperparameters ---*- C++ -*-===//
//
// The shape of a decoder-only Llama-family model (Llama 2/3, Mistral without
// a sliding window, Qwen2/2.5, Qwen3, SmolLM2) as the serving engine needs
// it, read from a Hugging Face config.json or from GGUF metadata. Every
// model is a stack of pre-norm blocks: RMSNorm, attention with RoPE
// (rotate-half layout, grouped KV heads), RMSNorm, SwiGLU MLP. The variants:
//   llama: no biases (Mistral maps here),
//   qwen2: biases on the q/k/v projections,
//   qwen3: RMSNorm over each head of q and k before RoPE, explicit head_dim,
//   gemma3: Gemma 3's text model: qwen3's q/k norms, norms that scale by
//     (1 + w), the attention's and MLP's outputs normalized before the
//     residual, embeddings times sqrt(hidden), a GeGLU MLP (tanh GELU), a
//     softmax scale of query_pre_attn_scalar^-1/2, and sliding-window
//     layers with their own RoPE base between full-attention ones;
//   deepseek_v2 and deepseek_v3 (V3's router: sigmoid scores with a
//     correction bias, groups ranked by their top two):
//     multi-head latent attention (MLA: keys and values from one
//     compressed latent per token, RoPE on a separate narrow part, rotated
//     by adjacent pairs) and DeepSeek's mixture of experts (shared experts,
//     a scaled and optionally group-limited top-k); see `mla()`.
// Anything else a config asks for (o_proj or MLP biases, sliding windows,
// other activations, YaRN) is refused with an Error rather than ignored.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_MODEL_MODELCONFIG_H
#define VFLOW_MODEL_MODELCONFIG_H

#include "vflow/Runtime/Json.h"

#include <cstdint>
#include <string>
#include <vector>

namespace vflow::model {

/// How RoPE's frequencies are adjusted for a longer context.
struct RopeScaling {
  enum class Type {
    None,
    /// Positions divided by `factor` (every frequency divided by it).
    Linear,
    /// Llama 3.1's scaling (HF rope_type "llama3"): factor, lowFreqFactor,
    /// highFreqFactor, originalMaxPositions.
    Llama3,
    /// Frequency i divided by freqFactors[i] (headDim / 2 of them): how
    /// llama.cpp stores Llama 3 scaling in a GGUF (the rope_freqs tensor),
    /// whose parameters the file does not keep.
    FreqFactors,
    /// YaRN (HF rope_type "yarn": DeepSeek-V2/V3): frequencies between
    /// betaSlow and betaFast rotations over originalMaxPositions blend
    /// from extrapolated to interpolated (divided by factor); cos and sin
    /// are multiplied by ropeAttentionFactor().
    Yarn,
  };
  Type type = Type::None;
  double factor = 1.0;
  double lowFreqFactor = 1.0;
  double highFreqFactor = 4.0;
  int64_t originalMaxPositions = 0;
  std::vector<float> freqFactors;
  /// YaRN: the ramp's bounds in rotations, and the mscales of its
  /// attention factor (0: absent); attentionFactor < 0: derived from them.
  double betaFast = 32.0, betaSlow = 1.0;
  double mscale = 0.0, mscaleAllDim = 0.0, attentionFactor = -1.0;
};

/// "none", "linear", "llama3", "freq_factors", "yarn".
const char *ropeScalingName(RopeScaling::Type type);

struct ModelConfig {
  /// "llama", "qwen2", "qwen3", "qwen3_moe" (Qwen3's attention, a mixture
  /// of experts), "mixtral" (Llama's attention, a mixture of experts),
  /// "gemma3", "deepseek_v2" or "deepseek_v3" (MLA, DeepSeek's mixture of
  /// experts).
  std::string arch;
  int64_t vocabSize = 0;
  int64_t hiddenSize = 0;
  int64_t intermediateSize = 0;
  int64_t numLayers = 0;
  int64_t numHeads = 0;
  int64_t numKVHeads = 0;
  /// The config's head_dim when it has one (Qwen3), else hidden / heads.
  /// With MLA: the width of the cached latent, kvLoraRank + qkRopeHeadDim
  /// (the KV cache holds one "KV head" of it per token; numKVHeads is 1).
  int64_t headDim = 0;
  /// Multi-head latent attention (DeepSeek-V2/V3) when kvLoraRank > 0.
  /// Per token a latent c = RMSNorm(x W_kva[:kvLoraRank]) and a rotated
  /// k_pe = RoPE(x W_kva[kvLoraRank:]) of qkRopeHeadDim are cached as one
  /// row [c; k_pe]; head h's key is [W_UK[h] c; k_pe] and its value
  /// W_UV[h] c (kv_b_proj's rows). Attention runs absorbed: head h's query
  /// [q_nope W_UK[h]; RoPE(q_pe)] against the cached rows, the values being
  /// the same rows (the output's first kvLoraRank are W_UV[h]'s input), so
  /// a flow's K is the latent row and q the absorbed query, and q . K is
  /// the true logit. qLoraRank > 0: queries through a low-rank
  /// q_a_proj / q_a_layernorm / q_b_proj (0: one q_proj).
  int64_t kvLoraRank = 0, qLoraRank = 0, qkNopeHeadDim = 0, qkRopeHeadDim = 0,
          vHeadDim = 0;
  bool mla() const { return kvLoraRank > 0; }
  /// The width RoPE rotates per head: qkRopeHeadDim with MLA, else
  /// headDim.
  int64_t ropeDim() const { return mla() ? qkRopeHeadDim : headDim; }
  /// RoPE rotates adjacent pairs (2i, 2i + 1) (DeepSeek) rather than the
  /// two halves of a head (Llama's rotate_half).
  bool ropeInterleaved = false;
  double rmsNormEps = 1e-6;
  double ropeTheta = 10000.0;
  RopeScaling ropeScaling;
  int64_t maxPositions = 0;
  /// Every layer attends only the last slidingWindow tokens (Mistral's and
  /// Mixtral's sliding_window; Gemma 3's sliding layers); 0: every token.
  int64_t slidingWindow = 0;
  /// Layers that attend every token although slidingWindow > 0 (Gemma 3's
  /// full_attention layers); empty: every layer slides.
  std::vector<int64_t> fullAttentionLayers;
  /// Whether layer `layer` attends only its last slidingWindow tokens.
  bool slidingLayer(int64_t layer) const;
  /// RoPE base of the sliding layers when they have their own (Gemma 3's
  /// rope_local_base_freq, never scaled); 0: ropeTheta and ropeScaling.
  double ropeLocalTheta = 0.0;
  /// The MLP's activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU with
  /// GELU's tanh approximation: Gemma).
  std::string activation = "silu";
  /// Added to every RMSNorm weight at load: Gemma's norms scale by (1 + w)
  /// (1 for a Hugging Face Gemma 3; llama.cpp's GGUF converter has added
  /// it already: 0).
  double normWeightOffset = 0.0;
  /// Gemma 2/3's four norms a layer: the attention's and the MLP's outputs
  /// are normalized (post_attention_layernorm, post_feedforward_layernorm)
  /// before they join the residual, and the MLP reads
  /// pre_feedforward_layernorm of the residual.
  bool sandwichNorms = false;
  /// The embeddings are multiplied by this (Gemma: sqrt(hidden_size)).
  double embedScale = 1.0;
  /// The attention's softmax scale (Gemma 3: query_pre_attn_scalar^-1/2);
  /// 0: 1/sqrt(headDim).
  double attentionScale = 0.0;
  /// lm_head shares model.embed_tokens.weight (there is no lm_head.weight).
  bool tieEmbeddings = false;
  /// q/k/v projections have biases (Qwen2).
  bool attentionBias = false;
  /// q_norm/k_norm over each head (Qwen3).
  bool qkNorm = false;
  /// A mixture of experts in place of the MLP (0: none): numExperts experts
  /// of expertIntermediateSize, expertsPerToken of them per token, weighted
  /// by the softmax of the router's logits over all experts, renormalized
  /// over the chosen ones when normTopKProb. Layers listed in denseMlpLayers
  /// keep a dense MLP of intermediateSize (Qwen3-MoE's mlp_only_layers and
  /// decoder_sparse_step).
  int64_t numExperts = 0;
  int64_t expertsPerToken = 0;
  int64_t expertIntermediateSize = 0;
  bool normTopKProb = true;
  std::vector<int64_t> denseMlpLayers;
  /// DeepSeek's mixture: numSharedExperts experts' worth of an MLP of
  /// numSharedExperts x expertIntermediateSize that every token takes;
  /// routed weights multiplied by routedScalingFactor; with expertGroups >
  /// 0 (group_limited_greedy) a token picks among the experts of the
  /// topkGroups groups whose best expert scores highest.
  int64_t numSharedExperts = 0;
  double routedScalingFactor = 1.0;
  int64_t expertGroups = 0, topkGroups = 0;
  /// DeepSeek-V3's router (transformers' DeepseekV3TopkRouter): each
  /// expert's score is the sigmoid of its logit (not a softmax); the choice
  /// (groups, then experts) ranks score + the layer's
  /// e_score_correction_bias, a group by the sum of its two best; the
  /// weights are the chosen scores, renormalized when normTopKProb.
  bool sigmoidRouter = false;
  /// Multi-token prediction layers stored after the model's (DeepSeek-V3's
  /// num_nextn_predict_layers): a speculative-decoding head the engine does
  /// not run; their tensors are skipped at load.
  int64_t mtpLayers = 0;
  /// Whether layer `layer` has the mixture of experts.
  bool moeLayer(int64_t layer) const;
  /// -1 when the config names none.
  int64_t bosTokenId = -1;
  std::vector<int64_t> eosTokenIds;

  /// Throws vflow::rt::Error naming the first bad field and why (zero or
  /// negative sizes, numKVHeads not dividing numHeads, an odd headDim, bad
  /// scaling parameters, token ids outside the vocabulary, ...).
  void validate() const;

  /// Every field, for logs and reports.
  rt::Json toJson() const;
};

/// Maps a Hugging Face config.json (`source` names it in errors). model_type
/// llama and mistral become "llama", qwen2 "qwen2", qwen3 "qwen3",
/// gemma3_text "gemma3", deepseek_v2 and deepseek_v3 theirs; others are an
/// Error naming the model_type and the supported ones. The result is validated.
ModelConfig configFromHF(const rt::Json &config, const std::string &source);

/// Maps GGUF metadata (as ModelWeights::ggufMetadata() gives it) for
/// general.architecture llama, qwen2, qwen3 or gemma3. The vocabulary size is
/// {arch}.vocab_size, else the length of tokenizer.ggml.tokens, else
/// `embedRows` (token_embd's row count; 0 when unknown); the embeddings are
/// tied when the file has no output.weight. A llama3 rope_freqs tensor is the
/// caller's to add (RopeScaling::FreqFactors). The result is validated.
ModelConfig configFromGGUF(const rt::Json &metadata, const std::string &source,
                           int64_t embedRows, bool hasOutputWeight);

/// The factor YaRN multiplies RoPE's cos and sin by (1 without YaRN).
double ropeAttentionFactor(const ModelConfig &config);

/// RoPE's inverse frequencies, ropeDim() / 2 of them, with the scaling
/// applied: base^(-2i/headDim) as Hugging Face computes it, then divided by
/// the linear factor, Llama 3's smoothed factor, or freqFactors[i]
/// (computed in double, rounded to float). Throws Error when `config` does
/// not validate.
std::vector<float> ropeInverseFrequencies(const ModelConfig &config);
/// The sliding layers' inverse frequencies: ropeLocalTheta's, unscaled, when
/// the config has one, else ropeInverseFrequencies(config).
std::vector<float> ropeLocalInverseFrequencies(const ModelConfig &config);

} // namespace vflow::model

#endif // VFLOW_MODEL_MODELCONFIG_H
