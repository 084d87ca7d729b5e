"""Every search gives the same results run one after another with ``asr.immediate`` and
run concurrently through one ``asr.serve``, for models whose rows are batch-independent.
"""

import functools

import numpy as np
import pytest

from async_search import problems, search

PUZZLE = problems.SlidingPuzzle(3)
GAME = problems.ConnectFour()
NUM_SEARCHES = 32


def puzzle_starts(seed):
    return [PUZZLE.scramble(40, seed=seed * 1000 + i) for i in range(NUM_SEARCHES)]


def game_starts(seed):
    rng = np.random.default_rng(seed)
    starts = []
    for _ in range(NUM_SEARCHES):
        state = GAME.initial_state()
        for _ in range(rng.integers(0, 8)):
            state = GAME.play(state, int(rng.choice(GAME.legal_actions(state))))
        starts.append(state)
    return starts


@functools.lru_cache(maxsize=None)
def puzzle_model(kind):
    if kind == "manhattan":
        return problems.ManhattanHeuristic(PUZZLE)
    return problems.heuristic_mlp(PUZZLE, hidden_sizes=(32,), seed=1)


SEARCHES = {
    "batched_astar": lambda s, ev: search.batched_astar(PUZZLE, s, ev, budget=300,
                                                        buffer_size=4),
    "batched_astar_weighted": lambda s, ev: search.batched_astar(
        PUZZLE, s, ev, budget=300, buffer_size=16, weight=0.6),
    "continuous_astar": lambda s, ev: search.continuous_astar(PUZZLE, s, ev, budget=300,
                                                              max_in_flight=6),
    "multi_rollout": lambda s, ev: search.multi_rollout(PUZZLE, s, ev, depth=16,
                                                        num_rollouts=4, seed=3),
}


def assert_batched(stats):
    assert stats["mean_batch_size"] > 4  # the requests really were batched together


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(SEARCHES))
async def test_concurrent_searches_through_serve_equal_sequential_runs(name, seed,
                                                                       run_both):
    sequential, concurrent, stats = await run_both(SEARCHES[name], puzzle_starts(seed),
                                                   puzzle_model("mlp"))
    assert concurrent == sequential
    assert_batched(stats)


@pytest.mark.parametrize("name", ["batched_astar", "continuous_astar"])
async def test_astar_with_manhattan_through_serve_finds_the_same_optimal_paths(
        name, run_both, eight_puzzle_distances):
    def astar(s, ev):
        if name == "batched_astar":
            return search.batched_astar(PUZZLE, s, ev, budget=20000, buffer_size=8)
        return search.continuous_astar(PUZZLE, s, ev, budget=20000, max_in_flight=8)

    starts = puzzle_starts(7)
    sequential, concurrent, stats = await run_both(astar, starts, puzzle_model("manhattan"))
    assert concurrent == sequential
    assert [r.cost for r in concurrent] == [eight_puzzle_distances[s] for s in starts]
    assert_batched(stats)


async def test_requests_split_across_small_batches_give_the_same_results(run_both):
    sequential, concurrent, _ = await run_both(SEARCHES["batched_astar"], puzzle_starts(3),
                                               puzzle_model("mlp"), max_batch_size=5)
    assert concurrent == sequential


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_concurrent_mcts_through_serve_equals_sequential_runs(seed, run_both):
    net = problems.PolicyValueMLP(GAME, hidden_sizes=(32,), seed=seed)

    def mcts(state, ev):
        return search.mcts(GAME, state, ev, num_simulations=48, num_parallel=8, seed=seed)

    sequential, concurrent, stats = await run_both(mcts, game_starts(seed), net)
    assert concurrent == sequential
    assert_batched(stats)


async def test_tensorflow_nets_through_serve_equal_sequential_runs(run_both):
    tf_nets = pytest.importorskip("async_search.problems.tf_nets")
    pytest.importorskip("tensorflow")
    heuristic = tf_nets.heuristic_tf_net(PUZZLE, hidden_sizes=(32,), seed=1,
                                         max_batch_size=256)
    sequential, concurrent, _ = await run_both(SEARCHES["batched_astar"], puzzle_starts(4),
                                               heuristic)
    assert concurrent == sequential
    # The TensorFlow net is the NumPy MLP: same results as with the NumPy model.
    numpy_results, _, _ = await run_both(SEARCHES["batched_astar"], puzzle_starts(4)[:4],
                                         puzzle_model("mlp"))
    assert sequential[:4] == numpy_results

    policy_value = tf_nets.policy_value_tf_net(GAME, hidden_sizes=(32,), seed=0,
                                               max_batch_size=256)

    def mcts(state, ev):
        return search.mcts(GAME, state, ev, num_simulations=32, num_parallel=8, seed=0)

    sequential, concurrent, _ = await run_both(mcts, game_starts(0), policy_value)
    assert concurrent == sequential
