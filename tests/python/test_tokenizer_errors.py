"""Broken tokenizer inputs: Tokenizer.from_model raises TokenizerError
naming the file and what is wrong for each (never a bare JSONDecodeError,
UnicodeDecodeError, KeyError, TypeError, tokenizers' Exception or OSError),
and NoTokenizer only when the model has no tokenizer at all. A UTF-8 byte
order mark at the start of a JSON file is skipped."""

from __future__ import annotations

import json
import pathlib
import re
import sys
from typing import Any, Callable, Dict, List, Tuple

import pytest

pytest.importorskip("tokenizers")

from vflow._tokenizer import NoTokenizer, Tokenizer, TokenizerError  # noqa: E402,E501

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_tokenizer import gpt2_metadata, write_gguf  # noqa: E402
from tiny_model import write_tokenizer  # noqa: E402

BOM = b"\xef\xbb\xbf"


def hf_dir(path: pathlib.Path) -> pathlib.Path:
    """A good directory: tokenizer.json (64 words), tokenizer_config.json
    (BOS <s> = 1 added, EOS </s> = 2)."""
    write_tokenizer(path, 64)
    return path


def put(path: pathlib.Path, name: str, content: Any) -> None:
    data = content if isinstance(content, bytes) else json.dumps(
        content).encode()
    (path / name).write_bytes(data)


def config(path: pathlib.Path, **fields: Any) -> None:
    tconfig = json.loads((path / "tokenizer_config.json").read_text())
    tconfig.update(fields)
    put(path, "tokenizer_config.json", tconfig)


Break = Callable[[pathlib.Path], None]
# (name, how the directory is broken, the file named, what the message says)
Case = Tuple[str, Break, str, str]


def writes(file: str, what: str, content: Any, why: str) -> Case:
    """`file` written as `content` (bytes as they are, else as JSON)."""
    return (f"{file} {what}", lambda d: put(d, file, content), file, why)


def configured(name: str, why: str, **fields: Any) -> Case:
    """tokenizer_config.json with `fields` set."""
    return (name, lambda d: config(d, **fields), "tokenizer_config.json", why)


def directory(file: str) -> Case:
    """`file` a directory instead of a regular file."""
    def brk(d: pathlib.Path) -> None:
        (d / file).unlink()
        (d / file).mkdir()
    return (f"{file} a directory", brk, file, "not a regular file")


