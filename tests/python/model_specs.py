"""The tiny models of the model-family tests (write_model arguments by
name): tests/python/test_moe.py, test_sliding_window.py, test_gemma3.py
and test_deepseek.py run them against tiny_model's float64 reference,
lab/tools/hf_tiny_check.py against transformers. No vflow import: the
transformers side reads this too."""

from __future__ import annotations

from typing import Any, Dict

# Qwen3-MoE with a dense layer (mlp_only_layers) and head_dim != hidden /
# heads; Mixtral with Llama's attention and bf16 storage.
MOE: Dict[str, Dict[str, Any]] = {
    "qwen3-moe": dict(arch="qwen3_moe", head_dim=32, seed=11, experts=8,
                      experts_per_token=2, dense_mlp_layers=(1,)),
    "mixtral": dict(arch="mixtral", seed=12, experts=4, experts_per_token=2,
                    expert_intermediate=48, dtype="bfloat16"),
}


WINDOW: Dict[str, Dict[str, Any]] = {
    # A window of 12 tokens over blocks of 16: windows start inside blocks.
    "mistral": dict(arch="mistral", seed=21, sliding_window=12),
    "mixtral-window": dict(arch="mixtral", seed=22, experts=4,
                           experts_per_token=2, expert_intermediate=48,
                           sliding_window=20),
}


GEMMA3: Dict[str, Dict[str, Any]] = {
    # 4 query heads over 1 KV head (as Gemma 3 270M), a window of 12 over
    # blocks of 16, the middle layer full; a softmax scale that is not
    # 1/sqrt(head_dim) and a global RoPE base unlike the local one.
    "gemma3": dict(arch="gemma3_text", seed=32, heads=4, kv_heads=1,
                   head_dim=32, layers=3, sliding_window=12,
                   layer_types=["sliding_attention", "full_attention",
                                "sliding_attention"],
                   rope_theta=1.0e6, rope_local_theta=10000.0,
                   query_pre_attn_scalar=20),
}


# A direct q_proj, a dense first layer, two shared experts and scaled
# routing; then a low-rank query, YaRN and group-limited routing, stored in
# bf16.
DEEPSEEK: Dict[str, Dict[str, Any]] = {
    "deepseek-v2": dict(arch="deepseek_v2", seed=41, heads=4, kv_heads=4,
                        layers=3, experts=8, experts_per_token=2,
                        expert_intermediate=32,
                        mla=dict(kv_lora_rank=32, qk_nope_head_dim=16,
                                 qk_rope_head_dim=8, v_head_dim=16,
                                 first_k_dense_replace=1, n_shared_experts=2,
                                 routed_scaling_factor=1.5)),
    "deepseek-v2-yarn": dict(
        arch="deepseek_v2", seed=42, heads=4, kv_heads=4, layers=2,
        experts=8, experts_per_token=2, expert_intermediate=32,
        dtype="bfloat16",
        rope_scaling={"type": "yarn", "factor": 4.0,
                      "original_max_position_embeddings": 16,
                      "mscale": 0.707, "mscale_all_dim": 0.707,
                      "beta_fast": 32, "beta_slow": 1},
        mla=dict(kv_lora_rank=24, q_lora_rank=20, qk_nope_head_dim=12,
                 qk_rope_head_dim=8, v_head_dim=20,
                 topk_method="group_limited_greedy", n_group=4,
                 topk_group=2)),
    # DeepSeek-V3's router: sigmoid scores, a correction bias, groups by
    # their two best, renormalized and scaled; then halves rotated.
    "deepseek-v3": dict(arch="deepseek_v3", seed=43, heads=4, kv_heads=4,
                        layers=3, experts=8, experts_per_token=3,
                        expert_intermediate=32,
                        mla=dict(kv_lora_rank=32, q_lora_rank=24,
                                 qk_nope_head_dim=16, qk_rope_head_dim=8,
                                 v_head_dim=16, first_k_dense_replace=1,
                                 n_group=4, topk_group=2,
                                 routed_scaling_factor=2.5)),
    "deepseek-v3-halves": dict(arch="deepseek_v3", seed=44, heads=4,
                               kv_heads=4, layers=2, experts=4,
                               experts_per_token=2, expert_intermediate=32,
                               mla=dict(kv_lora_rank=24, qk_nope_head_dim=8,
                                        qk_rope_head_dim=8, v_head_dim=12,
                                        rope_interleave=False)),
}
