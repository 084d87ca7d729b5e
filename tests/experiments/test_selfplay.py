"""Slots of training's self-play games (the games themselves: tests/training)."""

import asyncio

import pytest

import async_search as asr
from async_search import problems
from async_search.experiments.selfplay import (SamplesConfig, play_slot, samples_digest,
                                               slot_quota)
from async_search.training.selfplay import SelfPlayConfig, selfplay_game

CONFIG = SamplesConfig(num_samples=30, games_per_client=2,
                       selfplay=SelfPlayConfig(simulations=8, num_parallel=4,
                                               sampling_moves=4))


@pytest.fixture(scope="module")
def game():
    return problems.ConnectFour()


@pytest.fixture(scope="module")
def net(game):
    return problems.PolicyValueMLP(game, hidden_sizes=(16,), seed=0)


def test_a_slot_plays_training_games_in_turn_until_its_quota(game, net):
    records = asyncio.run(play_slot(game, asr.immediate(net), slot=1, num_slots=4,
                                    config=CONFIG))
    assert sum(len(r.moves) for r in records) >= slot_quota(CONFIG.num_samples, 4) == 8
    # Game ids 1, 5, 9, ...: the slot's games are training's games of those ids.
    first = asyncio.run(selfplay_game(1, asr.immediate(net), game=game,
                                      config=CONFIG.selfplay))
    assert records[0].moves == first.moves
    assert records[0].x.tobytes() == first.x.tobytes()


def test_a_slot_reports_each_game_it_finishes(game, net):
    seen = []
    records = asyncio.run(play_slot(game, asr.immediate(net), slot=0, num_slots=4,
                                    config=CONFIG, on_game=seen.append))
    assert seen == [len(r.moves) for r in records]


def test_batched_self_play_equals_the_baseline(game, net):
    async def slots(evaluate):
        return await asyncio.gather(*(play_slot(game, evaluate, slot=s, num_slots=2,
                                                config=CONFIG) for s in range(2)))

    async def served():
        async with asr.serve(net) as evaluate:
            return await slots(evaluate)
    baseline = asyncio.run(slots(asr.immediate(net)))
    assert samples_digest(asyncio.run(served()), 30) == samples_digest(baseline, 30)
    assert samples_digest(baseline, 30) != samples_digest(baseline, 29)
    assert samples_digest(baseline, 30) != samples_digest(baseline[::-1], 30)


@pytest.mark.parametrize("fields, words", [
    (dict(num_samples=0), "num_samples must be an integer >= 1, got 0"),
    (dict(games_per_client=-1), "games_per_client must be an integer >= 1"),
    (dict(selfplay={"simulations": 8}), "selfplay must be a training.SelfPlayConfig"),
])
def test_a_bad_samples_config_is_refused(fields, words):
    with pytest.raises(ValueError, match=words):
        SamplesConfig(**fields)
