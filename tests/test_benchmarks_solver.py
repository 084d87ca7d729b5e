"""benchmarks/solver.py: move accuracy split by the positions' outcome."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.solver import by_outcome, record


def positions(*scores):
    return [SimpleNamespace(score=s) for s in scores]


def test_accuracy_splits_into_won_or_drawn_and_lost_positions():
    ps = positions(3, 0, -2, -5, 1)  # won, drawn, lost, lost, won
    result = SimpleNamespace(accuracy=0.6, mistakes=(1, 2))
    assert by_outcome(result, ps) == {"not_lost": round(2 / 3, 3), "lost": 0.5}
    row = {}
    record(row, "net", result, ps)
    assert row == {"net": 0.6, "net_not_lost": round(2 / 3, 3), "net_lost": 0.5}


def test_a_subset_without_positions_has_no_figure():
    result = SimpleNamespace(accuracy=1.0, mistakes=())
    assert by_outcome(result, positions(2, 0)) == {"not_lost": 1.0, "lost": None}


def test_an_agent_is_leaves_and_c_puct_and_may_prove_values():
    from benchmarks.solver import parse_agent

    assert parse_agent("8:1.25") == (8, 1.25, False)
    assert parse_agent("1:1.5:solve") == (1, 1.5, True)


def test_a_malformed_agent_stops_with_what_it_expected():
    from benchmarks.solver import parse_agent

    for text in ("8", "1:1.5:prove", "1:1.5:solve:x"):
        with pytest.raises(SystemExit, match="leaves:c_puct"):
            parse_agent(text)
