"""Odd requests, built from picklable descriptions, for tests of every entry point.

A description is ``(kind, rows, seed)``; ``build`` makes the array (or non-array) it
names, in the process that asks, so that a child process of the process backend makes
the same odd object (a pickle would turn an unaligned or strided array into a plain
one). The model is ``square_plus_one`` on ``[n, 4] float32``: elementwise, so a subclass
that keeps its own arithmetic (``np.matrix`` makes ``x * x`` a matrix product) shows in
the answer.
"""

from __future__ import annotations

from typing import Any, List, Tuple

import numpy as np

from async_search.models import with_spec

WIDTH = 4
DTYPE = np.float32

Description = Tuple[str, int, int]


class Doubling(np.ndarray):
    """An ndarray subclass with arithmetic of its own: ``a * b`` is ``2 * a * b``."""

    def __mul__(self, other):
        return np.multiply(np.asarray(self), np.asarray(other)) * 2


def square_plus_one_fn(x):
    return x * x + 1


def square_plus_one():
    """The model every odd-array test serves (picklable factory)."""
    return with_spec(square_plus_one_fn, (WIDTH,), DTYPE)


def _values(rows: int, seed: int, dtype=DTYPE, width: int = WIDTH) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(-20, 20, (rows, width)).astype(dtype)


def _unaligned(values: np.ndarray) -> np.ndarray:
    raw = np.zeros(values.nbytes + 1, np.uint8)
    out = np.frombuffer(raw.data, values.dtype, count=values.size, offset=1)
    out = out.reshape(values.shape)
    out[...] = values
    return out


def _masked(v, seed):
    return np.ma.masked_array(v, mask=np.random.default_rng(seed).random(v.shape) < 0.5)


def _readonly(v):
    v.flags.writeable = False
    return v


#: kind -> how to make it from plain values ``v`` of the spec (rows, WIDTH) float32.
_KINDS = {
    "plain": lambda v, s: v,
    "matrix": lambda v, s: np.matrix(v) if len(v) else v.view(np.matrix),
    "masked": _masked,
    "masked_nomask": lambda v, s: np.ma.masked_array(v),
    "subclass": lambda v, s: v.view(Doubling),
    "recarray": lambda v, s: v.view(np.recarray),
    "fortran": lambda v, s: np.asfortranarray(v),
    "reversed_rows": lambda v, s: v[::-1],
    "reversed_cols": lambda v, s: v[:, ::-1],
    "strided": lambda v, s: np.repeat(v, 2, axis=1)[:, ::2],
    "broadcast": lambda v, s: np.broadcast_to(v[:1], v.shape) if len(v) else v,
    "readonly": lambda v, s: _readonly(v.copy()),
    "unaligned": lambda v, s: _unaligned(v),
    "big_endian": lambda v, s: v.astype(">f4"),
    "view_of_bigger": lambda v, s: np.concatenate([v, v])[: len(v)],
    "float64": lambda v, s: v.astype(np.float64),
    "float16": lambda v, s: v.astype(np.float16),
    "int32": lambda v, s: v.astype(np.int32),
    "object": lambda v, s: v.astype(object),
    "complex": lambda v, s: v.astype(np.complex64),
    "wrong_width": lambda v, s: np.ones((len(v), WIDTH + 1), DTYPE),
    "extra_axis": lambda v, s: v[..., None],
    "one_d": lambda v, s: v.ravel(),
    "zero_d": lambda v, s: np.array(1.0, DTYPE),
    "scalar": lambda v, s: DTYPE(1.0),
    "python_float": lambda v, s: 1.0,
    "list": lambda v, s: v.tolist(),
    "none": lambda v, s: None,
    "string": lambda v, s: "1, 2, 3, 4",
}

KINDS = sorted(_KINDS)

#: Kinds that fit the spec after ``np.asarray`` (values and shape alike): a server
#: must answer them, exactly as the model answers ``np.asarray(x)``.
MUST_ANSWER = {"plain", "matrix", "masked", "masked_nomask", "subclass", "recarray",
               "fortran", "reversed_rows", "reversed_cols", "strided", "broadcast",
               "readonly", "unaligned", "view_of_bigger", "big_endian"}


def build(description: Description) -> Any:
    kind, rows, seed = description
    if kind == "matrix" and rows == 0:
        rows = 1  # a matrix always has two dimensions; keep it non-empty
    return _KINDS[kind](_values(rows, seed), seed)


def healthy(seed: int, rows: int = 1) -> np.ndarray:
    return _values(rows, 10_000 + seed)


def expected(x: Any) -> np.ndarray:
    """What the model answers for ``np.asarray(x)`` alone."""
    return square_plus_one_fn(np.asarray(x).view(np.ndarray))


def same_answer(got: Any, want: np.ndarray) -> bool:
    """``got`` is a plain float32 ndarray equal to ``want`` (values, shape)."""
    return (type(got) is np.ndarray and got.dtype == DTYPE and got.shape == want.shape
            and np.array_equal(got, want.astype(DTYPE)))


async def ask_all(evaluate, case: List[Description], healthy_seeds: List[int]):
    """Every request of ``case`` and the healthy ones, made in one loop iteration.
    Returns (odd outcomes, healthy outcomes): an answer, or ('refused', error type)."""
    import asyncio

    async def ask(x):
        try:
            return await evaluate(x)
        except Exception as e:  # noqa: BLE001 - the outcome is what is checked
            return ("refused", type(e).__name__, str(e))

    odd = [build(d) for d in case]
    good = [healthy(s) for s in healthy_seeds]
    tasks = []
    for i in range(max(len(odd), len(good))):  # interleaved
        if i < len(good):
            tasks.append(ask(good[i]))
        if i < len(odd):
            tasks.append(ask(odd[i]))
    outcomes = await asyncio.gather(*tasks)
    odd_out, good_out = [], []
    for i in range(max(len(odd), len(good))):
        if i < len(good):
            good_out.append(outcomes.pop(0))
        if i < len(odd):
            odd_out.append(outcomes.pop(0))
    return odd_out, good_out


async def odd_search(start, evaluate):
    """A search for ``run_searches``: ``start`` is (odd descriptions, healthy seeds)."""
    odd, good = await ask_all(evaluate, list(start[0]), list(start[1]))
    return [_portable(o) for o in odd], [_portable(g) for g in good]


def _portable(outcome):
    if isinstance(outcome, tuple):
        return outcome
    return ("answer", type(outcome).__name__, np.asarray(outcome).copy(),
            str(getattr(outcome, "dtype", "")))


def check_outcomes(case: List[Description], healthy_seeds: List[int], odd_out, good_out):
    """Asserts the promise: each odd request answered exactly as the model answers
    ``np.asarray(x)`` alone, or refused with InputSpecError (a kind that fits must be
    answered); every healthy request beside it exact."""
    for seed, got in zip(healthy_seeds, good_out):
        got = _unportable(got)
        assert same_answer(got, expected(healthy(seed))), (
            f"healthy request {seed} beside {case}: got {got!r}")
    for description, got in zip(case, odd_out):
        got = _unportable(got)
        if isinstance(got, tuple):
            assert got[1] == "InputSpecError", f"{description}: {got}"
            assert description[0] not in MUST_ANSWER, f"{description} refused: {got}"
            continue
        x = build(description)
        assert same_answer(got, expected(x)), (
            f"{description}: got {got!r}, want {expected(x)!r}")


def _unportable(outcome):
    if isinstance(outcome, tuple) and outcome[0] == "answer":
        _, type_name, values, dtype = outcome
        assert type_name == "ndarray", f"the answer is a {type_name}"
        return values
    return outcome
