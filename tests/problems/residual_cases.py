"""What the residual-net tests of every framework share: small nets with weights that
exercise every layer, inputs, and the searches they must run."""

from __future__ import annotations

import asyncio
from typing import Any, List

import numpy as np

import async_search as asr
from async_search import search
from async_search.problems import ConnectFour, CostToGoResNet, PolicyValueResNet, SlidingPuzzle

GAME = ConnectFour()
PUZZLE = SlidingPuzzle(4)
#: float32 against the float64 reference, through a few layers of small nets.
TOLERANCE = 1e-4


def with_random_weights(net: Any, seed: int = 1) -> Any:
    """``net`` with every weight random, batch norm included (seeded identity batch norm
    and zero biases would let a framework that skips them pass)."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, value in net.weights.items():
        if name.endswith("running_var"):
            weights[name] = rng.uniform(0.5, 2.0, value.shape)
        elif name.endswith(("bias", "running_mean")) or "bn" in name:
            weights[name] = rng.normal(0.0, 0.2, value.shape) + (
                1.0 if name.endswith(".weight") else 0.0)
        else:
            weights[name] = value + rng.normal(0.0, 0.05, value.shape)
    return net.with_weights({k: np.asarray(v, np.float32) for k, v in weights.items()})


def small_policy_value(seed: int = 1) -> PolicyValueResNet:
    return with_random_weights(PolicyValueResNet(GAME, channels=8, blocks=2,
                                                 value_hidden=16, seed=0), seed)


def small_cost_to_go(seed: int = 1) -> CostToGoResNet:
    return with_random_weights(CostToGoResNet(PUZZLE, first_width=32, width=16, blocks=2,
                                              seed=0), seed)


def positions(count: int, seed: int = 0) -> List[Any]:
    """Connect Four positions after a few random moves, none over."""
    rng = np.random.default_rng(seed)
    found = []
    while len(found) < count:
        state = GAME.initial_state()
        for _ in range(int(rng.integers(0, 12))):
            nxt = GAME.play(state, int(rng.choice(GAME.legal_actions(state))))
            if GAME.terminal_value(nxt) is not None:
                break
            state = nxt
        found.append(state)
    return found


def board_inputs(count: int, seed: int = 0) -> np.ndarray:
    return GAME.encode(positions(count, seed))


def puzzle_inputs(count: int, seed: int = 0) -> np.ndarray:
    return PUZZLE.encode([PUZZLE.scramble(30, seed=seed + i) for i in range(count)])


def assert_outputs_close(got: Any, expected: Any, tolerance: float = TOLERANCE) -> None:
    """Equal structure, shapes and float32 dtype; values within ``tolerance``."""
    if isinstance(expected, tuple):
        assert isinstance(got, tuple) and len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_outputs_close(g, e, tolerance)
        return
    got = np.asarray(got)
    assert got.shape == expected.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)


async def _mcts(evaluate: Any, states: List[Any]) -> List[Any]:
    return await asyncio.gather(*(search.mcts(GAME, s, evaluate, num_simulations=24,
                                              num_parallel=4, seed=i)
                                  for i, s in enumerate(states)))


async def _astar(evaluate: Any, starts: List[Any]) -> List[Any]:
    return await asyncio.gather(*(search.batched_astar(PUZZLE, s, evaluate, budget=120,
                                                       buffer_size=4) for s in starts))


async def searches_run_served_and_immediate(policy_value: Any, cost_to_go: Any) -> dict:
    """MCTS on Connect Four with ``policy_value`` and A* on the 15-puzzle with
    ``cost_to_go`` (models), 8 of each concurrently through ``asr.serve`` and one at a
    time through ``asr.immediate``; checks what each returns and that the served runs
    were batched. Returns the served stats."""
    states = positions(8, seed=3)
    starts = [PUZZLE.scramble(8, seed=i) for i in range(8)]
    stats = {}
    async with asr.serve(policy_value, max_batch_size=64) as evaluate:
        served_mcts = await asyncio.wait_for(_mcts(evaluate, states), 120)
        stats["mcts"] = dict(evaluate.stats)
    async with asr.serve(cost_to_go, max_batch_size=64) as evaluate:
        served_astar = await asyncio.wait_for(_astar(evaluate, starts), 120)
        stats["astar"] = dict(evaluate.stats)
    alone_mcts = await asyncio.wait_for(_mcts(asr.immediate(policy_value), states), 120)
    alone_astar = await asyncio.wait_for(_astar(asr.immediate(cost_to_go), starts), 120)
    for state, served, alone in zip(states, served_mcts, alone_mcts):
        assert sum(served.visit_counts) == sum(alone.visit_counts) == 24
        assert served.action in GAME.legal_actions(state)
        assert -1.0 <= served.root_value <= 1.0
    for served, alone in zip(served_astar, alone_astar):
        assert served.status in search.Status and alone.status in search.Status
        assert served.evaluations > 0 and alone.evaluations > 0
    for kind in ("mcts", "astar"):  # concurrent searches shared batches
        assert stats[kind]["mean_batch_size"] > 4, (kind, stats[kind])
    return stats
