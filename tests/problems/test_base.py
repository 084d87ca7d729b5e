"""The protocols that searches depend on: what ``compact_keys_of`` finds."""

from async_search import problems
from async_search.problems.base import CompactKeys, SearchProblem, compact_keys_of


def test_compact_keys_of_a_problem_that_offers_none_is_none():
    graph = problems.SyntheticGraph(branching=2, depth=3)
    assert isinstance(graph, SearchProblem)
    assert compact_keys_of(graph) is None
    assert compact_keys_of(problems.SlidingPuzzle(5)) is None  # offers, but not at 5


def test_compact_keys_of_the_15_puzzle_follow_the_protocol():
    puzzle = problems.SlidingPuzzle(4)
    keys = compact_keys_of(puzzle)
    assert isinstance(keys, CompactKeys) and keys is puzzle.compact_keys()
    assert keys.step_cost == 1 and keys.goal_keys == {keys.key(puzzle.goal)}
