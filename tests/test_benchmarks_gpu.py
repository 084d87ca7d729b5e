"""benchmarks/gpu.py and its GPU session's summary: the parts that need no GPU."""

import asyncio
import json
import os
import sys
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "gpu_session"))

import gpu  # noqa: E402
import summarize  # noqa: E402


@pytest.mark.parametrize("flag, value", [
    ("--workloads", "mcts,chess"), ("--workloads", ""), ("--workloads", "mcts,mcts"),
    ("--sections", "in_process,profile"), ("--switch-interval", "0"),
    ("--switch-interval", "-1"),
])
def test_workloads_and_sections_outside_their_lists_are_refused(flag, value, capsys):
    with pytest.raises(SystemExit) as stop:
        gpu.parse_args([flag, value], cuda=False)
    assert stop.value.code == 2
    assert f"{flag} takes " in capsys.readouterr().err


@pytest.mark.parametrize("flag, value", [
    ("--concurrency", "64,many"), ("--clients", "0,2"), ("--fixed-batch-sizes", "-4"),
    ("--rounds", "0"), ("--servers", "0"), ("--servers", "1,two"),
    ("--process-searches", "0"), ("--process-searches", "-3"), ("--max-clients", "0"),
    ("--mcts-simulations", "0"), ("--astar-evaluations", "-1"), ("--buffer-size", "0"),
    ("--max-batch-size", "0"), ("--torch-threads", "0"), ("--scramble", "-1"),
])
def test_counts_that_are_not_positive_integers_are_refused(flag, value, capsys):
    with pytest.raises(SystemExit) as stop:
        gpu.parse_args([flag, value], cuda=False)
    assert stop.value.code == 2
    assert value in capsys.readouterr().err


def test_more_servers_than_the_process_backend_starts_are_refused_before_any_copy(capsys):
    from async_search.backends.config import max_servers

    with pytest.raises(SystemExit) as stop:
        gpu.parse_args(["--servers", f"1,{max_servers('process') + 1}"], cuda=False)
    assert stop.value.code == 2
    assert "is more than the process backend can start here" in capsys.readouterr().err


def test_workloads_keep_their_order_and_sections_default_to_all():
    args = gpu.parse_args(["--workloads", "mcts,astar", "--smoke"], cuda=False)
    assert args.workloads == ["mcts", "astar"]
    assert args.sections == list(gpu.SECTIONS)
    assert args.framework == "torch" and not args.eager


def test_the_report_is_rewritten_after_each_run_without_batch_sizes(tmp_path):
    out = tmp_path / "gpu.json"
    report = {"benchmark": "benchmarks/gpu.py", "runs": {}}
    partial = gpu.PartialReport(report, str(out))
    partial.add("mcts_connect_four", "in_process", "64",
                {"nodes_per_s": 10.0, "sizes": [3, 4]})
    partial.add("mcts_connect_four", "in_process", "64", {"nodes_per_s": 12.0, "sizes": [5]})
    written = json.loads(out.read_text())
    assert written["partial"] is True
    assert written["rounds_so_far"]["mcts_connect_four"]["in_process"]["64"] == [
        {"nodes_per_s": 10.0}, {"nodes_per_s": 12.0}]
    assert "partial" not in report  # the final report is the caller's, whole


class RowMixing:
    """A model whose row i moves by ``shift`` times the mean of its batch: a row's
    outputs depend on its batch-mates by a known amount."""

    batch_tolerance = 0.5

    def __init__(self, shift):
        self.shift = shift

    def __call__(self, x):
        return x.sum(axis=1, keepdims=True) + self.shift * x.mean()


def served_with(model):
    spec = types.SimpleNamespace(batch_shape=lambda n: (n, 4))
    return types.SimpleNamespace(
        net=types.SimpleNamespace(input_spec=spec), sizes=[4, 8, 16, 32], model=model)


