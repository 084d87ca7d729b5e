"""Self-play: deterministic games as consistent training arrays, on any evaluate."""

import asyncio
import functools

import numpy as np
import pytest

import async_search as asr
from async_search import problems
from async_search.training.replay import ReplayBuffer
from async_search.training.selfplay import GameRecord, SelfPlayConfig, selfplay_game

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
    ("dirichlet_alpha", 0.0), ("dirichlet_fraction", -0.1),
    ("dirichlet_fraction", float("nan")), ("c_puct", 0.0), ("seed", -1),
])
def test_a_bad_self_play_config_raises_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SelfPlayConfig(**{field: value})
