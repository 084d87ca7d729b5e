"""The pure MCTS core: selection, virtual loss, expansion and backup, without a loop."""

import math

import numpy as np
import pytest

from async_search.base import TensorSpec
from async_search.problems import ConnectFour
from async_search.search.tree import (EVALUATED, LEAF, PENDING, TERMINAL, Tree,
                                      priors_from_logits)

GAME = ConnectFour()
UNIFORM = [0.0] * 7


class Corridor:
    """A one-action game: from k, the only move leads to k - 1; 0 is a draw."""

    num_actions = 1
    input_spec = TensorSpec((1,), np.float32)

    def legal_actions(self, state):
        return (0,) if state else ()

    def play(self, state, action):
        return state - 1

    def terminal_value(self, state):
        return 0.0 if state == 0 else None


class Plain:
    """Connect Four through the Game protocol only (no internal fast rules)."""

    num_actions = 7
    input_spec = GAME.input_spec

    def legal_actions(self, state):
        return GAME.legal_actions(state)

    def play(self, state, action):
        return GAME.play(state, action)

    def terminal_value(self, state):
        return GAME.terminal_value(state)


def rooted(state=None, logits=UNIFORM, game=GAME):
    tree = Tree(game, GAME.initial_state() if state is None else state)
    tree.expand_root(logits)
    return tree


def set_edge(tree, node, i, visits, value_sum):
    """Give edge ``i`` of ``node`` completed statistics (what backups would leave)."""
    e = tree.edges(node)[i]
    into = tree.edge_child.index(node) if node else 0  # N lives on the edge into node
    tree.edge_seen1[into] += visits - (tree.edge_seen1[e] - 1)
    tree.edge_value_sum[e] = value_sum
    tree.edge_seen1[e] = 1 + visits
    tree.edge_q[e] = value_sum / visits if visits else 0.0


def test_select_child_prefers_the_highest_prior_among_unvisited_edges():
    tree = rooted(logits=[0.0, 0.0, 0.0, 1.5, 0.0, 0.0, 0.0])
    assert tree.select_child(0, 1.25) == 3


def test_select_child_ties_go_to_the_first_edge():
    assert rooted().select_child(0, 1.25) == 0


def test_select_child_balances_value_and_exploration():
    tree = rooted()
    set_edge(tree, 0, 0, 10, -5.0)
    set_edge(tree, 0, 1, 1, 0.9)
    assert tree.visits(0)[:2] == [10, 1] and tree.node_visits(0) == 11
    assert tree.select_child(0, 1.0) == 1  # Q = 0.9 beats the unvisited edges' U
    set_edge(tree, 0, 1, 2, -1.8)  # Q of edge 1 is now -0.9
    assert tree.select_child(0, 1.0) == 2


def test_virtual_loss_sends_parallel_descents_to_different_leaves():
    tree = rooted()
    paths, leaves, states = tree.select_leaves(1.25, 7)
    assert len({tree.node_state[leaf] for leaf in leaves}) == 7
    assert tree.virtual(0) == [1] * 7 and tree.node_visits(0) == 7
    assert all(tree.is_pending(leaf) for leaf in leaves)
    assert states == [GAME.play(GAME.initial_state(), a) for a in range(7)]
    # A virtual visit counts as a loss: Q = (value_sum - virtual) / (visits + virtual).
    assert tree.edge_q[paths[0][0]] == -1.0 and tree.edge_seen1[paths[0][0]] == 2


def test_a_descent_reaching_a_pending_leaf_is_undone_and_ends_the_round():
    tree = Tree(Corridor(), 5)
    tree.expand_root([0.0])
    paths, leaves, states = tree.select_leaves(1.25, 4)
    assert len(paths) == 1 and tree.is_pending(leaves[0]) and states == [4]
    assert tree.virtual(0) == [1] and tree.node_visits(0) == 1
    assert tree.edge_q[paths[0][0]] == -1.0