def test_batch_dependence_is_zero_for_independent_rows_and_seen_otherwise():
    alone = gpu.batch_dependence(served_with(RowMixing(0.0)), rows=8)
    assert set(alone["per_batch_size"]) == {"8", "16", "32"}  # 4 holds fewer than 8 rows
    assert alone["worst_max_abs"] == 0.0
    assert alone["adapter_batch_tolerance"] == 0.5
    mixing = gpu.batch_dependence(served_with(RowMixing(1.0)), rows=8)
    assert mixing["worst_max_abs"] > 0.01
    assert all(0 < v["max_rel"] < 1 for v in mixing["per_batch_size"].values())


def test_rows_alone_and_among_put_the_rows_first_in_a_full_batch():
    seen = []

    def model(x):
        seen.append(x.shape)
        return x[:, :1]

    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    alone, among = gpu.rows_alone_and_among(model, x, 8)
    assert seen == [(1, 4), (1, 4), (8, 4)]
    np.testing.assert_array_equal(among[:2], x[:, :1])
    np.testing.assert_array_equal(np.concatenate(alone), x[:, :1])


def test_the_h200_summary_reads_the_committed_reports():
    summary = summarize.summarize(os.path.join(ROOT, "results", "benchmarks", "gpu_h200"))
    assert summary["machine"]["gpu"].endswith("NVIDIA H200")
    assert summary["machine"]["cpu_cores"] == 16
    mcts = summary["ratios"]["mcts_connect_four"]
    # serve at 1024 searches (13,689/s, eager) against the hand-written batcher (27,675/s)
    assert mcts["vs_handwritten_same_concurrency_eager"]["1024"] == pytest.approx(0.49)
    assert mcts["vs_handwritten_same_concurrency_cuda_graphs"]["1024"] == pytest.approx(1.35)
    assert mcts["best_vs_best_handwritten"]["ours"] == "b_mcts_graphs process_backend 14"
    astar = summary["ratios"]["astar_15_puzzle"]
    assert astar["scaling_efficiency_torch_eager"]["2"] == pytest.approx(0.98)
    graphs = summary["ceiling"]["policy_value"]["torch_cuda_graphs"]["1"]
    assert graphs["with_copies_ms"] < 0.5 < summary["ceiling"]["policy_value"][
        "torch_eager"]["1"]["with_copies_ms"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20)), max_size=12))
def test_union_length_counts_each_covered_unit_once(pairs):
    intervals = [(start, start + length) for start, length in pairs]
    covered = set()
    for start, end in intervals:
        covered.update(range(start, end))
    assert gpu.union_length(intervals) == len(covered)


def run(busy, vs_ceiling, **extra):
    return {"device_busy_fraction": busy, "vs_ceiling": vs_ceiling, "mean_batch": 9.0,
            "nodes_per_s": 1.0, **extra}


def test_the_steady_rate_counts_only_the_batches_while_every_client_searched():
    from async_search.servers.stats import BatchRecord

    # Servers started at 100 s; clients searched 101-105 and 102-104 (started 1 s
    # apart): the window is 102-104, holding the batches of 100 and 300 elements.
    trace = [BatchRecord(1.5, 50, 0.1), BatchRecord(2.5, 100, 0.2),
             BatchRecord(3.9, 300, 0.4), BatchRecord(4.5, 550, 0.5)]
    stats = {"servers": [{"started_at": 100.0}], "trace": trace,
             "clients": [{"began_at": 101.0, "ended_at": 105.0},
                         {"began_at": 102.0, "ended_at": 104.0}]}
    record = gpu.steady_state(stats, nodes=2000)  # 2 nodes an element
    assert record == {"start_spread_s": 1.0, "steady_s": 2.0,
                      "steady_nodes_per_s": 400.0,  # 800 nodes in 2 s
                      "steady_fraction_in_model": 0.3}
    # Clients that never searched together: no steady rate, and it says so.
    stats["clients"][1].update(began_at=105.5, ended_at=106.0)
    assert gpu.steady_state(stats, 2000) == {"start_spread_s": 4.5, "steady_s": 0.0}
    # A tree whose clients report no times: nothing.
    assert gpu.steady_state({**stats, "clients": [{"cpu_s": 1.0}]}, 2000) == {}
    # A trace that lost batches (the server ran more than it keeps): no rate.
    stats["clients"][1].update(began_at=102.0, ended_at=104.0)
    stats["servers"][0]["batches"] = 5
    assert gpu.steady_state(stats, 2000) == {"start_spread_s": 1.0, "steady_s": 2.0,
                                             "trace_truncated": True}
    # The trace from the searches' start (a second model built for 1 s after the first
    # server started): the clients' times are read against trace_origin, not it.
    shifted = {**stats, "servers": [{"started_at": 99.0}], "trace_origin": 100.0}
    shifted["servers"][0]["batches"] = 4
    assert gpu.steady_state(shifted, nodes=2000)["steady_nodes_per_s"] == 400.0


