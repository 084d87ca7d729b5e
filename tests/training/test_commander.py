"""The commander: iterations, checkpoints, resume after a stop or a crash, pushes."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import numpy as np
import pytest

from async_search.training import (Commander, CommanderConfig, SelfPlayConfig,
                                   read_checkpoint)

pytestmark = pytest.mark.timeout(300)


def tiny(iterations: int = 2, **changes) -> CommanderConfig:
    config = CommanderConfig(
        iterations=iterations, games_per_iteration=4,
        selfplay=SelfPlayConfig(simulations=4, num_parallel=2, sampling_moves=4),
        train_steps=6, batch_size=16, buffer_capacity=2000, hidden_sizes=(16,),
        arena_games=4, eval_games=2, eval_simulations=4, uct_rollouts=4,
        max_batch_size=64, seed=3, backend="local", num_procs=1)
    return dataclasses.replace(config, **changes)


def run(commander: Commander):
    return asyncio.run(commander.run())


def same_run(a: Commander, b: Commander) -> None:
    """Equal weights, buffers and records (timings aside)."""
    for (wa, ba), (wb, bb) in zip(a.trainer.weights, b.trainer.weights):
        np.testing.assert_array_equal(wa, wb)
        np.testing.assert_array_equal(ba, bb)
    xa, pa, za = a.buffer.arrays()
    xb, pb, zb = b.buffer.arrays()
    np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(pa, pb)
    np.testing.assert_array_equal(za, zb)
    timing = ("selfplay_s", "samples_per_s", "s_per_1000_samples", "train_s", "eval_s",
              "iteration_s")

    def strip(r):
        return {k: v for k, v in dataclasses.asdict(r).items() if k not in timing}

    assert [strip(r) for r in a.history] == [strip(r) for r in b.history]
    assert a.best_version == b.best_version


def test_iterations_fill_the_buffer_train_and_record_every_phase(tmp_path):
    commander = Commander(tiny(), str(tmp_path))
    records = run(commander)
    assert [r.iteration for r in records] == [1, 2]
    assert len(commander.buffer) == sum(r.samples for r in records) > 0
    for r in records:
        assert r.samples > 0 and r.samples_per_s > 0 and r.train_s > 0
        assert 0.0 <= r.arena_score <= 1.0
        assert set(r.scores) == {"one_ply", "uct4", "policy_vs_random"}
        assert np.isfinite([r.policy_loss, r.value_loss, r.l2_loss]).all()
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["iteration"] == 2 and len(state["history"]) == 2
    assert read_checkpoint(tmp_path / "best").metadata["version"] == commander.best_version


def test_a_resumed_run_continues_the_same_sequence(tmp_path):
    straight = Commander(tiny(3), str(tmp_path / "a"))
    run(straight)
    first = Commander(tiny(1), str(tmp_path / "b"))
    run(first)
    resumed = Commander(tiny(3), str(tmp_path / "b"), resume=True)
    assert resumed.iteration == 1
    run(resumed)
    same_run(straight, resumed)


def test_an_iteration_that_crashes_resumes_from_the_checkpoint_with_no_sample_lost(
        tmp_path):
    straight = Commander(tiny(2), str(tmp_path / "a"))
    run(straight)
    crashing = Commander(tiny(2), str(tmp_path / "b"))
    real = crashing.trainer.train_steps
    calls = {"n": 0}

    def train_steps(buffer, n):
        calls["n"] += 1
        if crashing.iteration == 1:  # the second iteration crashes while training
            raise RuntimeError("injected crash in training")
        return real(buffer, n)

    crashing.trainer.train_steps = train_steps
    with pytest.raises(RuntimeError, match="injected crash"):
        run(crashing)
    state = json.loads((tmp_path / "b" / "state.json").read_text())
    assert state["iteration"] == 1 and state["phase_done"] == "selfplay"
    resumed = Commander(tiny(2), str(tmp_path / "b"), resume=True)
    # The crashed iteration's self-play samples were saved before it crashed.
    assert len(resumed.buffer) == len(straight.buffer)
    run(resumed)
    same_run(straight, resumed)


def test_resume_refuses_other_parameters_and_a_missing_run(tmp_path):
    run(Commander(tiny(1), str(tmp_path)))
    with pytest.raises(ValueError, match="train_steps"):
        Commander(tiny(2, train_steps=7), str(tmp_path), resume=True)
    with pytest.raises(ValueError, match="state.json"):
        Commander(tiny(1), str(tmp_path / "nothing"), resume=True)


def test_a_promotion_reaches_every_registered_server_with_its_version(tmp_path):
    commander = Commander(tiny(2, gate_threshold=0.0), str(tmp_path))
    received = []

    class Sync:
        def update_model(self, model, version):
            received.append(("sync", version, model))

    class Async:
        async def update_model(self, model, version):
            await asyncio.sleep(0)
            received.append(("async", version, model))

    commander.add_target(Sync())
    commander.add_target(Async())
    records = run(commander)
    assert all(r.promoted for r in records)  # threshold 0 promotes every candidate
    assert [(kind, version) for kind, version, _ in received] == [
        ("sync", 1), ("async", 1), ("sync", 2), ("async", 2)]
    assert received[-1][2] is commander.best
    # Two registered targets and the commander's own evaluation server.
    assert [r.pushed_to for r in records] == [3, 3]


def test_without_a_promotion_nothing_is_pushed_and_the_best_stays(tmp_path):
    commander = Commander(tiny(1, gate_threshold=1.0, arena_games=4), str(tmp_path))
    best = commander.best
    received = []

    class Target:
        def update_model(self, model, version):
            received.append(version)

    commander.add_target(Target())
    (record,) = run(commander)
    if record.arena_score < 1.0:
        assert not record.promoted and record.pushed_to == 0
        assert received == [] and commander.best is best and commander.best_version == 0
    else:  # a clean sweep passes even a threshold of 1
        assert record.promoted and received == [1]


def test_overlap_plays_the_next_self_play_during_training_and_pushes_into_it(tmp_path):
    # Self-play (48 games of 48 simulations a move) takes far longer than training and a 4-game arena, so each
    # promotion lands while the next iteration's games are being played.
    selfplay = SelfPlayConfig(simulations=48, num_parallel=4, sampling_moves=4)
    commander = Commander(tiny(3, overlap=True, gate_threshold=0.0, eval_games=0,
                               games_per_iteration=48, selfplay=selfplay), str(tmp_path))
    handles = []
    add_target = commander.add_target

    def spy(servers):
        if hasattr(servers, "backend"):  # a self-play run's ModelServers
            handles.append(servers)
        add_target(servers)

    commander.add_target = spy
    records = run(commander)
    assert [r.iteration for r in records] == [1, 2, 3]
    assert commander._next_selfplay is None  # nothing outlives the run
    assert len(handles) == 3 and all(h.closed for h in handles)
    # The runs of iterations 2 and 3 started before promotions 1 and 2: pushed into.
    assert [h.version for h in handles[1:]] == [1, 2]
    assert [r.pushed_to for r in records[:2]] == [2, 2]
    assert commander.buffer.added == sum(r.samples for r in records)


@pytest.mark.parametrize("field, value", [("iterations", 0), ("games_per_iteration", -1),
                                          ("train_steps", 0), ("arena_games", 0),
                                          ("gate_threshold", 1.5), ("backend", "gpu"),
                                          ("learning_rate", 0.0), ("eval_games", -1)])
def test_bad_parameters_are_refused_before_anything_runs(field, value):
    with pytest.raises(ValueError, match=field):
        tiny(**{field: value})


@pytest.mark.parametrize("backend", ["process", "ray"])
def test_self_play_on_other_backends_gives_the_local_backends_games(tmp_path, backend,
                                                                    request):
    if backend == "ray":
        request.getfixturevalue("ray_session")
    local = Commander(tiny(1, eval_games=0), str(tmp_path / "local"))
    run(local)
    remote = Commander(tiny(1, eval_games=0, backend=backend, num_procs=2),
                       str(tmp_path / backend))
    run(remote)
    # Games are deterministic functions of their ids and the net: same samples anywhere.
    same_run(local, remote)
