"""Tree reuse between moves (search/reuse.py), for search.mcts and search.gumbel_mcts."""

import pickle

import numpy as np
import pytest

import async_search as asr
from async_search import problems, search
from async_search.search.reuse import start_tree, subtree

GAME = problems.ConnectFour()
NET = problems.PolicyValueMLP(GAME, hidden_sizes=(64,), seed=0)
START = GAME.from_moves([3, 3, 2])
SEARCHES = {
    "mcts": lambda state, ev, **kw: search.mcts(GAME, state, ev, **kw),
    "gumbel": lambda state, ev, **kw: search.gumbel_mcts(GAME, state, ev, **kw),
}


def same_statistics(old, old_node, new, new_node):
    """Every statistic of ``old``'s subtree at ``old_node`` equals ``new``'s at
    ``new_node``, node by node (matched by the actions leading to them)."""
    assert old.node_state[old_node] == new.node_state[new_node]
    assert old.status(old_node) == new.status(new_node)
    assert old.node_value.get(old_node) == new.node_value.get(new_node)
    assert old.terminal_value(old_node) == new.terminal_value(new_node)
    assert old.node_visits(old_node) == new.node_visits(new_node)
    for read in ("actions", "visits", "value_sums", "priors", "virtual"):
        assert getattr(old, read)(old_node) == getattr(new, read)(new_node), read
    nodes = 1
    for a, b in zip(old.children(old_node), new.children(new_node)):
        assert (a is None) == (b is None)
        if a is not None:
            nodes += same_statistics(old, a, new, b)
    return nodes


@pytest.mark.parametrize("name", SEARCHES)
async def test_a_kept_subtree_has_the_statistics_of_the_child(name):
    r = await SEARCHES[name](START, asr.immediate(NET), num_simulations=64, seed=1,
                             keep_tree=True)
    for action in GAME.legal_actions(START):
        kept = r.subtree(action)
        edge = r.tree.edges(0)[r.tree.actions(0).index(action)]
        child = r.tree.edge_child[edge]
        if kept is None:
            assert r.visit_counts[action] == 0
            continue
        assert kept.node_state[0] == GAME.play(START, action)
        assert kept.node_visits(0) == r.visit_counts[action] - 1  # its own evaluation
        nodes = same_statistics(r.tree, child, kept, 0)
        assert nodes == kept.num_nodes  # and nothing else came along


@pytest.mark.parametrize("name", SEARCHES)
async def test_a_reused_search_goes_on_from_the_kept_statistics(name, recorder):
    first = await SEARCHES[name](START, asr.immediate(NET), num_simulations=64,
                                 keep_tree=True)
    kept = first.subtree(first.action)
    state = GAME.play(START, first.action)
    evaluate = recorder(NET)
    again = await SEARCHES[name](state, evaluate, num_simulations=32, reuse=kept, seed=3)
    assert again.reused_visits == kept.node_visits(0) > 0
    assert sum(again.visit_counts) == 32 + again.reused_visits
    assert again.num_simulations == 32
    # The root was not evaluated again.
    assert again.evaluations == sum(len(x) for x in evaluate.requests) <= 32
    assert again.network_value == kept.node_value[0]
    assert again.tree_size >= kept.num_nodes


@pytest.mark.parametrize("name", SEARCHES)
async def test_a_reused_search_is_deterministic_and_leaves_the_subtree_alone(name):
    first = await SEARCHES[name](START, asr.immediate(NET), num_simulations=48,
                                 keep_tree=True)
    kept = first.subtree(first.action)
    before = first.subtree(first.action)
    state = GAME.play(START, first.action)
    runs = [await SEARCHES[name](state, asr.immediate(NET), num_simulations=24,
                                 reuse=kept, seed=2) for _ in range(2)]
    assert runs[0] == runs[1]
    same_statistics(before, 0, kept, 0)


@pytest.mark.parametrize("name", SEARCHES)
async def test_reuse_gives_equal_results_immediate_and_served(name, run_both):
    first = await SEARCHES[name](START, asr.immediate(NET), num_simulations=48,
                                 keep_tree=True)
    starts = [(GAME.play(START, a), first.subtree(a)) for a in GAME.legal_actions(START)
              if first.visit_counts[a] > 1]
    assert len(starts) >= 2

    async def go(start, evaluate):
        state, kept = start
        return await SEARCHES[name](state, evaluate, num_simulations=16, num_parallel=4,
                                    reuse=kept)

    sequential, concurrent, _ = await run_both(go, starts, NET)
    assert sequential == concurrent


@pytest.mark.parametrize("name", SEARCHES)
async def test_a_child_visited_once_is_reused_from_its_evaluation_alone(name, recorder):
    first = await SEARCHES[name](GAME.initial_state(), asr.immediate(NET),
                                 num_simulations=7, num_parallel=7, keep_tree=True,
                                 **({"dirichlet_fraction": 0.0} if name == "mcts" else {}))
    once = [a for a in range(7) if first.visit_counts[a] == 1]
    kept = first.subtree(once[0])
    assert kept.status(0) == "EVALUATED" and kept.node_visits(0) == 0
    assert subtree(kept, 0) is None  # nothing below it yet: no reply to walk down
    evaluate = recorder(NET)
    again = await SEARCHES[name](GAME.play(GAME.initial_state(), once[0]), evaluate,
                                 num_simulations=8, reuse=kept)
    assert again.reused_visits == 0 and sum(again.visit_counts) == 8
    assert len(evaluate.requests[0]) > 1 or again.requests == len(evaluate.requests)
    assert again.evaluations == sum(len(x) for x in evaluate.requests)


