"""move_accuracy on trivial choosers, and the network choosers (policy alone, MCTS)."""

import asyncio
from typing import NamedTuple, Tuple

import numpy as np
import pytest

import async_search as asr
from async_search.errors import ModelOutputError
from async_search.problems import ConnectFour, connect_four_positions, pretrained
from async_search.search.accuracy import (LabelledPosition, MoveAccuracy, gumbel_chooser,
                                          mcts_chooser, move_accuracy, policy_chooser)

GAME = ConnectFour()


@pytest.fixture(scope="module")
def positions():
    return connect_four_positions("end")[90:110]  # random and self-play-like games


def wrong_move(position):
    return next(a for a in GAME.legal_actions(position.state)
                if a not in position.optimal_moves)


async def test_an_oracle_scores_one_and_an_anti_oracle_zero(positions):
    oracle = {p.state: p.optimal_moves[-1] for p in positions}
    right = await move_accuracy(oracle.__getitem__, positions)
    assert right == MoveAccuracy(accuracy=1.0, correct=20, positions=20,
                                 chosen=tuple(oracle[p.state] for p in positions),
                                 mistakes=())
    anti = {p.state: wrong_move(p) for p in positions}
    wrong = await move_accuracy(anti.__getitem__, positions)
    assert (wrong.accuracy, wrong.correct, wrong.mistakes) == (0.0, 0, tuple(range(20)))


async def test_the_fraction_counts_the_optimal_choices(positions):
    half = {p.state: p.optimal_moves[0] if i % 4 else wrong_move(p)
            for i, p in enumerate(positions)}
    result = await move_accuracy(half.__getitem__, positions)
    assert result.accuracy == 15 / 20 and result.correct == 15
    assert result.mistakes == (0, 4, 8, 12, 16)


async def test_an_awaitable_chooser_is_awaited_and_asked_concurrently(positions):
    waiting = []

    async def choose(state):
        waiting.append(state)
        await asyncio.sleep(0)
        assert len(waiting) == len(positions)  # all asked before any answered
        return {p.state: p.optimal_moves[0] for p in positions}[state]

    result = await asyncio.wait_for(move_accuracy(choose, positions), 10)
    assert result.accuracy == 1.0


async def test_a_failing_chooser_fails_the_call_and_cancels_the_other_questions(
        positions):
    ended = []

    async def choose(state):
        try:
            if state == positions[3].state:
                raise KeyError("no move")
            await asyncio.sleep(60)
            return 0
        finally:
            ended.append(state)

    with pytest.raises(KeyError, match="no move"):
        await asyncio.wait_for(move_accuracy(choose, positions), 10)
    assert len(ended) == len(positions)  # every question ended with the call


async def test_an_illegal_move_is_a_mistake(positions):
    full = [p for p in connect_four_positions("end")
            if len(GAME.legal_actions(p.state)) < 7][:5]
    illegal = {p.state: next(a for a in range(7) if a not in GAME.legal_actions(p.state))
               for p in full}
    result = await move_accuracy(illegal.__getitem__, full)
    assert result.accuracy == 0.0 and result.positions == 5


async def test_any_labelled_positions_will_do():
    class Labelled(NamedTuple):
        state: str
        optimal_moves: Tuple[int, ...]

    items = [Labelled("a", (0, 1)), Labelled("b", (2,)), Labelled("c", (3,))]
    assert all(isinstance(i, LabelledPosition) for i in items)
    result = await move_accuracy(lambda s: {"a": 1, "b": 2, "c": 0}[s], items)
    assert result.chosen == (1, 2, 0) and result.mistakes == (2,)
    assert (await move_accuracy(lambda s: 0, [])).positions == 0


@pytest.mark.parametrize("bad", [1.0, True, "3", None])
async def test_a_move_that_is_not_an_integer_is_refused(positions, bad):
    with pytest.raises(ValueError, match="integer action"):
        await move_accuracy(lambda s: bad, positions)


async def test_a_chooser_that_is_not_callable_is_refused(positions):
    with pytest.raises(ValueError, match="callable"):
        await move_accuracy(3, positions)


# -- the network choosers -----------------------------------------------------------------

def fixed_logits(row, value=0.0):
    async def evaluate(x):
        n = len(x)
        return (np.tile(np.asarray(row, np.float32), (n, 1)),
                np.full((n, 1), value, np.float32))
    return evaluate


async def test_the_policy_chooser_takes_the_best_legal_logit():
    state = GAME.from_moves([6] * 6)                 # column 6 full
    choose = policy_chooser(GAME, fixed_logits([0, 1, 5, 2, 5, 0, 9]))
    assert await choose(state) == 2                  # 6 is illegal; a tie goes low
    assert await choose(GAME.initial_state()) == 6


@pytest.mark.parametrize("output", [
    np.zeros((1, 7)), (np.zeros((1, 6)), np.zeros((1, 1))), (np.zeros((2, 7)),)])
async def test_the_policy_chooser_names_a_malformed_output(output):
    async def evaluate(x):
        return output
    with pytest.raises(ModelOutputError):
        await policy_chooser(GAME, evaluate)(GAME.initial_state())


async def test_mcts_takes_a_win_the_prior_ignores():
    state = GAME.from_moves([0, 6, 0, 6, 0, 5])      # column 0 wins at once
    choose = mcts_chooser(GAME, fixed_logits([0, 0, 0, 0, 0, 0, 9]), num_simulations=64)
    assert await choose(state) == 0


