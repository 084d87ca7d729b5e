import numpy as np
import pytest

import async_search as asr
from async_search import problems, search
from async_search.errors import ModelOutputError

GAME = problems.ConnectFour()
NET = problems.PolicyValueMLP(GAME, hidden_sizes=(64,), seed=0)
WIN_AT_3 = GAME.from_moves([0, 6, 1, 6, 2, 5])   # first player to move wins at column 3
BLOCK_AT_3 = GAME.from_moves([0, 6, 1, 6, 2])    # second player must block column 3


async def run(state=None, evaluate=None, **kwargs):
    args = dict(num_simulations=64, num_parallel=8, seed=0)
    args.update(kwargs)
    return await search.mcts(GAME, GAME.initial_state() if state is None else state,
                             evaluate or asr.immediate(NET), **args)


async def test_golden_result_of_a_seeded_search_from_the_empty_board():
    # Pins selection, virtual loss, noise, backup order and counting: a change in any of
    # them changes these numbers.
    result = await run(num_simulations=256, num_parallel=8, seed=0)
    assert result.visit_counts == (11, 34, 32, 11, 25, 52, 91)
    assert (result.action, result.num_simulations, result.tree_size, result.evaluations,
            result.requests) == (6, 256, 257, 257, 34)
    assert result.root_value == pytest.approx(0.03795749946327061, abs=1e-12)
    assert result.network_value == pytest.approx(0.05374908447265625, abs=1e-12)


async def test_golden_visit_counts_with_more_noise_and_four_in_flight():
    result = await run(GAME.from_moves([3, 3, 2]), num_simulations=100, num_parallel=4,
                       seed=42, dirichlet_fraction=0.5)
    assert result.visit_counts == (9, 34, 2, 30, 7, 6, 12)
    assert (result.action, result.tree_size, result.evaluations, result.requests) == (
        1, 101, 96, 26)


@pytest.mark.parametrize("num_parallel", [1, 3, 8, 32])
async def test_visit_counts_sum_to_num_simulations(num_parallel):
    result = await run(num_simulations=50, num_parallel=num_parallel)
    assert sum(result.visit_counts) == result.num_simulations == 50
    assert result.action == int(np.argmax(result.visit_counts))


async def test_one_leaf_in_flight_means_one_request_per_simulation(recorder):
    evaluate = recorder(NET)
    result = await run(evaluate=evaluate, num_simulations=30, num_parallel=1)
    assert result.requests == len(evaluate.requests) == 31
    assert [len(x) for x in evaluate.requests] == [1] * 31


async def test_each_round_evaluates_up_to_num_parallel_leaves_in_one_request(recorder):
    evaluate = recorder(NET)
    result = await run(evaluate=evaluate, num_simulations=128, num_parallel=8)
    sizes = [len(x) for x in evaluate.requests]
    assert sizes[0] == 1 and max(sizes) == 8
    assert sum(s == 8 for s in sizes) >= 0.75 * (len(sizes) - 1)
    assert result.evaluations == sum(sizes) and result.requests == len(sizes)
    assert result.requests >= 1 + 128 // 8


async def test_finds_the_winning_move():
    result = await run(WIN_AT_3, num_simulations=64, dirichlet_fraction=0.0)
    assert result.action == 3 and result.action_values[3] == 1.0


async def test_blocks_the_opponents_winning_move():
    result = await run(BLOCK_AT_3, num_simulations=200, dirichlet_fraction=0.0)
    assert result.action == 3
    assert result.visit_counts[3] > 0.5 * result.num_simulations


async def test_result_is_seeded_through_the_root_noise():
    a, b, c = [await run(seed=s) for s in (5, 5, 6)]
    assert a == b
    assert a.root_prior != c.root_prior and a.visit_counts != c.visit_counts
    quiet = [await run(seed=s, dirichlet_fraction=0.0) for s in (5, 6)]
    assert quiet[0] == quiet[1]


