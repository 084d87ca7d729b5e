"""The pure MCTS core: selection, virtual loss, expansion and backup, without a loop."""

import math

import numpy as np

from async_search.base import TensorSpec
from async_search.problems import ConnectFour
from async_search.search.tree import (add_exploration_noise, add_virtual_loss, backup,
                                      complete_leaves, expand, new_node,
                                      priors_from_logits, select_child, select_leaf,
                                      select_leaves)

GAME = ConnectFour()


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


def expanded_root(state, prior=None):
    root = new_node(GAME, state)
    expand(root, prior or [1 / len(root.actions)] * len(root.actions))
    return root


def test_select_child_prefers_the_highest_prior_among_unvisited_edges():
    root = expanded_root(GAME.initial_state(), [0.1, 0.1, 0.1, 0.4, 0.1, 0.1, 0.1])
    assert select_child(root, 1.25) == 3


def test_select_child_ties_go_to_the_first_edge():
    assert select_child(expanded_root(GAME.initial_state()), 1.25) == 0


def visit(node, i, value):
    """Back up ``value`` (for the player to move at ``node``) through edge ``i``."""
    add_virtual_loss(node, i)
    backup([(node, i)], -value)


def test_select_child_balances_value_and_exploration():
    root = expanded_root(GAME.initial_state())
    for _ in range(10):
        visit(root, 0, -0.5)
    visit(root, 1, 0.9)
    assert root.visits[:2] == [10, 1] and root.edge_visits == 11
    assert select_child(root, 1.0) == 1  # Q = 0.9 beats the unvisited edges' U
    visit(root, 1, -2.7)  # Q of edge 1 is now -0.9
    assert select_child(root, 1.0) == 2


def test_virtual_loss_sends_parallel_descents_to_different_leaves():
    root = expanded_root(GAME.initial_state())
    selected = select_leaves(GAME, root, 1.25, 7)
    leaves = [leaf for _, leaf in selected]
    assert len({leaf.state for leaf in leaves}) == 7
    assert root.virtual == [1] * 7 and root.edge_visits == 7
    assert all(leaf.pending for leaf in leaves)


def test_a_descent_reaching_a_pending_leaf_is_undone_and_ends_the_round():
    game = Corridor()
    root = new_node(game, 5)
    expand(root, [1.0])
    selected = select_leaves(game, root, 1.25, 4)
    assert len(selected) == 1
    assert root.virtual == [1] and root.edge_visits == 1


def test_backup_credits_each_edge_from_the_view_of_the_player_who_took_it():
    root = expanded_root(GAME.initial_state(), [0, 1, 0, 0, 0, 0, 0])
    path, leaf = select_leaf(GAME, root, 1.25)
    expand(leaf, [1 / 7] * 7)
    backup(path, 0.0)
    path, leaf = select_leaf(GAME, root, 1.25)
    assert [i for _, i in path] == [1, 0]
    backup(path, 0.5)  # good for the player to move at the leaf (the first player)
    child = path[1][0]
    assert child.value_sum[0] == -0.5 and root.value_sum[1] == 0.5
    assert child.visits[0] == 1 and root.visits[1] == 2
    assert child.virtual[0] == root.virtual[1] == 0
    assert root.edge_visits == 2 and child.edge_visits == 1


def test_a_terminal_leaf_backs_up_its_own_value_without_evaluation():
    state = GAME.from_moves([0, 6, 1, 6, 2, 5])  # the first player wins at column 3
    root = expanded_root(state, [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    for _ in range(3):
        selected = select_leaves(GAME, root, 1.25, 1)
        assert [leaf.terminal_value for _, leaf in selected] == [-1.0]
        complete_leaves(selected, None, [])
    assert root.visits[3] == 3 and root.value_sum[3] == 3.0 and root.virtual[3] == 0


def test_terminal_leaves_may_repeat_within_a_round():
    game = Corridor()
    root = new_node(game, 1)  # the only move ends the game
    expand(root, [1.0])
    selected = select_leaves(game, root, 1.25, 4)
    assert len(selected) == 4 and root.virtual == [4]
    complete_leaves(selected, None, [])
    assert root.visits == [4] and root.value_sum == [0.0] and root.virtual == [0]


def test_complete_leaves_expands_evaluated_leaves_in_selection_order():
    root = expanded_root(GAME.initial_state())
    selected = select_leaves(GAME, root, 1.25, 3)
    logits = np.zeros((3, 7), np.float32)
    logits[:, 6] = 5.0
    complete_leaves(selected, logits, [0.1, 0.2, -0.3])
    assert root.value_sum[:3] == [-0.1, -0.2, 0.3] and root.visits[:3] == [1, 1, 1]
    for _, leaf in selected:
        assert leaf.expanded and not leaf.pending
        assert max(leaf.prior) == leaf.prior[6]


def test_priors_are_a_softmax_of_the_logits_of_legal_actions():
    node = new_node(GAME, GAME.from_moves([0] * 6 + [3] * 6))
    assert node.actions == (1, 2, 4, 5, 6)
    prior = priors_from_logits(node, np.arange(7, dtype=np.float32))
    expected = np.exp([1.0, 2, 4, 5, 6])
    assert np.allclose(prior, expected / expected.sum()) and math.isclose(sum(prior), 1)


def test_exploration_noise_is_seeded_and_keeps_the_prior_normalised():
    priors = []
    for seed in (0, 0, 1):
        root = expanded_root(GAME.initial_state())
        add_exploration_noise(root, np.random.default_rng(seed), 0.3, 0.25)
        priors.append(root.prior)
    assert priors[0] == priors[1] != priors[2]
    assert math.isclose(sum(priors[0]), 1.0)
    assert min(priors[0]) >= 0.75 / 7 - 1e-12
