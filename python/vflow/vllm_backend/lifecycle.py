"""What the backend needs from vLLM beyond its attention API, hooked into
vLLM 0.26.0's worker (docs/vllm.md, "How it hooks in"):

- request slots: Model Runner V2's DefaultModelState.add_request(req_index,
  ...) tells which stable index a new, resumed (after preemption) or
  prefix-hit request takes, so its vflow states restart; its prepare_attn
  gives each step's rows -> indices (input_batch.idx_mapping);
- memory: Worker.determine_available_memory's answer (bytes for the KV
  cache) shrinks by what vflow keeps beside the cache, so vLLM's blocks
  and vflow's fields fit in the same budget;
- block copies: the copy-on-write of a partial prefix-cache hit
  (copy_kv_cache_blocks_inplace) assumes block-major storage; vflow's
  cache is K/V first, so its layers' blocks are copied here instead
  (copy_blocks). A copied block is partial: it has no fields yet, and gets
  them when a token completes it.

These are internal to vLLM: install() checks that the methods exist with
the parameters used here and refuses otherwise, naming what differs."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List

from .runtime import copy_blocks, current_runtime, is_vflow_cache

_installed = False


def _params(fn: Callable[..., Any]) -> List[str]:
    return list(inspect.signature(fn).parameters)


def _check(cls: Any, name: str, expected: List[str]) -> Callable[..., Any]:
    fn = getattr(cls, name, None)
    if fn is None or _params(fn)[:len(expected)] != expected:
        got = "missing" if fn is None else f"parameters {_params(fn)}"
        raise RuntimeError(
            f"vflow's vLLM backend: {cls.__qualname__}.{name} is {got}, "
            f"expected parameters starting {expected} (this vflow supports "
            "vLLM 0.26.0)")
    return fn


def install() -> None:
    """Wraps the methods above (idempotent; in every process, cheap: the
    wrappers do nothing where no vflow backend runs)."""
    global _installed
    if _installed:
        return
    import vllm.v1.worker.gpu.model_runner as runner
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState
    from vllm.v1.worker.gpu_worker import Worker

    add = _check(DefaultModelState, "add_request",
                 ["self", "req_index", "new_req_data"])
    remove = _check(DefaultModelState, "remove_request", ["self", "req_id"])
    prepare = _check(DefaultModelState, "prepare_attn",
                     ["self", "input_batch"])
    memory = _check(Worker, "determine_available_memory", ["self"])
    copy = _check(runner, "copy_kv_cache_blocks_inplace",
                  ["kv_caches", "num_blocks", "kv_cache_block_copies"])
    known: Dict[str, int] = {}

    def add_request(self: Any, req_index: int, new_req_data: Any) -> None:
        add(self, req_index, new_req_data)
        rt = current_runtime()
        if rt is not None:
            known[new_req_data.req_id] = int(req_index)
            rt.request_added(int(req_index))

    def remove_request(self: Any, req_id: str) -> None:
        remove(self, req_id)
        known.pop(req_id, None)

    def prepare_attn(self: Any, input_batch: Any, *args: Any,
                     **kwargs: Any) -> Any:
        rt = current_runtime()
        if rt is not None:
            # Dummy batches (profiling, warm-up, capture, data-parallel
            # padding) carry made-up request ids: no slot of theirs.
            real = bool(input_batch.req_ids) and all(
                r in known for r in input_batch.req_ids)
            rt.step_prepared(input_batch.idx_mapping if real else None)
        return prepare(self, input_batch, *args, **kwargs)

    def determine_available_memory(self: Any) -> int:
        available = int(memory(self))
        rt = current_runtime()
        if rt is None:
            return available
        return rt.kv_budget(available)

    def copy_kv_cache_blocks_inplace(kv_caches: Any, num_blocks: int,
                                     kv_cache_block_copies: Any) -> None:
        entries = list(kv_caches)
        ours = [t for t in entries if is_vflow_cache(t)]
        others = [t for t in entries if not is_vflow_cache(t)]
        if others:
            copy(others, num_blocks, kv_cache_block_copies)
        for kv in ours:
            copy_blocks(kv, num_blocks, kv_cache_block_copies)

    runner.copy_kv_cache_blocks_inplace = copy_kv_cache_blocks_inplace
    DefaultModelState.add_request = add_request
    DefaultModelState.remove_request = remove_request
    DefaultModelState.prepare_attn = prepare_attn
    Worker.determine_available_memory = determine_available_memory
    _installed = True
