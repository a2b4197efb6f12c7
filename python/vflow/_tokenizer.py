"""The serving engine's tokenizer: text to token ids and back, for the
models vflow loads (Llama 2/3, Qwen2/2.5/3, SmolLM2).

    tok = Tokenizer.from_model("SmolLM2-135M-Instruct.Q4_1.gguf")
    ids = tok.encode("Hello")              # BOS first when the model adds one
    text = tok.decode(ids)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])

Every tokenizer runs on the `tokenizers` package:
  - a Hugging Face directory: its tokenizer.json as it is, with the BOS/EOS
    ids, add_bos_token and the chat template from tokenizer_config.json,
    generation_config.json and config.json where they say so;
  - a .gguf file: the tokenizer its metadata describes, rebuilt as llama.cpp
    runs it. tokenizer.ggml.model "gpt2" is a byte-level BPE split first by
    the regexes llama.cpp uses for the file's tokenizer.ggml.pre (src/
    llama-vocab.cpp); "llama" is SentencePiece's BPE with byte fallback
    (merges ranked by the scores of the tokens they make). Control tokens
    are special (matched whole in text, skipped by decode), user-defined
    ones are matched whole.
Decoding never "cleans up" spaces: decode(encode(text)) gives text back.

Loading raises TokenizerError (a ValueError) naming the file and what is
wrong with it for every broken input (unreadable, not UTF-8, not JSON, a
field of the wrong type, an id outside the vocabulary, ...), and its
subclass NoTokenizer only when the model has no tokenizer at all (a
directory without tokenizer.json, a GGUF file without tokenizer.ggml.model
and tokenizer.ggml.tokens). A UTF-8 byte order mark at the start of a JSON
file is skipped.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import warnings
from pathlib import Path
from typing import (Any, Dict, Iterable, Iterator, List, Mapping, Optional,
                    Sequence, Tuple)

import tokenizers
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers

__all__ = ["NoTokenizer", "Tokenizer", "TokenizerError", "gguf_backend"]

# GGUF token types (llama.cpp's llama_token_type).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

# Pre-tokenizer regexes, in the syntax of tokenizer.json (Oniguruma): where
# llama.cpp rewrites a model's regex for its own engine, the original it
# names is used. They split the text one after the other, each match and
# each gap a piece, before the byte-level mapping.
_GPT2 = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
         r"|\s+(?!\S)|\s+")
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+"
           r"|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]


def _group(names: Iterable[str], regexes: List[str],
           **flags: bool) -> Dict[str, Tuple[List[str], Dict[str, bool]]]:
    return {name: (regexes, flags) for name in names}


# tokenizer.ggml.pre -> (regexes, llama.cpp's flags: ignore_merges, add_bos),
# as src/llama-vocab.cpp maps them ("gpt2" is an alias of "gpt-2").
_BPE_PRE: Dict[str, Tuple[List[str], Dict[str, bool]]] = {
    **_group(["default"], _DEFAULT),
    **_group(["gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "exaone4"],
             [_GPT2]),
    **_group(["smollm", "starcoder", "refact", "command-r", "codeshell",
              "exaone", "minerva-7b"], [r"\p{N}", _GPT2]),
    **_group(["llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"],
             [_LLAMA3], ignore_merges=True, add_bos=True),
    **_group(["dbrx", "smaug-bpe"], [_LLAMA3]),
    **_group(["qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"], [_QWEN2]),
    **_group(["qwen35"], [_QWEN35]),
}


class TokenizerError(ValueError):
    """A model's tokenizer files or metadata that vflow cannot use; the
    message names the file (or GGUF metadata) and what is wrong."""


class NoTokenizer(TokenizerError):
    """The model has no tokenizer at all: a Hugging Face directory without
    tokenizer.json, a GGUF file without tokenizer.ggml.model and
    tokenizer.ggml.tokens (or with tokenizer.ggml.model "none")."""


@contextlib.contextmanager
def _about(source: Any) -> Iterator[None]:
    """Any other exception raised while reading `source` (a file or GGUF
    metadata) becomes a TokenizerError naming it: json, tokenizers and
    jinja2 raise their own types, and a field of an unexpected shape can
    raise KeyError, TypeError or AttributeError."""
    try:
        yield
    except TokenizerError:
        raise
    except Exception as e:
        raise TokenizerError(f"{source}: {type(e).__name__}: {e}") from e


# ---------------------------------------------------------------------------
# GGUF metadata -> tokenizers.Tokenizer
# ---------------------------------------------------------------------------


def _kind_name(kind: type) -> str:
    return {bool: "a bool", int: "an int", float: "a number", str: "a string",
            list: "an array", dict: "an object"}.get(
                kind, f"a {kind.__name__}")


def _meta(metadata: Mapping[str, Any], key: str, source: str,
          kind: type, default: Any = None, required: bool = False) -> Any:
    value = metadata.get(key)
    if value is None:
        if required:
            raise TokenizerError(
                f"{source}: no {key} in the GGUF metadata (the file has no "
                "tokenizer vocabulary vflow can use)")
        return default
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON numbers from the runtime are doubles
    if not isinstance(value, kind) or (kind is int
                                       and isinstance(value, bool)):
        raise TokenizerError(
            f"{source}: {key} is {_kind_name(type(value))} {value!r:.60}, "
            f"expected {_kind_name(kind)}")
    return value


def _entries(metadata: Mapping[str, Any], key: str, source: str,
             kind: type, count: Optional[int] = None,
             default: Any = None) -> Any:
    """A GGUF array whose every entry is a `kind` (int: not bool; float:
    any finite number), of `count` entries when given."""
    values = _meta(metadata, key, source, list, default=default,
                   required=default is None)
    for i, v in enumerate(values):
        number = kind is float and isinstance(v, (int, float)) and not \
            isinstance(v, bool) and math.isfinite(v)
        if not (number or (kind is not float and isinstance(v, kind)
                           and not (kind is int and isinstance(v, bool)))):
            raise TokenizerError(
                f"{source}: {key}[{i}] = {v!r:.60} is not "
                f"{'a finite number' if kind is float else _kind_name(kind)}")
    if count is not None and len(values) != count:
        raise TokenizerError(
            f"{source}: {key} has {len(values)} entries for {count} tokens")
    return values


def _split_merge(merge: str, index: int, source: str) -> Tuple[str, str]:
    # As llama.cpp: the first space after the first character separates
    # the pair (a token may itself be a space).
    pos = merge.find(" ", 1)
    if pos < 0:
        raise TokenizerError(
            f"{source}: tokenizer.ggml.merges[{index}] = {merge!r} is not "
            "two tokens separated by a space")
    return merge[:pos], merge[pos + 1:]


def _byte_level_bpe(metadata: Mapping[str, Any], tokens: List[str],
                    source: str) -> Tuple[tokenizers.Tokenizer, bool]:
    pre = _meta(metadata, "tokenizer.ggml.pre", source, str)
    if pre is None:
        warnings.warn(f"{source}: no tokenizer.ggml.pre; using llama.cpp's "
                      "'default' pre-tokenizer (the file may tokenize badly)")
        pre = "default"
    if pre not in _BPE_PRE:
        raise TokenizerError(
            f"{source}: tokenizer.ggml.pre = {pre!r} is a pre-tokenizer vflow "
            f"does not know (known: {', '.join(sorted(_BPE_PRE))})")
    regexes, flags = _BPE_PRE[pre]
    merges = _entries(metadata, "tokenizer.ggml.merges", source, str)
    vocab = {token: i for i, token in enumerate(tokens)}
    model = tokenizers.models.BPE(
        vocab, [_split_merge(m, i, source) for i, m in enumerate(merges)],
        ignore_merges=flags.get("ignore_merges", False))
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False,
                                    trim_offsets=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    return backend, flags.get("add_bos", False)


def _spm_merges(tokens: List[str], types: List[int],
                scores: List[float]) -> List[Tuple[str, str]]:
    """SentencePiece BPE as merges: every normal token that is two normal
    tokens joined, ranked by the token's score (higher first), as
    SentencePiece (and llama.cpp) merge the best-scoring pair first."""
    normal = {t: i for i, t in enumerate(tokens) if types[i] == _NORMAL}
    ranked = []
    for token, i in normal.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in normal and right in normal:
                ranked.append((-scores[i], normal[left], normal[right],
                               left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def _sentencepiece_bpe(metadata: Mapping[str, Any], tokens: List[str],
                       types: List[int],
                       source: str) -> tokenizers.Tokenizer:
    scores = _entries(metadata, "tokenizer.ggml.scores", source, float,
                      count=len(tokens))
    unk = _meta(metadata, "tokenizer.ggml.unknown_token_id", source, int)
    has_bytes = any(t == _BYTE for t in types)
    vocab = {token: i for i, token in enumerate(tokens)}
    model = tokenizers.models.BPE(
        vocab, _spm_merges(tokens, types, [float(s) for s in scores]),
        unk_token=tokens[unk] if unk is not None and 0 <= unk < len(tokens)
        else None,
        fuse_unk=True, byte_fallback=has_bytes)
    backend = tokenizers.Tokenizer(model)
    prefix = _meta(metadata, "tokenizer.ggml.add_space_prefix", source, bool,
                   default=True)
    replace = normalizers.Replace(" ", "\u2581")
    backend.normalizer = (normalizers.Sequence(
        [normalizers.Prepend("\u2581"), replace]) if prefix else replace)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(),
             decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(steps)
    return backend


def gguf_backend(metadata: Mapping[str, Any],
                 source: str = "GGUF metadata"
                 ) -> Tuple[tokenizers.Tokenizer, bool]:
    """The `tokenizers` tokenizer a GGUF file's metadata describes (keys
    tokenizer.ggml.*), and whether llama.cpp adds BOS to it by default (the
    file's tokenizer.ggml.add_bos_token overrides that). `source` names the
    file in errors: TokenizerError for metadata that is broken or that
    vflow cannot build (tokenizer models other than "gpt2" and "llama"),
    NoTokenizer when it has no tokenizer."""
    if not isinstance(metadata, Mapping):
        raise TokenizerError(f"{source}: the GGUF metadata is a "
                             f"{type(metadata).__name__}, not a mapping")
    with _about(source):
        return _gguf_backend(metadata, source)


def _gguf_backend(metadata: Mapping[str, Any],
                  source: str) -> Tuple[tokenizers.Tokenizer, bool]:
    model, vocab = "tokenizer.ggml.model", "tokenizer.ggml.tokens"
    if (metadata.get(model) is None and metadata.get(vocab) is None) or \
            metadata.get(model) == "none":
        raise NoTokenizer(
            f"{source}: no tokenizer.ggml.model and tokenizer.ggml.tokens in "
            "the GGUF metadata (the model has no tokenizer; pass token ids)"
            if metadata.get(model) is None else
            f"{source}: tokenizer.ggml.model = 'none' (the model has no "
            "tokenizer; pass token ids)")
    kind = _meta(metadata, model, source, str, required=True)
    tokens = _entries(metadata, vocab, source, str)
    if not tokens:
        raise TokenizerError(f"{source}: {vocab} is empty")
    types = _entries(metadata, "tokenizer.ggml.token_type", source, int,
                     count=len(tokens), default=[_NORMAL] * len(tokens))
    if kind == "gpt2":
        backend, add_bos = _byte_level_bpe(metadata, tokens, source)
    elif kind == "llama":
        backend, add_bos = _sentencepiece_bpe(metadata, tokens, types,
                                              source), True
    else:
        raise TokenizerError(
            f"{source}: tokenizer.ggml.model = {kind!r}: vflow builds GGUF "
            "tokenizers of the models 'gpt2' (byte-level BPE) and 'llama' "
            "(SentencePiece BPE) only")
    special = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(tokens, types)
               if ty in (_CONTROL, _UNKNOWN) and t]
    user = [AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types) if ty == _USER_DEFINED and t]
    backend.add_special_tokens(special)
    backend.add_tokens(user)
    if backend.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise TokenizerError(
            f"{source}: tokenizer.ggml.tokens has repeated tokens (the "
            f"tokenizer has {backend.get_vocab_size(with_added_tokens=True)} "
            f"distinct tokens for {len(tokens)} ids)")
    return backend, add_bos


# ---------------------------------------------------------------------------
# Hugging Face directories
# ---------------------------------------------------------------------------


_BOM = b"\xef\xbb\xbf"


def _read_text(path: Path, json_text: bool = False) -> str:
    """A UTF-8 text file (a byte order mark at its start skipped, except in
    JSON: refused there, as the runtime's JSON reader and Hugging Face's
    refuse it)."""
    if not path.is_file():
        raise TokenizerError(f"{path}: not a regular file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TokenizerError(
            f"{path}: cannot read it: {e.strerror or e}") from e
    skip = len(_BOM) if data.startswith(_BOM) else 0
    if skip and json_text:
        raise TokenizerError(
            f"{path}: the document starts with a UTF-8 byte-order mark (JSON "
            "text has none)")
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = skip + e.start
        raise TokenizerError(
            f"{path}: not UTF-8 text (byte 0x{data[at]:02x} at offset {at}: "
            f"{e.reason})") from e


def _read_json(path: Path) -> Dict[str, Any]:
    """A JSON object file; {} when there is no such file."""
    if not path.exists():
        return {}
    text = _read_text(path, json_text=True)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise TokenizerError(
            f"{path}: not valid JSON: {e.msg} at line {e.lineno} column "
            f"{e.colno}") from e
    except (ValueError, RecursionError) as e:  # too many digits, too deep
        raise TokenizerError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise TokenizerError(f"{path}: expected a JSON object, not "
                             f"{_json_type(value)}")
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _token_text(config: Mapping[str, Any], key: str,
                file: Path) -> Optional[str]:
    """A special token as tokenizer_config.json spells it: a string or an
    AddedToken object ({"content": ...}); None when absent or null."""
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, dict):
        value = value.get("content")
        if not isinstance(value, str):
            raise TokenizerError(
                f"{file}: {key} is an object without a string \"content\"")
    if not isinstance(value, str):
        raise TokenizerError(
            f"{file}: {key} is {_json_type(value)}, expected a string or "
            "{\"content\": ...}")
    return value


def _ids(config: Mapping[str, Any], key: str, file: Path,
         vocab_size: int) -> List[int]:
    """A token id or a list of them (generation_config.json, config.json),
    each within the vocabulary; [] when absent or null."""
    value = config.get(key)
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TokenizerError(
                f"{file}: {key} is {_json_type(value)} "
                f"{json.dumps(value)[:60]}, expected a token id or a list of "
                "them")
        if not 0 <= v < vocab_size:
            raise TokenizerError(
                f"{file}: {key} {v} is outside the vocabulary of "
                f"tokenizer.json ({vocab_size} tokens)")
    return list(values)


def _flag(config: Mapping[str, Any], key: str, file: Path) -> Optional[bool]:
    value = config.get(key)
    if value is not None and not isinstance(value, bool):
        raise TokenizerError(f"{file}: {key} is {_json_type(value)}, "
                             "expected true or false")
    return value


def _chat_template(directory: Path,
                   config: Mapping[str, Any]) -> Optional[str]:
    file = directory / "tokenizer_config.json"
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}]
        named = {}
        for i, t in enumerate(template):
            if not (isinstance(t, dict) and isinstance(t.get("name"), str)
                    and isinstance(t.get("template"), str)):
                raise TokenizerError(
                    f"{file}: chat_template[{i}] is not an object with a "
                    "string \"name\" and \"template\"")
            named[t["name"]] = t["template"]
        template = named.get("default")
    elif template is not None and not isinstance(template, str):
        raise TokenizerError(
            f"{file}: chat_template is {_json_type(template)}, expected a "
            "string or a list of {\"name\", \"template\"}")
    if isinstance(template, str):
        return template
    jinja = directory / "chat_template.jinja"
    if jinja.exists():
        return _read_text(jinja)
    other = directory / "chat_template.json"
    template = _read_json(other).get("chat_template")
    if template is not None and not isinstance(template, str):
        raise TokenizerError(f"{other}: chat_template is "
                             f"{_json_type(template)}, expected a string")
    return template


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------


def _unique(ids: Iterable[int]) -> List[int]:
    out: List[int] = []
    for i in ids:
        if i not in out:
            out.append(i)
    return out


class Tokenizer:
    """A model's tokenizer. Build it with `from_model` (or `from_hf_dir`,
    `from_gguf`, `from_gguf_metadata`); `backend` is the underlying
    `tokenizers.Tokenizer`."""

    def __init__(self, backend: tokenizers.Tokenizer, *,
                 bos_token_id: Optional[int] = None,
                 eos_token_ids: Sequence[int] = (),
                 add_bos_token: bool = False,
                 add_eos_token: bool = False,
                 chat_template: Optional[str] = None,
                 source: str = "tokenizer") -> None:
        self.backend = backend
        self.source = source
        self.bos_token_id = bos_token_id
        self.eos_token_ids: List[int] = list(eos_token_ids)
        self.add_bos_token = add_bos_token
        self.add_eos_token = add_eos_token
        self.chat_template = chat_template
        n = self.vocab_size
        for what, ids in (("bos_token_id", [bos_token_id]),
                          ("eos_token_ids", self.eos_token_ids)):
            for i in ids:
                if i is not None and not 0 <= i < n:
                    raise TokenizerError(
                        f"{source}: {what} {i} is outside the vocabulary "
                        f"({n} tokens)")
        if add_bos_token and bos_token_id is None:
            raise TokenizerError(
                f"{source}: the model asks for a BOS token but names none")
        if add_eos_token and not self.eos_token_ids:
            raise TokenizerError(
                f"{source}: the model asks for an EOS token but names none")

    # -- construction --------------------------------------------------------

    @classmethod
    def from_model(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """A Hugging Face model directory (with tokenizer.json) or a .gguf
        file. Raises FileNotFoundError when `path` does not exist,
        NoTokenizer when the model has no tokenizer, TokenizerError (naming
        the file and what is wrong) for anything else that cannot be
        used."""
        p = Path(path)
        if "\0" in str(p):
            raise TokenizerError(f"{str(p)!r}: a path cannot hold a NUL byte")
        if p.is_dir():
            return cls.from_hf_dir(p)
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file or directory")
        try:
            with open(p, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            raise TokenizerError(
                f"{p}: cannot read it: {e.strerror or e}") from e
        if magic != b"GGUF":
            raise TokenizerError(
                f"{p}: neither a model directory nor a GGUF file (it does not "
                "start with the GGUF magic)")
        return cls.from_gguf(p)

    @classmethod
    def from_hf_dir(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """tokenizer.json of a Hugging Face directory, with the special
        tokens and flags of its tokenizer_config.json, generation_config.json
        and config.json (NoTokenizer when it has no tokenizer.json)."""
        d = Path(path)
        file = d / "tokenizer.json"
        if not file.exists():
            raise NoTokenizer(
                f"{d}: no tokenizer.json (vflow reads a Hugging Face model's "
                "tokenizer from its tokenizer.json)")
        text = _read_text(file, json_text=True)
        try:
            backend = tokenizers.Tokenizer.from_str(text)
        except Exception as e:  # tokenizers raises Exception
            raise TokenizerError(f"{file}: cannot load it: {e}") from e
        n = backend.get_vocab_size(with_added_tokens=True)
        tfile = d / "tokenizer_config.json"
        gfile = d / "generation_config.json"
        mfile = d / "config.json"
        tconfig = _read_json(tfile)
        gconfig = _read_json(gfile)
        mconfig = _read_json(mfile)

        def token_id(key: str) -> Optional[int]:
            text = _token_text(tconfig, key, tfile)
            if text is None:
                return None
            i = backend.token_to_id(text)
            if i is None:
                raise TokenizerError(
                    f"{tfile}: {key} {text!r} is not in tokenizer.json's "
                    "vocabulary")
            return i

        with _about(tfile):
            bos = token_id("bos_token")
            eos_token = token_id("eos_token")
            add_bos = _flag(tconfig, "add_bos_token", tfile)
            add_eos = _flag(tconfig, "add_eos_token", tfile) is True
            template = _chat_template(d, tconfig)
        bos_ids = (_ids(gconfig, "bos_token_id", gfile, n)
                   + _ids(mconfig, "bos_token_id", mfile, n))
        if bos is None:
            bos = next(iter(bos_ids), None)
        eos = _unique(_ids(gconfig, "eos_token_id", gfile, n)
                      + _ids(mconfig, "eos_token_id", mfile, n)
                      + ([eos_token] if eos_token is not None else []))
        if add_bos is None:
            # No flag: whether tokenizer.json's post-processor adds BOS.
            with _about(file):
                with_special = backend.encode("a",
                                              add_special_tokens=True).ids
                add_bos = (bos is not None and bool(with_special)
                           and with_special[0] == bos
                           and backend.encode("a", add_special_tokens=False)
                           .ids[:1] != [bos])
        if add_bos and bos is None:
            raise TokenizerError(
                f"{tfile}: add_bos_token is true but no BOS token is named "
                f"(bos_token here, bos_token_id in {gfile.name} or "
                f"{mfile.name})")
        if add_eos and not eos:
            raise TokenizerError(
                f"{tfile}: add_eos_token is true but no EOS token is named "
                f"(eos_token here, eos_token_id in {gfile.name} or "
                f"{mfile.name})")
        return cls(backend, bos_token_id=bos, eos_token_ids=eos,
                   add_bos_token=add_bos, add_eos_token=add_eos,
                   chat_template=template, source=str(d))

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """The tokenizer in a GGUF file's metadata (the file is opened by
        vflow's model loader, which checks the whole file)."""
        from . import _vflow

        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no such file")
        try:
            _, metadata = _vflow.model_info(str(p))
        except _vflow.RuntimeError as e:  # the loader's message names it
            message = str(e)
            raise TokenizerError(message if str(p) in message
                                 else f"{p}: {message}") from e
        with _about(p):
            meta = json.loads(metadata)
        if not isinstance(meta, dict):
            raise TokenizerError(f"{p}: not a GGUF file (no metadata)")
        return cls.from_gguf_metadata(meta, source=str(p))

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any],
                           source: str = "GGUF metadata") -> Tokenizer:
        """The tokenizer that GGUF metadata describes (keys as in the file:
        tokenizer.ggml.model, .pre, .tokens, .merges or .scores,
        .token_type, .bos_token_id, .eos_token_id, .add_bos_token,
        tokenizer.chat_template, ...)."""
        backend, add_bos = gguf_backend(metadata, source)
        with _about(source):
            return cls._from_gguf_backend(metadata, source, backend, add_bos)

    @classmethod
    def _from_gguf_backend(cls, metadata: Mapping[str, Any], source: str,
                           backend: tokenizers.Tokenizer,
                           add_bos: bool) -> Tokenizer:
        def opt_int(key: str) -> Optional[int]:
            return _meta(metadata, key, source, int)

        add_bos = _meta(metadata, "tokenizer.ggml.add_bos_token", source, bool,
                        default=add_bos)
        add_eos = _meta(metadata, "tokenizer.ggml.add_eos_token", source, bool,
                        default=False)
        # As the engine's ModelConfig: eos, then eot and eom.
        eos = _unique(i for i in (opt_int("tokenizer.ggml.eos_token_id"),
                                  opt_int("tokenizer.ggml.eot_token_id"),
                                  opt_int("tokenizer.ggml.eom_token_id"))
                      if i is not None)
        bos = opt_int("tokenizer.ggml.bos_token_id")
        return cls(backend, bos_token_id=bos, eos_token_ids=eos,
                   add_bos_token=add_bos, add_eos_token=add_eos,
                   chat_template=_meta(metadata, "tokenizer.chat_template",
                                       source, str),
                   source=source)

    # -- use -----------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """The number of token ids (added tokens included); every id is
        below it. The model's embedding may have more rows (padding)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        """Token ids of `text`. Special tokens written in the text (like
        <|im_start|>) are matched whole. With add_special_tokens, BOS is put
        first (and EOS last) when the model asks for it."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens:
            if self.add_bos_token and self.bos_token_id is not None:
                ids.insert(0, self.bos_token_id)
            if self.add_eos_token:
                ids.append(self.eos_token_ids[0])
        return ids

    def decode(self, ids: Sequence[int],
               skip_special_tokens: bool = True) -> str:
        """The text of `ids` (special tokens left out unless
        skip_special_tokens is False)."""
        ids = [int(i) for i in ids]
        n = self.vocab_size
        for i in ids:
            if not 0 <= i < n:
                raise ValueError(
                    f"token id {i} is outside the vocabulary ({n} tokens)")
        return self.backend.decode(ids,
                                   skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> Optional[str]:
        """The vocabulary's spelling of one token (byte-level or
        SentencePiece form, not decoded text)."""
        return self.backend.id_to_token(token_id)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True,
                            **variables: Any) -> str:
        """The model's chat template rendered over `messages` ([{"role":
        ..., "content": ...}, ...]) as transformers renders it (jinja2,
        sandboxed; bos_token and eos_token defined; `variables` passed on,
        e.g. tools=...). Encode the result with add_special_tokens=False
        when the template writes BOS itself."""
        if self.chat_template is None:
            raise TokenizerError(f"{self.source}: the model has no chat "
                                 "template")
        try:
            import jinja2
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as e:
            raise ImportError("apply_chat_template needs jinja2 (pip install "
                              "jinja2)") from e

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None,
                   separators: Any = None, sort_keys: bool = False) -> str:
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                              separators=separators, sort_keys=sort_keys)

        def strftime_now(fmt: str) -> str:
            import datetime
            return datetime.datetime.now().strftime(fmt)

        env = ImmutableSandboxedEnvironment(trim_blocks=True,
                                            lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        special = {
            "bos_token": (self.token_text(self.bos_token_id)
                          if self.bos_token_id is not None else ""),
            "eos_token": (self.token_text(self.eos_token_ids[0])
                          if self.eos_token_ids else ""),
        }
        try:
            template = env.from_string(self.chat_template)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise TokenizerError(
                f"{self.source}: the chat template does not compile: line "
                f"{e.lineno}: {e.message}") from e
        return template.render(
            **{**special, **variables}, messages=list(messages),
            add_generation_prompt=add_generation_prompt)

    def __repr__(self) -> str:
        return (f"Tokenizer({self.source!r}, vocab_size={self.vocab_size}, "
                f"bos={self.bos_token_id}, eos={self.eos_token_ids}, "
                f"add_bos={self.add_bos_token})")
