"""What the GPU tests share: torch with a GPU (or None), a stock program
from the carried artifacts (the GPU machine has no compiler) or compiled
from examples/, a CUDA graph of a step, the devices besides the CPU to run
engine tests on, and an engine's outputs against a float64 reference."""

from __future__ import annotations

import os
from typing import Any, Callable, List, Sequence

import numpy as np

import vflow

#: Devices besides the CPU to run engine tests on (VFLOW_TEST_DEVICES, as
#: lab/tools/flow_tests_gpu.sh sets it on the GPU machine).
OTHER_DEVICES = [d for d in os.environ.get("VFLOW_TEST_DEVICES", "cpu")
                 .split(",") if d != "cpu"]


def follows_reference(engine: Any, ref: Any, prompts: Sequence[List[int]],
                      n_new: int, tolerance: float = 0.03,
                      margin: float = 0.2, route_margin: float = 0.03) -> None:
    """An engine on the GPU (bf16 weights and activations) against a
    tiny_model Reference: each prompt's last logits within `tolerance` of
    the reference's spread; greedy tokens, alone and batched, equal the
    reference's while its choices are clear: the top-2 margin of the token
    above `margin` and, in a mixture of experts, every row so far routed
    with its last chosen and first unchosen experts' router logits more
    than `route_margin` apart (closer, bf16 rounding may choose the other
    token or expert; a prompt with such a row has no logits check). At
    least one prompt's logits and one token are compared."""
    def clear_rows(seq: List[int]) -> int:
        """How many leading rows of seq the reference routes clearly."""
        ref.logits(seq)
        unclear = np.flatnonzero(ref.route_gaps < route_margin)
        return int(unclear[0]) if unclear.size else len(seq)

    logit_checks = 0
    for p in prompts:
        want = ref.logits(p)[-1]
        if clear_rows(list(p)) < len(p):
            continue
        got = np.asarray(engine._engine.prompt_logits(list(p)))
        spread = float(want.max() - want.min())
        err = float(np.abs(got - want).max())
        assert err < tolerance * spread, (p, err, spread)
        logit_checks += 1
    assert logit_checks > 0, "no prompt is routed clearly"
    wanted = []
    for p in prompts:
        tokens, margins = ref.greedy_with_margins(p, n_new)
        # Token i comes from row len(p) - 1 + i.
        clear = clear_rows(list(p) + tokens[:-1]) - len(p) + 1
        wanted.append((tokens, [m if i < clear else 0.0
                                for i, m in enumerate(margins)]))
    assert any(ms[0] >= margin for _, ms in wanted), "no token is clear"
    params = vflow.SamplingParams(max_tokens=n_new, temperature=0.0,
                                  ignore_eos=True)

    def check(p: List[int], out: Any, want: Any) -> None:
        tokens = [int(t) for t in out.token_ids]
        for t, w, m in zip(tokens, *want):
            if m < margin:
                break
            assert t == w, (p, tokens, want[0])

    for p, want in zip(prompts, wanted):
        (out,) = engine.generate([list(p)], params)
        check(list(p), out, want)
    outs = engine.generate([list(p) for p in prompts], params)
    for p, out, want in zip(prompts, outs, wanted):
        check(list(p), out, want)


def routed_model_follows(model: str, ref: Any,
                         make: Callable[[int, int], List[int]],
                         n_new: int) -> None:
    """A mixture-of-experts model (at `model`, the tiny_model Reference
    `ref`) on each device besides the CPU in bf16 follows the reference
    (follows_reference): two prompts routed clearly at every row (5 and 12
    tokens: the logits check) and two longer ones (23 and 60: tokens until
    a row's routing is unclear), from make(length, salt)."""
    prompts = [clear_prompt(ref, n, make) for n in (5, 12)] + \
        [make(n, 3) for n in (23, 60)]
    for device in OTHER_DEVICES:
        engine = vflow.LLM(model, device=device, kv_dtype="bf16")
        follows_reference(engine, ref, prompts, n_new)


def clear_prompt(ref: Any, length: int, make: Callable[[int, int], List[int]],
                 route_margin: float = 0.03, tries: int = 400) -> List[int]:
    """The first of make(length, salt) for salt 0, 1, ... whose every row
    the reference routes clearly (follows_reference's route_margin)."""
    for salt in range(tries):
        p = make(length, salt)
        ref.logits(p)
        if float(ref.route_gaps.min()) >= route_margin:
            return p
    raise AssertionError(f"no clearly routed prompt of {length} tokens in "
                         f"{tries} tries")


def torch_with_gpu() -> Any:
    """torch when it is installed and sees a GPU, else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def stock_program(name: str, artifacts: str) -> vflow.Program:
    """examples/NAME.vflow: ARTIFACTS/NAME.vfa when it exists, else
    compiled."""
    path = os.path.join(artifacts, name + ".vfa")
    if os.path.exists(path):
        return vflow.load(path)
    here = os.path.dirname(os.path.abspath(__file__))
    return vflow.compile_file(os.path.join(here, "..", "..", "examples",
                                           name + ".vflow"))


def capture_graph(torch: Any, step: Callable[[], Any],
                  reset: Callable[[], None] = lambda: None) -> Any:
    """A CUDA graph of `step()` by torch's recipe: one warm-up run on a side
    stream, then the capture. `reset()` runs after each, for a step that
    changes what the next one sees."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    reset()
    return graph
