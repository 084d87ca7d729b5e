"""Shipped models and Korf's 100 15-puzzle instances."""

import os

import numpy as np
import pytest

from async_search import problems
from async_search.problems.pretrained_models import (PRETRAINED, KorfInstance, korf100,
                                                     pretrained_path)

PUZZLE = problems.SlidingPuzzle(4)


# -- Korf's instances ---------------------------------------------------------------------


def test_korf100_has_100_distinct_solvable_instances():
    instances = korf100()
    assert len(instances) == 100
    assert [i.id for i in instances] == list(range(1, 101))
    assert len({i.state for i in instances}) == 100
    for instance in instances:
        assert isinstance(instance, KorfInstance) and isinstance(instance.state, bytes)
        PUZZLE.check_state(instance.state)  # 16 cells, each tile once, solvable
        assert instance.state != PUZZLE.goal


def test_korf100_optimal_lengths_are_at_least_manhattan_with_the_same_parity():
    for instance in korf100():
        manhattan = PUZZLE.manhattan_distance(instance.state)
        assert instance.optimal >= manhattan
        assert (instance.optimal - manhattan) % 2 == 0  # every move changes it by one


def test_korf100_matches_the_published_first_instance_and_range_of_lengths():
    instances = korf100()
    assert instances[0].optimal == 57
    lengths = [i.optimal for i in instances]
    assert (min(lengths), max(lengths)) == (41, 66)  # Korf 1985: 41 to 66 moves
    assert sum(lengths) / len(lengths) == pytest.approx(53.05)


# -- names --------------------------------------------------------------------------------


def test_an_unknown_pretrained_name_raises_value_error_listing_the_known_ones():
    for call in (problems.pretrained, pretrained_path):
        with pytest.raises(ValueError) as info:
            call("chess")
        message = str(info.value)
        assert "'chess'" in message
        assert "'connect_four'" in message and "'15-puzzle'" in message


def test_every_known_name_has_a_folder_under_the_package():
    assert set(PRETRAINED) == {"connect_four", "15-puzzle"}
    for name in PRETRAINED:
        path = pretrained_path(name)
        assert os.path.basename(path) == name
        assert os.path.basename(os.path.dirname(path)) == "pretrained"


# -- the shipped checkpoints ----------------------------------------------------------------


def test_pretrained_connect_four_loads_a_policy_value_net_with_game_shaped_outputs():
    net = problems.pretrained("connect_four")
    # A residual policy with an MLP value, reading the threat planes (issue 22's net).
    assert isinstance(net, problems.FeaturedNet)
    assert isinstance(net.body, problems.PolicyValueConvNet)
    assert (net.net_config.architecture, net.net_config.value_net) == ("residual", "mlp")
    assert net.input_spec == problems.ConnectFour().input_spec
    assert isinstance(net.checkpoint_metadata, dict)
    assert net.net_config.kind == "policy_value" and net.net_config.features == "threats"
    game = problems.ConnectFour()
    states = [game.initial_state(), game.from_moves([3, 3, 2]),
              game.from_moves([0, 1, 0, 1, 0, 1])]
    logits, value = net(game.encode(states))
    assert logits.shape == (3, 7) and value.shape == (3, 1)
    assert logits.dtype == value.dtype == np.float32
    assert np.isfinite(logits).all() and (np.abs(value) <= 1).all()


def test_pretrained_connect_four_tf_twin_is_bitwise_equal():
    pytest.importorskip("tensorflow")
    net = problems.pretrained("connect_four")
    twin = problems.tf_twin(net, max_batch_size=32)
    game = problems.ConnectFour()
    states = [game.from_moves([(i * 3 + k) % 7 for k in range(i % 9)]) for i in range(17)]
    x = game.encode(states)
    for n in (1, 3, 17):
        logits, value = net(x[:n])
        tf_logits, tf_value = twin(x[:n])
        assert tf_logits.tobytes() == logits.tobytes()
        assert tf_value.tobytes() == value.tobytes()


def test_pretrained_15_puzzle_loads_a_learned_heuristic_with_one_cost_per_board():
    h = problems.pretrained("15-puzzle")
    assert isinstance(h, problems.LearnedHeuristic)
    assert isinstance(h.checkpoint_metadata, dict)
    assert h.net_config.kind == "heuristic" and h.net_config.size == 4
    states = [PUZZLE.goal] + [i.state for i in korf100()[:9]]
    y = h(PUZZLE.encode(states))
    assert y.shape == (10, 1) and y.dtype == np.float32
    assert np.isfinite(y).all() and (y >= 0).all()


