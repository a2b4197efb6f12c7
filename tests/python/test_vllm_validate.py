"""The vflow backend's answers to vLLM's configuration checks, with real
vLLM classes (they import without a GPU): block sizes from the flow, the
refusals' reasons, tensor parallelism past the KV heads, the CUDA-graph
support it declares. Skipped where vLLM is not installed (the GPU machine
runs it: lab/tools/vllm_gpu.sh test)."""

from __future__ import annotations

import pathlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from vllm.platforms.interface import DeviceCapability  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport  # noqa: E402

from vflow.vllm_backend.backend import (VflowAttentionBackend,  # noqa: E402
                                        VflowMetadataBuilder)
from vflow.vllm_backend.config import ConfigError, parse  # noqa: E402
from vflow.vllm_backend.runtime import (ModelShape, Runtime,  # noqa: E402
                                        use_runtime)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def shape(**kw: int) -> ModelShape:
    args = dict(num_layers=4, kv_heads=2, total_kv_heads=2,
                tensor_parallel=1, max_model_len=1024, max_seqs=4,
                max_rows=4)
    args.update(kw)
    return ModelShape(**args)  # type: ignore[arg-type]


def runtime(flow: str, **kw: int) -> Runtime:
    cfg = parse({"vflow": {"flow": str(ROOT / "examples" / f"{flow}.vflow")}})
    assert cfg is not None
    return Runtime(cfg, shape(**kw))


def reasons(block_size: int, kv_cache_dtype: str = "auto") -> list:
    return VflowAttentionBackend.validate_configuration(
        head_size=128, dtype=torch.bfloat16, kv_cache_dtype=kv_cache_dtype,
        block_size=block_size, use_mla=False, has_sink=False,
        use_sparse=False, use_mm_prefix=False,
        use_per_head_quant_scales=False,
        device_capability=DeviceCapability(9, 0), attn_type="decoder")


def test_block_sizes_come_from_the_flow() -> None:
    use_runtime(runtime("quest"))
    assert VflowAttentionBackend.get_supported_kernel_block_sizes() == [16]
    assert reasons(16) == [] and reasons(32) == []
    use_runtime(runtime("eps"))
    assert VflowAttentionBackend.get_supported_kernel_block_sizes() == [128]
    assert reasons(128) == []
    assert reasons(16) == ["block_size 16 is not a multiple of the flow's "
                           "128-token blocks (pass --block-size 128)"]
    use_runtime(None)


def test_refusals_and_declarations() -> None:
    use_runtime(runtime("quest"))
    assert reasons(16, "fp8") == []  # fp8 e4m3 KV, unscaled
    assert "kv_cache_dtype not supported" in reasons(16, "fp8_e5m2")
    assert VflowAttentionBackend.get_kv_cache_shape(10, 16, 2, 128) == (
        2, 10, 2, 16, 128)
    assert VflowAttentionBackend.get_name() == "CUSTOM"
    assert not VflowAttentionBackend.supports_kv_connector()
    assert (VflowMetadataBuilder._cudagraph_support
            == AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE)
    assert VflowMetadataBuilder.reorder_batch_threshold == 1
    use_runtime(None)


def test_tensor_parallel_past_the_kv_heads_is_refused() -> None:
    runtime("quest", tensor_parallel=2, kv_heads=1)  # 2 KV heads, 2 ranks
    with pytest.raises(ConfigError, match="tensor_parallel_size 4 is larger "
                       "than the model's 2 KV heads"):
        runtime("quest", tensor_parallel=4, kv_heads=1)
    with pytest.raises(ConfigError, match="VLLM_USE_V2_MODEL_RUNNER=1"):
        Runtime(parse({"vflow": {"flow": str(ROOT / "examples" /
                                              "quest.vflow")}}),
                shape(v2_runner=False))  # type: ignore[arg-type]


def test_register_installs_the_backend_and_the_hooks() -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState
    from vllm.v1.worker.gpu_worker import Worker
    import vllm.v1.worker.gpu.model_runner as model_runner

    from vflow.vllm_backend import BACKEND, register

    register()
    register()  # idempotent
    assert AttentionBackendEnum.CUSTOM.get_path() == BACKEND
    for fn in (DefaultModelState.add_request, DefaultModelState.prepare_attn,
               DefaultModelState.remove_request,
               Worker.determine_available_memory,
               model_runner.copy_kv_cache_blocks_inplace):
        assert fn.__module__ == "vflow.vllm_backend.lifecycle", fn
