"""The pure A* core, driven without an event loop."""

import pytest

from async_search.search import Status
from async_search.search.astar import astar_result
from async_search.search.frontier import (expand_nodes, has_open_node, new_frontier, path_to,
                                          pop_nodes, record_values)


def drive(problem, start, *, buffer_size=1, weight=1.0, budget=10**9, trace=None):
    """batched_astar without the coroutine: the model is the toy graph's h table."""
    model = problem.model()
    fr = new_frontier(problem, start, weight=weight)
    while fr.evaluations < budget and has_open_node(fr):
        nodes = pop_nodes(fr, buffer_size)
        if trace is not None:
            trace.extend(s for s, _ in nodes)
        states = expand_nodes(problem, fr, nodes)
        if states:
            fr.evaluations += len(states)
            fr.requests += 1
            record_values(fr, states, model(problem.encode(states))[:, 0].tolist())
    return fr


def test_start_at_a_goal_leaves_nothing_to_expand(toy_graph):
    graph = toy_graph({"S": [("A", 1)]}, goals=["S"])
    fr = new_frontier(graph, "S", weight=1.0)
    assert not has_open_node(fr) and pop_nodes(fr, 4) == []
    result = astar_result(fr)
    assert result.status is Status.GOAL_FOUND and result.path == ("S",) and result.cost == 0


def test_pop_order_is_by_f_then_smaller_h_then_insertion(toy_graph):
    graph = toy_graph({"S": [("X", 1), ("Y", 2), ("Z", 1), ("W", 1)]}, goals=[],
                      h={"X": 2, "Y": 1, "Z": 2, "W": 5})
    trace = []
    drive(graph, "S", trace=trace)
    assert trace == ["S", "Y", "X", "Z", "W"]


def test_a_child_shared_by_two_popped_nodes_is_evaluated_once(toy_graph):
    graph = toy_graph({"S": [("A", 1), ("B", 1)], "A": [("C", 1), ("D", 1)],
                       "B": [("C", 1)]}, goals=[])
    fr = new_frontier(graph, "S", weight=1.0)
    record_values(fr, expand_nodes(graph, fr, pop_nodes(fr, 1)), [0.0, 0.0])
    assert expand_nodes(graph, fr, pop_nodes(fr, 2)) == ["C", "D"]


def test_cheaper_path_reopens_an_expanded_state_without_reevaluating_it(toy_graph):
    # h(B) = 3 makes B come after C was expanded via A (g 3); B then finds C at g 2.5.
    graph = toy_graph({"S": [("A", 1), ("B", 2)], "A": [("C", 2)], "B": [("C", 0.5)],
                       "C": [("G", 10)]}, goals=["G"], h={"A": 0, "B": 3, "C": 0})
    trace = []
    fr = drive(graph, "S", trace=trace)
    assert trace == ["S", "A", "C", "B", "C"]
    result = astar_result(fr)
    assert result.path == ("S", "B", "C", "G") and result.cost == 12.5
    assert result.evaluations == 3  # A, B, C; C's value was reused when reopened


def test_search_continues_past_a_goal_while_a_cheaper_one_may_exist(toy_graph):
    # The expensive goal is generated first; A (f = 2 < 3) must still be expanded.
    graph = toy_graph({"S": [("G", 3), ("A", 1)], "A": [("G", 1)]}, goals=["G"],
                      h={"A": 1})
    fr = drive(graph, "S", buffer_size=4)
    assert path_to(fr, "G") == (("S", "A", "G"), 2)
    assert not has_open_node(fr)


def test_nodes_with_priority_at_the_goal_cost_are_not_expanded(toy_graph):
    graph = toy_graph({"S": [("G", 2), ("A", 1)], "A": [("B", 1)]}, goals=["G"],
                      h={"A": 1})
    trace = []
    fr = drive(graph, "S", trace=trace)
    assert trace == ["S"]  # f(A) = 2 is not below the goal's cost 2
    assert astar_result(fr).cost == 2


def test_weight_zero_is_greedy_on_h(toy_graph):
    graph = toy_graph({"S": [("A", 1), ("B", 10)]}, goals=[], h={"A": 5, "B": 1})
    for weight, first in ((1.0, "A"), (0.0, "B")):
        trace = []
        drive(graph, "S", weight=weight, trace=trace)
        assert trace[1] == first


def test_result_status_without_goal_tells_budget_from_exhausted_space(toy_graph):
    graph = toy_graph({"S": [("A", 1), ("B", 1)], "A": [("C", 1)]}, goals=[])
    done = astar_result(drive(graph, "S"))
    assert done.status is Status.SPACE_EXHAUSTED and done.path is None
    assert (done.nodes_expanded, done.nodes_generated, done.evaluations) == (4, 4, 3)
    stopped = astar_result(drive(graph, "S", budget=1))
    assert stopped.status is Status.BUDGET_EXHAUSTED and stopped.evaluations == 2


