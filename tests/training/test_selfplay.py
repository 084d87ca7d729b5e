"""Self-play: deterministic games as consistent training arrays, on any evaluate."""

import asyncio
import functools

import numpy as np
import pytest

import async_search as asr
from async_search import problems
from async_search.training.replay import ReplayBuffer
from async_search.training.selfplay import (GameRecord, SelfPlayConfig, random_opening,
                                           selfplay_game)

GAME = problems.ConnectFour()
NET = problems.PolicyValueMLP(GAME, hidden_sizes=(16,), seed=0)
CONFIG = SelfPlayConfig(simulations=8, num_parallel=4, sampling_moves=4, seed=0)
GAME_IDS = range(8)


def play(game_id, config=CONFIG, model=NET):
    return asyncio.run(selfplay_game(game_id, asr.immediate(model), game=GAME,
                                     config=config))


def assert_same_record(a, b):
    assert a.moves == b.moves and a.winner == b.winner
    for x, y in ((a.x, b.x), (a.policy, b.policy), (a.value, b.value)):
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


@pytest.fixture(scope="module")
def records():
    return [play(i) for i in GAME_IDS]


def test_a_game_is_deterministic_for_its_id_and_seed(records):
    assert_same_record(play(3), records[3])


def test_games_differ_across_ids_and_seeds(records):
    assert len({r.moves for r in records}) == len(records)
    other_seed = SelfPlayConfig(simulations=8, num_parallel=4, sampling_moves=4, seed=1)
    assert play(3, other_seed).moves != records[3].moves


def test_the_arrays_have_one_row_per_move_and_the_game_shapes(records):
    for r in records:
        n = len(r.moves)
        assert isinstance(r, GameRecord) and n >= 7  # a win takes at least 7 stones
        assert r.x.shape == (n, 2, 6, 7) and r.x.dtype == np.float32
        assert r.policy.shape == (n, 7) and r.policy.dtype == np.float32
        assert r.value.shape == (n,) and r.value.dtype == np.float32


def test_the_positions_are_the_games_positions_encoded_for_the_player_to_move(records):
    for r in records:
        states = [GAME.from_moves(r.moves[:i]) for i in range(len(r.moves))]
        np.testing.assert_array_equal(r.x, GAME.encode(states))
        assert GAME.is_terminal(GAME.from_moves(r.moves))


def test_policy_rows_are_visit_counts_summing_to_the_simulations_on_legal_moves(records):
    for r in records:
        assert (r.policy == np.round(r.policy)).all() and (r.policy >= 0).all()
        assert (r.policy.sum(axis=1) == CONFIG.simulations).all()
        for i, row in enumerate(r.policy):
            legal = GAME.legal_actions(GAME.from_moves(r.moves[:i]))
            assert set(np.flatnonzero(row)) <= set(legal)


def test_moves_after_the_sampling_moves_take_the_most_visited_action(records):
    for r in records:
        for i in range(CONFIG.sampling_moves, len(r.moves)):
            row = r.policy[i]
            assert r.moves[i] == int(np.flatnonzero(row == row.max())[0])


def test_values_alternate_and_the_last_mover_wins_with_value_one(records):
    for r in records:
        final = GAME.from_moves(r.moves)
        assert (r.value[:-1] == -r.value[1:]).all()
        if GAME.terminal_value(final) == 0.0:  # a draw
            assert (r.value == 0).all() and r.winner == 0
        else:
            assert r.value[-1] == 1.0  # the player to move last made the winning move


def test_winner_agrees_with_the_values_and_the_final_position(records):
    for r in records:
        final = GAME.from_moves(r.moves)
        assert r.winner == GAME.winner(final)
        assert r.value[0] == r.winner  # the first player moves at position 0
        if r.winner:
            assert r.winner == (1 if len(r.moves) % 2 else -1)
    assert {r.winner for r in records} == {1, -1}  # both sides win some