def test_every_batch_counts_and_the_clients_bound_a_run_whose_trace_lost_batches():
    stats = {"servers": [{"batch_size_histogram": {4: 2, 9: 1}},
                         {"batch_size_histogram": {"16": 1}}],
             "clients": [{"began_at": 10.0, "ended_at": 12.5},
                         {"began_at": 10.5, "ended_at": 13.0}]}
    assert sorted(gpu.batch_sizes(stats)) == [4, 4, 9, 16]
    assert gpu.searched_seconds(stats) == 3.0
    stats["clients"].append({"cpu_s": 1.0})  # an attempt that died reports no times
    assert gpu.searched_seconds(stats) is None


def test_steady_scaling_is_read_like_the_whole_runs():
    report = {"runs": {"astar_15_puzzle": {"process_backend": {
        "1": run(0.3, 0.1, nodes_per_s=100.0, steady_nodes_per_s=120.0),
        "4": run(0.3, 0.1, nodes_per_s=240.0, steady_nodes_per_s=432.0),
        "8": run(0.3, 0.1, nodes_per_s=400.0)}}}}  # no moment with all 8 searching
    entry = gpu.goals(report)["astar_15_puzzle"]
    assert entry["scaling_efficiency"] == {"1": 1.0, "4": 0.6, "8": 0.5}
    assert entry["steady_scaling_efficiency"] == {"1": 1.0, "4": 0.9}


def test_the_busy_goal_reads_the_process_backend_runs_too():
    report = {"runs": {"mcts_connect_four": {
        "in_process": {"1024": run(0.5, 0.2, searches=1024)},
        "process_backend": {"1": run(0.3, 0.1, clients=1), "2": run(0.3, 0.1, clients=2),
                            "1x2": run(0.3, 0.1, clients=1, servers=2),
                            "14x2": run(0.95, 0.92, clients=14, servers=2)}}}}
    entry = gpu.goals(report)["mcts_connect_four"]
    assert entry["busiest_run"] == {
        "section": "process_backend", "clients": 14, "servers": 2,
        "device_busy_fraction": 0.95, "vs_ceiling": 0.92, "mean_batch": 9.0}
    assert entry["busy_goal_met"] is True
    assert entry["scaling_efficiency"] == {"1": 1.0, "2": 0.5}
    assert entry["scaling_efficiency_x2"] == {"1x2": 1.0, "14x2": 0.07}
    report["runs"]["mcts_connect_four"]["process_backend"]["14x2"] = run(0.95, 0.85)
    assert gpu.goals(report)["mcts_connect_four"]["busy_goal_met"] is False


def test_a_run_faster_than_the_model_alone_leaves_the_busy_goal_unjudged():
    # A smoke run on a loaded CPU read vs_ceiling 1.12 (the ceiling timed slow), and
    # the goal counted as met by that noise.
    report = {"runs": {"mcts_connect_four": {
        "in_process": {"256": run(0.95, 1.12, searches=256)}}}}
    entry = gpu.goals(report)["mcts_connect_four"]
    assert entry["busy_goal_met"] is None
    assert "1.12x the model alone" in entry["ceiling_note"]
    report["runs"]["mcts_connect_four"]["in_process"]["256"] = run(0.95, 1.04,
                                                                   searches=256)
    entry = gpu.goals(report)["mcts_connect_four"]
    assert entry["busy_goal_met"] is True and "ceiling_note" not in entry
    # Not busy enough: not met, whatever the ceiling (its noise only flatters).
    report["runs"]["mcts_connect_four"]["in_process"]["256"] = run(0.5, 1.12,
                                                                   searches=256)
    entry = gpu.goals(report)["mcts_connect_four"]
    assert entry["busy_goal_met"] is False and "1.12x" in entry["ceiling_note"]
    # Every run is read against one ceiling: a less busy run that outpaced it shows it
    # slow for the busiest too.
    report["runs"]["mcts_connect_four"]["in_process"] = {
        "64": run(0.95, 0.95, searches=64), "256": run(0.6, 1.3, searches=256)}
    entry = gpu.goals(report)["mcts_connect_four"]
    assert entry["busiest_run"]["searches"] == 64
    assert entry["busy_goal_met"] is None and "1.3x" in entry["ceiling_note"]