def test_an_undone_descent_leaves_the_statistics_exactly_as_they_were():
    tree = grow(rooted(GAME.from_moves([3, 3])), 20, 4)
    before = [list(getattr(tree, name)) for name in ("edge_q", "edge_seen1",
                                                     "edge_virtual")]
    paths, leaves, _ = tree.select_leaves(1.25, 1)
    assert len(paths[0]) >= 2
    tree._revert(paths[0])
    after = [getattr(tree, name) for name in ("edge_q", "edge_seen1", "edge_virtual")]
    for old, new in zip(before, after):
        assert new[:len(old)] == old


def test_backup_credits_each_edge_from_the_view_of_the_player_who_took_it():
    tree = rooted(logits=[0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    paths, leaves, _ = tree.select_leaves(1.25, 1)
    tree.complete_leaves(paths, leaves, np.array([[5.0, 0, 0, 0, 0, 0, 0]]), [0.0])
    paths, leaves, _ = tree.select_leaves(1.25, 1)
    child = tree.edge_child[paths[0][0]]
    assert [tree.edge_action[e] for e in paths[0]] == [1, 0]
    tree.complete_leaves(paths, leaves, np.zeros((1, 7)), [0.5])  # good for the leaf's
    assert tree.value_sums(child)[0] == -0.5 and tree.value_sums(0)[1] == 0.5
    assert tree.visits(child)[0] == 1 and tree.visits(0)[1] == 2
    assert tree.virtual(child)[0] == tree.virtual(0)[1] == 0
    assert tree.node_visits(0) == 2 and tree.node_visits(child) == 1


def test_a_terminal_leaf_backs_up_its_own_value_without_evaluation():
    state = GAME.from_moves([0, 6, 1, 6, 2, 5])  # the first player wins at column 3
    tree = rooted(state, [-50.0, -50.0, -50.0, 50.0, -50.0, -50.0, -50.0])
    for _ in range(3):
        paths, leaves, states = tree.select_leaves(1.25, 1)
        assert [tree.terminal_value(leaf) for leaf in leaves] == [-1.0]
        assert tree.node_edges[leaves[0]] is TERMINAL and states == []
        assert tree.status(leaves[0]) == "TERMINAL"
        tree.complete_leaves(paths, leaves, None, [])
    assert tree.visits(0)[3] == 3 and tree.value_sums(0)[3] == 3.0
    assert tree.virtual(0)[3] == 0


def test_terminal_leaves_may_repeat_within_a_round():
    tree = Tree(Corridor(), 1)  # the only move ends the game
    tree.expand_root([0.0])
    paths, leaves, _ = tree.select_leaves(1.25, 4)
    assert len(paths) == 4 and tree.virtual(0) == [4]
    tree.complete_leaves(paths, leaves, None, [])
    assert tree.visits(0) == [4] and tree.value_sums(0) == [0.0] and tree.virtual(0) == [0]


def test_complete_leaves_expands_evaluated_leaves_in_selection_order():
    tree = rooted()
    paths, leaves, _ = tree.select_leaves(1.25, 3)
    logits = np.zeros((3, 7), np.float32)
    logits[:, 6] = 5.0
    tree.complete_leaves(paths, leaves, logits, [0.1, 0.2, -0.3])
    assert tree.value_sums(0)[:3] == [-0.1, -0.2, 0.3] and tree.visits(0)[:3] == [1, 1, 1]
    for leaf in leaves:
        assert tree.is_expanded(leaf) and not tree.is_pending(leaf)
        # Edges (and priors) wait for the first descent through the leaf.
        assert tree.node_edges[leaf] is EVALUATED and tree.priors(leaf) == []
        tree.select_child(leaf, 1.25)
        assert max(tree.priors(leaf)) == tree.priors(leaf)[6]
        assert tree.actions(leaf) == tuple(range(7))


def test_edges_are_made_by_the_first_descent_through_a_node():
    tree = rooted()
    paths, leaves, _ = tree.select_leaves(1.25, 7)
    tree.complete_leaves(paths, leaves, np.zeros((7, 7)), [0.0] * 7)
    edges = len(tree.edge_child)
    paths, leaves, _ = tree.select_leaves(1.25, 1)
    assert len(paths[0]) == 2 and len(tree.edge_child) == edges + 7
    assert tree.node_edges[leaves[0]] is PENDING and tree.status(leaves[0]) == "PENDING"
    assert tree.children(0)[0] == tree.edge_child[paths[0][0]]
    assert tree.children(tree.edge_child[paths[0][0]]) == [leaves[0]] + [None] * 6


def test_priors_are_a_softmax_of_the_logits_of_legal_actions():
    state = GAME.from_moves([0] * 6 + [3] * 6)
    actions = GAME.legal_actions(state)
    assert actions == (1, 2, 4, 5, 6)
    prior = priors_from_logits(actions, np.arange(7, dtype=np.float32))
    expected = np.exp([1.0, 2, 4, 5, 6])
    assert np.allclose(prior, expected / expected.sum()) and math.isclose(sum(prior), 1)
    tree = rooted(state, np.arange(7, dtype=np.float32))
    assert tree.priors(0) == prior and tree.actions(0) == actions


def test_exploration_noise_is_seeded_and_keeps_the_prior_normalised():
    priors = []
    for seed in (0, 0, 1):
        tree = rooted()
        tree.add_exploration_noise(np.random.default_rng(seed), 0.3, 0.25)
        priors.append(tree.priors(0))
    assert priors[0] == priors[1] != priors[2]
    assert math.isclose(sum(priors[0]), 1.0)
    assert min(priors[0]) >= 0.75 / 7 - 1e-12
    tree = rooted()
    tree.add_exploration_noise(np.random.default_rng(0), 0.3, 0.0)
    assert tree.priors(0) == [1 / 7] * 7


def hash_logits(states, num_actions=7):
    """Deterministic, non-uniform logits and values for a list of states."""
    keys = [hash(s) % 1000003 for s in states]
    logits = np.array([[(k * (a + 3)) % 17 / 4.0 for a in range(num_actions)]
                       for k in keys])
    return logits, [((k % 201) - 100) / 100.0 for k in keys]


def grow(tree, rounds, k, check_descent=None):
    for _ in range(rounds):
        if check_descent is not None:
            check_descent(tree)
        paths, leaves, states = tree.select_leaves(1.25, k)
        logits, values = hash_logits(states) if states else (None, [])
        tree.complete_leaves(paths, leaves, logits, values)
    return tree


def test_the_inlined_descent_follows_select_child():
    def check(tree):
        node, expected = 0, []
        while tree.is_expanded(node):
            i = tree.select_child(node, 1.25)
            e = tree.edges(node)[i]
            expected.append(e)
            node = tree.edge_child[e]
            if not node:
                break
        paths, leaves, _ = tree.select_leaves(1.25, 1)
        assert paths[0] == expected
        tree._revert(paths[0])
        if tree.node_edges[leaves[0]] is PENDING:
            tree.node_edges[leaves[0]] = LEAF

    grow(rooted(GAME.from_moves([3, 3, 2])), 150, 1, check)


@pytest.mark.parametrize("k", [1, 8])
def test_the_fast_connect_four_rules_build_the_same_tree_as_the_game_protocol(k):
    start = GAME.from_moves([3, 2, 3, 2, 4])
    fast = grow(rooted(start), 60, k)
    plain = grow(rooted(start, game=Plain()), 60, k)
    assert fast.node_state == plain.node_state
    for name in Tree.__slots__:
        if name.startswith(("node_", "edge_")):
            assert getattr(fast, name) == getattr(plain, name), name
    assert fast._terminal == plain._terminal
    # The status ranges are all empty, hence equal: compare them by name.
    assert [fast.status(n) for n in range(fast.num_nodes)] == [
        plain.status(n) for n in range(plain.num_nodes)]
    assert {fast.status(n) for n in range(fast.num_nodes)} >= {"EDGES", "EVALUATED"}


def test_a_subclass_that_changes_the_rules_gets_the_generic_path():
    class Gravityless(ConnectFour):
        def play(self, state, action):
            return super().play(state, action)

    assert GAME._mcts_rules() is not None and Gravityless()._mcts_rules() is None


def test_expand_root_refuses_a_terminal_or_expanded_root():
    with pytest.raises(ValueError, match="terminal or already expanded"):
        rooted().expand_root(UNIFORM)
    with pytest.raises(ValueError, match="not expanded"):
        Tree(GAME, GAME.initial_state()).select_child(0, 1.25)
    with pytest.raises(ValueError, match="needs an expanded root"):
        Tree(GAME, GAME.initial_state()).select_leaves(1.25, 1)


def puct_rule(tree):
    """PUCT as a ``descend`` rule. The descent has already counted itself on the edge
    into ``node`` (as in ``select_leaves``), so ``node_visits`` reads ``1 + N``."""
    def rule(node, edges):
        scale = 1.25 * math.sqrt(tree.node_visits(node))
        return max(edges, key=lambda e: (tree.edge_q[e] + scale * tree.edge_prior[e]
                                         / tree.edge_seen1[e], -e))

    return rule


@pytest.mark.parametrize("k", [1, 4])
def test_descend_with_the_puct_rule_builds_the_tree_of_select_leaves(k):
    start = GAME.from_moves([3, 2, 3, 2, 4])
    by_rounds = grow(rooted(start), 40, k)
    by_descents = rooted(start)
    for _ in range(40):
        paths, leaves, states = [], [], []
        for _ in range(k):
            descent = by_descents.descend(puct_rule(by_descents))
            if descent is None:
                break
            paths.append(descent[0])
            leaves.append(descent[1])
            if descent[2] is not None:
                states.append(descent[2])
        logits, values = hash_logits(states) if states else (None, [])
        by_descents.complete_leaves(paths, leaves, logits, values)
    for name in Tree.__slots__:
        if name.startswith(("node_", "edge_")):
            assert getattr(by_rounds, name) == getattr(by_descents, name), name


def test_descend_reaching_a_pending_leaf_is_undone():
    tree = Tree(Corridor(), 5)
    tree.expand_root([0.0], 0.0)
    path, leaf, state = tree.descend(lambda node, edges: edges.start)
    assert state == 4 and tree.is_pending(leaf)
    assert tree.descend(lambda node, edges: edges.start) is None
    assert tree.virtual(0) == [1] and tree.node_visits(0) == 1


def test_evaluated_nodes_keep_their_network_value():
    tree = rooted()
    tree.node_value[0] = 0.25
    paths, leaves, _ = tree.select_leaves(1.25, 3)
    tree.complete_leaves(paths, leaves, np.zeros((3, 7)), [0.5, 0.0, -0.5])
    assert tree.node_value == {0: 0.25, leaves[0]: 0.5, leaves[1]: 0.0, leaves[2]: -0.5}
    with pytest.raises(ValueError, match="not expanded"):
        Tree(GAME, GAME.initial_state()).make_edges(0)


# -- proofs (Tree.prove, MCTS-Solver) ----------------------------------------------------

BLOCK_AT_3 = GAME.from_moves([0, 6, 1, 6, 2])  # O to move must block X's row at 3
OPEN_THREE = GAME.from_moves([1, 1, 2, 2])  # X to move: X at 3 threatens both 0 and 4


def descend_to(tree, actions):
    """Descents along ``actions`` from the root, each completed at once (new nodes
    evaluated with uniform logits and value 0), until one ends at the end of
    ``actions`` or on a terminal node; the node it ended on."""
    while True:
        taken = []

        def rule(node, edges):
            edge = edges[tree.actions(node).index(actions[len(taken)])]
            taken.append(edge)
            return edge
        path, leaf, state = tree.descend(rule)
        tree.complete_leaves([path], [leaf], None if state is None else np.zeros((1, 7)),
                             [] if state is None else [0.0])
        if state is None or len(path) == len(actions):
            return leaf


def test_without_prove_a_win_below_the_root_solves_nothing():
    tree = rooted(BLOCK_AT_3)
    leaf = descend_to(tree, [6, 3])  # O does not block: X wins at 3
    assert tree.terminal_value(leaf) == -1.0
    child = tree.edge_child[tree.edges(0)[6]]
    assert tree.status(child) == "EDGES" and tree.proof(child) is None
    assert tree.value_sums(0)[6] == -1.0 and tree.visits(0)[6] == 2


def test_a_win_one_move_away_solves_the_node_above_it():
    tree = rooted(BLOCK_AT_3)
    tree.prove()
    descend_to(tree, [6])  # O's move 6, valued 0 by the network
    into = tree.edges(0)[6]
    assert tree.value_sums(0)[6] == 0.0
    leaf = descend_to(tree, [6, 3])  # then X wins at 3
    child = tree.edge_child[into]
    assert tree.proof(leaf) == (-1.0, 0)
    assert tree.status(child) == "TERMINAL" and tree.proof(child) == (1.0, 1)
    # The edge into it is revalued as if every visit had known: two losses for O.
    assert tree.visits(0)[6] == 2 and tree.value_sums(0)[6] == -2.0
    assert tree.edge_q[into] == -1.0
    # Descents now stop there and back up its exact value.
    assert descend_to(tree, [6]) == child
    assert tree.value_sums(0)[6] == -3.0 and tree.num_nodes == 3


def test_a_descent_in_flight_through_a_node_proved_in_its_round_backs_up_the_proof():
    tree = rooted(BLOCK_AT_3)
    tree.prove()
    descend_to(tree, [6])

    def rule_for(actions):
        def rule(node, edges):
            return edges[tree.actions(node).index(actions[0 if node == 0 else 1])]
        return rule

    # One round, two descents through O's move 6: X wins at 3 (the proof), and X plays 0
    # (a new leaf, valued +0.9 for O by the network, selected before the proof).
    won, won_leaf, _ = tree.descend(rule_for([6, 3]))
    other, other_leaf, state = tree.descend(rule_for([6, 0]))
    assert state is not None
    tree.complete_leaves([won, other], [won_leaf, other_leaf], np.zeros((1, 7)), [0.9])
    into = tree.edges(0)[6]
    assert tree.proof(tree.edge_child[into]) == (1.0, 1)
    assert tree.visits(0)[6] == 3 and tree.value_sums(0)[6] == -3.0  # not -1.1
    assert tree.edge_q[into] == -1.0


def test_a_node_whose_every_move_loses_is_solved_as_a_loss_two_plies_from_the_end():
    tree = rooted(OPEN_THREE)
    tree.prove()
    descend_to(tree, [3])  # X: 1, 2, 3 in the bottom row, open at 0 and 4
    node = tree.edge_child[tree.edges(0)[3]]
    for reply in range(7):
        descend_to(tree, [3, reply, 4 if reply == 0 else 0])  # X wins where O is not
        if reply == 0:
            edges = tree.node_edges[node]  # made by the first descent through it
        assert tree.proof(tree.edge_child[edges[reply]]) == (1.0, 1)
        assert tree.proof(node) == ((-1.0, 2) if reply == 6 else None)
    assert tree.status(node) == "TERMINAL"
    # X's move 3 wins, by every one of its 15 visits; the root is never a solved node.
    assert tree.visits(0)[3] == 15 and tree.value_sums(0)[3] == 15.0
    assert tree.proof(0) is None


def test_proved_values_agree_with_the_solver():
    import asyncio

    import async_search as asr
    from async_search import search
    from async_search.problems import PolicyValueMLP, connect_four_positions
    from async_search.problems.connect_four_solver import ConnectFourSolver

    solver = ConnectFourSolver()
    evaluate = asr.immediate(PolicyValueMLP(GAME, hidden_sizes=(16,), seed=0))
    solved = 0
    for p in connect_four_positions("end")[::5]:
        result = asyncio.run(search.mcts(GAME, p.state, evaluate, num_simulations=200,
                                         dirichlet_fraction=0.0, solve=True,
                                         keep_tree=True))
        tree = result.tree
        for node in range(1, tree.num_nodes):
            proof = tree.proof(node)
            if proof is not None and proof[1] > 0:  # solved, not a terminal position
                assert np.sign(proof[0]) == np.sign(solver.solve(tree.node_state[node]))
                solved += 1
        if result.solved_value is not None:
            assert np.sign(result.solved_value) == np.sign(p.score)
            if result.solved_value > 0:
                assert result.action in p.optimal_moves
    assert solved > 50


class Broken(Corridor):
    """A Corridor whose legal actions or terminal value break the Game protocol."""

    def __init__(self, actions=(0,), end=0.0):
        self.actions, self.end = actions, end

    def legal_actions(self, state):
        return self.actions if state else ()

    def terminal_value(self, state):
        return self.end if state == 0 else None


@pytest.mark.parametrize("actions", [(0, 5), (-1,), (0.0,), (True,), ("0",)])
def test_a_game_whose_legal_actions_leave_its_actions_is_refused_naming_it(actions):
    with pytest.raises(ValueError, match=r"Broken.*legal_actions gave .* num_actions=1"):
        Tree(Broken(actions=actions), 2)


@pytest.mark.parametrize("actions", [(0, 0), (1, 0), (0, 2, 1)])
def test_a_game_whose_legal_actions_repeat_or_go_down_is_refused_naming_it(actions):
    # (0, 1, 2, 0) gave visit counts that did not sum to num_simulations, and a Gumbel
    # policy summing to 0.75.
    class ThreeWays(Broken):
        num_actions = 3
    with pytest.raises(ValueError, match=r"ThreeWays.*legal_actions gave .*ascending, "
                                         r"each once"):
        Tree(ThreeWays(actions=actions), 2)


@pytest.mark.parametrize("end", [math.nan, 5.0, -1.5, "1", 1j, True, np.array([0.5]),
                                 __import__("decimal").Decimal("0.5")])
def test_a_terminal_value_outside_minus_one_to_one_is_refused_naming_the_game(end):
    with pytest.raises(ValueError, match=r"Broken.*terminal_value is .* \[-1, 1\]"):
        Tree(Broken(end=end), 0)  # the root is over
    tree = Tree(Broken(end=end), 1)
    with pytest.raises(ValueError, match=r"terminal_value is .* \[-1, 1\]"):
        tree._child(1, 0)  # a child that ends the game


def test_a_game_of_the_protocol_with_integer_actions_of_numpy_plays_on():
    tree = Tree(Broken(actions=(np.int64(0),)), 2)
    assert tree._child(2, 0)[2] == (np.int64(0),)
    assert Tree(Broken(end=np.float32(0.5)), 0).node_edges[0] == TERMINAL


def test_a_child_whose_legal_actions_leave_the_game_is_refused_too():
    class LaterBroken(Corridor):
        def legal_actions(self, state):  # the root is fine, its child is not
            return (0,) if state == 2 else (0, 5) if state else ()

    tree = Tree(LaterBroken(), 2)
    with pytest.raises(ValueError, match=r"LaterBroken.*legal_actions gave 5"):
        tree._child(2, 0)


def test_legal_actions_may_be_any_iterable_of_actions():
    class Generated(Corridor):
        def legal_actions(self, state):
            return (a for a in (0,)) if state else iter(())

    tree = Tree(Generated(), 2)
    assert tree._child(2, 0)[2] == (0,)