async def test_network_prior_is_the_root_prior_before_the_noise():
    state = GAME.from_moves([0] * 6)                     # column 0 full: illegal
    logits, _ = NET(GAME.encode([state]))
    legal = list(GAME.legal_actions(state))
    want = np.exp(logits[0, legal] - logits[0, legal].max())
    want /= want.sum()
    noisy = await run(state, num_simulations=16, dirichlet_fraction=0.5)
    quiet = await run(state, num_simulations=16, dirichlet_fraction=0.0)
    assert noisy.network_prior == quiet.network_prior == quiet.root_prior
    assert noisy.root_prior != noisy.network_prior
    assert noisy.network_prior[0] == 0.0
    np.testing.assert_allclose([noisy.network_prior[a] for a in legal], want, rtol=1e-5)


async def test_root_value_averages_the_network_value_and_the_backups():
    result = await run(num_simulations=40)
    backed_up = sum(n * q for n, q in zip(result.visit_counts, result.action_values))
    assert result.root_value == pytest.approx((result.network_value + backed_up) / 41)
    assert sum(result.root_prior) == pytest.approx(1.0)


async def test_illegal_actions_get_no_visits_and_no_prior():
    state = GAME.from_moves([0] * 6)
    result = await run(state, num_simulations=30)
    assert result.visit_counts[0] == 0 and result.root_prior[0] == 0.0


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_simulations=0), "num_simulations must be an integer >= 1, got 0"),
    (dict(num_parallel=0), "num_parallel must be an integer >= 1, got 0"),
    (dict(num_simulations=True), "num_simulations must be an integer >= 1, got True"),
    (dict(c_puct=0.0), "c_puct must be a finite number > 0.0, got 0.0"),
    (dict(c_puct=1e308), "c_puct must be at most 1e.06 .*, got 1e.308"),
    (dict(dirichlet_alpha=-1), "dirichlet_alpha must be a finite number > 0.0"),
    # NumPy's draws overflowed to zeros: the root's priors summed to 0.75, or 0.
    (dict(dirichlet_alpha=3e307), "dirichlet_alpha must be at most 1e.06 .*got 3e.307"),
    (dict(dirichlet_fraction=1.5), r"dirichlet_fraction must be in \[0, 1\], got 1.5"),
    (dict(state=GAME.play(WIN_AT_3, 3)), "cannot search from a terminal state"),
    (dict(state=(1, 1)), "two stones on a cell"),
    (dict(seed=-1), "seed must be an integer >= 0, got -1"),
    (dict(seed=True), "seed must be an integer >= 0, got True"),
    (dict(seed="1"), "seed must be an integer >= 0, got '1'"),
    (dict(seed=None), "seed must be an integer >= 0, got None"),
])
async def test_bad_arguments_raise_before_any_request(kwargs, message, recorder):
    evaluate = recorder(NET)
    with pytest.raises(ValueError, match=message):
        await run(evaluate=evaluate, **kwargs)
    assert evaluate.requests == []


async def test_model_returning_one_array_raises_model_output_error():
    async def evaluate(x):
        return np.zeros((len(x), 8), np.float32)

    with pytest.raises(ModelOutputError, match=r"tuple \(policy_logits \[n, 7\]"):
        await run(evaluate=evaluate)


@pytest.mark.parametrize("value, message", [
    (np.array([[np.nan]], np.float32), "must be finite"),
    (np.array([[np.inf]], np.float64), "must be finite"),
    (np.zeros((1, 2), np.float32), r"one value per element, shape \[1\] or \[1, 1\]"),
    ((np.zeros(1),), "got a tuple of outputs"),
])
async def test_bad_values_raise_model_output_error(value, message):
    async def evaluate(x):
        return np.zeros((len(x), 7), np.float32), value

    with pytest.raises(ModelOutputError, match=message):
        await run(evaluate=evaluate)


