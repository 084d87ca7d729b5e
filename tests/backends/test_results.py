"""merge_stats: the servers' traces on one clock."""

from async_search.backends.config import RunConfig
from async_search.backends.results import merge_stats
from async_search.servers.stats import BatchRecord


def _servers_started_at(*starts, sizes=(4, 2)):
    """Server stats, as ServingStats.as_dict gives them: one batch each, of ``sizes``."""
    return [{"started_at": s, "model_time_s": 0.1, "batches": 1, "elements": n,
             "mean_batch_size": float(n), "std_batch_size": 0.0}
            for s, n in zip(starts, sizes)]


def test_traces_go_on_the_searches_clock_when_its_origin_is_given():
    # Two servers, started 0.9 s apart; the searches' clock starts at 101.0, once both
    # serve. A batch 0.5 s into each server's life: 99.6 and 100.5 on that clock...
    servers = _servers_started_at(100.1, 101.0)
    traces = [[BatchRecord(1.4, 4, 0.01)], [BatchRecord(0.5, 2, 0.01)]]
    stats = merge_stats(RunConfig(), 1.0, servers, traces, origin=101.0)
    assert [round(r.finished_s, 6) for r in stats["trace"]] == [0.5, 0.5]
    assert [r.size for r in stats["trace"]] == [4, 2]


def test_traces_go_on_the_earliest_servers_clock_without_an_origin():
    servers = _servers_started_at(101.0, 100.0)
    traces = [[BatchRecord(0.5, 4, 0.01)], [BatchRecord(0.2, 2, 0.01)]]
    stats = merge_stats(RunConfig(), 2.0, servers, traces)
    assert [round(r.finished_s, 6) for r in stats["trace"]] == [0.2, 1.5]
    assert stats["batches"] == 2 and stats["elements"] == 6


def test_the_figures_count_every_batch_not_only_those_the_trace_kept():
    # Two servers' own counts; their traces kept the latest batch each. The figures
    # came from the trace: 2 batches of 6 elements, where 10,500 of 21,000 ran.
    servers = [{"started_at": 0.0, "model_time_s": 1.0, "batches": 10_000,
                "elements": 20_000, "mean_batch_size": 2.0, "std_batch_size": 0.0},
               {"started_at": 0.0, "model_time_s": 1.0, "batches": 500,
                "elements": 1_000, "mean_batch_size": 2.0, "std_batch_size": 1.0}]
    traces = [[BatchRecord(1.0, 2, 0.01)], [BatchRecord(1.0, 4, 0.01)]]
    stats = merge_stats(RunConfig(), 2.0, servers, traces)
    assert stats["batches"] == 10_500 and stats["elements"] == 21_000
    assert stats["mean_batch_size"] == 2.0
    assert abs(stats["std_batch_size"] - (500 / 10_500) ** 0.5) < 1e-12
    assert len(stats["trace"]) == 2


def test_the_pooled_spread_is_exact_for_a_large_mean_and_a_small_spread():
    # E[x^2] - mean^2 lost 4 digits here.
    import numpy as np

    sizes = [np.array([4096] * 500_000 + [4097] * 3), np.array([4096] * 7)]
    servers = [{"started_at": 0.0, "model_time_s": 0.0, "batches": len(s),
                "elements": int(s.sum()), "mean_batch_size": float(s.mean()),
                "std_batch_size": float(s.std())} for s in sizes]
    stats = merge_stats(RunConfig(), 1.0, servers, [[], []])
    whole = np.concatenate(sizes)
    assert abs(stats["std_batch_size"] - whole.std()) <= 1e-9 * whole.std()