def test_untimed_runs_pick_the_one_nearest_the_ceiling_and_leave_the_goal_open():
    report = {"runs": {"astar_15_puzzle": {
        "in_process": {"64": run(None, 0.2, searches=64)},
        "process_backend": {"4": run(None, 0.6, clients=4)}}}}
    entry = gpu.goals(report)["astar_15_puzzle"]
    assert entry["busiest_run"]["section"] == "process_backend"
    assert entry["busy_goal_met"] is None


def test_the_factory_hands_each_server_its_own_copy_of_the_adapter():
    torch = pytest.importorskip("torch")
    from async_search import problems

    args = gpu.parse_args(["--smoke", "--servers", "3"], cuda=False)
    net = problems.CostToGoResNet(gpu.PUZZLE, first_width=16, width=8, blocks=1, seed=0)
    served = gpu.Served("cost_to_go", net, torch.device("cpu"), args, torch)
    assert [served.factory() for _ in range(2)] == served.copies[:1] * 2
    served.serve_with(3)
    handed = [served.factory() for _ in range(6)]
    assert handed[:3] == served.copies and handed[3:] == served.copies
    assert len({id(model) for model in served.copies}) == 3
    x = np.zeros(net.input_spec.batch_shape(2), np.float32)
    first = served.copies[0](x)
    for copy in served.copies[1:]:  # the same weights in each copy
        np.testing.assert_array_equal(copy(x), first)


def test_each_framework_counts_a_nets_weights_alike():
    # PyTorch's count left out batch norm's running statistics, which JAX's params hold:
    # one net, two figures in the reports.
    torch = pytest.importorskip("torch")
    pytest.importorskip("jax")
    counts = {}
    for framework in ("torch", "jax"):
        args = gpu.parse_args(["--smoke", "--channels", "8", "--blocks", "1",
                               "--first-width", "16", "--width", "8", "--dense-blocks", "1",
                               "--framework", framework], cuda=False)
        for key, (_, served) in gpu.served_nets(args, torch, torch.device("cpu")).items():
            named = sum(value.size for value in served.net.weights.values())
            counts[framework, key] = served.parameters()
            assert served.parameters() == named, (framework, key)
    assert counts["torch", "astar_15_puzzle"] == counts["jax", "astar_15_puzzle"]
    assert counts["torch", "mcts_connect_four"] == counts["jax", "mcts_connect_four"]


def test_a_run_on_several_devices_reports_no_busy_fraction():
    """serve(devices=...) computes on copies it makes (not timed), on devices whose
    CUDA events cannot be read against one another: no figure rather than a wrong one
    (or an error reading them)."""
    torch = pytest.importorskip("torch")
    from async_search import problems

    args = gpu.parse_args(["--smoke"], cuda=False)
    net = problems.CostToGoResNet(gpu.PUZZLE, first_width=8, width=8, blocks=1, seed=0)
    served = gpu.Served("cost_to_go", net, torch.device("cpu"), args, torch)
    served.ceiling = {b: {"on_device": 1e-3, "with_copies": 1e-3} for b in served.sizes}
    work = gpu.Workload("astar", served, args)
    one = asyncio.run(gpu.in_process(work, 4))
    assert one["device_busy_fraction"] > 0
    two = asyncio.run(gpu.in_process(work, 4, devices=["cpu", "cpu"]))
    assert two["device_busy_fraction"] is None and two["nodes"] == one["nodes"] > 0


