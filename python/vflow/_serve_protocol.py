"""vflow serve's request bodies (OpenAI's completions and chat completions,
plus vLLM's top_k, ignore_eos, stop_token_ids and vflow's own "vflow"
field), checked by pydantic, and its errors in OpenAI's shape."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

# OpenAI's sampling fields vflow does not implement: refused when set to
# something other than their neutral value, never silently ignored.
_NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0.0,
            "best_of": None, "echo": False, "suffix": None,
            "logit_bias": None, "tools": None, "response_format": None}


class ApiError(Exception):
    """An error response: HTTP status, message, the field at fault."""

    def __init__(self, status: int, message: str, param: Optional[str] = None,
                 code: Optional[str] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.code = code


def error_body(status: int, message: str, param: Optional[str] = None,
               code: Optional[str] = None) -> Dict[str, Any]:
    kind = ("invalid_request_error" if status < 500 else
            "server_error" if status != 503 else "overloaded_error")
    if status == 404:
        kind = "not_found_error"
    return {"error": {"message": message, "type": kind, "param": param,
                      "code": code if code is not None else status}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class VflowOptions(BaseModel):
    """The "vflow" extension field: which served flow runs the request."""

    model_config = ConfigDict(extra="forbid")
    flow: Optional[str] = None
    params: Optional[Dict[str, Any]] = None


class _Common(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="allow")
    model: Optional[str] = None
    max_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)
    seed: Optional[int] = Field(default=None, ge=0, lt=2**64)
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: List[int] = Field(default_factory=list)
    ignore_eos: bool = False
    n: int = Field(default=1, ge=1, le=128)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    vflow: Optional[VflowOptions] = None

    def check_unsupported(self) -> None:
        extra = self.model_extra or {}
        for name, neutral in _NEUTRAL.items():
            if extra.get(name, neutral) not in (neutral, None):
                raise ApiError(400, f"{name}: not supported by vflow serve",
                               name)
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options: only with stream: true",
                           "stream_options")


class CompletionRequest(_Common):
    prompt: Union[str, List[int], List[str], List[List[int]]]
    logprobs: Optional[int] = Field(default=None, ge=0, le=20)

    def top_logprobs_asked(self) -> Optional[int]:
        return self.logprobs

    def prompts(self) -> List[Union[str, List[int]]]:
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]  # type: ignore[list-item]
        if not p:
            raise ApiError(400, "prompt: empty", "prompt")
        return list(p)  # type: ignore[arg-type]


class ContentPart(BaseModel):
    type: str
    text: Optional[str] = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: Optional[Union[str, List[ContentPart]]] = None

    def rendered(self) -> Dict[str, Any]:
        """The message as chat templates read it: text content only."""
        content = self.content
        if isinstance(content, list):
            parts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise ApiError(400, f"messages: a {part.type!r} content "
                                   "part: only text is supported", "messages")
                parts.append(part.text)
            content = "".join(parts)
        return dict(self.model_extra or {}, role=self.role,
                    content=content or "")


class ChatRequest(_Common):
    messages: List[Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=20)

    def top_logprobs_asked(self) -> Optional[int]:
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(400, "top_logprobs: needs logprobs: true",
                           "top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None


class Sampling:
    """A request's sampling as the engine takes it, per choice: the i-th
    of n samples gets seed + i (its own stream when a seed is given)."""

    def __init__(self, req: _Common, max_tokens: int) -> None:
        import vflow

        self.stop = [req.stop] if isinstance(req.stop, str) else \
            list(req.stop or [])
        self.stop_token_ids = list(req.stop_token_ids)
        top_k = 0 if req.top_k == -1 else req.top_k
        self.logprobs = req.top_logprobs_asked()  # type: ignore[attr-defined]
        self._make = lambda seed: vflow.SamplingParams(
            max_tokens=max_tokens, temperature=req.temperature,
            top_p=req.top_p, top_k=top_k, seed=seed,
            ignore_eos=req.ignore_eos, logprobs=self.logprobs)
        self.seed = req.seed
        try:
            self._make(self.seed)  # the engine's checks, naming the field
        except (TypeError, ValueError) as e:
            raise ApiError(400, str(e), None) from None

    def params(self, i: int) -> Any:
        return self._make(None if self.seed is None else
                          (self.seed + i) % 2**64)
