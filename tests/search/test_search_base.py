"""search/base.py: reading a heuristic model's outputs (values_of), and every search's
check of evaluate."""

import numpy as np
import pytest

import async_search as asr
from async_search.errors import ModelOutputError
from async_search.search.base import values_of


@pytest.mark.parametrize("y", [
    np.array([[1 + 2j], [3 + 0j]]),  # the imaginary part would be dropped silently
    np.array([["a"], ["b"]]),
    np.array([[object()], [1.0]], dtype=object),
    np.array([["3"], [1.0]], dtype=object),  # text is not a number, held as an object too
    # dates and time spans are not values; NaT, their NaN, would be a finite -9.2e18
    np.full((2, 1), np.timedelta64("NaT", "s"), dtype="m8[s]"),
    np.array([[1], [2]], dtype="M8[s]"),
    np.array([[np.timedelta64(1, "s")], [1.0]], dtype=object),
])
def test_values_of_refuses_outputs_that_are_not_real_numbers(y):
    with pytest.raises(ModelOutputError, match="must be real numbers"):
        values_of(y, 2, "the heuristic model's output")


def test_values_of_reads_numbers_held_as_objects_as_floats():
    assert values_of(np.array([[1.5], [2]], dtype=object), 2, "h") == [1.5, 2.0]
    # NumPy's scalars too, its bool among them (no numbers.Real, unlike Python's)
    held = np.array([np.float32(0.5), np.int64(3), np.bool_(True), False], dtype=object)
    assert values_of(held, 4, "h") == [0.5, 3.0, 1.0, 0.0]


@pytest.mark.parametrize("y", [np.array([[1.0], [np.inf]], np.float32),
                               np.array([np.nan, 1.0], np.float16)])
def test_values_of_refuses_values_that_are_not_finite(y):
    with pytest.raises(ModelOutputError, match="must be finite"):
        values_of(y, 2, "h")


@pytest.mark.parametrize("y", [np.array([[1e400], [1]], dtype=np.longdouble),
                               np.array([[10**400], [1]], dtype=object)])
def test_values_of_refuses_values_past_the_floats_of_any_type(y):
    with pytest.raises(ModelOutputError, match="must be finite"):
        values_of(y, 2, "h")


def test_values_of_gives_python_floats_for_a_longdouble():
    # NumPy scalars in a result would not serialize (json.dumps refuses a longdouble)
    values = values_of(np.array([[1.5], [2]], dtype=np.longdouble), 2, "h")
    assert values == [1.5, 2.0] and all(type(v) is float for v in values)


def test_values_of_takes_finite_values_whose_sum_overflows():
    assert values_of(np.array([1e308, 1e308]), 2, "h") == [1e308, 1e308]


@pytest.mark.parametrize("name", ["batched_astar", "continuous_astar", "simple_rollout",
                                  "multi_rollout", "mcts", "gumbel_mcts"])
@pytest.mark.parametrize("evaluate", [5, None, np.zeros((1, 1), np.float32)])
async def test_every_search_refuses_an_evaluate_that_cannot_be_called(name, evaluate):
    # A model's output or a number passed for evaluate, named, before any work; not
    # "'int' object is not callable" from inside the search.
    from async_search import problems, search
    puzzle, game = problems.SlidingPuzzle(3), problems.ConnectFour()
    args = {"batched_astar": (puzzle, {"budget": 10, "buffer_size": 2}),
            "continuous_astar": (puzzle, {"budget": 10}),
            "simple_rollout": (puzzle, {"depth": 2, "seed": 0}),
            "multi_rollout": (puzzle, {"depth": 2, "num_rollouts": 2, "seed": 0}),
            "mcts": (game, {"num_simulations": 2, "num_parallel": 1}),
            "gumbel_mcts": (game, {"num_simulations": 2})}
    problem, options = args[name]
    start = puzzle.scramble(3, seed=0) if problem is puzzle else game.initial_state()
    with pytest.raises(ValueError, match="evaluate must be an awaitable callable"):
        await getattr(search, name)(problem, start, evaluate, **options)


SEARCH_ARGS = {"batched_astar": {"budget": 10, "buffer_size": 2},
               "continuous_astar": {"budget": 10},
               "simple_rollout": {"depth": 2, "seed": 0},
               "multi_rollout": {"depth": 2, "num_rollouts": 2, "seed": 0},
               "mcts": {"num_simulations": 2, "num_parallel": 1},
               "gumbel_mcts": {"num_simulations": 2}}