@pytest.mark.parametrize("value", [-1.7e308, 1.0000001, -2.0, 1e308, 3])
@pytest.mark.parametrize("where", ["root", "later"])
async def test_values_outside_minus_one_to_one_raise_model_output_error(value, where):
    # Before, -1.7e308 overflowed the backed-up sums: a root_value of NaN, silently.
    async def evaluate(x):
        values = np.zeros((len(x), 1), np.float64)
        if where == "root" or len(x) > 1:
            values[-1] = value
        return np.zeros((len(x), 7), np.float32), values

    with pytest.raises(ModelOutputError, match=r"must be in \[-1, 1\].*got \["):
        await run(evaluate=evaluate)


async def test_values_at_the_ends_of_the_range_are_taken():
    ends = lambda x: (np.zeros((len(x), 7), np.float32),
                      np.where(np.arange(len(x)) % 2, 1.0, -1.0)[:, None])
    result = await run(evaluate=asr.immediate(ends), num_simulations=32)
    assert sum(result.visit_counts) == 32 and -1.0 <= result.root_value <= 1.0


@pytest.mark.parametrize("bad, message", [
    (np.nan, "not NaN or \\+inf"),
    (np.inf, "not NaN or \\+inf"),
    (-np.inf, "at least one legal action above -inf"),
])
@pytest.mark.parametrize("where", ["root", "later"])
async def test_non_finite_logits_raise_model_output_error(bad, message, where):
    # Before, NaN or inf priors made every score NaN: all visits went silently to
    # column 0.
    async def evaluate(x):
        logits = np.zeros((len(x), 7), np.float32)
        if where == "root" or len(x) > 1 or x.sum() > 0:
            logits[:, :] = bad
        return logits, np.zeros((len(x), 1), np.float32)

    with pytest.raises(ModelOutputError, match=message):
        await run(evaluate=evaluate)


async def test_minus_inf_logits_on_some_legal_actions_give_them_no_prior():
    masked = lambda x: (np.where(np.arange(7) < 2, -np.inf, 0.0) * np.ones((len(x), 1)),
                        np.zeros((len(x), 1), np.float32))
    result = await run(evaluate=asr.immediate(masked), dirichlet_fraction=0.0)
    assert result.root_prior[:2] == (0.0, 0.0) and sum(result.root_prior) == 1.0


@pytest.mark.parametrize("dtype", [complex, object, str])
async def test_logits_that_are_not_real_numbers_raise_model_output_error(dtype):
    async def evaluate(x):
        return np.zeros((len(x), 7), dtype), np.zeros((len(x), 1), np.float32)

    with pytest.raises(ModelOutputError, match="policy logits must be real numbers"):
        await run(evaluate=evaluate)


class NoMovesAfterTwoStones(problems.ConnectFour):
    """Breaks the Game protocol: no legal action, yet the game is not over."""

    def legal_actions(self, state):
        return () if (state[0] | state[1]).bit_count() >= 2 else super().legal_actions(state)


@pytest.mark.parametrize("state", [GAME.initial_state(), GAME.from_moves([3, 3])])
async def test_a_game_without_legal_actions_that_is_not_over_raises(state):
    game = NoMovesAfterTwoStones()
    with pytest.raises(ValueError, match="legal_actions is empty but terminal_value is "
                                         "None"):
        await search.mcts(game, state, asr.immediate(NET), num_simulations=200, seed=0)


def rounded_net(x):
    logits, value = NET(x)
    return logits, np.round(value * 8) / 8  # float32 [n, 1], exact in float16 too


@pytest.mark.parametrize("convert", [
    lambda v: v.astype(np.float64).reshape(-1),  # [n] float64
    lambda v: v.astype(np.float16),  # float16 [n, 1]
    lambda v: v.reshape(-1, 1, 1),  # [n, 1, 1]: values_of's path
    lambda v: (v * 8).astype(np.int64) / 8,  # float64 by way of integers
])
async def test_values_in_any_accepted_form_give_the_same_search(convert):
    expected = await run(evaluate=asr.immediate(rounded_net))
    again = await run(evaluate=asr.immediate(
        lambda x: (rounded_net(x)[0], convert(rounded_net(x)[1]))))
    assert again == expected and isinstance(again.network_value, float)


