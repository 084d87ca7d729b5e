"""Gumbel AlphaZero search (search/gumbel.py): properties, edges, errors, batching."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import async_search as asr
from async_search import problems, search
from async_search.base import TensorSpec
from async_search.errors import ModelOutputError
from async_search.search.halving import halving_schedule

GAME = problems.ConnectFour()
NET = problems.PolicyValueMLP(GAME, hidden_sizes=(64,), seed=0)
WIN_AT_3 = GAME.from_moves([0, 6, 1, 6, 2, 5])   # first player to move wins at column 3
BLOCK_AT_3 = GAME.from_moves([0, 6, 1, 6, 2])    # second player must block column 3
ONE_COLUMN_LEFT = GAME.from_moves(    # 41 stones: one cell left, in column 4
    int(c) for c in "31001621625211325530651563266254330440440")


async def run(state=None, evaluate=None, **kwargs):
    args = dict(num_simulations=32, num_parallel=8, seed=0)
    args.update(kwargs)
    return await search.gumbel_mcts(GAME, GAME.initial_state() if state is None else state,
                                    evaluate or asr.immediate(NET), **args)


def legal(state):
    return GAME.legal_actions(state)


def check_invariants(result, state, num_simulations, k):
    actions = legal(state)
    assert result.action in actions and result.action in result.considered
    assert len(result.considered) == min(k, len(actions))
    assert set(result.considered) <= set(actions)
    assert math.isclose(sum(result.policy), 1.0, abs_tol=1e-9)
    assert all(p == 0.0 for a, p in enumerate(result.policy) if a not in actions)
    assert sum(result.visit_counts) == result.num_simulations == num_simulations
    assert all(n == 0 for a, n in enumerate(result.visit_counts)
               if a not in result.considered)
    assert -1.0 <= result.root_value <= 1.0
    assert all(-1.0 <= q <= 1.0 for q in result.completed_values)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(moves=st.lists(st.integers(0, 6), max_size=30),
       n=st.integers(1, 40), k=st.integers(1, 9), num_parallel=st.integers(1, 9),
       seed=st.integers(0, 3), scale=st.sampled_from([0.0, 1.0]))
async def test_invariants_hold_for_any_position_and_budget(moves, n, k, num_parallel,
                                                           seed, scale):
    state = GAME.initial_state()
    for m in moves:
        if GAME.terminal_value(state) is not None:
            break
        if m in legal(state):
            state = GAME.play(state, m)
    if GAME.terminal_value(state) is not None:
        return
    result = await run(state, num_simulations=n, max_num_considered_actions=k,
                       num_parallel=num_parallel, seed=seed, gumbel_scale=scale)
    check_invariants(result, state, n, k)


async def test_one_simulation_per_considered_action_visits_each_once():
    result = await run(num_simulations=7, max_num_considered_actions=16)
    assert result.visit_counts == (1,) * 7
    # The action then has the best g + logits + sigma(q) of all: here not simply the
    # best prior, so the values did count.
    check_invariants(result, GAME.initial_state(), 7, 16)


@pytest.mark.parametrize("n", [1, 2, 4])
async def test_a_budget_below_k_visits_the_first_sampled_actions_once(n):
    result = await run(num_simulations=n, max_num_considered_actions=16)
    assert [a for a in range(7) if result.visit_counts[a]] == sorted(result.considered[:n])
    assert result.action in result.considered[:n]


async def test_one_considered_action_takes_every_simulation():
    result = await run(num_simulations=20, max_num_considered_actions=1)
    assert result.visit_counts[result.action] == 20
    assert result.considered == (result.action,)


async def test_a_single_legal_action_is_played_with_all_simulations():
    assert legal(ONE_COLUMN_LEFT) == (4,)
    result = await run(ONE_COLUMN_LEFT, num_simulations=9)
    assert result.action == 4 and result.visit_counts[4] == 9
    assert result.policy[4] == 1.0 and result.considered == (4,)


async def test_the_budget_follows_the_sequential_halving_schedule():
    result = await run(num_simulations=100, max_num_considered_actions=4, seed=1)
    phases = halving_schedule(100, 4)
    assert phases == [(4, 12), (2, 25), (2, 25)]
    counts = sorted(n for n in result.visit_counts if n)
    # Two actions were dropped after 12 visits; the survivors share the rest: 25 each,
    # then the last phase is cut after 100 - 98 = 2 visits, one each.
    assert counts == [12, 12, 38, 38]
    assert result.visit_counts[result.action] == 38


async def test_a_budget_too_large_to_list_is_searched_as_any_other():
    # Each phase was listed before its first visit: 10**30 simulations raised an
    # OverflowError (2**62 a MemoryError) where mcts simply searches.
    class Enough(Exception):
        pass

    inner = asr.immediate(NET)
    asked = []

    async def evaluate(x):
        asked.append(len(x))
        if len(asked) > 20:
            raise Enough
        return await inner(x)

    for budget in (10 ** 30, 2 ** 62):
        asked.clear()
        with pytest.raises(Enough):  # (asked 21 times: it searched)
            await run(evaluate=evaluate, num_simulations=budget)


async def test_finds_the_winning_move_and_blocks():
    for state, move in ((WIN_AT_3, 3), (BLOCK_AT_3, 3)):
        for seed in range(3):
            result = await run(state, num_simulations=32, seed=seed, gumbel_scale=0.0,
                               evaluate=asr.immediate(problems.pretrained("connect_four")))
            assert result.action == move


async def test_without_noise_the_seed_has_no_effect():
    a = await run(seed=0, gumbel_scale=0.0)
    b = await run(seed=5, gumbel_scale=0.0)
    assert a == b


async def test_the_seed_draws_the_noise():
    results = [await run(seed=s, num_simulations=8) for s in (0, 0, 1, 2)]
    assert results[0] == results[1]
    assert len({r.considered for r in results[1:]}) > 1


async def test_the_improved_policy_is_the_prior_when_values_do_not_count():
    result = await run(c_scale=0.0)
    assert result.policy == pytest.approx(result.root_prior, abs=1e-12)


async def test_the_improved_policy_moves_toward_higher_values():
    result = await run(num_simulations=64)
    visited = [a for a in range(7) if result.visit_counts[a]]
    best = max(visited, key=lambda a: result.completed_values[a])
    worst = min(visited, key=lambda a: result.completed_values[a])
    ratio = lambda a: result.policy[a] / result.root_prior[a]
    assert ratio(best) > 1.0 > ratio(worst)


async def test_root_value_averages_the_network_value_and_the_backups():
    result = await run(num_simulations=24)
    total = sum(n * q for n, q in zip(result.visit_counts, result.action_values))
    assert result.root_value == pytest.approx((result.network_value + total) / 25)


async def test_completed_values_are_q_where_visited():
    result = await run(num_simulations=3)
    for a in range(7):
        if result.visit_counts[a]:
            assert result.completed_values[a] == result.action_values[a]
    unvisited = {result.completed_values[a] for a in range(7) if not result.visit_counts[a]}
    assert len(unvisited) == 1  # v_mix, the same for all


async def test_one_leaf_in_flight_means_one_request_per_simulation(recorder):
    evaluate = recorder(NET)
    result = await run(evaluate=evaluate, num_simulations=20, num_parallel=1)
    assert [len(x) for x in evaluate.requests] == [1] * result.requests
    assert result.evaluations == result.requests <= 21


async def test_a_round_sends_up_to_num_parallel_leaves_in_one_request(recorder):
    evaluate = recorder(NET)
    result = await run(evaluate=evaluate, num_simulations=64, num_parallel=8)
    sizes = [len(x) for x in evaluate.requests]
    assert sizes[0] == 1 and max(sizes) <= 8 and sizes[1] == 7  # 7 actions, one each
    assert result.evaluations == sum(sizes) and result.requests == len(sizes)


async def test_terminal_leaves_back_up_their_own_value_without_evaluation(recorder):
    evaluate = recorder(NET)
    result = await run(WIN_AT_3, evaluate=evaluate, num_simulations=40, gumbel_scale=0.0)
    assert result.action_values[3] == 1.0 and result.action == 3
    assert result.evaluations < 1 + 40


@pytest.mark.parametrize("positions", [[(), (3,), (3, 3, 2), (0, 6, 1, 6, 2)]])
async def test_immediate_and_served_searches_are_equal(positions, run_both):
    states = [GAME.from_moves(m) for m in positions]

    async def gumbel(state, evaluate):
        return await search.gumbel_mcts(GAME, state, evaluate, num_simulations=24,
                                        num_parallel=4, seed=7)

    sequential, concurrent, stats = await run_both(gumbel, states, NET)
    assert sequential == concurrent
    assert stats["mean_batch_size"] > 1  # the searches did share batches


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_simulations=0), "num_simulations must be an integer >= 1, got 0"),
    (dict(num_simulations=True), "num_simulations must be an integer >= 1, got True"),
    (dict(max_num_considered_actions=0), "max_num_considered_actions must be an integer"),
    (dict(num_parallel=0), "num_parallel must be an integer >= 1, got 0"),
    (dict(c_visit=-1.0), "c_visit must be a finite number >= 0.0, got -1.0"),
    (dict(c_scale=math.nan), "c_scale must be a finite number >= 0.0, got nan"),
    (dict(c_scale=1e307), "c_scale must be at most 1e.06 .*, got 1e.307"),
    (dict(c_visit=1e300), "c_visit must be at most 1e.06"),
    (dict(gumbel_scale=1e300), "gumbel_scale must be at most 1e.06"),
    (dict(gumbel_scale=-0.5), "gumbel_scale must be a finite number >= 0.0"),
    (dict(seed=-1), "seed must be an integer >= 0, got -1"),
    (dict(seed=None), "seed must be an integer >= 0, got None"),
    (dict(keep_tree=1), "keep_tree must be a bool, got 1"),
    (dict(reuse="tree"), "reuse must be a search.tree.Tree"),
    (dict(state=GAME.play(WIN_AT_3, 3)), "cannot search from a terminal state"),
    (dict(state=(1, 1)), "two stones on a cell"),
])
async def test_bad_arguments_raise_before_any_request(kwargs, message, recorder):
    evaluate = recorder(NET)
    with pytest.raises(ValueError, match=message):
        await run(evaluate=evaluate, **kwargs)
    assert evaluate.requests == []


async def test_an_evaluate_that_is_not_callable_is_refused():
    with pytest.raises(ValueError, match="evaluate must be an awaitable callable"):
        await search.gumbel_mcts(GAME, GAME.initial_state(), NET(GAME.encode([
            GAME.initial_state()])), num_simulations=4)


async def test_model_returning_one_array_raises_model_output_error():
    async def evaluate(x):
        return np.zeros((len(x), 8), np.float32)

    with pytest.raises(ModelOutputError, match=r"tuple \(policy_logits \[n, 7\]"):
        await run(evaluate=evaluate)


@pytest.mark.parametrize("where", ["root", "later"])
async def test_values_outside_minus_one_to_one_raise_model_output_error(where):
    async def evaluate(x):
        values = np.zeros((len(x), 1), np.float64)
        if where == "root" or len(x) > 1:
            values[-1] = 1.5
        return np.zeros((len(x), 7), np.float32), values

    with pytest.raises(ModelOutputError, match=r"must be in \[-1, 1\]"):
        await run(evaluate=evaluate)


async def test_minus_inf_logits_on_some_legal_actions_get_no_policy():
    masked = lambda x: (np.where(np.arange(7) < 2, -np.inf, 0.0) * np.ones((len(x), 1)),
                        np.zeros((len(x), 1), np.float32))
    result = await run(evaluate=asr.immediate(masked), max_num_considered_actions=5)
    assert result.policy[:2] == (0.0, 0.0) and result.root_prior[:2] == (0.0, 0.0)
    assert set(result.considered) == {2, 3, 4, 5, 6} and result.action >= 2


async def test_nan_logits_raise_model_output_error():
    nan = lambda x: (np.full((len(x), 7), np.nan), np.zeros((len(x), 1), np.float32))
    with pytest.raises(ModelOutputError, match="not NaN or \\+inf"):
        await run(evaluate=asr.immediate(nan))


class Corridor:
    """A one-action game: from k, the only move leads to k - 1; 0 is a loss for the
    player to move."""

    num_actions = 1
    input_spec = TensorSpec((1,), np.float32)

    def check_state(self, state):
        pass

    def legal_actions(self, state):
        return (0,) if state else ()

    def play(self, state, action):
        return state - 1

    def terminal_value(self, state):
        return -1.0 if state == 0 else None

    def encode(self, states):
        return np.array([[s] for s in states], np.float32)


async def test_a_game_through_the_protocol_alone_is_searched():
    game = Corridor()
    model = lambda x: (np.zeros((len(x), 1), np.float32), np.zeros((len(x), 1), np.float32))
    result = await search.gumbel_mcts(game, 1, asr.immediate(model), num_simulations=5)
    # The only move wins at once: the terminal child backs up +1 for the root player.
    assert result.visit_counts == (5,) and result.action_values == (1.0,)
    assert result.evaluations == result.requests == 1
    result = await search.gumbel_mcts(game, 6, asr.immediate(model), num_simulations=12,
                                      num_parallel=4)
    assert result.visit_counts == (12,) and result.policy == (1.0,)