@pytest.mark.parametrize("name", sorted(SEARCH_ARGS))
@pytest.mark.parametrize("wrong", ["the other kind", "a class"])
async def test_every_search_refuses_a_problem_of_the_wrong_kind_naming_what_it_lacks(
        name, wrong):
    # A game given to A*, or a class for an instance: an AttributeError deep in the
    # search ("'ConnectFour' object has no attribute 'is_goal'"), or a misleading
    # "check_state() missing 1 required positional argument".
    from async_search import problems, search
    puzzle, game = problems.SlidingPuzzle(3), problems.ConnectFour()
    needs_game = name in ("mcts", "gumbel_mcts")
    right, other = (game, puzzle) if needs_game else (puzzle, game)
    start = game.initial_state() if needs_game else puzzle.scramble(3, seed=0)
    problem = other if wrong == "the other kind" else type(right)
    evaluate = asr.immediate(lambda x: np.zeros((len(x), 1), np.float32))
    kind, method = ("game", "legal_actions") if needs_game else ("problem", "is_goal")
    message = (f"{kind} must be a .* without .*{method}" if wrong == "the other kind"
               else f"{kind} must be a .* instance .*, got the class {type(right).__name__}")
    with pytest.raises(TypeError, match=message):
        await getattr(search, name)(problem, start, evaluate, **SEARCH_ARGS[name])


async def test_a_class_given_for_evaluate_is_refused_before_any_work():
    from async_search import problems, search
    puzzle = problems.SlidingPuzzle(3)
    with pytest.raises(ValueError, match="evaluate must be .*got the class "
                                         "ManhattanHeuristic"):
        await search.batched_astar(puzzle, puzzle.scramble(3, seed=0),
                                   problems.ManhattanHeuristic, budget=10, buffer_size=2)


SEARCHES = ["batched_astar", "continuous_astar", "simple_rollout", "multi_rollout", "mcts",
            "gumbel_mcts", "policy_chooser"]


def _run_search(name, evaluate, requests=1):
    """A coroutine: the search ``name`` from a start that needs at least two requests
    (``policy_chooser``: ``requests`` moves chosen, one request each)."""
    from async_search import problems, search
    puzzle, game = problems.SlidingPuzzle(3), problems.ConnectFour()
    if name == "policy_chooser":
        choose = search.policy_chooser(game, evaluate)

        async def moves():
            return [await choose(game.initial_state()) for _ in range(requests)]
        return moves()
    args = {"batched_astar": (puzzle, {"budget": 50, "buffer_size": 2}),
            "continuous_astar": (puzzle, {"budget": 50}),
            "simple_rollout": (puzzle, {"depth": 3, "seed": 0}),
            "multi_rollout": (puzzle, {"depth": 3, "num_rollouts": 2, "seed": 0}),
            "mcts": (game, {"num_simulations": 3, "num_parallel": 1}),
            "gumbel_mcts": (game, {"num_simulations": 3, "num_parallel": 1})}
    problem, options = args[name]
    start = puzzle.scramble(12, seed=0) if problem is puzzle else game.initial_state()
    return getattr(search, name)(problem, start, evaluate, **options)


def _free_model(name):
    """A model with constant outputs of the right form for the search ``name``, and the
    number of times it was called."""
    calls = []

    def model(x):
        calls.append(len(x))
        if name in ("mcts", "gumbel_mcts", "policy_chooser"):
            return np.zeros((len(x), 7), np.float32), np.zeros((len(x), 1), np.float32)
        return np.zeros(len(x), np.float32)
    return model, calls


@pytest.mark.parametrize("name", SEARCHES)
@pytest.mark.parametrize("bad_request", [1, 2])
async def test_every_search_names_a_model_passed_for_evaluate_at_the_request(name,
                                                                              bad_request):
    # A model passed where asr.immediate(model) belongs runs, and what it returns cannot
    # be awaited: named (not Python's bare "can't be used in 'await' expression"), at
    # the request that returned it, before its outputs are used. bad_request=2 passes
    # the first request through asr.immediate: every request of a search is checked.
    import async_search as asr
    model, calls = _free_model(name)
    immediate = asr.immediate(model)

    def evaluate(x):
        return immediate(x) if len(calls) + 1 < bad_request else model(x)

    with pytest.raises(TypeError, match=r"evaluate must return an awaitable, but "
                                        r"evaluate\(x\) returned a (numpy\.ndarray|tuple)"
                       ) as caught:
        await _run_search(name, evaluate, requests=2)
    assert "asr.immediate(model)" in str(caught.value)
    assert "asr.serve(model)" in str(caught.value)
    assert len(calls) == bad_request


@pytest.mark.parametrize("name", SEARCHES)
async def test_a_type_error_from_inside_an_awaitable_evaluate_reaches_the_caller_unchanged(
        name):
    # The await's TypeError is renamed only when what evaluate returned is not
    # awaitable: a bug inside a real evaluate keeps its own message.
    async def evaluate(x):
        raise TypeError("a bug inside evaluate")

    with pytest.raises(TypeError, match="^a bug inside evaluate$"):
        await _run_search(name, evaluate)