async def test_the_shipped_net_scores_the_same_served_or_immediate(positions):
    net = pretrained("connect_four")
    immediate = asr.immediate(net)
    alone = await move_accuracy(policy_chooser(GAME, immediate), positions)
    searched = await move_accuracy(mcts_chooser(GAME, immediate, num_simulations=32),
                                   positions)
    async with asr.serve(net, max_batch_size=256) as evaluate:
        assert await asyncio.wait_for(move_accuracy(policy_chooser(GAME, evaluate),
                                                    positions), 60) == alone
        assert await asyncio.wait_for(move_accuracy(
            mcts_chooser(GAME, evaluate, num_simulations=32), positions), 60) == searched


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_simulations=0), "num_simulations"), (dict(num_parallel=0), "num_parallel"),
    (dict(c_puct=0.0), "c_puct")])
def test_mcts_chooser_checks_its_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mcts_chooser(GAME, fixed_logits([0] * 7), **kwargs)
    with pytest.raises(ValueError, match="evaluate"):
        mcts_chooser(GAME, None)
    with pytest.raises(ValueError, match="evaluate"):
        policy_chooser(GAME, None)


@pytest.mark.parametrize("chooser", [policy_chooser, mcts_chooser, gumbel_chooser])
def test_every_chooser_refuses_what_is_no_game_by_name(chooser):
    # policy_chooser alone took them: an AttributeError (num_actions) for a puzzle, and
    # for the class, a TypeError at the first position from inside check_state.
    from async_search.problems import SlidingPuzzle

    with pytest.raises(TypeError, match="without legal_actions, play, terminal_value"):
        chooser(SlidingPuzzle(3), fixed_logits([0] * 7))
    with pytest.raises(TypeError, match="got the class ConnectFour"):
        chooser(ConnectFour, fixed_logits([0] * 7))


async def test_mcts_chooser_is_mcts_without_root_noise(positions):
    from async_search.search import mcts

    evaluate = asr.immediate(pretrained("connect_four"))
    actions = {}
    for c_puct in (0.25, 8.0):
        choose = mcts_chooser(GAME, evaluate, num_simulations=24, num_parallel=4,
                              c_puct=c_puct)
        for p in positions:
            result = await mcts(GAME, p.state, evaluate, num_simulations=24,
                                num_parallel=4, c_puct=c_puct, dirichlet_fraction=0.0)
            assert await choose(p.state) == result.action
            actions.setdefault(c_puct, []).append(result.action)
    assert actions[0.25] != actions[8.0]  # c_puct matters on these positions


# -- the Gumbel chooser ---------------------------------------------------------------------


async def test_gumbel_takes_a_win_the_prior_ignores():
    state = GAME.from_moves([0, 6, 0, 6, 0, 5])      # column 0 wins at once
    # sigma(q) outweighs a prior gap of 2 nats, not an unbounded one: the improved
    # policy is softmax(logits + sigma(q)).
    choose = gumbel_chooser(GAME, fixed_logits([0, 0, 0, 0, 0, 0, 2]), num_simulations=64)
    assert await choose(state) == 0
    assert await policy_chooser(GAME, fixed_logits([0, 0, 0, 0, 0, 0, 2]))(state) == 6


async def test_gumbel_chooser_is_gumbel_search_without_noise(positions):
    from async_search.search import gumbel_mcts

    evaluate = asr.immediate(pretrained("connect_four"))
    actions = {}
    for c_scale in (0.0, 1.0):
        choose = gumbel_chooser(GAME, evaluate, num_simulations=16, num_parallel=4,
                                c_scale=c_scale)
        for p in positions:
            result = await gumbel_mcts(GAME, p.state, evaluate, num_simulations=16,
                                       num_parallel=4, c_scale=c_scale, gumbel_scale=0.0)
            assert await choose(p.state) == result.action
            actions.setdefault(c_scale, []).append(result.action)
    assert actions[0.0] != actions[1.0]  # the values matter on these positions


async def test_gumbel_scores_the_same_served_or_immediate(positions):
    net = pretrained("connect_four")
    searched = await move_accuracy(gumbel_chooser(GAME, asr.immediate(net),
                                                  num_simulations=16), positions)
    async with asr.serve(net, max_batch_size=256) as evaluate:
        assert await asyncio.wait_for(move_accuracy(
            gumbel_chooser(GAME, evaluate, num_simulations=16), positions), 60) == searched


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_simulations=0), "num_simulations"), (dict(num_parallel=0), "num_parallel"),
    (dict(max_num_considered_actions=0), "max_num_considered_actions"),
    (dict(c_visit=-1.0), "c_visit"), (dict(c_scale=-1.0), "c_scale")])
def test_gumbel_chooser_checks_its_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gumbel_chooser(GAME, fixed_logits([0] * 7), **kwargs)
    with pytest.raises(ValueError, match="evaluate"):
        gumbel_chooser(GAME, None)



async def test_the_policy_chooser_refuses_nan_logits_on_the_legal_moves():
    choose = policy_chooser(GAME, fixed_logits([np.nan] * 7))
    with pytest.raises(ModelOutputError, match="finite"):
        await choose(GAME.initial_state())


async def test_the_policy_chooser_says_a_finished_game_has_no_move_and_asks_nothing():
    asked = []

    async def evaluate(x):
        asked.append(len(x))
        return np.zeros((len(x), 7), np.float32), np.zeros((len(x), 1), np.float32)

    state = GAME.from_moves([0, 1, 0, 1, 0, 1, 0])  # four in column 0: over
    assert GAME.is_terminal(state)
    with pytest.raises(ValueError, match="the game is over"):
        await policy_chooser(GAME, evaluate)(state)
    assert asked == []
