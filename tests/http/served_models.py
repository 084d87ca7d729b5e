"""The models the front and client tests serve: an MLP, one that waits on a gate, one
that raises, one that fails some rows."""

import asyncio
import threading

import numpy as np

from async_search.errors import InputSpecError
from async_search.models import MLP, with_spec

MODEL = MLP((16,), hidden_sizes=(32,), output_size=4, seed=0)
X = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)


class Gated:
    """Blocks its device thread on each batch until the test opens the gate."""

    input_spec = MODEL.input_spec

    def __init__(self):
        self.gate = threading.Event()
        self.started = threading.Event()

    def __call__(self, x):
        self.started.set()
        assert self.gate.wait(30)
        return MODEL(x)


class UpdatedWhileWaiting:
    """An evaluate function serving version 0 until a request comes: the model is
    updated to version 1 while that request waits, and version 1 answers it."""

    input_spec = MODEL.input_spec

    def __init__(self):
        self.version = 0

    async def with_version(self, x):
        self.version = 1
        return MODEL(x), 1

    async def __call__(self, x):
        return (await self.with_version(x))[0]


class Raising:
    input_spec = MODEL.input_spec

    def __call__(self, x):
        raise RuntimeError("the model broke")


class PoisonedBy:
    """MODEL, but it fails any batch that holds a row whose first value is ``poison``,
    and its check_values refuses rows whose first value is ``refused``."""

    input_spec = MODEL.input_spec

    def __init__(self, poison=99.0, refused=-99.0):
        self.poison, self.refused = poison, refused

    def __call__(self, x):
        if (x[:, 0] == self.poison).any():
            raise RuntimeError("a poisoned row")
        return MODEL(x)

    def check_values(self, x):
        if (x[:, 0] == self.refused).any():
            raise InputSpecError("a refused row")


def poisoned_requests(bad_value: float) -> list:
    """Eight one-row requests for PoisonedBy, the third and sixth holding ``bad_value``."""
    xs = [X[i % 5:i % 5 + 1] + i for i in range(8)]
    for i in POISONED:
        xs[i][0, 0] = bad_value
    return xs


POISONED = (2, 5)


def check_only_the_poisoned_failed(got: list, xs: list, error: type, said: str) -> None:
    for i, y in enumerate(got):
        if i in POISONED:
            assert isinstance(y, error) and said in str(y), y
        else:
            np.testing.assert_array_equal(y, MODEL(xs[i]))


class SearchWorkload:
    """A* with the shipped 15-puzzle heuristic and MCTS with the shipped Connect Four
    net (two outputs): what a remote client must answer exactly as ``immediate`` does.
    ``models`` are the sources a front serves them from, as "h" and "net"."""

    def __init__(self):
        from async_search import problems
        from async_search.http.repository import ModelSource

        self.puzzle = problems.SlidingPuzzle(4)
        self.heuristic = problems.pretrained("15-puzzle")
        self.starts = [self.puzzle.scramble(30, seed=s) for s in range(12)]
        self.game = problems.ConnectFour()
        self.net = problems.pretrained("connect_four")
        self.models = {"h": ModelSource(lambda: self.heuristic),
                       "net": ModelSource(lambda: self.net)}

    def astar(self, start, evaluate):
        from async_search import search
        return search.batched_astar(self.puzzle, start, evaluate, budget=300,
                                    buffer_size=4)

    def mcts(self, evaluate, seed):
        from async_search import search
        return search.mcts(self.game, self.game.initial_state(), evaluate,
                           num_simulations=48, num_parallel=8, seed=seed)

    async def expected(self):
        """The results with ``immediate``: A* per start, then MCTS per seed."""
        import async_search as asr
        astar = [await self.astar(s, asr.immediate(self.heuristic)) for s in self.starts]
        mcts = [await self.mcts(asr.immediate(self.net), seed) for seed in range(4)]
        return astar, mcts

    async def run(self, heuristic_evaluate, net_evaluate):
        """The same searches, all at once, through the two remote evaluate functions."""
        from tests.helpers import within
        astar = await within(asyncio.gather(*(self.astar(s, heuristic_evaluate)
                                              for s in self.starts)), "A*", timeout=60)
        mcts = await within(asyncio.gather(*(self.mcts(net_evaluate, seed)
                                             for seed in range(4))), "MCTS", timeout=60)
        return astar, mcts


#: A model whose answer is 20 KiB a row (its input's 64 bytes repeated 320 times).
WIDE = with_spec(lambda x: np.repeat(x, 320, axis=1), (16,), np.float32)


async def check_answers_too_long_together_are_halved(evaluate, split_stat: str,
                                                     alone: np.ndarray) -> None:
    """64 one-row requests to ``WIDE``, each answer under the client's
    max_response_bytes and all together far over it, are all answered, after more
    halves than the budget for finding bad requests (4 log2(64) + 2); a request whose
    own answer (``alone``) is too long fails with ModelOutputError."""
    import pytest

    from async_search.errors import ModelOutputError
    from tests.helpers import within

    xs = np.random.default_rng(1).standard_normal((64, 1, 16)).astype(np.float32)
    ys = await within(asyncio.gather(*(evaluate(x) for x in xs)), "answers")
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(y, np.repeat(x, 320, axis=1))
    assert evaluate.stats[split_stat] > 4 * 6 + 2
    with pytest.raises(ModelOutputError, match="max_response_bytes"):
        await within(evaluate(alone), "an answer too long alone")