def test_the_cpu_clock_counts_the_loop_thread_and_reaped_children():
    import subprocess
    import time

    clock = gpu.CpuClock()
    busy_until = time.thread_time() + 0.2
    while time.thread_time() < busy_until:  # this thread computes 0.2 s
        pass
    subprocess.run([sys.executable, "-c",
                    "import time\nt = time.process_time() + 0.3\n"
                    "while time.process_time() < t: pass"], check=True, timeout=60)
    record = clock.read(clients=1)
    assert 1.05 >= record["loop_cpu"] > 0.1  # 0.2 s of CPU over the wall time of both
    assert record["process_cpu"] >= record["loop_cpu"] - 0.01
    # the child's 0.3 s of CPU, over the wall time of both (at least 0.5 s)
    assert record["clients_cpu"] > 0.1
    assert "clients_cpu" not in gpu.CpuClock().read()


def test_the_cpu_topology_counts_physical_cores_apart_from_their_threads():
    topology = gpu.cpu_topology()
    assert topology["logical_cpus"] >= 1
    if topology["physical_cores"] is not None:  # sysfs readable (Linux)
        assert 1 <= topology["physical_cores"] <= topology["logical_cpus"]
        assert topology["threads_per_core"] >= 1


def test_the_loop_defaults_to_uvloop_where_installed_and_asyncio_is_asked_for():
    import importlib.util

    installed = importlib.util.find_spec("uvloop") is not None
    assert gpu.parse_args([], cuda=False).loop == ("uvloop" if installed else "asyncio")
    assert gpu.parse_args(["--loop", "asyncio"], cuda=False).loop == "asyncio"


def test_a_later_leases_reports_make_a_table_each_finished_or_cut_short(tmp_path):
    finished = json.load(open(os.path.join(ROOT, "results", "benchmarks", "gpu_cpu.json")))
    stacks = {"samples": 3, "interval_s": 0.01, "threads": {"MainThread": {
        "samples": 3, "self": {"run (runners.py:118)": 1.0}, "inclusive": {}}}}
    finished["runs"]["astar_15_puzzle"]["process_backend"]["1"]["stacks"] = stacks
    steady = {"client_waves": 2, "steady_nodes_per_s": 123.4, "steady_s": 5.0,
              "start_spread_s": 0.4, "steady_fraction_in_model": 0.9}
    finished["runs"]["astar_15_puzzle"]["process_backend"]["1"].update(steady)
    finished["settings"]["client_waves"] = 2
    cut_short = json.load(open(os.path.join(ROOT, "results", "benchmarks", "gpu_h200",
                                            "a_mcts_eager.json")))
    (tmp_path / "c_cpu.json").write_text(json.dumps(finished))
    assert cut_short["partial"]  # stopped at its step's time limit
    (tmp_path / "c_eager.json").write_text(json.dumps(cut_short))
    (tmp_path / "a_other.json").write_text("{}")  # another prefix: not read
    (tmp_path / "env.txt").write_text("GPU 0: NVIDIA H200 (UUID: x)\n16\n")
    summary = summarize.summarize_reports(str(tmp_path), "c_")
    assert set(summary["reports"]) == {"c_cpu", "c_eager"}
    assert summary["machine"][1] == "16"
    cpu = summary["reports"]["c_cpu"]
    astar = cpu["runs"]["astar_15_puzzle"]
    assert astar["in_process"]["256"]["nodes_per_s"] == round(
        finished["runs"]["astar_15_puzzle"]["in_process"]["256"]["nodes_per_s"])
    assert astar["process_backend"]["1"]["clients_cpu"] == finished["runs"][
        "astar_15_puzzle"]["process_backend"]["1"]["clients_cpu"]
    assert astar["process_backend"]["1"]["stacks"] == stacks  # --sample-stacks
    # lease_c.sh's steady windows, and which waves setting each table ran with
    assert {k: astar["process_backend"]["1"][k] for k in steady} == steady
    assert cpu["settings"]["client_waves"] == 2
    assert "stacks" not in astar["in_process"]["256"]
    assert cpu["goals"] == finished["goals"] and not cpu["partial"]
    eager = summary["reports"]["c_eager"]
    assert eager["partial"] and "goals" not in eager
    assert eager["runs"]["mcts_connect_four"]["in_process"]["1024"]["nodes_per_s"] > 0
    with pytest.raises(SystemExit, match="no d_"):
        summarize.summarize_reports(str(tmp_path), "d_")