def test_concurrent_games_through_serve_match_sequential_immediate_games(records):
    async def main():
        async with asr.serve(NET, max_batch_size=64) as evaluate:
            games = await asyncio.gather(*(
                selfplay_game(i, evaluate, game=GAME, config=CONFIG) for i in GAME_IDS))
            return games, evaluate.stats
    served, stats = asyncio.run(main())
    for a, b in zip(served, records, strict=True):
        assert_same_record(a, b)
    assert stats["mean_batch_size"] > 1  # the games really batched together


def test_the_signature_fits_run_searches_through_functools_partial(records):
    fn = functools.partial(selfplay_game, game=GAME, config=CONFIG)
    assert_same_record(asyncio.run(fn(2, asr.immediate(NET))), records[2])


def test_records_go_into_a_replay_buffer(records):
    buf = ReplayBuffer(1000, seed=0)
    for r in records:
        buf.add(r.x, r.policy, r.value)
    assert len(buf) == sum(len(r.moves) for r in records)
    np.testing.assert_allclose(buf.arrays().policy.sum(axis=1), 1.0, rtol=1e-6)


def test_without_sampling_moves_and_noise_a_game_ignores_the_seed():
    greedy = dict(simulations=8, num_parallel=4, sampling_moves=0, dirichlet_fraction=0.0)
    a = play(0, SelfPlayConfig(**greedy, seed=0))
    b = play(5, SelfPlayConfig(**greedy, seed=7))
    assert_same_record(a, b)


@pytest.mark.parametrize("field, value", [
    ("simulations", 0), ("simulations", 2.5), ("num_parallel", 0), ("sampling_moves", -1),
    ("dirichlet_alpha", 0.0), ("dirichlet_alpha", 3e307), ("dirichlet_fraction", -0.1),
    ("dirichlet_fraction", float("nan")), ("dirichlet_fraction", 1.5), ("c_puct", 0.0),
    ("seed", -1), ("random_opening_moves", -1), ("random_opening_moves", 2.0),
    ("random_opening_moves", True), ("random_opening_moves", 2 ** 31),
    ("solve", 1), ("solve", "yes"), ("policy_target", "counts"), ("policy_target", None),
])
def test_a_bad_self_play_config_raises_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SelfPlayConfig(**{field: value})


def test_a_dirichlet_fraction_above_one_is_refused_by_the_config_not_the_search():
    # search.mcts refuses it too, but only once a Commander's workers play a game.
    with pytest.raises(ValueError, match=r"^dirichlet_fraction must be a finite number "
                                         r">= 0\.0 and <= 1\.0, got 1\.5$"):
        SelfPlayConfig(dirichlet_fraction=1.5)
    assert SelfPlayConfig(dirichlet_fraction=1.0).dirichlet_fraction == 1.0


def test_solve_makes_every_search_of_a_game_prove_values(monkeypatch):
    from async_search import search

    seen = []
    real = search.mcts

    async def spy(*args, **kwargs):
        seen.append(kwargs["solve"])
        return await real(*args, **kwargs)
    monkeypatch.setattr(search, "mcts", spy)
    record = play(0, SelfPlayConfig(simulations=16, num_parallel=4, seed=0, solve=True))
    assert seen == [True] * len(record.moves)
    assert np.array_equal(record.policy.sum(axis=1), [16.0] * len(record.moves))
    seen.clear()
    play(0, SelfPlayConfig(simulations=16, num_parallel=4, seed=0))
    assert seen and not any(seen)


# -- Gumbel AlphaZero and tree reuse -------------------------------------------------------

GUMBEL = SelfPlayConfig(simulations=8, num_parallel=4, policy="gumbel", seed=0)


@pytest.fixture(scope="module")
def gumbel_records():
    return [play(i, GUMBEL) for i in range(4)]


IMPROVED = SelfPlayConfig(simulations=8, num_parallel=4, sampling_moves=4, seed=0,
                          policy_target="improved")


def test_the_improved_target_plays_the_same_game_as_the_visits_target(records):
    # The target is read off each search; the moves still follow the visits.
    for i, record in enumerate(records[:3]):
        improved = play(i, IMPROVED)
        assert improved.moves == record.moves and improved.x.tobytes() == record.x.tobytes()
        assert improved.value.tobytes() == record.value.tobytes()
        assert not np.array_equal(improved.policy, record.policy)


