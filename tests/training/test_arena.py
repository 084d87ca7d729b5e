"""The arena: matches between players, and the gate."""

import asyncio
import math

import numpy as np
import pytest

import async_search as asr
from async_search import problems
from async_search.training.arena import MatchGame, gate, play_games, play_match
from async_search.training.players import MCTSPlayer, OnePlyPlayer, RandomPlayer, UCTPlayer
from async_search.training.ratings import MatchResult

GAME = problems.ConnectFour()
NET = problems.PolicyValueMLP(GAME, hidden_sizes=(64,), seed=0)


def stones(state):
    return (state.to_move | state.waiting).bit_count()


class Recorder:
    """Plays the lowest legal action after one draw from rng, and records each call."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    async def choose(self, game, state, rng):
        draw = rng.random()
        self.log.append((self.name, state, draw))
        return game.legal_actions(state)[0]


async def test_mcts_players_batch_through_a_server_in_a_match():
    async with asr.serve(NET) as evaluate:
        player = MCTSPlayer(evaluate, simulations=8, num_parallel=4)
        result = await play_match(GAME, player, RandomPlayer(), num_games=4, seed=0)
        stats = evaluate.stats
    assert result.games == 4
    assert stats["mean_batch_size"] > 4   # requests of several games met in batches


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


async def test_play_games_records_the_games_that_play_match_scores():
    kwargs = dict(num_games=8, seed=6, opening_moves=3)
    records = await play_games(GAME, UCTPlayer(10), OnePlyPlayer(), **kwargs)
    result = await play_match(GAME, UCTPlayer(10), OnePlyPlayer(), **kwargs)
    assert [r.player_first for r in records] == [True, False] * 4
    assert result == MatchResult(wins=sum(r.outcome > 0 for r in records),
                                 draws=sum(r.outcome == 0 for r in records),
                                 losses=sum(r.outcome < 0 for r in records))
    for record in records:
        # The moves replay to a finished game whose value is the recorded outcome.
        state = GAME.from_moves(record.moves[:-1])
        assert GAME.legal_actions(state) and record.moves[-1] in GAME.legal_actions(state)
        final = GAME.play(state, record.moves[-1])
        assert not GAME.legal_actions(final)
        mover_value = GAME.terminal_value(final)
        expected = mover_value if record.player_moved(len(record.moves)) else -mover_value
        assert record.outcome == expected and record.opening_plies == 3


async def test_play_games_records_who_made_each_move():
    log = []
    records = await play_games(GAME, Recorder("A", log), Recorder("B", log), num_games=2,
                               seed=1, opening_moves=1)
    for record in records:
        # Recorder plays the lowest legal column: replay and ask who was asked where.
        state = GAME.from_moves(record.moves[:1])
        for ply in range(1, len(record.moves)):
            name = "A" if record.player_moved(ply) else "B"
            assert (name, state) in [(n, s) for n, s, _ in log]
            state = GAME.play(state, record.moves[ply])
    assert isinstance(records[0], MatchGame)


@pytest.mark.parametrize("fields, match", [
    (dict(moves=[0, 1]), "moves"), (dict(moves=(0, True)), "moves"),
    (dict(moves=(0, 1.0)), "moves"), (dict(moves=None), "moves"),
    (dict(opening_plies=3), "opening_plies"), (dict(opening_plies=-1), "opening_plies"),
    (dict(player_first=1), "player_first"), (dict(outcome=0.5), "outcome"),
    (dict(outcome=True), "outcome"), (dict(outcome=float("nan")), "outcome"),
])
def test_a_match_game_refuses_malformed_fields(fields, match):
    good = dict(moves=(0, 1), opening_plies=0, player_first=True, outcome=0.0)
    MatchGame(**good)
    with pytest.raises(ValueError, match=match):
        MatchGame(**{**good, **fields})


class Stuck:
    """Never answers; counts the calls cancelled."""

    name = "stuck"

    def __init__(self):
        self.cancelled = 0

    async def choose(self, game, state, rng):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


class Raising:
    name = "raising"

    async def choose(self, game, state, rng):
        raise KeyError("odd")


async def test_a_player_that_raises_ends_the_match_and_no_game_plays_on():
    stuck = Stuck()
    # Game 0: Raising moves first and raises; game 1: Stuck moves first and waits.
    with pytest.raises(KeyError, match="odd"):
        await asyncio.wait_for(play_games(GAME, Raising(), stuck, num_games=2), 5)
    assert stuck.cancelled == 1


async def test_cancelling_a_match_cancels_every_game():
    stuck = Stuck()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(play_match(GAME, stuck, stuck, num_games=3), 0.2)
    assert stuck.cancelled == 3


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


async def test_play_match_refuses_a_plain_choose_and_what_is_no_game():
    # A choose that is no coroutine failed at its await ("object int can't be used in
    # 'await' expression"), and game=None with an AttributeError.
    class Plain:
        name = "plain"

        def choose(self, game, state, rng):
            return 0

    with pytest.raises(ValueError, match="opponent must be a Player.*async"):
        await play_match(GAME, RandomPlayer(), Plain(), num_games=2)
    with pytest.raises(TypeError, match="game must be a Game"):
        await play_match(None, RandomPlayer(), RandomPlayer(), num_games=2)


def test_tally_refuses_what_is_no_match_game():
    from async_search.training.arena import tally

    with pytest.raises(ValueError, match="tally takes MatchGame records"):
        tally([1])


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
    with pytest.raises(ValueError, match=match):
        await play_games(GAME, RandomPlayer(), RandomPlayer(), **kwargs)


async def test_play_match_rejects_a_non_player():
    with pytest.raises(ValueError, match="opponent must be a Player"):
        await play_match(GAME, RandomPlayer(), "random", num_games=2)


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
