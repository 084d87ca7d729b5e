"""benchmarks/fake_device.py: runs in one process and through client processes."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import fake_device  # noqa: E402


def test_the_fake_device_takes_its_time_per_batch_and_row_and_answers_each_kind():
    import numpy as np

    device = fake_device.FakeDevice("mcts", ms=2.0, trips=2, us_per_row=100.0)
    policy, value = device(np.zeros((10, 3), np.float32))
    assert policy.shape == (10, 7) and value.shape == (10, 1)
    assert device.batches == 1 and device.busy == pytest.approx(0.003)
    assert device.wall >= 0.003
    assert fake_device.FakeDevice("astar", 1.0, 1)(np.zeros((4, 2))).shape == (4, 1)


@pytest.mark.parametrize("clients", [None, 2])
def test_a_run_counts_every_searchs_nodes_in_one_process_or_through_clients(clients):
    argv = ["--ms", "1", "--trips", "1", "--searches", "8", "--searches-kinds",
            "astar,mcts", "--astar-evaluations", "20", "--mcts-simulations", "16"]
    report = fake_device.main(argv + ([] if clients is None else ["--clients", "2"]))
    astar, mcts = report["runs"]
    assert (astar["search"], mcts["search"]) == ("astar", "mcts")
    # MCTS runs its simulations whatever its values; 8 searches in each process
    assert mcts["nodes"] == 8 * (clients or 1) * 16
    for record in report["runs"]:
        assert record["mean_batch"] > 1 and 0 < record["device_busy_fraction"] <= 1.0
        if clients is None:
            assert "loop_cpu" in record and "clients" not in record
        else:
            assert record["clients"] == 2 and record["clients_cpu"] > 0
            assert 0 < record["clients_busy"] <= 1.1
            assert "serving_loop_cpu" in record


@pytest.mark.parametrize("flag, value", [("--clients", "0"), ("--ms", "0"),
                                         ("--searches", "many")])
def test_flags_out_of_range_are_refused(flag, value, capsys):
    with pytest.raises(SystemExit) as stop:
        fake_device.main([flag, value])
    assert stop.value.code == 2
