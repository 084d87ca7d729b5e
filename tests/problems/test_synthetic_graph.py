import numpy as np
import pytest

import async_search as asr
from async_search import problems, search
from async_search.problems import SyntheticGraph, synthetic_graph


def all_states(graph, start):
    states, frontier = [start], [start]
    while frontier:
        frontier = [c for s in frontier for c, _ in graph.neighbors(s)]
        states.extend(frontier)
    return states


def test_successors_are_deterministic_given_seed():
    a, b, c = (SyntheticGraph(3, 5, seed=s) for s in (1, 1, 2))
    assert a.neighbors(a.start()) == b.neighbors(b.start())
    assert a.neighbors(a.start()) != c.neighbors(c.start())
    assert a.start(0) != a.start(1)


def test_tree_has_branching_children_per_level_and_leaves_at_depth():
    graph = SyntheticGraph(branching=3, depth=4, seed=0)
    states = all_states(graph, graph.start())
    assert len(states) == 1 + 3 + 9 + 27 + 81
    assert len(set(states)) == len(states)
    assert all(graph.neighbors(s) == [] for s in states if s[0] == 4)
    assert all(cost == 1 for s in states for _, cost in graph.neighbors(s))


def test_goals_are_leaves_in_about_goal_fraction():
    graph = SyntheticGraph(branching=4, depth=5, seed=0, goal_fraction=0.1)
    states = all_states(graph, graph.start())
    goals = [s for s in states if graph.is_goal(s)]
    assert all(s[0] == 5 for s in goals)
    assert 60 <= len(goals) <= 150  # of 1024 leaves


class StepClock:
    """Stands in for the ``time`` module: ``perf_counter_ns`` advances 1 ms a read."""

    def __init__(self):
        self.reads = 0

    def perf_counter_ns(self):
        self.reads += 1
        return self.reads * 1_000_000


def test_expansion_spins_for_node_cost_us(monkeypatch):
    # On a clock that advances 1 ms a read, 3000 us of spinning is the start read and
    # three more: the spin ends on the clock, not after a set number of loops.
    clock = StepClock()
    monkeypatch.setattr(synthetic_graph, "time", clock)
    graph = SyntheticGraph(branching=2, depth=3, node_cost_us=3000, seed=0)
    assert len(graph.neighbors(graph.start())) == 2
    assert clock.reads == 1 + 3
    clock.reads = 0
    free = SyntheticGraph(branching=2, depth=3, node_cost_us=0, seed=0)
    assert free.neighbors(free.start()) == graph.neighbors(graph.start())
    assert clock.reads == 1 + 3  # graph's expansion only: node_cost_us=0 never spins


def test_encode_holds_remaining_depth_then_id_bits():
    graph = SyntheticGraph(branching=2, depth=6, seed=0, num_features=9)
    state = (2, 0b10110001)
    x = graph.encode([state, graph.start()])
    assert x.shape == (2, 9) and x.dtype == np.float32
    assert x[0].tolist() == [4, 1, 0, 0, 0, 1, 1, 0, 1]
    assert x[1, 0] == 6


@pytest.mark.parametrize("bad", [(0,), (7, 1), (-1, 3), (1, 2 ** 64), [0, 1]])
def test_check_state_rejects_states_off_the_graph(bad):
    with pytest.raises(ValueError, match="SyntheticGraph.*level in 0..6"):
        SyntheticGraph(depth=6).check_state(bad)


@pytest.mark.parametrize("kwargs, name", [
    (dict(branching=0), "branching"), (dict(depth=0), "depth"),
    (dict(node_cost_us=-1), "node_cost_us"), (dict(goal_fraction=1.5), "goal_fraction"),
    # finite, but past a float once in nanoseconds: every expansion raised OverflowError
    (dict(node_cost_us=1e306), "node_cost_us"),
    (dict(seed=1.5), "seed"), (dict(seed=None), "seed")])
def test_bad_arguments_raise(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SyntheticGraph(**kwargs)


@pytest.mark.parametrize("index", [None, 1.5, "1", True])
def test_a_start_index_that_is_no_integer_is_refused_not_rounded(index):
    with pytest.raises(ValueError, match="start's index must be an integer"):
        SyntheticGraph().start(index)
    assert SyntheticGraph().start(-2) != SyntheticGraph().start(2)  # any integer is one


async def test_astar_with_depth_heuristic_finds_a_goal_at_depth():
    graph = SyntheticGraph(branching=3, depth=6, seed=4, goal_fraction=0.05)
    evaluate = asr.immediate(problems.DepthHeuristic(graph))
    result = await search.batched_astar(graph, graph.start(), evaluate, budget=5000,
                                        buffer_size=4)
    assert result.status is search.Status.GOAL_FOUND
    assert result.cost == 6 and graph.is_goal(result.path[-1])