HF_CASES: List[Case] = [
    writes("tokenizer.json", "not JSON", b"{not json", "cannot load it"),
    writes("tokenizer.json", "not UTF-8", b'{"version": "\xff"}',
           r"not UTF-8 text \(byte 0xff at offset 13"),
    writes("tokenizer.json", "not a tokenizer", [1, 2], "cannot load it"),
    directory("tokenizer.json"),
    writes("tokenizer_config.json", "not JSON", b'{"bos_token": }',
           "not valid JSON: .* line 1 column 15"),
    writes("tokenizer_config.json", "not UTF-8", b'{"bos_token": "\xc3("}',
           "not UTF-8 text .*offset 15"),
    writes("tokenizer_config.json", "a BOM", BOM + b'{"a": "b"}',
           "starts with a UTF-8 byte-order mark"),
    ("tokenizer.json a BOM",
     lambda d: put(d, "tokenizer.json",
                   BOM + (d / "tokenizer.json").read_bytes()),
     "tokenizer.json", "starts with a UTF-8 byte-order mark"),
    writes("generation_config.json", "a BOM", BOM + b'{"eos_token_id": 2}',
           "starts with a UTF-8 byte-order mark"),
    writes("tokenizer_config.json", "an array", [],
           "expected a JSON object, not an array"),
    directory("tokenizer_config.json"),
    configured("bos_token a number",
               "bos_token is a number, expected a string", bos_token=1),
    configured("eos_token an object without content",
               "eos_token is an object without", eos_token={"content": 2}),
    configured("bos_token not in the vocabulary",
               "bos_token '<nope>' is not in", bos_token="<nope>"),
    configured("add_bos_token a string",
               "add_bos_token is a string, expected true",
               add_bos_token="yes"),
    configured("add_bos_token without a BOS token",
               "add_bos_token is true but no BOS token", bos_token=None),
    configured("chat_template a number", "chat_template is a number",
               chat_template=42),
    configured("chat_template a list of junk",
               r"chat_template\[0\] is not an object", chat_template=[1]),
    writes("chat_template.jinja", "not UTF-8", b"{{ '\xfe' }}",
           "not UTF-8 text .*byte 0xfe at offset 4"),
    writes("chat_template.json", "template a list", {"chat_template": []},
           "chat_template is an array"),
    writes("generation_config.json", "not UTF-8",
           b'{"eos_token_id": 2}\xff', "not UTF-8 text .*offset 19"),
    writes("generation_config.json", "eos_token_id a string",
           {"eos_token_id": "2"}, "eos_token_id is a string"),
    writes("generation_config.json", "eos_token_id outside the vocabulary",
           {"eos_token_id": [2, 10**6]},
           "eos_token_id 1000000 is outside the vocabulary .*64 tokens"),
    writes("config.json", "bos_token_id a bool", {"bos_token_id": [True]},
           "bos_token_id is an array"),
    writes("config.json", "not UTF-8", b'{"model_type": "ll\xe9ma"}',
           "not UTF-8 text .*byte 0xe9"),
    writes("config.json", "nested too deep", b"[" * 100000 + b"]" * 100000,
           "not valid JSON"),
    writes("config.json", "not JSON", b"model_type: llama",
           "not valid JSON: Expecting value at line 1 column 1"),
]


@pytest.mark.parametrize("name,brk,file,why", HF_CASES,
                         ids=[c[0] for c in HF_CASES])
def test_broken_hf_dir(tmp_path: pathlib.Path, name: str, brk: Break,
                       file: str, why: str) -> None:
    d = hf_dir(tmp_path / "m")
    Tokenizer.from_model(d)  # good before it is broken
    brk(d)
    with pytest.raises(TokenizerError) as info:
        Tokenizer.from_model(d)
    assert not isinstance(info.value, NoTokenizer)
    message = str(info.value)
    assert message.startswith(str(d / file) + ": "), message
    assert re.search(why, message), message


def test_byte_order_marks_are_refused_as_the_model_loader_does(
        tmp_path: pathlib.Path) -> None:
    """The JSON files of a model directory are read by one rule: a leading
    UTF-8 BOM is refused with the runtime JSON reader's words (config.json
    is read by both)."""
    d = hf_dir(tmp_path / "m")
    put(d, "config.json", BOM + b'{"bos_token_id": 1}')
    with pytest.raises(TokenizerError) as info:
        Tokenizer.from_model(d)
    assert str(info.value) == (
        f"{d / 'config.json'}: the document starts with a UTF-8 byte-order "
        "mark (JSON text has none)")