@pytest.mark.parametrize("name", SEARCHES)
@pytest.mark.parametrize("kind", ["immediate", "serve", "cached", "async_def", "future",
                                  "coroutine"])
async def test_every_search_takes_every_kind_of_awaitable_evaluate(name, kind):
    # Whatever evaluate returns that can be awaited is awaited, with the same result.
    import asyncio

    import async_search as asr
    from async_search.routing.cache import CachedEvaluate
    model, _ = _free_model(name)
    expected = await _run_search(name, asr.immediate(model), requests=2)

    async def async_def(x):
        return model(x)

    def future(x):
        done = asyncio.get_running_loop().create_future()
        done.set_result(model(x))
        return done

    def coroutine(x):
        return async_def(x)

    evaluates = {"immediate": lambda: asr.immediate(model),
                 "cached": lambda: CachedEvaluate(asr.immediate(model), fixed_model=True),
                 "async_def": lambda: async_def, "future": lambda: future,
                 "coroutine": lambda: coroutine}
    if kind == "serve":
        async with asr.serve(model) as evaluate:
            result = await _run_search(name, evaluate, requests=2)
    else:
        result = await _run_search(name, evaluates[kind](), requests=2)
    assert result == expected


def test_outputs_numpy_cannot_read_fail_as_the_models_not_numpys():
    # A torch tensor that requires grad (the researcher forgot .detach().numpy()) made
    # a raw torch RuntimeError in the search.
    from async_search.errors import ModelOutputError
    from async_search.search.base import policy_logits_of

    class Unreadable:
        def __array__(self, dtype=None, copy=None):
            raise RuntimeError("Can't call numpy() on Tensor that requires grad")

    with pytest.raises(ModelOutputError, match="the heuristic must be a NumPy array, "
                                               "got a Unreadable .*requires grad"):
        values_of(Unreadable(), 2, "the heuristic")
    with pytest.raises(ModelOutputError, match="the policy logits must be a NumPy array"):
        policy_logits_of((Unreadable(), np.zeros((2, 1))), 2, 7)


# -- the user's own problems and games, outside their protocols ------------------------
class _Line:
    """States 0..20 of a line (steps of 1), goal 10; ``encode`` as given."""

    input_spec = asr.TensorSpec((1,), np.float32)

    def __init__(self, encode=None, state=int):
        self._encode, self._state = encode, state

    def check_state(self, s):
        pass

    def neighbors(self, s):
        v = int(np.asarray(s).ravel()[0])
        return [(self._state(t), 1.0) for t in (v - 1, v + 1) if 0 <= t <= 20]

    def is_goal(self, s):
        return int(np.asarray(s).ravel()[0]) == 10

    def encode(self, states):
        x = np.array([[float(np.asarray(s).ravel()[0])] for s in states], np.float32)
        return x if self._encode is None else self._encode(x)


class _Pick:
    """A one-move game: pick an action of ``num_actions`` (3 by default), then it is
    over; ``encode`` as given, ``legal_actions`` as NumPy ints."""

    input_spec = asr.TensorSpec((1,), np.float32)

    def __init__(self, num_actions=3, encode=None):
        if num_actions is not None:
            self.num_actions = num_actions
        self._encode = encode

    def initial_state(self):
        return ()

    def check_state(self, s):
        pass

    def legal_actions(self, s):
        return np.arange(3) if not s else np.arange(0)

    def play(self, s, a):
        return (*s, int(a))

    def terminal_value(self, s):
        return -1.0 if s else None

    def encode(self, states):
        x = np.zeros((len(states), 1), np.float32)
        return x if self._encode is None else self._encode(x)


def _line_model(x):
    return np.abs(10 - x[:, :1])


def _pick_model(x):
    return np.zeros((len(x), 3), np.float32), np.zeros((len(x), 1), np.float32)


@pytest.mark.parametrize("name", ["batched_astar", "continuous_astar", "simple_rollout",
                                  "multi_rollout"])
async def test_an_encode_with_a_wrong_row_count_is_the_problems_error(name):
    # The model was blamed ("the heuristic model's output must have one value per
    # element"), for rows the problem's encode dropped.
    from async_search import search

    problem = _Line(encode=lambda x: x[:-1] if len(x) > 1 else np.concatenate([x, x]))
    evaluate = asr.immediate(_line_model)
    call = {"batched_astar": lambda: search.batched_astar(problem, 0, evaluate,
                                                          budget=50, buffer_size=2),
            "continuous_astar": lambda: search.continuous_astar(problem, 0, evaluate,
                                                                budget=50),
            "simple_rollout": lambda: search.simple_rollout(problem, 0, evaluate,
                                                            depth=5, seed=0),
            "multi_rollout": lambda: search.multi_rollout(problem, 0, evaluate, depth=5,
                                                          num_rollouts=2, seed=0)}[name]
    with pytest.raises(ValueError, match=r"_Line.encode gave \d+ rows for \d+ states"):
        await call()