def test_the_improved_target_is_each_searchs_root_improved_policy():
    # Replays game 1 with the same seeds: each row is root_improved_policy of that
    # move's search (over the legal moves, 0 elsewhere).
    from async_search import search
    from async_search.search.completed_q import root_improved_policy
    record = play(1, IMPROVED)
    rng = np.random.default_rng([IMPROVED.seed, 1])
    state, ev = GAME.initial_state(), asr.immediate(NET)
    for i, (move, row) in enumerate(zip(record.moves, record.policy)):
        r = asyncio.run(search.mcts(GAME, state, ev, num_simulations=8, num_parallel=4,
                                    c_puct=IMPROVED.c_puct,
                                    dirichlet_alpha=IMPROVED.dirichlet_alpha,
                                    dirichlet_fraction=IMPROVED.dirichlet_fraction,
                                    seed=int(rng.integers(2 ** 63))))
        if i < IMPROVED.sampling_moves:  # the sampled move draws from the same rng
            counts = np.asarray(r.visit_counts, np.float64)
            assert move == int(rng.choice(len(counts), p=counts / counts.sum()))
        else:
            assert move == r.action
        legal = list(GAME.legal_actions(state))
        want = np.zeros(GAME.num_actions)
        want[legal] = root_improved_policy([r.network_prior[a] for a in legal],
                                           [r.visit_counts[a] for a in legal],
                                           [r.action_values[a] for a in legal],
                                           r.network_value)
        np.testing.assert_array_equal(row, want.astype(np.float32))
        state = GAME.play(state, move)


def test_a_gumbel_game_is_deterministic_and_differs_across_ids(gumbel_records):
    for i, record in enumerate(gumbel_records):
        assert_same_record(record, play(i, GUMBEL))
    assert len({r.moves for r in gumbel_records}) == len(gumbel_records)


def test_improved_policy_rows_sum_to_one_on_legal_moves(gumbel_records):
    # Gumbel's targets, and PUCT's with policy_target="improved".
    for record in [*gumbel_records, play(2, IMPROVED)]:
        np.testing.assert_allclose(record.policy.sum(axis=1), 1.0, rtol=1e-5)
        state = GAME.initial_state()
        for row, move in zip(record.policy, record.moves):
            legal = set(GAME.legal_actions(state))
            assert all(p == 0 for a, p in enumerate(row) if a not in legal)
            state = GAME.play(state, move)


def test_a_gumbel_game_plays_the_searchs_action_and_targets_its_policy():
    # Replays game 0 move by move with the same seeds: each move and row is the search's.
    from async_search import search
    record = play(0, GUMBEL)
    rng = np.random.default_rng([GUMBEL.seed, 0])
    state, ev = GAME.initial_state(), asr.immediate(NET)
    for move, row in zip(record.moves, record.policy):
        r = asyncio.run(search.gumbel_mcts(GAME, state, ev, num_simulations=8,
                                           num_parallel=4, seed=int(rng.integers(2 ** 63))))
        assert move == r.action
        np.testing.assert_array_equal(row, np.asarray(r.policy, np.float32))
        state = GAME.play(state, move)


def test_gumbel_ignores_the_sampling_moves():
    # The Gumbel noise samples every move: sampling_moves changes nothing.
    import dataclasses
    other = dataclasses.replace(GUMBEL, sampling_moves=0)
    assert_same_record(play(1, GUMBEL), play(1, other))


