"""experiments.progress: the bars over model evaluations and self-play positions."""

import io

import pytest

tqdm = pytest.importorskip("tqdm")  # the plot extra

from async_search.experiments import Experiment, default_runs, run_experiment
from async_search.experiments.progress import progress_bar

from tests.experiments.conftest import TINY_MODEL, tiny_search


class Recorder(tqdm.tqdm):
    """A bar drawn into a string, whatever the terminal, that keeps its totals."""

    made: list = []

    def __init__(self, *args, **kwargs):
        kwargs.update(disable=False, file=io.StringIO())
        super().__init__(*args, **kwargs)
        self.totals = [self.total]
        Recorder.made.append(self)

    def update(self, n=1):
        out = super().update(n)
        self.totals.append((self.n, self.total))
        return out


@pytest.fixture
def bars(monkeypatch):
    Recorder.made = []
    monkeypatch.setattr(tqdm, "tqdm", Recorder)
    return Recorder.made


@pytest.mark.parametrize("search", ["astar", "rollout", "continuous"])
def test_a_search_that_stops_at_its_goal_has_a_count_and_no_total(bars, search):
    """A* and rollouts stop when they reach the goal: a total of budget x searches would
    crawl to a few percent with a wrong ETA, then jump."""
    params = tiny_search(search, num_searches=1 if search == "continuous" else 2)
    exp = Experiment("t", params, TINY_MODEL, default_runs(skip_sync=True,
                                                           backends=("local",)))
    assert run_experiment(exp, save_path=None, show_progress=True).ok
    (bar,) = bars
    assert bar.totals[0] is None
    assert all(total is None for _, total in bar.totals[1:]) and bar.n > 0


def test_mcts_spends_its_whole_budget_and_keeps_its_total(bars):
    params = tiny_search("mcts", num_searches=2, gnn_budget=16)
    exp = Experiment("t", params, TINY_MODEL, default_runs(skip_sync=True,
                                                           backends=("local",)))
    assert run_experiment(exp, save_path=None, show_progress=True).ok
    (bar,) = bars
    assert bar.totals[0] == 2 * 17  # the root, then 16 simulations, per search
    assert all(n <= total for n, total in bar.totals[1:])


def test_a_count_past_the_total_raises_the_total(bars):
    with progress_bar("games", 10, unit="position") as update:
        update(6)
        update(7)  # whole games pass the positions asked for
        (bar,) = bars
        assert (bar.n, bar.total) == (13, 13)
        assert "100%" in bar.format_meter(**bar.format_dict)  # not 130 %