def test_values_recorded_in_any_order_are_pushed_in_that_order(toy_graph):
    # Equal priorities go to the earlier push: here the order values were recorded in.
    graph = toy_graph({"S": [("A", 1), ("B", 1), ("C", 1)]}, goals=[])
    fr = new_frontier(graph, "S", weight=1.0)
    states = expand_nodes(graph, fr, pop_nodes(fr, 1))
    assert states == ["A", "B", "C"]
    record_values(fr, ["C", "A"], [0.0, 0.0])
    record_values(fr, ["B"], [0.0])
    assert [s for s, _ in pop_nodes(fr, 3)] == ["C", "A", "B"]


def test_a_node_reached_more_cheaply_after_its_value_is_known_is_pushed_again(toy_graph):
    # C is first reached at g 5 and evaluated; A, popped next, reaches it at g 2: C is
    # pushed again at once (its value is known), and its first entry goes stale.
    graph = toy_graph({"S": [("A", 1), ("C", 5)], "A": [("C", 1)], "C": []}, goals=[],
                      h={"A": 0, "C": 0})
    trace = []
    fr = drive(graph, "S", trace=trace)
    assert trace == ["S", "A", "C"]
    assert path_to(fr, "C") == (("S", "A", "C"), 2)
    assert astar_result(fr).evaluations == 2


def test_priorities_that_overflow_to_inf_are_still_popped(toy_graph):
    # weight * g + h overflows for a huge h: such a node is open at f = inf, and
    # pop_nodes must agree with has_open_node (continuous_astar looped forever when they
    # did not). (weight * g itself stays a float: a path past that is refused.)
    graph = toy_graph({"S": [("A", 1e295)], "A": [("B", 1e295)], "B": [("G", 1e295)]},
                      goals=["G"], h={"A": 1, "B": 1})
    fr = new_frontier(graph, "S", weight=1e12)
    for state in ("S", "A"):
        assert pop_nodes(fr, 4) == [(state, fr.g[fr.index[state]])]
        record_values(fr, expand_nodes(graph, fr, [(state, fr.g[fr.index[state]])]),
                      [1.7e308])
    assert fr.f_heap == [float("inf")]
    assert has_open_node(fr) and pop_nodes(fr, 4) == [("B", 2e295)]


def test_a_path_whose_weighted_cost_passes_the_floats_is_refused_when_generated(
        toy_graph):
    graph = toy_graph({"S": [("A", 1)], "A": [("B", 1)], "B": [("G", 1)]}, goals=["G"],
                      h={"A": 1, "B": 1})
    fr = new_frontier(graph, "S", weight=1e308)
    record_values(fr, expand_nodes(graph, fr, pop_nodes(fr, 4)), [1.0])  # g 1: a float
    with pytest.raises(ValueError, match="ToyGraph: a path costs 2, past the largest "
                                         "float .* over the weight"):
        expand_nodes(graph, fr, pop_nodes(fr, 4))


def test_batched_astar_with_a_huge_weight_searches_on_to_a_cheapest_goal():
    import asyncio

    import async_search as asr
    from async_search import problems
    from async_search.search import batched_astar

    puzzle = problems.SlidingPuzzle(3)
    evaluate = asr.immediate(problems.ManhattanHeuristic(puzzle))
    # A weight past 1e12 searches as 1e12 (g orders the nodes, h breaks ties): the
    # cheapest path, as with any weight >= 1 and an admissible heuristic, where f would
    # overflow to inf and every priority tie.
    start = bytes([8, 6, 7, 2, 5, 4, 3, 0, 1])  # 31 moves from the goal
    results = [asyncio.run(batched_astar(puzzle, start, evaluate, budget=200_000,
                                         buffer_size=4, weight=weight))
               for weight in (1.0, 1e12, 1e308)]
    assert all(r.status is Status.GOAL_FOUND and r.cost == 31 for r in results)
    assert results[1] == results[2]


def test_a_paths_cost_is_summed_from_the_start_as_its_g_values_were(toy_graph):
    # Summed from the goal back, 1e-16 + 1e-16 + 1.0 is 1.0000000000000002; from the
    # start on, as g grew, (1.0 + 1e-16) + 1e-16 is 1.0.
    graph = toy_graph({"S": [("A", 1.0)], "A": [("B", 1e-16)], "B": [("G", 1e-16)]},
                      goals=["G"])
    result = astar_result(drive(graph, "S"))
    assert result.path == ("S", "A", "B", "G")
    assert result.cost == (1.0 + 1e-16) + 1e-16 == 1.0


def test_a_paths_cost_is_its_g_where_pythons_sum_compensates(toy_graph, compensated_sum):
    # Python 3.12's sum adds floats with compensation: the cost was 1.0000000000000002
    # there, and no longer the goal's g.
    graph = toy_graph({"S": [("A", 1.0)], "A": [("B", 1e-16)], "B": [("G", 1e-16)]},
                      goals=["G"])
    assert astar_result(drive(graph, "S")).cost == 1.0
