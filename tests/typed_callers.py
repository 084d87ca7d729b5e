"""Calls of the public contract (DESIGN.md) as a researcher writes them, checked by mypy
in ``tests/test_typing.py``: a type hint that a correct call trips on is a defect (no
shipped problem met the search protocols, ``TensorSpec((16,), np.float32)`` was refused,
a chooser's coroutine was not one). Run only by mypy, never imported by the tests."""

import asyncio
import os
import pathlib
from typing import Any

import numpy as np

import async_search as asr
from async_search import problems, search
from async_search.batchers import BatchManager, BatchSizeBatcher
from async_search.models import MLP, with_spec

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


async def answers_used_as_arrays(x: np.ndarray) -> None:
    # an answer is Any (its kind is the model's): no narrowing before its first use
    ev = asr.immediate(model)
    y = await ev(x)
    print(y.shape, y[:, 0])
    router = asr.Router({"a": ev})
    print((await router(x)).shape, float((await asr.CachedEvaluate(ev)(x)).sum()))
    logits, value = await asr.immediate(problems.pretrained("connect_four"))(x)
    print(logits.shape, value)


async def deadline_search(start: Any, evaluate: asr.TimedEvaluate) -> Any:
    return await evaluate(np.zeros((1, 16), np.float32), timeout=0.5)


def more_backends() -> None:
    out = asr.run_searches(deadline_search, [0, 1], lambda: model, backend="process",
                           max_batch_size="auto")
    print(list(out))


async def http_fronts(x: np.ndarray) -> None:
    from async_search.http import GrpcFront, GrpcRemoteEvaluate, HttpFront, RemoteEvaluate

    async with asr.serve(model) as evaluate:
        async with HttpFront({"net": evaluate}) as http, GrpcFront(http.repository) as g:
            async with GrpcRemoteEvaluate(g.address, "net") as remote:
                print((await remote(x)).shape)
            async with RemoteEvaluate(http.url, "net") as over_http:
                print((await over_http(x)).shape)


def typed_pieces(tmp: "os.PathLike[str]") -> None:
    from async_search.routing.router import LeastOutstanding, RoundRobin
    from async_search.training import Commander, CommanderConfig
    from async_search.unbatchers import NumpyUnbatcher

    print(problems.ConnectFour(), NumpyUnbatcher(), RoundRobin(), LeastOutstanding())
    Commander(CommanderConfig(iterations=1), save_dir=pathlib.Path(tmp) / "c4")
    with_spec(lambda batch: [batch, batch], (4,), np.float32)  # a list of outputs


class Nim:
    """A researcher's own game, typed as they would type it (a list of actions)."""

    input_spec = asr.TensorSpec((1,), np.float32)
    num_actions = 2

    def initial_state(self) -> int:
        return 5

    def check_state(self, state: int) -> None:
        pass

    def legal_actions(self, state: int) -> list[int]:
        return [a for a in (0, 1) if a < state]

    def play(self, state: int, action: int) -> int:
        return state - action - 1

    def terminal_value(self, state: int) -> float | None:
        return -1.0 if state == 0 else None

    def encode(self, states: Any) -> np.ndarray:
        return np.array([[s] for s in states], np.float32)


async def own_game(evaluate: asr.Evaluate) -> None:
    game = Nim()
    print((await search.mcts(game, game.initial_state(), evaluate, num_simulations=8)).action)
