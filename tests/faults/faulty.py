"""Faults to inject, picklable for every backend: searches and models that fail on cue,
with exceptions and results that cannot travel between processes, and a tally of what
each request got."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import numpy as np

# -- exceptions and results that do not travel ----------------------------------------


class UnpicklableError(Exception):
    """Holds a lock: pickle (and cloudpickle) refuse it."""

    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()


class UnloadableError(Exception):
    """Pickles, but its pickle does not load: ``__init__`` takes two arguments and only
    the message reaches ``Exception.args``."""

    def __init__(self, code, detail):
        super().__init__(f"code {code}: {detail}")
        self.code = code


def _refuse_to_load():
    raise RuntimeError("this object refuses to be loaded")


class UnloadableResult:
    """Pickles, but loading it raises."""

    def __reduce__(self):
        return (_refuse_to_load, ())


class UnpicklableResult:
    """A search result holding a lock."""

    def __init__(self):
        self.lock = threading.Lock()


# -- a model that fails on cue ---------------------------------------------------------
#: Input values (column 0) that make FaultyModel raise.
POISON_VALUE, UNPICKLABLE_VALUE, UNLOADABLE_VALUE = -1.0, -2.0, -3.0


class FaultyModel:
    """``model(x) == 2 * x[:, :1]``, raising for a batch that holds a cue value: a
    ValueError for POISON_VALUE, an UnpicklableError or an UnloadableError for the
    others."""

    def __call__(self, x):
        column = x[:, 0]
        if (column == UNPICKLABLE_VALUE).any():
            raise UnpicklableError("the model raised an exception holding a lock")
        if (column == UNLOADABLE_VALUE).any():
            raise UnloadableError(7, "the model raised an exception that cannot load")
        if (column == POISON_VALUE).any():
            raise ValueError("the model cannot take a negative input")
        return 2.0 * x[:, :1]


def faulty_model():
    return FaultyModel()


def expected(value: float) -> float:
    """What a good search with start ``("ok", value)`` returns."""
    return 2.0 * value


# -- a search that fails on cue --------------------------------------------------------
#: Fault kinds a start may name: ``(kind, value)``.
KINDS = ("ok", "raise_unpicklable", "raise_unloadable", "raise_plain",
         "return_unpicklable", "return_unloadable", "model_unpicklable",
         "model_unloadable", "model_poison", "kill")


async def faulty_search(start, evaluate):
    """``start = (kind, value)``: asks the model for ``value`` and returns its output,
    or fails as ``kind`` says (after its request: the failure comes mid-search)."""
    kind, value = start
    if kind.startswith("model_"):
        # Alone in its batch: the good searches' requests have been answered by now.
        await asyncio.sleep(0.3)
        cue = {"model_unpicklable": UNPICKLABLE_VALUE,
               "model_unloadable": UNLOADABLE_VALUE, "model_poison": POISON_VALUE}[kind]
        y = await evaluate(np.full((1, 3), cue, np.float32))
        return float(y[0, 0])
    y = await evaluate(np.full((1, 3), value, np.float32))
    if kind == "ok":
        return float(y[0, 0])
    if kind == "raise_unpicklable":
        raise UnpicklableError(f"search {value} raised an exception holding a lock")
    if kind == "raise_unloadable":
        raise UnloadableError(value, "search raised an exception that cannot load")
    if kind == "raise_plain":
        raise ArithmeticError(f"search {value} is cursed")
    if kind == "return_unpicklable":
        return UnpicklableResult()
    if kind == "return_unloadable":
        return UnloadableResult()
    if kind == "kill":  # SIGKILL of its own (client) process, mid-run
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError(kind)


# -- the tally -------------------------------------------------------------------------
@dataclasses.dataclass
class Tally:
    """What the requests of a test got. ``hung`` and ``wrong`` must stay 0."""

    sent: int = 0
    answered_exactly: int = 0
    failed_clearly: int = 0
    hung: int = 0
    wrong: int = 0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def check(self, *, answered: int, failed: int) -> None:
        assert (self.hung, self.wrong) == (0, 0), self
        assert (self.answered_exactly, self.failed_clearly) == (answered, failed), self
        assert self.sent == answered + failed, self


def names_start(error: BaseException, index: int) -> bool:
    """Whether a failure says which start raised it (a note from the backend)."""
    return any(f"start {index}" in note for note in getattr(error, "__notes__", ()))


def clear_remote_failure(error: BaseException, index: int, *words: str) -> bool:
    """A failure that names its start, carries the remote traceback as text, and says
    what went wrong (``words``, in its type name, message or traceback)."""
    text = getattr(error, "remote_traceback", "")
    described = f"{type(error).__name__} {error} {getattr(error, 'type_name', '')} {text}"
    return (isinstance(error, BaseException) and names_start(error, index)
            and "Traceback (most recent call last)" in text
            and all(w in described for w in words))


def tally_run(starts, outcome, checks) -> Tally:
    """Counts a run with ``return_exceptions=True``: ``outcome`` is its results (None:
    the run did not return in time); ``checks[i](result) -> bool`` for a start that
    must fail, else the exact result is ``expected(value)``."""
    tally = Tally(sent=len(starts))
    if outcome is None:
        tally.hung = len(starts)
        return tally
    for i, ((kind, value), got) in enumerate(zip(starts, outcome)):
        if i in checks:
            if isinstance(got, BaseException) and checks[i](got):
                tally.failed_clearly += 1
            else:
                tally.wrong += 1
        elif not isinstance(got, BaseException) and got == expected(value):
            tally.answered_exactly += 1
        else:
            tally.wrong += 1
    return tally
