import math

import numpy as np
import pytest

import async_search as asr
from async_search import problems
from async_search.errors import ModelOutputError
from async_search.training.arena import (RANDOM_RATING, MatchResult, MCTSPlayer,
                                         OnePlyPlayer, Player, PolicyPlayer,
                                         RandomPlayer, UCTPlayer, _uct_visit_counts,
                                         elo_difference, fit_rating, gate, play_match)

GAME = problems.ConnectFour()
NET = problems.PolicyValueMLP(GAME, hidden_sizes=(64,), seed=0)
WIN_AT_3 = GAME.from_moves([0, 6, 1, 6, 2, 5])       # first player to move wins at 3
BLOCK_AT_3 = GAME.from_moves([0, 6, 1, 6, 2])        # second player must block column 3
WIN_OR_BLOCK = GAME.from_moves([0, 6, 1, 6, 2, 6])   # win at 3, opponent threatens 6
FULL_COLUMNS = GAME.from_moves([0, 0, 0, 0, 0, 0, 6, 6, 6, 6, 6, 6])  # 0 and 6 full


def stones(state):
    return (state.to_move | state.waiting).bit_count()


def random_positions(count, seed=0):
    """Non-terminal positions of every length, from random games."""
    rng = np.random.default_rng(seed)
    positions = [FULL_COLUMNS]
    while len(positions) < count:
        state = GAME.initial_state()
        for _ in range(int(rng.integers(0, 40))):
            legal = GAME.legal_actions(state)
            if not legal:
                break
            state = GAME.play(state, legal[int(rng.integers(len(legal)))])
        if GAME.legal_actions(state):
            positions.append(state)
    return positions


