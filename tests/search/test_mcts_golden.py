"""Golden results of ``search.mcts``, recorded from the implementation before issue 12.

Issue 12 rewrote the tree for speed; these pin every field of ``MCTSResult`` (floats
exactly) and the leaves sent in every request (a digest), for seeds, 1, 3 and 8 leaves in
flight, with and without root noise, from the opening, mid-game and near-terminal
positions, with a non-uniform deterministic model (logits and value from an integer hash
of the input, so the search is not trivial) and with the free model of the benchmark
(zeros: every choice is a tie, so they pin the tie-breaking). Each case also runs through
``PlainGame``, which hides Connect Four's fast internal helpers, so that the generic path
of the tree gives the same results.

The goldens are in ``data/mcts_golden.json``, recorded from the pre-issue-12 tree (commit
3c80ed5). To print the table again (only with a reason written down): run this file as a
script.
"""

import asyncio
import hashlib
import json
import pathlib

import numpy as np
import pytest

from async_search import problems, search

GAME = problems.ConnectFour()
GOLDEN = json.loads((pathlib.Path(__file__).parent / "data" / "mcts_golden.json").read_text())

# name -> moves from the empty board (near-terminal ones found by seeded random playouts)
POSITIONS = {
    "opening": "",
    "mid12": "335601561262",
    "mid20": "51022530245561603114",
    "late30": "552205005102066654241066514631",
    "near36": "334406345041341245033105506111055626",
    "near39": "104226536364234561024662051014321345503",
    "near40": "1453330640566312165301153140426456402022",
    "win_at_3": "016162",
    "block_at_3": "01616",
    "draw_next": "31001621625211325530651563266254330440440",  # one move to a full board
}


def hash_model(x):
    """Logits and a value from an integer hash of each encoded row: deterministic,
    exact on every platform (integer arithmetic, then one rounding to float32)."""
    flat = np.asarray(x).reshape(len(x), -1).astype(np.int64)
    weights = (np.arange(flat.shape[1], dtype=np.int64) * 2654435761 + 12345) % 1000003
    key = (flat * weights).sum(axis=1)
    a = np.arange(GAME.num_actions + 1, dtype=np.int64)
    h = (key[:, None] * (2 * a + 1) * 40503 + 977 * a) % 2003
    logits = (h[:, :-1] / 500.0 - 2.0).astype(np.float32)
    value = ((h[:, -1:] - 1001) / 1001.0).astype(np.float32)
    return logits, value


def zero_model(x):
    return (np.zeros((len(x), GAME.num_actions), np.float32),
            np.zeros((len(x), 1), np.float32))


MODELS = {"hash": hash_model, "zero": zero_model}


class PlainGame:
    """Connect Four through the ``Game`` protocol only (no internal fast helpers)."""

    def __init__(self, game):
        self._game = game
        self.input_spec = game.input_spec
        self.num_actions = game.num_actions

    def initial_state(self):
        return self._game.initial_state()

    def check_state(self, state):
        self._game.check_state(state)

    def legal_actions(self, state):
        return self._game.legal_actions(state)

    def play(self, state, action):
        return self._game.play(state, action)

    def terminal_value(self, state):
        return self._game.terminal_value(state)

    def encode(self, states):
        return self._game.encode(states)


def cases():
    """(case id, position, model, keyword arguments of mcts)."""
    out = []
    for position in POSITIONS:
        for model, seeds in (("hash", (0, 3)), ("zero", (0,))):
            for seed in seeds:
                for num_parallel in (1, 8):
                    for fraction in (0.25, 0.0):
                        kwargs = dict(num_simulations=160, num_parallel=num_parallel,
                                      seed=seed, dirichlet_fraction=fraction)
                        out.append((f"{position}-{model}-s{seed}-p{num_parallel}-"
                                    f"f{fraction}", position, model, kwargs))
    extra = [
        ("opening", "hash", dict(num_simulations=512, num_parallel=8, seed=1)),
        ("opening", "zero", dict(num_simulations=512, num_parallel=8, seed=1)),
        ("opening", "hash", dict(num_simulations=1, num_parallel=8, seed=0)),
        ("opening", "hash", dict(num_simulations=7, num_parallel=3, seed=0)),
        ("mid12", "hash", dict(num_simulations=200, num_parallel=3, seed=5,
                               c_puct=3.0)),
        ("mid20", "hash", dict(num_simulations=200, num_parallel=32, seed=2,
                               dirichlet_alpha=1.0, dirichlet_fraction=0.5)),
        ("late30", "zero", dict(num_simulations=300, num_parallel=5, seed=4,
                                c_puct=0.5)),
        ("near36", "hash", dict(num_simulations=400, num_parallel=8, seed=9)),
    ]
    for position, model, kwargs in extra:
        name = "-".join([position, model] + [f"{k}={v}" for k, v in kwargs.items()])
        out.append((name, position, model, kwargs))
    return out


CASES = cases()


def digest(requests):
    h = hashlib.sha256()
    for x in requests:
        h.update(np.ascontiguousarray(x, np.float32).tobytes())
        h.update(b"|")
    return h.hexdigest()[:16]


async def record(game, position, model, kwargs):
    requests = []
    fn = MODELS[model]

    async def evaluate(x):
        requests.append(np.array(x))
        return fn(x)

    state = GAME.from_moves(int(c) for c in POSITIONS[position])
    r = await search.mcts(game, state, evaluate, **kwargs)
    return (r.action, r.visit_counts, r.action_values, r.root_prior, r.root_value,
            r.network_value, r.num_simulations, r.tree_size, r.evaluations, r.requests,
            digest(requests))


@pytest.mark.parametrize("plain", [False, True], ids=["connect_four", "plain_game"])
@pytest.mark.parametrize("name, position, model, kwargs", CASES, ids=[c[0] for c in CASES])
async def test_mcts_reproduces_the_golden_result(name, position, model, kwargs, plain):
    game = PlainGame(GAME) if plain else GAME
    # Through JSON, as the goldens are kept: tuples become lists, floats stay exact.
    assert json.loads(json.dumps(await record(game, position, model, kwargs))) == GOLDEN[name]


# Python 3.12's sum compensates: on it a third of these cases differed in their
# last bits from the goldens. A few of each model, on any Python.
@pytest.mark.parametrize("name, position, model, kwargs", CASES[::7],
                         ids=[c[0] for c in CASES[::7]])
async def test_the_golden_result_holds_where_pythons_sum_compensates(
        name, position, model, kwargs, compensated_sum):
    assert json.loads(json.dumps(await record(GAME, position, model, kwargs))) == \
        GOLDEN[name]


def test_every_case_has_a_golden_result():
    assert sorted(GOLDEN) == sorted(c[0] for c in CASES)


def _print_table():
    async def all_cases():
        return {name: await record(GAME, position, model, kwargs)
                for name, position, model, kwargs in CASES}

    table = asyncio.run(all_cases())
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    _print_table()
