import asyncio

import pytest

import async_search as asr
from async_search import problems
from async_search.experiments.selfplay import (SelfPlayParams, play_game, play_slot,
                                               samples_digest, slot_quota)

PARAMS = SelfPlayParams(num_samples=30, simulations=8, num_parallel=4,
                        games_per_client=2, sampling_moves=4)


@pytest.fixture(scope="module")
def game():
    return problems.ConnectFour()


@pytest.fixture(scope="module")
def net(game):
    return problems.PolicyValueMLP(game, hidden_sizes=(16,), seed=0)


def test_a_game_is_deterministic_and_ends(game, net):
    a = asyncio.run(play_game(game, asr.immediate(net), game_id=3, params=PARAMS))
    b = asyncio.run(play_game(game, asr.immediate(net), game_id=3, params=PARAMS))
    c = asyncio.run(play_game(game, asr.immediate(net), game_id=4, params=PARAMS))
    assert a == b and a != c
    assert 7 <= len(a) <= 42
    assert a[0].state == game.initial_state()
    assert all(sum(s.visit_counts) == PARAMS.simulations for s in a)


def test_outcomes_alternate_and_the_last_mover_won_or_drew(game, net):
    samples = asyncio.run(play_game(game, asr.immediate(net), game_id=0, params=PARAMS))
    outcomes = [s.outcome for s in samples]
    assert outcomes[-1] in (1.0, 0.0)  # the last player to move won (or drew)
    assert all(a == -b for a, b in zip(outcomes, outcomes[1:]))


def test_a_slot_plays_until_its_quota(game, net):
    samples = asyncio.run(play_slot(game, asr.immediate(net), slot=1, num_slots=4,
                                    params=PARAMS))
    assert len(samples) >= slot_quota(PARAMS.num_samples, 4) == 8


def test_batched_self_play_equals_the_baseline(game, net):
    async def slots(evaluate):
        return await asyncio.gather(*(play_slot(game, evaluate, slot=s, num_slots=2,
                                                params=PARAMS) for s in range(2)))

    async def served():
        async with asr.serve(net) as evaluate:
            return await slots(evaluate)
    baseline = asyncio.run(slots(asr.immediate(net)))
    assert samples_digest(asyncio.run(served()), 30) == samples_digest(baseline, 30)
    assert samples_digest(baseline, 30) != samples_digest(baseline, 29)


def test_bad_params_are_refused():
    with pytest.raises(ValueError, match="simulations must be an integer >= 1, got 0"):
        SelfPlayParams(simulations=0).check()
