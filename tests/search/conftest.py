"""Fixtures shared by the search tests: puzzles, exact distances, toy problems."""

import asyncio
import builtins
import collections
import math

import numpy as np
import pytest

import async_search as asr
from async_search.base import TensorSpec
from async_search.problems import SlidingPuzzle


@pytest.fixture(scope="session")
def eight_puzzle_distances():
    """The true distance to the goal of every solvable 8-puzzle state (BFS)."""
    puzzle = SlidingPuzzle(3)
    distance = {puzzle.goal: 0}
    queue = collections.deque([puzzle.goal])
    while queue:
        state = queue.popleft()
        d = distance[state] + 1
        for n, _ in puzzle.neighbors(state):
            if n not in distance:
                distance[n] = d
                queue.append(n)
    return distance


class ToyGraph:
    """An explicit weighted graph over named states; ``h`` gives the toy model's values."""

    def __init__(self, edges, goals, h=None):
        self.edges = edges
        self.goals = set(goals)
        names = sorted({s for s in edges} | {t for v in edges.values() for t, _ in v})
        self.index = {s: i for i, s in enumerate(names)}
        self.names = names
        self.h = h or {}
        self.input_spec = TensorSpec((1,), np.float32)

    def check_state(self, state):
        if state not in self.index:
            raise ValueError(f"ToyGraph: unknown state {state!r}")

    def neighbors(self, state):
        return list(self.edges.get(state, []))

    def is_goal(self, state):
        return state in self.goals

    def encode(self, states):
        return np.array([[self.index[s]] for s in states], np.float32)

    def model(self):
        table = np.array([self.h.get(s, 0.0) for s in self.names], np.float32)
        return lambda x: table[x[:, 0].astype(int)][:, None]


@pytest.fixture
def toy_graph():
    return ToyGraph


class Recorder:
    """An evaluate that records every request and answers with ``model``."""

    def __init__(self, model):
        self.model = model
        self.requests = []

    async def __call__(self, x):
        self.requests.append(x.copy())
        return self.model(x)


@pytest.fixture
def recorder():
    return Recorder


@pytest.fixture
def run_both():
    """Run ``search(start, evaluate)`` over ``starts`` one after another with
    ``asr.immediate(model)``, then all concurrently through one ``asr.serve(model)``;
    return both result lists and the server's stats."""

    async def run(search, starts, model, max_batch_size=256):
        sequential = [await search(s, asr.immediate(model)) for s in starts]
        async with asr.serve(model, max_batch_size=max_batch_size) as evaluate:
            concurrent = await asyncio.gather(*[search(s, evaluate) for s in starts])
            stats = dict(evaluate.stats)
        return sequential, list(concurrent), stats

    return run


@pytest.fixture
def compensated_sum(monkeypatch):
    """``sum`` as Python 3.12 and later have it, on any Python: floats added with
    compensation (here exactly, ``math.fsum``), where 3.11 rounded after each addition.
    A search's results must not change with it."""
    plain = builtins.sum

    def compensated(values, start=0):
        values = list(values)
        if values and all(type(v) is float for v in values) and type(start) in (int, float):
            return math.fsum([start, *values])
        return plain(values, start)

    monkeypatch.setattr(builtins, "sum", compensated)
    assert sum([1.0, 1e-16, 1e-16]) == 1.0000000000000002  # (it does compensate)