def test_sample_stacks_records_where_the_loop_and_the_device_thread_were(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "stacks.json"
    report = gpu.main(["--smoke", "--workloads", "mcts", "--sections", "in_process",
                       "--concurrency", "64", "--rounds", "1", "--sample-stacks",
                       "--min-s", "0.02",
                       "--out", str(out)])
    record = report["runs"]["mcts_connect_four"]["in_process"]["64"]
    threads = record["stacks"]["threads"]
    assert threads["MainThread"]["samples"] > 0
    device = [name for name in threads if name.startswith("async_search-device")]
    assert device and any("forward" in line or "_run" in line
                          for line in threads[device[0]]["inclusive"])
    assert json.loads(out.read_text())["runs"]["mcts_connect_four"]["in_process"]["64"][
        "stacks"] == record["stacks"]


def test_the_free_model_repeats_one_row_of_each_output_for_every_row():
    x = np.zeros((3, 5), np.float32)
    out = gpu.FreeModel((np.array([[1.0, 2.0]], np.float32), np.array([[3.0]])))(x)
    np.testing.assert_array_equal(out[0], [[1.0, 2.0]] * 3)
    np.testing.assert_array_equal(out[1], [[3.0]] * 3)
    assert out[0].dtype == np.float32
    named = gpu.FreeModel({"v": np.array([7], np.int64)})(x)
    np.testing.assert_array_equal(named["v"], [7, 7, 7])


def test_scaling_is_read_against_the_searches_alone_at_each_count_of_clients():
    report = {"runs": {"astar_15_puzzle": {
        "process_backend": {"1": run(0.3, 0.1, nodes_per_s=100.0),
                            "4": run(0.3, 0.1, nodes_per_s=240.0),
                            "8": run(0.3, 0.1, nodes_per_s=400.0)},
        "clients_alone": {"1": {"nodes_per_s": 200.0}, "4": {"nodes_per_s": 640.0},
                          "2": {"nodes_per_s": 400.0}}}}}
    entry = gpu.goals(report)["astar_15_puzzle"]
    assert entry["scaling_efficiency"] == {"1": 1.0, "4": 0.6, "8": 0.5}
    assert entry["scaling_efficiency_clients_alone"] == {"1": 1.0, "4": 0.8, "2": 1.0}
    assert entry["scaling_over_clients_alone"] == {"1": 1.0, "4": 0.75}  # 8 not alone
    del report["runs"]["astar_15_puzzle"]["clients_alone"]["1"]
    assert "scaling_efficiency_clients_alone" not in gpu.goals(report)["astar_15_puzzle"]


def test_a_clients_alone_process_that_fails_fails_the_run_instead_of_waiting():
    import asyncio
    import functools

    from async_search import TensorSpec

    spec = TensorSpec((4,), np.float32)
    work = types.SimpleNamespace(
        args=types.SimpleNamespace(process_searches=1, max_batch_size=8, loop="asyncio"),
        starts=lambda n: [b"not a puzzle"] * n,  # every search raises on it
        served=types.SimpleNamespace(model=lambda x: x[:, :1],
                                     net=types.SimpleNamespace(input_spec=spec)),
        search_fn=lambda per: functools.partial(gpu.astar, 10, 2), budget=lambda per: 10)
    with pytest.raises(RuntimeError, match=r"0 of 2 processes reported .*exit 1"):
        asyncio.run(asyncio.wait_for(gpu.clients_alone(work, 2), timeout=120))


def test_a_smoke_run_imports_neither_tensorflow_nor_ray_and_runs_clients_alone(tmp_path):
    # The GPU machines have neither: gpu.py must run on PyTorch and the NumPy core alone,
    # in this process and in the client processes that clients_alone spawns.
    pytest.importorskip("torch")
    import subprocess

    out = tmp_path / "g.json"
    code = (
        "import sys; sys.path[:0] = [{bench!r}]; import gpu; "
        "gpu.main(['--smoke', '--workloads', 'mcts', '--sections', "
        "'in_process,process_backend,clients_alone', '--concurrency', '4', '--clients', "
        "'1,2', '--process-searches', '4', '--min-s', '0.02', '--out', {out!r}]); "
        "print('imported:', sorted({{m.split('.')[0] for m in sys.modules}} "
        "& {{'tensorflow', 'ray', 'keras'}}))"
    ).format(bench=os.path.join(ROOT, "benchmarks"), out=str(out))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "imported: []"
    report = json.loads(out.read_text())
    runs = report["runs"]["mcts_connect_four"]["clients_alone"]
    assert set(runs) == {"1", "2"}
    for k, record in runs.items():
        assert record["clients"] == int(k) and record["searches"] == 4 * int(k)
        # every search ran its whole budget, through batches of more than one row
        assert record["nodes"] == record["searches"] * record["budget_per_search"]
        assert record["nodes_per_s"] > 0 and record["mean_batch"] > 1
        assert 0 < record["clients_cpu"] <= 1.5
    for record in report["runs"]["mcts_connect_four"]["process_backend"].values():
        assert 0 < record["clients_busy"] <= 1.1  # from run_searches' client stats
    goals = report["goals"]["mcts_connect_four"]
    assert set(goals["scaling_efficiency_clients_alone"]) == {"1", "2"}
    assert set(goals["scaling_over_clients_alone"]) == {"1", "2"}
    table = summarize.report_table(report, "alone")
    assert table["runs"]["mcts_connect_four"]["clients_alone"]["2"]["nodes_per_s"] > 0


def test_clients_busy_averages_each_finished_clients_cpu_over_its_wall_time():
    stats = {"clients": [{"cpu_s": 0.9, "searching_s": 1.0},
                         {"cpu_s": 0.1, "searching_s": 0.5},
                         {"ended": "died with exit code -9"}]}  # no usage: left out
    assert gpu.clients_busy(stats) == 0.55
    assert gpu.clients_busy({"clients": []}) is None
    assert gpu.clients_busy({}) is None


@pytest.mark.parametrize("flags", [["--script", "--compile"],
                                   ["--script", "--framework", "jax"],
                                   ["--peer-script", "--framework", "jax"]])
def test_script_is_refused_beside_compile_or_jax(flags, capsys):
    with pytest.raises(SystemExit) as stop:
        gpu.parse_args(flags, cuda=False)
    assert stop.value.code == 2
    assert "--script" in capsys.readouterr().err


def test_script_times_the_adapters_compiled_pass_and_the_peer_can_run_it_too(tmp_path):
    torch = pytest.importorskip("torch")
    report = gpu.main(["--smoke", "--workloads", "astar", "--sections",
                       "in_process,handwritten_torch", "--concurrency", "64",
                       "--peer-concurrency", "64", "--rounds", "1", "--min-s", "0.02",
                       "--script", "--peer-script", "--out", str(tmp_path / "s.json")])
    assert report["settings"]["script"] and report["settings"]["peer_script"]
    runs = report["runs"]["astar_15_puzzle"]
    for section in ("in_process", "handwritten_torch"):  # passes timed on both sides
        assert runs[section]["64"]["device_busy_fraction"] > 0, section
    served = gpu.Served("cost_to_go", gpu.problems.CostToGoResNet(
        gpu.PUZZLE, first_width=8, width=8, blocks=1, seed=0), torch.device("cpu"),
        gpu.parse_args(["--smoke", "--script", "--peer-script"], cuda=False), torch)
    assert served.model.script and isinstance(served.peer_module, torch.jit.ScriptModule)
    assert isinstance(served.forward, torch.jit.ScriptModule)  # the model alone: compiled