@pytest.mark.parametrize("name", ["mcts", "gumbel_mcts"])
async def test_a_game_encode_with_a_wrong_row_count_is_the_games_error(name):
    from async_search import search

    game = _Pick(encode=lambda x: np.concatenate([x, x]))
    with pytest.raises(ValueError, match="_Pick.encode gave 2 rows for 1 states"):
        await getattr(search, name)(game, (), asr.immediate(_pick_model),
                                    num_simulations=4, seed=0)


@pytest.mark.parametrize("name", ["batched_astar", "multi_rollout"])
async def test_an_unhashable_start_names_the_rule_before_any_request(name):
    from async_search import search

    problem = _Line(state=lambda t: np.array([t]))
    evaluate = asr.immediate(_line_model)
    call = (search.batched_astar(problem, np.array([0]), evaluate, budget=50,
                                 buffer_size=2) if name == "batched_astar" else
            search.multi_rollout(problem, np.array([0]), evaluate, depth=5,
                                 num_rollouts=2, seed=0))
    with pytest.raises(TypeError, match="states must be hashable.*got a ndarray"):
        await call


@pytest.mark.parametrize("name", ["batched_astar", "multi_rollout"])
async def test_unhashable_neighbours_name_the_rule_and_where_they_came_from(name):
    # a hashable start (an int) whose neighbours are lists: Python said only
    # "unhashable type: 'list'", from inside the search
    from async_search import search

    problem = _Line(state=lambda t: [t])
    evaluate = asr.immediate(_line_model)
    call = (search.batched_astar(problem, 0, evaluate, budget=50, buffer_size=2)
            if name == "batched_astar" else
            search.multi_rollout(problem, 0, evaluate, depth=5, num_rollouts=2, seed=0))
    with pytest.raises(TypeError, match="_Line: states must be hashable.*got a list "
                                        "from neighbors"):
        await call


async def test_num_actions_of_any_integer_kind_is_taken():
    # int() read them before the check came: a 0-d array is an int of NumPy's.
    from async_search import search

    for count in (np.int64(3), np.array(3)):
        r = await search.mcts(_Pick(num_actions=count), (), asr.immediate(_pick_model),
                              num_simulations=4, seed=0)
        assert r.action in (0, 1, 2)


async def test_an_encode_of_an_array_subclass_is_checked_and_compact_keys_are_named():
    from async_search import problems, search

    class Masked(_Line):
        def encode(self, states):
            return np.ma.masked_array(super().encode(states)[:-1])

    with pytest.raises(ValueError, match="Masked.encode gave"):
        await search.batched_astar(Masked(), 0, asr.immediate(_line_model), budget=50,
                                   buffer_size=2)

    class DroppingKeys:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def encode(self, keys):
            return self.inner.encode(keys)[:-1]

    class Puzzle(problems.SlidingPuzzle):
        def compact_keys(self):
            return DroppingKeys(super().compact_keys())

    puzzle = Puzzle(3)
    with pytest.raises(ValueError, match="DroppingKeys.encode gave .*CompactKeys"):
        await search.batched_astar(puzzle, puzzle.scramble(12, seed=1),
                                   asr.immediate(problems.ManhattanHeuristic(puzzle)),
                                   budget=2000, buffer_size=8)


@pytest.mark.parametrize("num_actions", [None, "3", 0, True, 2.0])
async def test_a_game_without_an_integer_num_actions_names_the_protocol(num_actions):
    # A missing one gave AttributeError and a string '<' not supported, deep in the tree.
    from async_search import search

    game = _Pick(num_actions=num_actions)
    for name in ("mcts", "gumbel_mcts"):
        with pytest.raises(TypeError, match="num_actions is an int >= 1"):
            await getattr(search, name)(game, (), asr.immediate(_pick_model),
                                        num_simulations=4, seed=0)


async def test_gumbel_gives_python_ints_for_numpy_legal_actions_as_mcts_does():
    import json

    from async_search import search

    r = await search.gumbel_mcts(_Pick(), (), asr.immediate(_pick_model),
                                 num_simulations=4, seed=0)
    assert type(r.action) is int and all(type(a) is int for a in r.considered)
    json.dumps({"action": r.action, "considered": r.considered})
