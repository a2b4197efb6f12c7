"""vflow serve's streamed text (vflow._serve.Choice) on a byte-level BPE
tokenizer, whose tokens split multi-byte characters: fed one token (or a few)
at a time, the deltas add up to the decode of all the ids; no delta ends
inside a character; stop strings cut the text at their first occurrence,
found across token boundaries, and nothing after them is sent."""

from __future__ import annotations

import random
from typing import Any, List, Sequence

import pytest

pytest.importorskip("fastapi")
tokenizers = pytest.importorskip("tokenizers")

from vflow._serve import Choice  # noqa: E402

TEXT = ("Héllo wörld! Ça va? 日本語のテキスト, emoji 🙂🚀 and mixed ΑΒΓ "
        "text with spaces   and\nnew lines. ") * 20


class ByteTokenizer:
    """A byte-level BPE (GPT-2's scheme) trained on TEXT, with vflow's
    tokenizer interface (decode)."""

    def __init__(self) -> None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator([TEXT], trainers.BpeTrainer(
            vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        self.tok = tok

    def encode(self, text: str) -> List[int]:
        return self.tok.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids))


@pytest.fixture(scope="module")
def tok() -> ByteTokenizer:
    return ByteTokenizer()


def stream(choice: Choice, ids: Sequence[int], rng: random.Random) -> List[str]:
    deltas, i = [], 0
    while i < len(ids) and choice.finish is None:
        n = rng.choice([1, 1, 1, 2, 3])
        deltas.append(choice.add(ids[i:i + n]))
        i += n
    if choice.finish is None:
        deltas.append(choice.add([], final=True))
    return deltas


def test_deltas_add_up_to_the_decode(tok: ByteTokenizer) -> None:
    rng = random.Random(0)
    for start in range(0, 400, 37):
        ids = tok.encode(TEXT[start:start + 120])
        assert tok.decode(ids) == TEXT[start:start + 120]
        deltas = stream(Choice(0, tok, [], []), ids, rng)
        assert "".join(deltas) == tok.decode(ids)
        assert not any("\ufffd" in d for d in deltas)


def test_stop_strings_cut_at_the_first(tok: ByteTokenizer) -> None:
    rng = random.Random(1)
    ids = tok.encode(TEXT[:300])
    full = tok.decode(ids)
    for stop in ("wörld", "🚀 and", "va? 日本", "\nnew", "テキスト, e"):
        c = Choice(0, tok, ["never there", stop], [])
        text = "".join(stream(c, ids, rng))
        assert c.finish == "stop"
        assert text == full[:full.find(stop)], stop


def test_stop_token_ids_end_the_text(tok: ByteTokenizer) -> None:
    ids = tok.encode(TEXT[:200])
    stop_id = ids[17]
    c = Choice(0, tok, [], [stop_id])
    text = "".join(stream(c, ids, random.Random(2)))
    first = ids.index(stop_id)
    assert c.finish == "stop"
    assert text == tok.decode(ids[:first])


def test_each_token_is_decoded_a_few_times(tok: ByteTokenizer) -> None:
    """Streaming n tokens decodes O(n) ids in all, not O(n^2) (one decode
    of the whole text per token would block the server's event loop)."""

    class Counting:
        decoded = 0

        def decode(self, ids: Sequence[int]) -> str:
            Counting.decoded += len(ids)
            return tok.decode(ids)

    ids = tok.encode(TEXT * 3)
    deltas = stream(Choice(0, Counting(), ["never"], []), ids,
                    random.Random(3))
    assert "".join(deltas) == tok.decode(ids)
    assert Counting.decoded < 12 * len(ids), (Counting.decoded, len(ids))
