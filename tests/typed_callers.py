"""Calls of the public contract (DESIGN.md) as a researcher writes them, checked by mypy
in ``tests/test_typing.py``: a type hint that a correct call trips on is a defect (no
shipped problem met the search protocols, ``TensorSpec((16,), np.float32)`` was refused,
a chooser's coroutine was not one). Run only by mypy, never imported by the tests."""

import asyncio
from typing import Any

import numpy as np

import async_search as asr
from async_search import problems, search
from async_search.batchers import BatchManager, BatchSizeBatcher
from async_search.models import MLP

spec = asr.TensorSpec((16,), np.float32)
spec_of_a_list = asr.TensorSpec([9, 9], "float32")
model = MLP((16,), hidden_sizes=(8,), output_size=1)


async def serving(x: np.ndarray) -> None:
    async with asr.serve(model, max_batch_size=256) as evaluate:
        y = await evaluate(x)
        print(y, evaluate.stats)
    ev = asr.immediate(model)
    print(await ev(x))


async def searches() -> None:
    puzzle = problems.SlidingPuzzle(3)
    evaluate = asr.immediate(problems.ManhattanHeuristic(puzzle))
    start = puzzle.scramble(40, seed=0)
    r = await search.batched_astar(puzzle, start, evaluate, budget=2000, buffer_size=16)
    r = await search.continuous_astar(puzzle, start, evaluate, budget=2000)
    rollouts = await search.multi_rollout(puzzle, start, evaluate, depth=16,
                                          num_rollouts=4, seed=0)
    game = problems.ConnectFour()
    net = asr.immediate(problems.pretrained("connect_four"))
    m = await search.mcts(game, game.initial_state(), net, num_simulations=256,
                          num_parallel=8, seed=0)
    g = await search.gumbel_mcts(game, game.initial_state(), net, num_simulations=16,
                                 seed=0)
    positions = problems.connect_four_positions("middle")
    oracle = {p.state: p.optimal_moves[0] for p in positions}
    accuracy = await search.move_accuracy(oracle.__getitem__, positions)
    print(r.cost, rollouts, m.action, g.action, accuracy.accuracy)


def choosers() -> int:
    game = problems.ConnectFour()
    net = asr.immediate(problems.pretrained("connect_four"))
    choose = search.mcts_chooser(game, net, num_simulations=8)
    return asyncio.run(choose(game.initial_state()))


async def astar(start: Any, evaluate: asr.Evaluate) -> Any:
    puzzle = problems.SlidingPuzzle(3)
    return await search.batched_astar(puzzle, start, evaluate, budget=2000, buffer_size=16)


def backends() -> None:
    puzzle = problems.SlidingPuzzle(3)
    starts = [puzzle.scramble(20, seed=s) for s in range(4)]
    out = asr.run_searches(astar, starts, lambda: problems.ManhattanHeuristic(puzzle),
                           backend="process", num_procs=2)
    print(list(out))


def seed_level() -> None:
    m = BatchManager(BatchSizeBatcher(8))
    m.add_inputs([1.0, 2.0, 3.0])
    m.add_inputs(np.zeros((2, 3)))
