"""Players: baselines and network players choose legal moves, deterministically."""

import asyncio

import numpy as np
import pytest

import async_search as asr
from async_search import problems
from async_search.errors import ModelOutputError
from async_search.training.arena import play_match
from async_search import search
from async_search.training.players import (GumbelPlayer, KeptTrees, MCTSPlayer, OnePlyPlayer,
                                           Player, PolicyPlayer, RandomPlayer, UCTPlayer,
                                           _uct_visit_counts)

GAME = problems.ConnectFour()
NET = problems.PolicyValueMLP(GAME, hidden_sizes=(64,), seed=0)
WIN_AT_3 = GAME.from_moves([0, 6, 1, 6, 2, 5])       # first player to move wins at 3
BLOCK_AT_3 = GAME.from_moves([0, 6, 1, 6, 2])        # second player must block column 3
WIN_OR_BLOCK = GAME.from_moves([0, 6, 1, 6, 2, 6])   # win at 3, opponent threatens 6
FULL_COLUMNS = GAME.from_moves([0, 0, 0, 0, 0, 0, 6, 6, 6, 6, 6, 6])  # 0 and 6 full


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


class NotConnectFour:
    """ConnectFour behind a wrapper: UCT cannot take its bitboard fast path."""

    def __init__(self):
        self.game = problems.ConnectFour()

    def __getattr__(self, name):
        return getattr(self.game, name)


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


@pytest.mark.parametrize("bad", [np.nan, np.inf])
async def test_policy_player_refuses_a_nan_or_inf_legal_logit_as_the_search_does(bad):
    logits = np.array([[bad, 0.0, 9.0, 0.0, 0.0, 0.0, 0.0]], np.float32)

    async def evaluate(x):
        return logits, np.zeros((1, 1), np.float32)

    state = GAME.initial_state()
    with pytest.raises(ModelOutputError, match="NaN or \\+inf"):
        await PolicyPlayer(evaluate).choose(GAME, state, np.random.default_rng(0))
    with pytest.raises(ModelOutputError, match="NaN or \\+inf"):
        await MCTSPlayer(evaluate, simulations=4).choose(GAME, state,
                                                         np.random.default_rng(0))
    # Illegal actions' logits are ignored, as the search ignores them.
    logits[0, 0], logits[0, 6] = 0.0, bad
    assert await PolicyPlayer(evaluate).choose(GAME, FULL_COLUMNS,
                                               np.random.default_rng(0)) == 2


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


@pytest.mark.parametrize("capacity", [0, -1, "x", 2.5])
def test_kept_trees_refuse_a_capacity_that_is_no_count(capacity):
    # -1 failed at the first move kept (a KeyError from the empty table).
    with pytest.raises(ValueError, match="KeptTrees capacity must be an integer >= 1"):
        KeptTrees(capacity)


@pytest.mark.parametrize("make", [PolicyPlayer, MCTSPlayer, GumbelPlayer])
async def test_a_player_given_a_model_for_evaluate_says_to_wrap_it(make):
    # PolicyPlayer awaited the model's outputs: "object tuple can't be used in 'await'
    # expression", where the search players named the slip.
    with pytest.raises(TypeError, match=r"asr\.immediate\(model\)"):
        await make(NET).choose(GAME, GAME.initial_state(), np.random.default_rng(0))


async def test_mcts_player_plays_legal_deterministic_moves():
    player = MCTSPlayer(asr.immediate(NET), simulations=16, num_parallel=4)
    assert player.name == "mcts"
    for state in random_positions(5):
        first = await player.choose(GAME, state, np.random.default_rng(0))
        again = await player.choose(GAME, state, np.random.default_rng(1))
        assert first in GAME.legal_actions(state) and first == again


@pytest.mark.parametrize("make", [
    lambda: UCTPlayer(0), lambda: UCTPlayer(10, c=-1.0), lambda: UCTPlayer(2.5),
    lambda: MCTSPlayer(asr.immediate(NET), simulations=0),
    lambda: MCTSPlayer(asr.immediate(NET), num_parallel=0),
    lambda: MCTSPlayer(asr.immediate(NET), c_puct=0.0),
    lambda: MCTSPlayer(None), lambda: PolicyPlayer(None),
    lambda: MCTSPlayer(asr.immediate(NET), reuse_tree="yes"),
    lambda: GumbelPlayer(None), lambda: GumbelPlayer(asr.immediate(NET), simulations=0),
    lambda: GumbelPlayer(asr.immediate(NET), max_num_considered_actions=0),
    lambda: GumbelPlayer(asr.immediate(NET), c_scale=-1.0),
    lambda: GumbelPlayer(asr.immediate(NET), reuse_tree=1),
])
def test_players_reject_bad_arguments(make):
    with pytest.raises(ValueError):
        make()