class Recorder:
    """Plays the lowest legal action after one draw from rng, and records each call."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    async def choose(self, game, state, rng):
        draw = rng.random()
        self.log.append((self.name, state, draw))
        return game.legal_actions(state)[0]


class NotConnectFour:
    """ConnectFour behind a wrapper: UCT cannot take its bitboard fast path."""

    def __init__(self):
        self.game = problems.ConnectFour()

    def __getattr__(self, name):
        return getattr(self.game, name)


# -- players ---------------------------------------------------------------------------


async def test_one_ply_takes_a_win_rather_than_blocking():
    for seed in range(5):
        rng = np.random.default_rng(seed)
        assert await OnePlyPlayer().choose(GAME, WIN_AT_3, rng) == 3
        assert await OnePlyPlayer().choose(GAME, WIN_OR_BLOCK, rng) == 3


async def test_one_ply_blocks_the_opponents_only_winning_column():
    for seed in range(10):
        assert await OnePlyPlayer().choose(GAME, BLOCK_AT_3,
                                           np.random.default_rng(seed)) == 3
    # Vertical threat of the second player in column 6.
    state = GAME.from_moves([0, 6, 1, 6, 0, 6])
    for seed in range(10):
        assert await OnePlyPlayer().choose(GAME, state, np.random.default_rng(seed)) == 6


async def test_one_ply_does_not_play_under_a_threat_it_mistakes_for_one():
    # The second player threatens row 1 of the empty column 3: playing 3 would let it
    # win on top, so 3 is not a block and the player stays random.
    state = GAME.from_moves([0, 1, 2, 0, 6, 1, 5, 2])
    assert GAME.terminal_value(GAME.from_moves([0, 1, 2, 0, 6, 1, 5, 2, 3, 3])) == -1.0
    moves = {await OnePlyPlayer().choose(GAME, state, np.random.default_rng(seed))
             for seed in range(20)}
    assert len(moves) > 2


async def test_one_ply_plays_at_random_without_wins_or_threats():
    moves = {await OnePlyPlayer().choose(GAME, GAME.initial_state(),
                                         np.random.default_rng(seed))
             for seed in range(30)}
    assert moves == set(range(7))


@pytest.mark.parametrize("player", [RandomPlayer(), OnePlyPlayer(), UCTPlayer(20)],
                         ids=lambda p: p.name)
async def test_baseline_players_only_play_legal_moves(player):
    assert isinstance(player, Player)
    rng = np.random.default_rng(1)
    for state in random_positions(25):
        assert await player.choose(GAME, state, rng) in GAME.legal_actions(state)
    assert set(GAME.legal_actions(FULL_COLUMNS)) == {1, 2, 3, 4, 5}


async def test_players_refuse_a_finished_game():
    over = GAME.from_moves([0, 6, 0, 6, 0, 6, 0])
    for player in (RandomPlayer(), OnePlyPlayer(), UCTPlayer(5),
                   PolicyPlayer(asr.immediate(NET))):
        with pytest.raises(ValueError, match="finished game"):
            await player.choose(GAME, over, np.random.default_rng(0))


async def test_uct_takes_an_immediate_win():
    for seed in range(5):
        rng = np.random.default_rng(seed)
        assert await UCTPlayer(50).choose(GAME, WIN_AT_3, rng) == 3
        assert await UCTPlayer(50).choose(GAME, WIN_OR_BLOCK, rng) == 3


async def test_uct_blocks_a_threat():
    for seed in range(3):
        assert await UCTPlayer(200).choose(GAME, BLOCK_AT_3,
                                           np.random.default_rng(seed)) == 3


def test_uct_visits_sum_to_rollouts_and_depend_only_on_the_rng():
    state = GAME.from_moves([3, 3, 2])
    a = _uct_visit_counts(GAME, state, 120, 1.4, np.random.default_rng(7))
    b = _uct_visit_counts(GAME, state, 120, 1.4, np.random.default_rng(7))
    c = _uct_visit_counts(GAME, state, 120, 1.4, np.random.default_rng(8))
    assert a == b and a != c
    assert sum(a.values()) == 120 and set(a) == set(GAME.legal_actions(state))


def test_uct_fast_connect_four_playouts_equal_the_generic_ones():
    generic = NotConnectFour()
    for i, state in enumerate(random_positions(8, seed=3)):
        fast = _uct_visit_counts(GAME, state, 60, 1.4, np.random.default_rng(i))
        slow = _uct_visit_counts(generic, state, 60, 1.4, np.random.default_rng(i))
        assert fast == slow


async def test_uct_beats_random_decisively():
    result = await play_match(GAME, UCTPlayer(40), RandomPlayer(), num_games=10, seed=0)
    assert result.wins >= 9


async def test_one_ply_beats_random():
    result = await play_match(GAME, OnePlyPlayer(), RandomPlayer(), num_games=20, seed=0)
    assert result.score >= 0.8


async def test_policy_player_plays_the_best_legal_logit_lowest_on_ties():
    async def evaluate(x):
        assert x.shape == (1, 2, 6, 7)
        # Column 6 has the top logit but is full; columns 1 and 2 tie.
        return np.array([[0.0, 5.0, 5.0, 1.0, 1.0, 1.0, 9.0]]), np.zeros((1, 1))

    assert await PolicyPlayer(evaluate).choose(GAME, FULL_COLUMNS,
                                               np.random.default_rng(0)) == 1


async def test_policy_player_follows_the_network():
    player = PolicyPlayer(asr.immediate(NET))
    for state in random_positions(10):
        logits = NET(GAME.encode([state]))[0][0]
        legal = GAME.legal_actions(state)
        expected = legal[int(np.argmax([logits[a] for a in legal]))]
        assert await player.choose(GAME, state, np.random.default_rng(0)) == expected


async def test_policy_player_rejects_a_model_without_a_policy():
    async def evaluate(x):
        return np.zeros((1, 1))

    with pytest.raises(ModelOutputError, match="policy-value"):
        await PolicyPlayer(evaluate).choose(GAME, GAME.initial_state(),
                                            np.random.default_rng(0))


async def test_mcts_player_plays_legal_deterministic_moves():
    player = MCTSPlayer(asr.immediate(NET), simulations=16, num_parallel=4)
    assert player.name == "mcts"
    for state in random_positions(5):
        first = await player.choose(GAME, state, np.random.default_rng(0))
        again = await player.choose(GAME, state, np.random.default_rng(1))
        assert first in GAME.legal_actions(state) and first == again


async def test_mcts_players_batch_through_a_server_in_a_match():
    async with asr.serve(NET) as evaluate:
        player = MCTSPlayer(evaluate, simulations=8, num_parallel=4)
        result = await play_match(GAME, player, RandomPlayer(), num_games=4, seed=0)
        stats = evaluate.stats
    assert result.games == 4
    assert stats["mean_batch_size"] > 4   # requests of several games met in batches


# -- matches ---------------------------------------------------------------------------


async def test_play_match_alternates_who_moves_first_and_seeds_game_k():
    log = []
    await play_match(GAME, Recorder("A", log), Recorder("B", log), num_games=6, seed=5)
    first_draws = {np.random.default_rng([5, k]).random(): k for k in range(6)}
    openers = {first_draws[draw]: name for name, state, draw in log if stones(state) == 0}
    assert openers == {0: "A", 1: "B", 2: "A", 3: "B", 4: "A", 5: "B"}


async def test_play_match_is_deterministic_for_a_seed():
    async def moves(seed):
        log = []
        a, b = Recorder("A", log), Recorder("B", log)
        result = await play_match(GAME, a, b, num_games=4, seed=seed, opening_moves=3)
        return result, [(name, state) for name, state, _ in log]

    assert await moves(1) == await moves(1)
    assert (await moves(1))[1] != (await moves(2))[1]
    first = await play_match(GAME, UCTPlayer(10), RandomPlayer(), num_games=6, seed=3)
    second = await play_match(GAME, UCTPlayer(10), RandomPlayer(), num_games=6, seed=3)
    assert first == second


async def test_play_match_scores_from_the_first_players_view():
    result = await play_match(GAME, RandomPlayer(), OnePlyPlayer(), num_games=10, seed=0)
    swapped = await play_match(GAME, OnePlyPlayer(), RandomPlayer(), num_games=10, seed=0)
    assert result.losses >= 7 and swapped.wins >= 7
    assert result.games == swapped.games == 10


async def test_a_player_against_itself_is_scored_by_side_not_by_object():
    player = RandomPlayer()
    itself = await play_match(GAME, player, player, num_games=12, seed=4)
    twin = await play_match(GAME, player, RandomPlayer(), num_games=12, seed=4)
    assert itself == twin and itself.losses > 0


async def test_opening_moves_give_each_pair_the_same_random_opening():
    log = []
    a, b = Recorder("A", log), Recorder("B", log)
    await play_match(GAME, a, b, num_games=4, seed=2, opening_moves=4)
    first_draws = {np.random.default_rng([2, k]).random(): k for k in range(4)}
    takeovers = {first_draws[draw]: (name, state) for name, state, draw in log
                 if draw in first_draws and stones(state) == 4}
    for j in range(2):
        rng = np.random.default_rng([2, j, 999])
        expected = GAME.initial_state()
        for _ in range(4):
            legal = GAME.legal_actions(expected)
            expected = GAME.play(expected, legal[int(rng.integers(len(legal)))])
        # Same opening in games 2j and 2j+1; the first player's side goes to A in the
        # even game and to B in the odd one.
        assert takeovers[2 * j] == ("A", expected)
        assert takeovers[2 * j + 1] == ("B", expected)
    assert takeovers[0][1] != takeovers[2][1]


async def test_on_game_is_called_once_per_game():
    calls = []
    await play_match(GAME, RandomPlayer(), RandomPlayer(), num_games=5,
                     on_game=lambda: calls.append(1))
    assert len(calls) == 5


async def test_an_illegal_action_names_the_player_and_the_action():
    class Cheat:
        name = "cheat"

        async def choose(self, game, state, rng):
            return 99

    with pytest.raises(ValueError, match=r"'cheat'.*99"):
        await play_match(GAME, RandomPlayer(), Cheat(), num_games=2)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_games=0), "num_games"), (dict(num_games=2.5), "num_games"),
    (dict(num_games=True), "num_games"), (dict(num_games=2, opening_moves=-1),
                                          "opening_moves"),
    (dict(num_games=2, opening_moves=1.0), "opening_moves"),
    (dict(num_games=2, seed=-1), "seed"), (dict(num_games=2, on_game=3), "on_game"),
])
async def test_play_match_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        await play_match(GAME, RandomPlayer(), RandomPlayer(), **kwargs)


async def test_play_match_rejects_a_non_player():
    with pytest.raises(ValueError, match="opponent must be a Player"):
        await play_match(GAME, RandomPlayer(), "random", num_games=2)


@pytest.mark.parametrize("make", [
    lambda: UCTPlayer(0), lambda: UCTPlayer(10, c=-1.0), lambda: UCTPlayer(2.5),
    lambda: MCTSPlayer(asr.immediate(NET), simulations=0),
    lambda: MCTSPlayer(asr.immediate(NET), num_parallel=0),
    lambda: MCTSPlayer(asr.immediate(NET), c_puct=0.0),
    lambda: MCTSPlayer(None), lambda: PolicyPlayer(None),
])
def test_players_reject_bad_arguments(make):
    with pytest.raises(ValueError):
        make()


# -- results, gating, ratings -------------------------------------------------------------


def test_match_result_counts_and_score():
    result = MatchResult(wins=24, draws=6, losses=10)
    assert (result.games, result.score) == (40, 0.675)
    assert result.describe() == "+24 =6 -10 of 40: score 0.675, Elo +127"
    with pytest.raises(ValueError, match="wins"):
        MatchResult(wins=-1, draws=0, losses=3)
    with pytest.raises(ValueError, match="at least one game"):
        MatchResult(0, 0, 0)
    with pytest.raises(Exception):
        result.wins = 3  # frozen


@pytest.mark.parametrize("wins, draws, losses, kwargs, promoted", [
    (22, 0, 18, {}, True),                       # 22 / 40 = 0.55 exactly
    (20, 4, 16, {}, True),                       # 22 / 40 with draws
    (21, 1, 18, {}, False),                      # 21.5 / 40 = 0.5375
    (21, 0, 19, {}, False),                      # 0.525
    (11, 0, 9, {}, False),                       # 0.55 over 20 < min_games
    (11, 0, 9, dict(min_games=20), True),
    (39, 0, 0, {}, False),                       # all wins, but 39 games
    (30, 0, 10, dict(threshold=0.75), True),
    (29, 1, 10, dict(threshold=0.75), False),
    (0, 0, 40, dict(threshold=0.0), True),
    (40, 0, 0, dict(threshold=1.0), True),
    (39, 1, 0, dict(threshold=1.0), False),
])
def test_gate_arithmetic(wins, draws, losses, kwargs, promoted):
    assert gate(MatchResult(wins, draws, losses), **kwargs) is promoted


@pytest.mark.parametrize("kwargs", [dict(threshold=1.5), dict(threshold=-0.1),
                                    dict(threshold=math.nan), dict(min_games=0),
                                    dict(min_games=2.0)])
def test_gate_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        gate(MatchResult(22, 0, 18), **kwargs)
    with pytest.raises(ValueError, match="MatchResult"):
        gate(0.6)


def test_elo_difference():
    assert elo_difference(0.5) == 0.0
    assert elo_difference(0.76) == pytest.approx(200.0, abs=1.0)
    assert elo_difference(0.3) == pytest.approx(-elo_difference(0.7), abs=1e-9)
    assert elo_difference(1.0) == pytest.approx(elo_difference(1 - 1e-3))
    assert elo_difference(0.0) == pytest.approx(-elo_difference(1.0))
    assert elo_difference(1.0, games=40) == pytest.approx(elo_difference(1 - 1 / 80))
    assert elo_difference(0.0, games=40) == pytest.approx(-elo_difference(1.0, 40))
    assert elo_difference(1.0, games=1) == 0.0
    for bad in (dict(score=1.2), dict(score=-0.1), dict(score=0.5, games=0)):
        with pytest.raises(ValueError):
            elo_difference(**bad)


def test_fit_rating_recovers_a_known_rating():
    true, games = 300.0, 4000
    results = []
    for opponent in (RANDOM_RATING, 200.0, 400.0, 600.0):
        expected = 1 / (1 + 10 ** ((opponent - true) / 400))
        wins = round(expected * games)
        results.append((opponent, MatchResult(wins=wins, draws=0, losses=games - wins)))
    assert fit_rating(results) == pytest.approx(true, abs=3.0)
    # Draws count half: the same scores as draws give the same rating.
    one = fit_rating([(100.0, MatchResult(30, 0, 10))])
    assert fit_rating([(100.0, MatchResult(20, 20, 0))]) == pytest.approx(one)
    assert one == pytest.approx(100.0 + elo_difference(30.25 / 40.5), abs=1e-6)


def test_fit_rating_is_finite_for_all_wins_and_all_losses():
    high = fit_rating([(0.0, MatchResult(40, 0, 0))])
    low = fit_rating([(0.0, MatchResult(0, 0, 40))])
    assert math.isfinite(high) and math.isfinite(low)
    assert high > 400 and low == pytest.approx(-high)
    assert fit_rating([(0.0, MatchResult(10, 0, 0))]) < high


@pytest.mark.parametrize("results", [[], [(0.0, 0.5)], [(math.inf, MatchResult(1, 0, 1))],
                                     [0.0]])
def test_fit_rating_rejects_bad_results(results):
    with pytest.raises(ValueError):
        fit_rating(results)