@pytest.mark.parametrize("policy", ["puct", "gumbel"])
def test_reusing_the_tree_passes_the_subtree_of_the_move_played(policy, monkeypatch):
    import dataclasses
    from async_search import search
    config = dataclasses.replace(CONFIG, policy=policy, reuse_tree=True)
    name = {"puct": "mcts", "gumbel": "gumbel_mcts"}[policy]
    real, calls = getattr(search, name), []

    async def spy(game, state, evaluate, **kwargs):
        calls.append((state, kwargs["reuse"], kwargs["keep_tree"]))
        return await real(game, state, evaluate, **kwargs)

    monkeypatch.setattr(search, name, spy)
    record = play(2, config)
    monkeypatch.undo()
    assert len(calls) == len(record.moves) and calls[0][1] is None
    assert all(keep for _, _, keep in calls)
    reused = [(state, tree) for state, tree, _ in calls if tree is not None]
    assert len(reused) > len(calls) // 2
    assert all(tree.node_state[0] == state for state, tree in reused)
    assert_same_record(record, play(2, config))  # still deterministic
    if policy == "puct":  # visit counts: a reused subtree adds to the simulations
        totals = record.policy.sum(axis=1)
        assert totals[0] == 8 and (totals >= 8).all() and (totals > 8).any()


@pytest.mark.parametrize("policy", ["puct", "gumbel"])
def test_reused_games_through_serve_match_immediate_games(policy):
    import dataclasses
    config = dataclasses.replace(CONFIG, policy=policy, reuse_tree=True)

    async def served():
        async with asr.serve(NET, max_batch_size=64) as evaluate:
            return await asyncio.gather(*(selfplay_game(i, evaluate, game=GAME,
                                                        config=config) for i in range(4)))

    for i, record in enumerate(asyncio.run(served())):
        assert_same_record(record, play(i, config))


@pytest.mark.parametrize("changes, message", [
    (dict(policy="alphazero"), "policy must be one of"),
    (dict(reuse_tree=1), "reuse_tree must be True or False"),
    (dict(max_num_considered_actions=0), "max_num_considered_actions"),
    (dict(c_visit=-1.0), "c_visit"),
    (dict(c_scale=-0.5), "c_scale"),
])
def test_bad_gumbel_and_reuse_settings_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        SelfPlayConfig(**changes)


def test_the_defaults_are_puct_without_reuse():
    assert (CONFIG.policy, CONFIG.reuse_tree) == ("puct", False)


# -- random openings -----------------------------------------------------------------------

OPENING = SelfPlayConfig(simulations=8, num_parallel=4, sampling_moves=4, seed=0,
                         random_opening_moves=12)


@pytest.fixture(scope="module")
def opening_records():
    return [play(i, OPENING) for i in range(12)]


def test_without_random_openings_games_start_from_the_empty_board(records):
    assert all(r.opening == () for r in records)


def test_random_openings_have_0_to_n_moves_and_differ_across_games(opening_records):
    lengths = [len(r.opening) for r in opening_records]
    assert all(0 <= n <= 12 for n in lengths)
    assert len(set(lengths)) > 3
    assert len({r.opening for r in opening_records}) > 6


def test_samples_start_after_the_opening(opening_records):
    for r in opening_records:
        game = r.opening + r.moves
        states = [GAME.from_moves(game[:i]) for i in range(len(r.opening), len(game))]
        np.testing.assert_array_equal(r.x, GAME.encode(states))
        assert len(r.x) == len(r.moves) == len(r.policy) == len(r.value)
        assert GAME.is_terminal(GAME.from_moves(game))
        assert r.value[-1] == 1.0 if r.winner else r.value[-1] == 0.0


def test_a_game_with_an_opening_is_deterministic_for_its_id_and_seed(opening_records):
    again = play(5, OPENING)
    assert_same_record(again, opening_records[5])
    assert again.opening == opening_records[5].opening


def test_a_random_opening_never_ends_the_game():
    # 40 random moves reach boards where some moves would win at once.
    for seed in range(50):
        state, moves = random_opening(GAME, 40, np.random.default_rng(seed))
        assert state == GAME.from_moves(moves) and len(moves) <= 40
        assert not GAME.is_terminal(state)


def test_a_random_opening_stops_where_every_move_would_end_the_game():
    class OneMoveGame:
        """A stand-in where the only legal move ends the game."""

        def initial_state(self):
            return 0

        def legal_actions(self, state):
            return [0]

        def play(self, state, action):
            return state + 1

        def terminal_value(self, state):
            return -1.0 if state >= 1 else None

    for seed in range(5):
        assert random_opening(OneMoveGame(), 8, np.random.default_rng(seed)) == (0, ())