# -- Gumbel search and tree reuse ----------------------------------------------------------


async def test_gumbel_player_plays_the_noiseless_searchs_action():
    player = GumbelPlayer(asr.immediate(NET), simulations=16, num_parallel=4)
    assert isinstance(player, Player) and player.name == "gumbel"
    for state in random_positions(5):
        move = await player.choose(GAME, state, np.random.default_rng(0))
        again = await player.choose(GAME, state, np.random.default_rng(1))
        r = await search.gumbel_mcts(GAME, state, asr.immediate(NET), num_simulations=16,
                                     num_parallel=4, gumbel_scale=0.0)
        assert move == again == r.action


async def test_gumbel_player_takes_an_immediate_win():
    player = GumbelPlayer(asr.immediate(problems.pretrained("connect_four")),
                          simulations=16)
    assert await player.choose(GAME, WIN_AT_3, np.random.default_rng(0)) == 3


def test_kept_trees_find_the_reply_by_its_state_for_the_same_game_only():
    ev = asr.immediate(NET)
    state = GAME.initial_state()
    r = asyncio.run(search.mcts(GAME, state, ev, num_simulations=64, keep_tree=True,
                                dirichlet_fraction=0.0))
    after = r.subtree(r.action)  # the tree after our move, as a player keeps it
    reply = max(after.edges(0), key=lambda e: after.edge_seen1[e])  # the most explored
    reply_state = after.node_state[after.edge_child[reply]]
    kept, game_rng, other_rng = KeptTrees(), np.random.default_rng(0), np.random.default_rng(0)
    kept.keep(after, game_rng)
    assert kept.take(reply_state, other_rng) is None  # another game's generator
    assert len(kept) == 1
    tree = kept.take(reply_state, game_rng)
    assert tree.node_state[0] == reply_state and len(kept) == 0
    expected = search.reuse.subtree(after, after.edge_action[reply])
    assert tree.num_nodes == expected.num_nodes > 1
    kept.keep(after, game_rng)
    assert kept.take(GAME.play(state, 3), game_rng) is None  # a state not below it
    kept.keep(after, game_rng)
    assert kept.take(after.node_state[0], game_rng) is after  # the player moves again
    small = KeptTrees(capacity=2)
    for seed in range(3):
        small.keep(after, np.random.default_rng(seed))
    assert len(small) == 2


@pytest.mark.parametrize("make", [
    lambda ev, reuse: MCTSPlayer(ev, simulations=64, num_parallel=2, reuse_tree=reuse),
    lambda ev, reuse: GumbelPlayer(ev, simulations=64, num_parallel=2, reuse_tree=reuse),
], ids=["mcts", "gumbel"])
def test_players_that_reuse_their_tree_search_from_the_kept_subtree(make, monkeypatch):
    ev = asr.immediate(NET)
    player = make(ev, True)
    name = "mcts" if isinstance(player, MCTSPlayer) else "gumbel_mcts"
    import async_search.training.players as players
    real, reused = getattr(players, name), []

    async def spy(game, state, evaluate, **kwargs):
        tree = kwargs["reuse"]
        reused.append(tree is not None and tree.node_state[0] == state)
        return await real(game, state, evaluate, **kwargs)

    monkeypatch.setattr(players, name, spy)
    result = asyncio.run(play_match(GAME, player, UCTPlayer(20), num_games=2, seed=0))
    # Replies the search never reached leave nothing to reuse; most were reached.
    assert result.games == 2 and sum(reused) > len(reused) // 3
    # Without reuse the player never passes a tree.
    reused.clear()
    asyncio.run(play_match(GAME, make(ev, False), UCTPlayer(20), num_games=2, seed=0))
    assert not any(reused)


@pytest.mark.parametrize("make", [
    lambda ev: MCTSPlayer(ev, simulations=16, num_parallel=2, reuse_tree=True),
    lambda ev: GumbelPlayer(ev, simulations=16, num_parallel=2, reuse_tree=True),
], ids=["mcts", "gumbel"])
def test_a_match_of_tree_reusing_players_through_serve_equals_one_with_immediate(make):
    # Concurrent games share the player object: each game must find its own tree.
    def match(ev):
        return play_match(GAME, make(ev), MCTSPlayer(ev, simulations=8, reuse_tree=True),
                          num_games=6, seed=3, opening_moves=2)

    async def served():
        async with asr.serve(NET, max_batch_size=16) as ev:
            return await match(ev)

    assert asyncio.run(served()) == asyncio.run(match(asr.immediate(NET)))