async def test_integer_values_are_read_as_floats():
    zeros = lambda x: (np.zeros((len(x), 7), np.float32), np.zeros((len(x), 1), np.int64))
    result = await run(evaluate=asr.immediate(zeros))
    free = await run(evaluate=asr.immediate(
        lambda x: (np.zeros((len(x), 7), np.float32), np.zeros((len(x), 1), np.float32))))
    assert result == free and type(result.network_value) is float


# -- solve=True (MCTS-Solver) ------------------------------------------------------------


async def test_solve_takes_a_win_one_move_away_and_reports_the_root_solved():
    result = await run(WIN_AT_3, num_simulations=64, dirichlet_fraction=0.0, solve=True)
    assert result.action == 3 and result.solved_value == 1.0
    plain = await run(WIN_AT_3, num_simulations=64, dirichlet_fraction=0.0)
    assert plain.solved_value is None


async def test_solve_never_plays_a_proved_loss_while_another_move_is_open():
    result = await run(BLOCK_AT_3, num_simulations=200, dirichlet_fraction=0.0,
                       solve=True, keep_tree=True)
    tree = result.tree
    lost = [a for e, a in zip(tree.edges(0), tree.actions(0))
            if tree.edge_child[e] and tree.proof(tree.edge_child[e]) == (1.0, 1)]
    assert len(lost) == 6 and 3 not in lost  # each move but the block: X wins at 3
    assert result.action == 3 and result.solved_value is None
    assert result.subtree(lost[0]) is None  # a solved child has nothing to keep


async def test_solve_in_a_lost_position_reports_the_loss():
    state = GAME.from_moves([1, 1, 2, 2, 3])  # X threatens 0 and 4: O cannot block both
    result = await run(state, num_simulations=200, dirichlet_fraction=0.0, solve=True)
    assert result.solved_value == -1.0 and result.action in GAME.legal_actions(state)


async def test_a_solving_tree_kept_for_reuse_keeps_its_proofs():
    result = await run(GAME.from_moves([3, 2, 3, 2, 4, 4, 1]), num_simulations=200,
                       dirichlet_fraction=0.0, solve=True, keep_tree=True)
    kept = result.subtree(result.action)
    solved = [n for n in range(kept.num_nodes) if kept.proof(n) and kept.proof(n)[1]]
    assert solved  # nodes solved below the move played, with their plies
    state = GAME.play(GAME.from_moves([3, 2, 3, 2, 4, 4, 1]), result.action)
    again = await run(state, num_simulations=32, reuse=kept, solve=True, keep_tree=True)
    assert sum(again.visit_counts) == 32 + again.reused_visits
    assert all(again.tree.proof(n) == kept.proof(n) for n in solved)  # same numbering


async def test_a_solving_tree_reused_without_solve_proves_nothing_more():
    start = GAME.from_moves([3, 2, 3, 2, 4, 4, 1])
    result = await run(start, num_simulations=200, dirichlet_fraction=0.0, solve=True,
                       keep_tree=True)
    kept = result.subtree(result.action)
    state = GAME.play(start, result.action)
    plain = await run(state, num_simulations=200, reuse=kept, keep_tree=True)
    fresh = await run(state, num_simulations=200, reuse=kept, keep_tree=True,
                      solve=True)
    count = [sum(1 for n in range(r.tree.num_nodes)
                 if r.tree.proof(n) and r.tree.proof(n)[1]) for r in (plain, fresh)]
    assert count[0] == sum(1 for n in range(kept.num_nodes)
                           if kept.proof(n) and kept.proof(n)[1]) < count[1]


@pytest.mark.parametrize("solve", [1, "yes", None])
async def test_solve_must_be_a_bool(solve):
    with pytest.raises(ValueError, match="solve must be a bool"):
        await run(solve=solve)