def test_a_directory_without_a_tokenizer(tmp_path: pathlib.Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(NoTokenizer, match=r"no tokenizer\.json"):
        Tokenizer.from_model(tmp_path)


def test_a_broken_chat_template_is_reported_when_used(
        tmp_path: pathlib.Path) -> None:
    d = hf_dir(tmp_path / "m")
    config(d, chat_template="{% for m in messages %}")
    tok = Tokenizer.from_model(d)  # encode/decode do not need it
    assert tok.decode(tok.encode("w5")) == "w5"
    with pytest.raises(TokenizerError,
                       match=r"chat template does not compile: line 1"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def meta(**changes: Any) -> Dict[str, Any]:
    m = gpt2_metadata()
    for key, value in changes.items():
        key = "tokenizer.ggml." + key
        if value is None:
            del m[key]
        else:
            m[key] = value
    return m


def tokens_with(i: int, value: Any) -> List[Any]:
    tokens = list(gpt2_metadata()["tokenizer.ggml.tokens"])
    tokens[i] = value
    return tokens


GGUF_CASES: List[Tuple[str, Any, str]] = [
    ("token_type entries not ints",
     meta(token_type=["x"] * 300), r"tokenizer\.ggml\.token_type\[0\] = 'x' "
     "is not an int"),
    ("token_type entries null",
     meta(token_type=[None] * 300), r"token_type\[0\] = None is not an int"),
    ("merges entries not strings",
     meta(merges=[5]), r"tokenizer\.ggml\.merges\[0\] = 5 is not a string"),
    ("a merge of unknown tokens",
     meta(merges=["h zz"]), "out of vocabulary"),
    ("tokens not strings",
     meta(tokens=tokens_with(3, 7)),
     r"tokenizer\.ggml\.tokens\[3\] = 7 is not a string"),
    ("tokens empty", meta(tokens=[]), r"tokenizer\.ggml\.tokens is empty"),
    ("bos id a bool",
     meta(bos_token_id=True),
     r"tokenizer\.ggml\.bos_token_id is a bool True, expected an int"),
    ("model a number",
     meta(model=3), r"tokenizer\.ggml\.model is an int 3, expected a string"),
    ("model unknown",
     meta(model="bert"), r"tokenizer\.ggml\.model = 'bert': vflow builds"),
    ("a vocabulary without a model",
     meta(model=None), r"no tokenizer\.ggml\.model in the GGUF metadata"),
    ("a model without a vocabulary",
     meta(tokens=None), r"no tokenizer\.ggml\.tokens in the GGUF metadata"),
    ("scores not numbers",
     dict(meta(model="llama"), **{"tokenizer.ggml.scores": ["x"] * 300}),
     r"tokenizer\.ggml\.scores\[0\] = 'x' is not a finite number"),
    ("chat template a list",
     dict(meta(), **{"tokenizer.chat_template": ["x"]}),
     r"tokenizer\.chat_template is an array"),
]


@pytest.mark.parametrize("name,metadata,why", GGUF_CASES,
                         ids=[c[0] for c in GGUF_CASES])
def test_broken_gguf_metadata(name: str, metadata: Any, why: str) -> None:
    with pytest.raises(TokenizerError, match="^m.gguf: .*" + why) as info:
        Tokenizer.from_gguf_metadata(metadata, "m.gguf")
    assert not isinstance(info.value, NoTokenizer)


def test_gguf_metadata_without_a_tokenizer() -> None:
    with pytest.raises(NoTokenizer, match=r"^m\.gguf: no tokenizer\.ggml"):
        Tokenizer.from_gguf_metadata({"general.architecture": "llama"},
                                     "m.gguf")
    with pytest.raises(NoTokenizer, match=r"tokenizer\.ggml\.model = 'none'"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "none"},
                                     "m.gguf")
    with pytest.raises(TokenizerError, match="not a mapping"):
        Tokenizer.from_gguf_metadata([], "m.gguf")  # type: ignore[arg-type]


def test_broken_gguf_files(tmp_path: pathlib.Path) -> None:
    good = tmp_path / "good.gguf"
    write_gguf(good, gpt2_metadata())
    Tokenizer.from_model(good)
    bare = tmp_path / "bare.gguf"
    write_gguf(bare, {})
    with pytest.raises(NoTokenizer, match=r"bare\.gguf: "):
        Tokenizer.from_model(bare)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:200])
    with pytest.raises(TokenizerError, match=r"cut\.gguf"):
        Tokenizer.from_model(cut)
    bad = tmp_path / "bad.gguf"
    write_gguf(bad, gpt2_metadata(**{"tokenizer.ggml.merges": [1, 2]}))
    with pytest.raises(TokenizerError,
                       match=r"bad\.gguf: tokenizer\.ggml\.merges\[0\] = 1"):
        Tokenizer.from_model(bad)
    with pytest.raises(TokenizerError, match="NUL byte"):
        Tokenizer.from_model(str(good) + "\0x")