def test_the_pretrained_nets_and_manhattan_take_a_batch_of_zero_rows():
    puzzle = problems.SlidingPuzzle(4)
    for model in (problems.pretrained("15-puzzle"), problems.pretrained("connect_four"),
                  problems.ManhattanHeuristic(puzzle)):
        spec = model.input_spec
        out = model(np.zeros((0, *spec.shape), spec.dtype))
        for leaf in (out if isinstance(out, tuple) else (out,)):
            assert len(leaf) == 0


def test_pretrained_15_puzzle_tf_twin_is_bitwise_equal():
    pytest.importorskip("tensorflow")
    h = problems.pretrained("15-puzzle")
    twin = problems.tf_twin(h, max_batch_size=32)
    x = PUZZLE.encode([i.state for i in korf100()[:17]])
    for n in (1, 3, 17):
        assert twin(x[:n]).tobytes() == h(x[:n]).tobytes()


def test_the_shipped_checkpoints_are_small_enough_to_ship():
    for name in PRETRAINED:
        folder = pretrained_path(name)
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        assert size <= 5 * 2 ** 20, f"{name}: {size} bytes"


async def test_the_pretrained_connect_four_net_alone_beats_random():
    import async_search as asr
    from async_search.training import PolicyPlayer, RandomPlayer, play_match

    game = problems.ConnectFour()
    async with asr.serve(problems.pretrained("connect_four")) as evaluate:
        result = await play_match(game, PolicyPlayer(evaluate), RandomPlayer(),
                                  num_games=20, seed=1)
    assert result.score >= 0.85, result.describe()


async def test_the_learned_heuristic_needs_fewer_expansions_than_manhattan_on_korf():
    import asyncio

    import async_search as asr
    from async_search import search

    starts = [i.state for i in korf100()[:8]]

    async def expansions(h):
        async with asr.serve(h, max_batch_size=1024) as evaluate:
            rs = await asyncio.gather(*(search.batched_astar(
                PUZZLE, s, evaluate, budget=20_000, buffer_size=16, weight=0.3)
                for s in starts))
        return sum(r.status.value == "goal_found" for r in rs), sum(
            r.nodes_expanded for r in rs)

    learned_solved, learned = await expansions(problems.pretrained("15-puzzle"))
    manhattan_solved, manhattan = await expansions(problems.ManhattanHeuristic(PUZZLE))
    assert learned_solved >= manhattan_solved
    assert learned < manhattan


@pytest.mark.parametrize("name", [None, 3, ["connect_four"], b"connect_four"])
def test_a_name_of_another_type_gets_the_same_clear_error(name):
    with pytest.raises(ValueError, match="known: 'connect_four', '15-puzzle'"):
        problems.pretrained(name)


def _korf_file(tmp_path, change):
    import json
    path = os.path.join(os.path.dirname(problems.__file__), "data", "korf100.json")
    with open(path) as f:
        data = json.load(f)
    change(data["instances"])
    out = tmp_path / "korf100.json"
    out.write_text(json.dumps(data))
    return str(out)


def _swap_two_tiles(state):
    i, j = [k for k, tile in enumerate(state) if tile][:2]
    state[i], state[j] = state[j], state[i]


@pytest.mark.parametrize("change, why", [
    (lambda rows: rows.pop(), "'instances' must be a list of 100 entries"),
    (lambda rows: rows[4].update(id=6), "entry 5 has id 6"),
    (lambda rows: rows[2].update(optimal=rows[2]["optimal"] + 1), "instance 3: an optimal"),
    (lambda rows: rows[2].update(optimal=2), "instance 3: an optimal length of 2"),
    (lambda rows: rows[7].update(state=rows[7]["state"][:15]), "entry 8"),
    (lambda rows: _swap_two_tiles(rows[7]["state"]), "entry 8 .*unsolvable"),
    (lambda rows: rows[9].update(optimal="55"), "entry 10 .*integers"),
    (lambda rows: rows[9].pop("optimal"), "entry 10 .*KeyError"),
])
def test_a_damaged_instances_file_is_refused_naming_the_file_and_the_instance(
        tmp_path, change, why):
    from async_search.problems.pretrained_models import read_korf_instances
    path = _korf_file(tmp_path, change)
    with pytest.raises(ValueError, match=f"not Korf's 100 instances: {why}") as info:
        read_korf_instances(path)
    assert path in str(info.value)


def test_the_shipped_instances_read_the_same_through_the_checked_reader(tmp_path):
    from async_search.problems.pretrained_models import read_korf_instances
    assert read_korf_instances(_korf_file(tmp_path, lambda rows: None)) == korf100()
