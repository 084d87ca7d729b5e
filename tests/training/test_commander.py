"""The commander: iterations, checkpoints, resume after a stop or a crash, pushes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import types

import numpy as np
import pytest

from async_search.errors import CheckpointError
from async_search.training import (Commander, CommanderConfig, ReplayBuffer,
                                   SelfPlayConfig, initial_weights, read_checkpoint,
                                   save_checkpoint)

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
              "iteration_s", "accuracy_s")

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
    assert state["selfplay_s"] > 0
    resumed = Commander(tiny(2), str(tmp_path / "b"), resume=True)
    # The crashed iteration's self-play samples were saved before it crashed.
    assert len(resumed.buffer) == len(straight.buffer)
    run(resumed)
    same_run(straight, resumed)
    # ... and so was their time: the resumed record reported 0 samples/s
    last = resumed.history[-1]
    assert last.selfplay_s == state["selfplay_s"] and last.samples_per_s > 0


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


def test_a_push_passes_over_servers_whose_run_ended_before_or_during_it(tmp_path):
    from async_search.backends.servers import ModelServers

    commander = Commander(tiny(1), str(tmp_path))
    received = []

    class Ended:  # closed, not yet taken off the targets (an overlapped run's end)
        closed = True

        def update_model(self, model, version):
            raise RuntimeError("the local run these servers belonged to has ended")

    class EndsDuringThePush:
        closed = False

        async def update_model(self, model, version):
            self.closed = True
            raise RuntimeError("the local run these servers belonged to has ended")

    class Serving:
        def update_model(self, model, version):
            received.append(version)

    class Broken:  # still serving: its failure is the push's
        closed = False

        def update_model(self, model, version):
            raise TypeError("weights it cannot take")

    assert hasattr(ModelServers, "closed")  # what the push reads
    for target in (Ended(), EndsDuringThePush(), Serving()):
        commander.add_target(target)
    assert asyncio.run(commander.push(commander.best, 7)) == 1 and received == [7]
    commander.add_target(Broken())
    with pytest.raises(TypeError, match="weights it cannot take"):
        asyncio.run(commander.push(commander.best, 8))


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


def test_a_promotion_made_while_the_next_self_plays_servers_start_reaches_them(
        tmp_path, monkeypatch):
    """Ray takes about a second to start a run's servers: a promotion made meanwhile
    went to the targets of that moment, which the starting run was not yet among, and
    its games were all played on the older net."""
    import async_search.backends as backends

    commander = Commander(tiny(2, overlap=True, gate_threshold=0.0, eval_games=0),
                          str(tmp_path))
    real = backends.run_searches_async
    handles, calls = [], []

    async def slow_to_start(*args, **kwargs):
        calls.append(len(calls))
        if len(calls) == 2:  # the overlapped run: its servers serve after promotion 1
            while commander.best_version < 1:
                await asyncio.sleep(0.01)
        hook = kwargs["on_servers"]

        def on_servers(servers):
            handles.append(servers)
            return hook(servers)

        return await real(*args, **{**kwargs, "on_servers": on_servers})

    monkeypatch.setattr(backends, "run_searches_async", slow_to_start)
    records = run(commander)
    assert [r.promoted for r in records] == [True, True] and len(handles) == 2
    assert handles[1].version == 1  # the run's servers took the promotion they missed
    assert records[0].pushed_to == 1  # (the arena's server only: the run was not yet up)


# -- Gumbel, tree reuse, move accuracy and the stronger baseline ---------------------------


def test_each_iteration_measures_the_candidates_move_accuracy_on_fixed_subsets(tmp_path):
    import async_search as asr
    from async_search.problems import ConnectFour
    from async_search.search.accuracy import mcts_chooser, move_accuracy, policy_chooser
    from async_search.training.commander import accuracy_subsets

    config = tiny(1, accuracy_positions=6, gate_threshold=1.0)  # no promotion
    commander = Commander(config, str(tmp_path))
    [record] = run(commander)
    assert set(record.accuracy) == {"net_end", "net_middle", "mcts_end", "mcts_middle"}
    assert 0 < record.accuracy_s <= record.eval_s
    # The figures are the candidate's (the trained net, not the best, which it did not
    # replace), on the same subsets a caller gets from accuracy_subsets.
    game, ev = ConnectFour(), asr.immediate(commander.trainer.model())
    for stage, positions in accuracy_subsets(6).items():
        assert len(positions) == 6
        net = asyncio.run(move_accuracy(policy_chooser(game, ev), positions))
        searched = asyncio.run(move_accuracy(mcts_chooser(
            game, ev, num_simulations=4, num_parallel=2, c_puct=config.eval_c_puct),
            positions))
        assert record.accuracy[f"net_{stage}"] == net.accuracy
        assert record.accuracy[f"mcts_{stage}"] == searched.accuracy


def test_accuracy_subsets_are_fixed_nested_and_capped_by_the_set():
    from async_search.training.commander import accuracy_subsets

    small, large = accuracy_subsets(5), accuracy_subsets(40)
    assert accuracy_subsets(5) == small
    for stage in ("end", "middle"):
        assert len(small[stage]) == 5 and len(large[stage]) == 40
        assert all(p in large[stage] for p in small[stage])
        assert len({p.state for p in small[stage]}) == 5
    assert len(accuracy_subsets(10_000)["end"]) == 200


def test_no_accuracy_positions_measures_nothing(tmp_path):
    [record] = run(Commander(tiny(1, accuracy_positions=0, eval_games=0), str(tmp_path)))
    assert record.accuracy == {} and record.scores == {}


def test_the_stronger_uct_baseline_is_played_when_asked(tmp_path):
    config = tiny(1, strong_uct_games=2, strong_uct_rollouts=8, accuracy_positions=0)
    [record] = run(Commander(config, str(tmp_path)))
    assert set(record.scores) == {"one_ply", "uct4", "uct8", "policy_vs_random"}
    # Only the stronger baseline: eval_games=0 leaves the others out.
    [record] = run(Commander(dataclasses.replace(config, eval_games=0),
                             str(tmp_path / "b")))
    assert set(record.scores) == {"uct8"}


def test_a_gumbel_run_with_tree_reuse_resumes_with_the_same_rows(tmp_path):
    def gumbel(iterations):
        return tiny(iterations, selfplay=SelfPlayConfig(
            simulations=4, num_parallel=2, policy="gumbel", reuse_tree=True),
            eval_policy="gumbel", eval_reuse_tree=True, accuracy_positions=4,
            eval_games=1)

    straight = Commander(gumbel(2), str(tmp_path / "a"))
    records = run(straight)
    assert all(set(r.accuracy) == {"net_end", "net_middle", "mcts_end", "mcts_middle"}
               for r in records)
    run(Commander(gumbel(1), str(tmp_path / "b")))
    resumed = Commander(gumbel(2), str(tmp_path / "b"), resume=True)
    assert resumed.config.selfplay.policy == "gumbel" and resumed.iteration == 1
    run(resumed)
    same_run(straight, resumed)


def test_the_evaluation_agent_follows_eval_policy():
    from async_search.training.players import GumbelPlayer, MCTSPlayer

    puct = Commander(tiny(1))._agent(lambda x: x, "candidate")
    gumbel = Commander(tiny(1, eval_policy="gumbel", eval_reuse_tree=True))._agent(
        lambda x: x, "candidate")
    assert type(puct) is MCTSPlayer and not puct.reuse_tree
    assert type(gumbel) is GumbelPlayer and gumbel.reuse_tree
    assert (gumbel.simulations, gumbel.num_parallel) == (4, tiny().eval_num_parallel)


def test_the_evaluation_agent_and_its_accuracy_chooser_prove_values_with_eval_solve(
        monkeypatch):
    from async_search.problems import ConnectFour

    agent = Commander(tiny(1, eval_solve=True))._agent(lambda x: x, "candidate")
    assert agent.solve and not Commander(tiny(1))._agent(lambda x: x, "c").solve
    seen = []

    async def fake_mcts(*args, **kwargs):
        seen.append(kwargs["solve"])
        return types.SimpleNamespace(action=0)
    monkeypatch.setattr("async_search.search.accuracy.mcts", fake_mcts)
    choose = Commander(tiny(1, eval_solve=True))._chooser(lambda x: x)
    asyncio.run(choose(ConnectFour().initial_state()))
    assert seen == [True]


def test_a_run_saved_before_solve_existed_resumes_without_it(run_copy):
    state = json.loads((run_copy / "state.json").read_text())
    del state["config"]["eval_solve"], state["config"]["selfplay"]["solve"]
    (run_copy / "state.json").write_text(json.dumps(state))
    resumed = Commander(tiny(2), str(run_copy), resume=True)
    assert not resumed.config.eval_solve and not resumed.config.selfplay.solve


def test_a_run_saved_before_policy_target_existed_resumes_on_the_visit_counts(run_copy):
    state = json.loads((run_copy / "state.json").read_text())
    del state["config"]["selfplay"]["policy_target"]
    (run_copy / "state.json").write_text(json.dumps(state))
    resumed = Commander(tiny(2), str(run_copy), resume=True)
    assert resumed.config.selfplay.policy_target == "visits"
    improved = tiny(2, selfplay=dataclasses.replace(tiny(2).selfplay,
                                                    policy_target="improved"))
    with pytest.raises(ValueError, match="selfplay differ"):  # a resume may not change it
        Commander(improved, str(run_copy), resume=True)


def test_resume_refuses_a_run_of_the_other_policy(tmp_path):
    run(Commander(tiny(1, accuracy_positions=0, eval_games=0), str(tmp_path)))
    other = tiny(1, accuracy_positions=0, eval_games=0, selfplay=SelfPlayConfig(
        simulations=4, num_parallel=2, sampling_moves=4, policy="gumbel"))
    with pytest.raises(ValueError, match="selfplay differ"):
        Commander(other, str(tmp_path), resume=True)


def test_a_commander_whose_iteration_failed_midway_refuses_to_go_on_itself(tmp_path):
    # Run again, it committed rows an uninterrupted run never has (its best version
    # moved before the push failed, its trainer took the steps twice), and a folder its
    # own loader refused.
    class FailsOnce:
        calls = 0

        def update_model(self, model, version):
            FailsOnce.calls += 1
            if FailsOnce.calls == 1:
                raise ConnectionError("the server was gone for a moment")

    straight = Commander(tiny(2), str(tmp_path / "a"))
    run(straight)
    failing = Commander(tiny(2), str(tmp_path / "b"))
    failing.add_target(FailsOnce())
    with pytest.raises(ConnectionError):
        run(failing)
    with pytest.raises(RuntimeError, match=r"iteration 1 of this Commander failed "
                                           r"\(ConnectionError.*resume=True"):
        run(failing)
    resumed = Commander(tiny(2), str(tmp_path / "b"), resume=True)
    run(resumed)
    same_run(straight, resumed)


def test_configs_hold_numpy_numbers_as_python_numbers_and_write_them(tmp_path):
    # A sweep over np.arange: JSON refused int64 when the run folder was written.
    config = tiny(1, seed=np.int64(5), train_steps=np.int32(6),
                  learning_rate=np.float32(0.01),
                  selfplay=SelfPlayConfig(simulations=np.int64(4), num_parallel=2,
                                          sampling_moves=4))
    assert type(config.seed) is int and type(config.learning_rate) is float
    assert type(config.selfplay.simulations) is int
    assert config == tiny(1, seed=5, learning_rate=float(np.float32(0.01)))
    Commander(config, str(tmp_path / "run"))  # writes its state.json
    json.loads((tmp_path / "run" / "state.json").read_text())


def test_two_uct_baselines_of_equal_rollouts_are_refused():
    # Scores are kept by rollouts: one match's score overwrote the other's.
    with pytest.raises(ValueError, match="uct_rollouts and strong_uct_rollouts are both"):
        tiny(uct_rollouts=50, strong_uct_rollouts=50, strong_uct_games=2)
    tiny(uct_rollouts=50, strong_uct_rollouts=50, strong_uct_games=0)  # one baseline


@pytest.mark.parametrize("field, value", [("iterations", 0), ("games_per_iteration", -1),
                                          ("train_steps", 0), ("arena_games", 0),
                                          ("gate_threshold", 1.5), ("backend", "gpu"),
                                          ("learning_rate", 0.0), ("eval_games", -1),
                                          ("eval_policy", "alphazero"),
                                          ("eval_reuse_tree", "yes"),
                                          ("eval_solve", 1),
                                          ("strong_uct_games", -1),
                                          ("strong_uct_rollouts", 0),
                                          ("accuracy_positions", -1),
                                          # int() made "256" the widths 2, 5, 6
                                          ("hidden_sizes", "256"),
                                          ("hidden_sizes", (1.5,)),
                                          ("hidden_sizes", (True, 64))])
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


# -- the saved run: checked when it is read back -----------------------------------------


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("commander") / "run"
    run(Commander(tiny(1), str(folder)))
    return folder


@pytest.fixture
def run_copy(saved_run, tmp_path):
    shutil.copytree(saved_run, tmp_path / "run")
    return tmp_path / "run"


def test_the_folder_holds_one_committed_generation_and_a_copy_of_the_best(saved_run):
    state = json.loads((saved_run / "state.json").read_text())
    assert sorted(os.listdir(saved_run)) == ["best", state["generation"], "state.json"]
    generation = saved_run / state["generation"]
    assert sorted(os.listdir(generation)) == ["best", "buffer.npz", "latest"]
    assert (read_checkpoint(saved_run / "best").weights[0][0].tobytes()
            == read_checkpoint(generation / "best").weights[0][0].tobytes())


def test_a_stale_best_copy_is_refreshed_on_resume(run_copy):
    generation = run_copy / json.loads((run_copy / "state.json").read_text())["generation"]
    save_checkpoint(run_copy / "best", read_checkpoint(generation / "latest").weights,
                    tiny().net, {"stale": True})  # as if killed between commit and copy
    Commander(tiny(1), str(run_copy), resume=True)
    assert "stale" not in read_checkpoint(run_copy / "best").metadata


def assert_resume_refused(folder, file, match):
    for resume in (lambda: Commander(tiny(1), str(folder), resume=True),
                   lambda: Commander.check_resume(tiny(1), str(folder))):
        with pytest.raises(CheckpointError, match=match) as info:
            resume()
        assert str(file) in str(info.value) and "\n" not in str(info.value)
        if "state.json" not in str(file):
            break  # check_resume reads state.json alone


def edit_state(folder, path, value=None, drop=False):
    file = folder / "state.json"
    state = json.loads(file.read_text())
    *parents, key = path
    node = state
    for p in parents:
        node = node[p]
    if drop:
        del node[key]
    else:
        node[key] = value
    file.write_text(json.dumps(state))
    return file


@pytest.mark.parametrize("damage, match", [
    (lambda b: b[:len(b) // 2], "not valid JSON"), (lambda b: b"", "empty"),
    (lambda b: np.random.default_rng(0).bytes(len(b)), "not UTF-8|not valid JSON"),
    (lambda b: b"\xff" + b[1:], "not UTF-8"), (lambda b: b"{}", "format"),
])
def test_a_damaged_state_file_is_refused_naming_it(run_copy, damage, match):
    file = run_copy / "state.json"
    file.write_bytes(damage(file.read_bytes()))
    assert_resume_refused(run_copy, file, match)


@pytest.mark.parametrize("path", [
    ("config",), ("iteration",), ("phase_done",), ("best_version",), ("best_elo",),
    ("history",), ("config", "selfplay"), ("config", "selfplay", "c_puct"),
    ("config", "backend"), ("history", 0, "scores"), ("history", 0, "promoted"),
    ("history", 0, "accuracy"), ("history", 0, "accuracy_s"),
    ("config", "accuracy_positions"), ("config", "eval_policy"),
    ("config", "selfplay", "policy"), ("config", "selfplay", "reuse_tree")])
def test_a_state_file_missing_a_field_is_refused_naming_it(run_copy, path):
    file = edit_state(run_copy, path, drop=True)
    assert_resume_refused(run_copy, file, "is missing")


@pytest.mark.parametrize("path, value", [
    (("config",), "c4"), (("iteration",), [1]), (("history",), {"0": 1}),
    (("config", "overlap"), "no"), (("config", "hidden_sizes"), 16),
    (("config", "selfplay"), 3), (("config", "selfplay", "value_target"), 1),
    (("history", 0), "row"), (("history", 0, "samples"), 1.5),
    (("history", 0, "scores"), [0.5]), (("history", 0, "promoted"), 1),
    (("history", 0, "elo"), "high"), (("best_elo",), None),
    (("history", 0, "accuracy"), [0.5]), (("history", 0, "accuracy"), {"net_end": "1"}),
    (("config", "eval_reuse_tree"), "no"), (("config", "selfplay", "reuse_tree"), 1),
    (("config", "eval_solve"), "no"), (("config", "selfplay", "solve"), 1),
    (("config", "selfplay", "policy"), 1)])
def test_a_state_file_with_a_field_of_the_wrong_type_is_refused_naming_it(run_copy, path,
                                                                          value):
    file = edit_state(run_copy, path, value)
    assert_resume_refused(run_copy, file, r"must be|not a valid")


@pytest.mark.parametrize("path, value", [
    (("iteration",), 4), (("best_version",), 3), (("phase_done",), "training"),
    (("history", 0, "arena_score"), 1.5), (("history", 0, "scores"), {"uct4": -0.1}),
    (("history", 0, "samples"), -1), (("history", 0, "iteration"), 2),
    (("history", 0, "best_version"), 5), (("config", "gate_threshold"), 2.0),
    (("config", "selfplay", "simulations"), 0), (("history", 0, "elo"), float("nan")),
    (("history", 0, "extra"), 1), (("history", 0, "accuracy"), {"net_end": 1.5}),
    (("history", 0, "accuracy"), {"mcts_middle": -0.1}), (("history", 0, "accuracy_s"), -1),
    (("config", "eval_policy"), "alphazero"), (("config", "selfplay", "policy"), "mcts"),
    (("config", "accuracy_positions"), -2)])
def test_a_state_file_with_a_number_out_of_range_is_refused_naming_it(run_copy, path,
                                                                      value):
    file = edit_state(run_copy, path, value)
    assert_resume_refused(run_copy, file, r"must be|not a valid|unknown|never writes")


def _generation(folder):
    return folder / json.loads((folder / "state.json").read_text())["generation"]


@pytest.mark.parametrize("name", ["buffer.npz", "best/config.json", "latest/config.json"])
@pytest.mark.parametrize("how", ["truncated", "empty", "random bytes"])
def test_a_damaged_net_or_buffer_is_refused_naming_it(run_copy, name, how):
    file = _generation(run_copy) / name
    data = file.read_bytes()
    file.write_bytes({"truncated": data[:len(data) // 2], "empty": b"",
                      "random bytes": np.random.default_rng(1).bytes(len(data))}[how])
    with pytest.raises(CheckpointError) as info:
        Commander(tiny(1), str(run_copy), resume=True)
    assert str(file) in str(info.value)


def test_a_buffer_or_net_of_another_run_is_refused_naming_it(run_copy):
    generation = _generation(run_copy)
    saved = ReplayBuffer.load(generation / "buffer.npz")
    twice = ReplayBuffer(saved.capacity, saved.seed)
    x, policy, value = saved.arrays()
    twice.add(np.concatenate([x, x]), np.concatenate([policy, policy]),
              np.concatenate([value, value]))  # every sample twice
    twice.save(generation / "buffer.npz")
    with pytest.raises(CheckpointError, match="does not belong to the run"):
        Commander(tiny(1), str(run_copy), resume=True)
    save_checkpoint(generation / "latest", initial_weights(tiny(hidden_sizes=(8,)).net, 0),
                    tiny(hidden_sizes=(8,)).net)
    with pytest.raises(CheckpointError, match="not this run's") as info:
        Commander(tiny(1), str(run_copy), resume=True)
    assert "latest" in str(info.value)


@pytest.mark.parametrize("name", ["best", "latest"])
def test_a_net_of_the_run_s_config_but_another_iteration_is_refused_naming_it(run_copy,
                                                                                name):
    # Another run's net of the same config (or best and latest swapped) was taken.
    generation = _generation(run_copy)
    saved = read_checkpoint(generation / name)
    save_checkpoint(generation / name, saved.weights, saved.config,
                    {**saved.metadata, "iteration": saved.metadata["iteration"] + 1})
    with pytest.raises(CheckpointError, match="saved at iteration .*not this run's"
                       ) as info:
        Commander(tiny(1), str(run_copy), resume=True)
    assert os.path.join(str(generation), name) in str(info.value)


# -- convolutional nets -------------------------------------------------------------------


def same_weights(a, b) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.parametrize("architecture,features,value_net", [
    ("conv", "planes", "head"), ("residual", "planes", "head"),
    ("residual", "threats", "head"), ("residual", "threats", "mlp")])
def test_a_convolutional_run_trains_saves_and_resumes_with_the_same_rows(
        tmp_path, architecture, features, value_net):
    conv = dict(architecture=architecture, channels=4, blocks=1, value_hidden=8,
                features=features, value_net=value_net, hidden_sizes=(16, 8))
    straight = Commander(tiny(2, **conv), str(tmp_path / "a"))
    run(straight)
    first = Commander(tiny(1, **conv), str(tmp_path / "b"))
    run(first)
    resumed = Commander(tiny(2, **conv), str(tmp_path / "b"), resume=True)
    run(resumed)
    same_weights(straight.trainer.weights, resumed.trainer.weights)
    np.testing.assert_array_equal(straight.buffer.arrays()[0], resumed.buffer.arrays()[0])
    assert ([r.arena_score for r in straight.history]
            == [r.arena_score for r in resumed.history])
    best = read_checkpoint(tmp_path / "b" / "best")
    assert best.config.architecture == architecture and best.config.channels == 4
    assert best.config.features == features and best.config.value_net == value_net
    model = best.model()
    body = model.body if features == "threats" else model
    assert type(body).__name__ == "PolicyValueConvNet"
    assert type(model).__name__ == ("FeaturedNet" if features == "threats"
                                    else "PolicyValueConvNet")
    with pytest.raises(ValueError, match="architecture"):  # a resume may not change it
        Commander(tiny(3, **{**conv, "architecture": "mlp", "value_net": "head"}),
                  str(tmp_path / "b"), resume=True)
    other = "planes" if features == "threats" else "threats"
    with pytest.raises(ValueError, match="features"):
        Commander(tiny(3, **{**conv, "features": other}), str(tmp_path / "b"),
                  resume=True)
    with pytest.raises(ValueError, match="value_net"):
        Commander(tiny(3, **{**conv, "value_net": "head" if value_net == "mlp"
                             else "mlp"}), str(tmp_path / "b"), resume=True)


def test_a_run_saved_before_the_net_architectures_existed_resumes_as_an_mlp(tmp_path):
    run_copy = tmp_path / "old"  # what those runs trained: an MLP on the stones alone
    run(Commander(tiny(1, features="planes"), str(run_copy)))
    state = json.loads((run_copy / "state.json").read_text())
    for name in ("architecture", "channels", "blocks", "value_hidden", "features",
                 "value_planes", "value_net"):
        del state["config"][name]
    (run_copy / "state.json").write_text(json.dumps(state))
    # Those runs read the stones alone: resumed as such, not with today's threat planes.
    with pytest.raises(ValueError, match="features"):
        Commander(tiny(2), str(run_copy), resume=True)
    resumed = Commander(tiny(2, features="planes"), str(run_copy), resume=True)
    assert resumed.iteration == 1 and resumed.config.net.architecture == "mlp"
    assert resumed.config.net.features == "planes"
    run(resumed)
    assert resumed.iteration == 2


def test_a_run_saved_before_random_openings_existed_resumes_without_them(run_copy):
    state = json.loads((run_copy / "state.json").read_text())
    del state["config"]["selfplay"]["random_opening_moves"]
    (run_copy / "state.json").write_text(json.dumps(state))
    resumed = Commander(tiny(2), str(run_copy), resume=True)
    assert resumed.config.selfplay.random_opening_moves == 0
    run(resumed)
    assert resumed.iteration == 2


def test_a_run_with_random_openings_resumes_with_the_same_rows(tmp_path):
    def config(iterations):
        c = tiny(iterations)
        return dataclasses.replace(c, selfplay=dataclasses.replace(
            c.selfplay, random_opening_moves=10))

    straight = Commander(config(2), str(tmp_path / "a"))
    run(straight)
    run(Commander(config(1), str(tmp_path / "b")))
    resumed = Commander(config(2), str(tmp_path / "b"), resume=True)
    run(resumed)
    np.testing.assert_array_equal(straight.buffer.arrays()[0], resumed.buffer.arrays()[0])
    with pytest.raises(ValueError, match="selfplay"):  # a resume may not change it
        Commander(tiny(3), str(tmp_path / "b"), resume=True)


@pytest.mark.parametrize("field,value", [("architecture", "transformer"),
                                         ("channels", 0), ("blocks", -1),
                                         ("value_hidden", 0), ("features", "lines"),
                                         ("value_planes", 0), ("value_net", "dense"),
                                         ("value_net", None)])
def test_bad_net_parameters_are_refused_before_anything_runs(field, value):
    with pytest.raises(ValueError, match=field):
        tiny(**{"architecture": "residual", field: value})


def test_an_mlp_value_is_refused_for_an_mlp_net():
    with pytest.raises(ValueError, match="value_net='mlp' is a convolutional net's"):
        tiny(value_net="mlp")