async def test_nothing_is_kept_for_an_action_never_tried_or_that_ended_the_game():
    win = GAME.from_moves([0, 6, 1, 6, 2, 5])
    r = await search.gumbel_mcts(GAME, win, asr.immediate(NET), num_simulations=3,
                                 max_num_considered_actions=3, keep_tree=True)
    tried = [a for a in range(7) if r.visit_counts[a]]
    untried = [a for a in range(7) if not r.visit_counts[a]]
    assert r.subtree(untried[0]) is None
    if 3 in tried:
        assert r.subtree(3) is None  # the winning move: a terminal child


async def test_subtree_refuses_an_illegal_action_and_a_result_without_a_tree():
    full = GAME.from_moves([0] * 6)
    r = await search.mcts(GAME, full, asr.immediate(NET), num_simulations=8,
                          keep_tree=True)
    with pytest.raises(ValueError, match="action 0 is not one of the root's actions"):
        r.subtree(0)
    for not_an_action in (True, 3.0, "3", None):  # True and 3.0 gave actions 1 and 3
        with pytest.raises(ValueError, match="an action is an integer, got"):
            r.subtree(not_an_action)
    assert r.subtree(np.int64(3)) is not None
    plain = await search.mcts(GAME, full, asr.immediate(NET), num_simulations=8)
    assert plain.tree is None
    with pytest.raises(ValueError, match="pass keep_tree=True"):
        plain.subtree(1)


@pytest.mark.parametrize("name", SEARCHES)
async def test_reuse_of_another_position_is_refused_before_any_request(name, recorder):
    first = await SEARCHES[name](START, asr.immediate(NET), num_simulations=16,
                                 keep_tree=True)
    kept = first.subtree(first.action)
    evaluate = recorder(NET)
    with pytest.raises(ValueError, match="reuse is a tree of another position"):
        await SEARCHES[name](START, evaluate, num_simulations=4, reuse=kept)
    assert evaluate.requests == []


def test_a_tree_in_the_middle_of_a_round_is_refused():
    tree = start_tree(GAME, START, None)
    tree.expand_root([0.0] * 7, 0.0)
    tree.select_leaves(1.25, 2)
    with pytest.raises(ValueError, match="descents in flight"):
        subtree(tree, 0)


async def test_results_pickle_without_a_tree_and_compare_without_it():
    r = await search.gumbel_mcts(GAME, START, asr.immediate(NET), num_simulations=8)
    assert pickle.loads(pickle.dumps(r)) == r
    kept = await search.gumbel_mcts(GAME, START, asr.immediate(NET), num_simulations=8,
                                    keep_tree=True)
    assert kept == r and kept.tree is not None and "Tree" not in repr(kept)


async def test_mcts_and_gumbel_trees_serve_each_other():
    g = await search.gumbel_mcts(GAME, START, asr.immediate(NET), num_simulations=32,
                                 keep_tree=True)
    state = GAME.play(START, g.action)
    m = await search.mcts(GAME, state, asr.immediate(NET), num_simulations=16,
                          reuse=g.subtree(g.action), keep_tree=True)
    assert m.reused_visits == g.visit_counts[g.action] - 1
    after = GAME.play(state, m.action)
    g2 = await search.gumbel_mcts(GAME, after, asr.immediate(NET), num_simulations=16,
                                  reuse=m.subtree(m.action))
    assert g2.reused_visits == m.visit_counts[m.action] - 1


async def test_a_player_walks_its_tree_down_its_move_and_the_reply():
    r = await search.gumbel_mcts(GAME, START, asr.immediate(NET), num_simulations=64,
                                 keep_tree=True, gumbel_scale=0.0)
    mine = r.subtree(r.action)
    reply = max(range(7), key=lambda a: (mine.visits(0)[mine.actions(0).index(a)]
                                         if a in mine.actions(0) else -1))
    two_plies = subtree(mine, reply)
    assert two_plies.node_state[0] == GAME.play(GAME.play(START, r.action), reply)
    again = await search.gumbel_mcts(GAME, two_plies.node_state[0], asr.immediate(NET),
                                     num_simulations=8, reuse=two_plies)
    assert again.reused_visits == two_plies.node_visits(0) > 0


@pytest.mark.parametrize("n1, n2", [(10, 20), (1, 30), (25, 7)])
async def test_mcts_going_on_from_its_own_tree_equals_one_longer_search(n1, n2):
    # The strongest check of what a kept tree holds: PUCT without noise and with one
    # leaf in flight (so that no round boundary differs), continued from its whole
    # tree, makes the choices of one uninterrupted search.
    kwargs = dict(num_parallel=1, dirichlet_fraction=0.0)
    first = await search.mcts(GAME, START, asr.immediate(NET), num_simulations=n1,
                              keep_tree=True, **kwargs)
    going_on = await search.mcts(GAME, START, asr.immediate(NET), num_simulations=n2,
                                 reuse=first.tree, **kwargs)
    longer = await search.mcts(GAME, START, asr.immediate(NET), num_simulations=n1 + n2,
                               **kwargs)
    assert going_on.visit_counts == longer.visit_counts
    assert going_on.action_values == longer.action_values
    assert going_on.root_value == longer.root_value
    assert going_on.tree_size == longer.tree_size
    assert going_on.reused_visits == n1
    assert going_on.evaluations == longer.evaluations - first.evaluations
