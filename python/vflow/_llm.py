"""The serving engine from Python, vLLM-style: vflow.LLM runs a Llama-family
model (a Hugging Face directory or a GGUF file) with a compiled flow
attached, continuous batching and prefix caching included.

    llm = vflow.LLM("SmolLM2.gguf", flow="examples/quest.vflow",
                    params={"budget": 32}, device="cpu")
    outs = llm.generate(["The capital of France is"],
                        vflow.SamplingParams(max_tokens=32))
    print(outs[0].text)

docs/engine.md is the guide.
"""

from __future__ import annotations

import numbers
import operator
import os
from dataclasses import dataclass, field
from typing import (Any, Dict, List, Mapping, Optional, Sequence, Tuple,
                    Union, cast)

from . import _vflow
from ._program import Program, compile_file, load

Prompt = Union[str, Sequence[int]]


@dataclass
class SamplingParams:
    """How tokens are picked: greedy at temperature 0, else softmax at
    `temperature` over the `top_k` best (0: all) cut to the smallest set of
    probability `top_p`; `seed` makes a request's stream reproducible."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None
    ignore_eos: bool = False
    # None, or k in [0, 20]: each generated token's log-probability and the
    # k most likely tokens' (RequestOutput.logprobs).
    logprobs: Optional[int] = None

    def __post_init__(self) -> None:
        # The engine's rule, in one place (TypeError or ValueError naming
        # the field: ints must be ints, not bools, floats or strings).
        _vflow.Engine.check_sampling_params(self._dict())

    def _dict(self) -> Dict[str, Any]:
        return dict(max_tokens=self.max_tokens, temperature=self.temperature,
                    top_p=self.top_p, top_k=self.top_k, seed=self.seed,
                    ignore_eos=self.ignore_eos, logprobs=self.logprobs)


@dataclass
class RequestOutput:
    """One prompt's result: the generated ids (and text when the model has
    a tokenizer); finish_reason "length", "stop" or "error" (with
    `error`); with SamplingParams.logprobs, per generated token
    (its log-probability, [(id, log-probability) of the most likely])."""

    prompt_token_ids: List[int]
    token_ids: List[int]
    text: Optional[str]
    finish_reason: str
    error: Optional[str] = None
    prompt: Optional[str] = field(default=None, repr=False)
    request_id: int = field(default=-1, repr=False)
    logprobs: Optional[List[Tuple[float, List[Tuple[int, float]]]]] = \
        field(default=None, repr=False)
    # Blocks its decodes attended and the blocks available then (per layer
    # and KV head).
    blocks_attended: int = field(default=0, repr=False)
    blocks_available: int = field(default=0, repr=False)
    # Complete blocks a flow's retain block evicted from it, and every token
    # evicted from it.
    blocks_evicted: int = field(default=0, repr=False)
    tokens_evicted: int = field(default=0, repr=False)


def _sampling(params: Optional[SamplingParams]) -> SamplingParams:
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise TypeError("sampling_params: expected a vflow.SamplingParams, "
                        f"not {type(params).__name__}")
    params.__post_init__()  # fields may have been changed since
    return params


def _flow_program(flow: Any, params: Optional[Mapping[str, Any]]) -> Optional[Program]:
    if flow is None:
        if params:
            raise ValueError("params: given without a flow")
        return None
    if isinstance(flow, Program):
        return flow.with_params(**params) if params else flow
    if isinstance(flow, (str, os.PathLike)):
        path = os.fspath(flow)
        if path.endswith(".vfa"):
            prog = load(path)
            return prog.with_params(**params) if params else prog
        return compile_file(path, params=dict(params or {}))
    raise ValueError(f"flow: expected None, a vflow.Program or a path, got "
                     f"{type(flow).__name__}")


EngineConfig = _vflow.EngineConfig


class LLM:
    """A model with an attached flow (None: dense attention everywhere, the
    baseline in the same engine). The first `dense_layers` layers stay
    dense with a flow. Options left None take vflow.EngineConfig's defaults
    (`vflow.EngineConfig()` shows them); `self.config` is the config the
    engine runs with."""

    def __init__(self, model: Union[str, "os.PathLike[str]"], *,
                 flow: Any = None, params: Optional[Mapping[str, Any]] = None,
                 dense_layers: Optional[int] = None,
                 kv_dtype: Optional[str] = None,
                 block_size: Optional[int] = None,
                 device: Optional[str] = None,
                 max_batch: Optional[int] = None,
                 kv_pool_tokens: Optional[int] = None,
                 max_tokens_per_step: Optional[int] = None,
                 enable_prefix_caching: Optional[bool] = None,
                 seed: Optional[int] = None,
                 cuda_graphs: Optional[bool] = None, quiet: bool = True,
                 mass_recall: Optional[bool] = None,
                 observe_tokens: Optional[int] = None,
                 max_model_len: Optional[int] = None) -> None:
        if device is None:  # the GPU when there is one
            device = "cuda" if _vflow.cuda_devices() > 0 else "cpu"
        self.device: str = device
        path = os.fspath(model)
        if not os.path.exists(path):
            raise FileNotFoundError(f"model: {path} does not exist")
        if flow is not None and block_size is not None:
            params = dict(params or {}, block_size=block_size)
        self.program = _flow_program(flow, params)
        # The engine's one config (vflow.EngineConfig, defaults in C++):
        # types are checked as each option is set, ranges when the engine
        # is built, each error naming the option; None keeps a default.
        self.config = EngineConfig()
        for name, value in dict(
                device=device, dense_layers=dense_layers, kv_dtype=kv_dtype,
                block_size=block_size, max_batch=max_batch,
                max_tokens_per_step=max_tokens_per_step,
                enable_prefix_caching=enable_prefix_caching, seed=seed,
                kv_pool_tokens=kv_pool_tokens,
                cache_dir=os.environ.get("VFLOW_CACHE_DIR"), quiet=quiet,
                cuda_graphs=cuda_graphs, mass_recall=mass_recall,
                observe_tokens=observe_tokens,
                max_model_len=max_model_len).items():
            if value is not None:
                setattr(self.config, name, value)
        artifact = self.program._artifact if self.program else None
        flow_name = self.program.flows[0] if self.program else ""
        self._engine = _vflow.Engine(path, artifact, flow_name, self.config)
        from ._tokenizer import NoTokenizer, Tokenizer

        # A model without a tokenizer takes token ids; a broken tokenizer
        # is an error that names the file (TokenizerError).
        self.tokenizer: Any = None
        try:
            self.tokenizer = Tokenizer.from_model(path)
        except NoTokenizer:
            self.tokenizer = None

    def _ids(self, prompt: Prompt, where: str) -> List[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"{where}: this model has no tokenizer; "
                                 "pass token ids")
            return list(self.tokenizer.encode(prompt))
        if isinstance(prompt, (bytes, bytearray)) or not hasattr(
                prompt, "__iter__"):
            raise TypeError(f"{where}: a prompt is a str or a sequence of "
                            f"token ids, not {type(prompt).__name__}")
        ids: List[int] = []
        for i, t in enumerate(prompt):
            # ints and numpy's integers; not bools, floats or strings.
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise TypeError(f"{where}[{i}]: a token id is an int, not "
                                f"{type(t).__name__} ({t!r})")
            t = operator.index(t)
            # An id outside the vocabulary ends its request with an error
            # (the others run); one that is not even an int32 is refused.
            if not -2**31 <= t < 2**31:
                raise ValueError(f"{where}[{i}]: token id {t} is not an "
                                 "int32")
            ids.append(t)
        return ids

    def generate(self, prompts: Union[Prompt, Sequence[Prompt]],
                 sampling_params: Optional[SamplingParams] = None
                 ) -> List[RequestOutput]:
        """Runs every prompt to its end (continuous batching); outputs in
        prompt order. A prompt that cannot run gets finish_reason "error";
        the others are not affected."""
        params = _sampling(sampling_params)
        batch: List[Prompt]
        if isinstance(prompts, str) or (
                len(prompts) > 0 and isinstance(prompts[0], numbers.Integral)):
            batch = [cast(Prompt, prompts)]
        else:
            batch = list(cast(Sequence[Prompt], prompts))
        ids = [self._ids(p, f"prompts[{i}]") for i, p in enumerate(batch)]
        return [self._output(d, p) for p, d in
                zip(batch, self._engine.generate(ids, params._dict()))]

    # Request by request, as a serving loop drives the engine.

    def add_request(self, prompt: Prompt,
                    sampling_params: Optional[SamplingParams] = None) -> int:
        """Queues one prompt; returns its request id (step() runs it)."""
        params = _sampling(sampling_params)
        return int(self._engine.add_request(self._ids(prompt, "prompt"),
                                            params._dict()))

    def step(self) -> List[RequestOutput]:
        """One engine step; the requests that finished in it."""
        return [self._output(d) for d in self._engine.step()]

    def abort(self, request_id: int) -> Optional[RequestOutput]:
        """Stops a request now (finish_reason "abort"), freeing its pages;
        None for an id that is not running or waiting."""
        d = self._engine.abort(request_id)
        return None if d is None else self._output(d)

    def generated_since(self, request_id: int, start: int = 0
                        ) -> Optional[Tuple[List[int], List[Any]]]:
        """(token ids, their log-probabilities if asked) request
        `request_id` generated from its `start`-th on, while it runs or
        waits (what a server streams between steps); None once step() or
        abort() returned its output, or for an unknown id."""
        got = self._engine.generated_since(request_id, start)
        return None if got is None else (list(got[0]), list(got[1]))

    def has_unfinished_requests(self) -> bool:
        return bool(self._engine.has_unfinished())

    def _output(self, d: Mapping[str, Any], prompt: Any = None) -> RequestOutput:
        text = None
        if self.tokenizer is not None:
            text = self.tokenizer.decode(d["token_ids"])
        return RequestOutput(
            prompt_token_ids=list(d["prompt_token_ids"]),
            token_ids=list(d["token_ids"]), text=text,
            finish_reason=d["finish_reason"], error=d["error"],
            prompt=prompt if isinstance(prompt, str) else None,
            request_id=int(d["id"]),
            logprobs=list(d["logprobs"]) or None,
            blocks_attended=int(d["blocks_attended"]),
            blocks_available=int(d["blocks_available"]),
            blocks_evicted=int(d["blocks_evicted"]),
            tokens_evicted=int(d["tokens_evicted"]))

    def stats(self) -> Dict[str, Any]:
        """Running and waiting requests, pool pages, prefix cache hits,
        preemptions, steps, the step time split (ms), the blocks decode
        attention attended and, with `mass_recall=True`, "mass_recall": per
        layer, each query head's mean share of dense attention's softmax
        mass on the tokens the flow attended (None for dense layers)."""
        return dict(self._engine.stats())

    def clear_prefix_cache(self) -> None:
        self._engine.clear_prefix_cache()
