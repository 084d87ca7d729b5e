"""Problems for the searches, and models for them.

Search problems (A*, rollouts): ``SlidingPuzzle`` (8- and 15-puzzle) and
``SyntheticGraph`` (a hashed tree with a tunable CPU cost per expansion). Games (MCTS):
``ConnectFour``, with a solver (``ConnectFourSolver``: exact scores and optimal moves)
and solver-labelled test positions (``connect_four_positions``, ``SolvedPosition``).
Models: ``ManhattanHeuristic`` and ``DepthHeuristic`` (exact, admissible),
``heuristic_mlp`` and ``PolicyValueMLP`` (seeded NumPy nets), and their TensorFlow twins
``heuristic_tf_net`` and ``policy_value_tf_net`` (TensorFlow is imported only when one is
built; ``tf_twin`` makes the twin of any of them, trained or not). Residual nets of
the published shapes: ``PolicyValueResNet`` (AlphaZero) and ``CostToGoResNet``
(DeepCubeA), NumPy weights and reference, built in PyTorch (``torch_resnet``),
TensorFlow (``keras_resnet``) and JAX (``jax_resnet``). ``PolicyValueConvNet``: the
small convolutional (plain or residual) policy-value net that the trainer trains, in
NumPy with exact rows. ``threat_planes``: Connect Four's planes and the cells where each
side would make four; ``FeaturedNet`` serves a net whose body reads them. Trained models:
``pretrained("connect_four")`` and ``pretrained("15-puzzle")`` (a ``LearnedHeuristic``);
``korf100()`` gives the published 15-puzzle instances with optimal lengths. A problem may
offer ``compact_keys()`` (a ``CompactKeys``) for A* to search on compact keys. Every model's output for an element is bitwise independent of its batch-mates.

Example:
    >>> from async_search import problems
    >>> puzzle = problems.SlidingPuzzle(3)
    >>> h = problems.ManhattanHeuristic(puzzle)
    >>> start = puzzle.scramble(10, seed=0)
    >>> float(h(puzzle.encode([start]))[0, 0]) == puzzle.manhattan_distance(start)
    True
"""

from async_search.problems.base import CompactKeys, Game, SearchProblem, State
from async_search.problems.connect_four import ConnectFour, ConnectFourState
from async_search.problems.connect_four_solver import ConnectFourSolver
from async_search.problems.connect_four_threats import FeaturedNet, threat_planes
from async_search.problems.conv_nets import PolicyValueConvNet
from async_search.problems.heuristics import (DepthHeuristic, LearnedHeuristic,
                                              ManhattanHeuristic, heuristic_mlp)
from async_search.problems.policy_value import PolicyValueMLP
from async_search.problems.pretrained_models import (PRETRAINED, KorfInstance, korf100,
                                                     pretrained)
from async_search.problems.residual_jax import jax_resnet
from async_search.problems.residual_nets import (CostToGoResNet, PolicyValueResNet,
                                                 ResNetWeights)
from async_search.problems.residual_tf import keras_resnet
from async_search.problems.residual_torch import torch_resnet, torch_resnet_weights
from async_search.problems.sliding_puzzle import SlidingPuzzle
from async_search.problems.solved_positions import SolvedPosition, connect_four_positions
from async_search.problems.synthetic_graph import SyntheticGraph
from async_search.problems.tf_nets import heuristic_tf_net, policy_value_tf_net, tf_twin

__all__ = [
    "Game", "SearchProblem", "State", "CompactKeys",
    "SlidingPuzzle", "ConnectFour", "ConnectFourState", "SyntheticGraph",
    "ConnectFourSolver", "SolvedPosition", "connect_four_positions",
    "ManhattanHeuristic", "DepthHeuristic", "heuristic_mlp", "PolicyValueMLP",
    "heuristic_tf_net", "policy_value_tf_net", "tf_twin", "LearnedHeuristic",
    "pretrained", "PRETRAINED", "korf100", "KorfInstance",
    "PolicyValueResNet", "CostToGoResNet", "ResNetWeights", "torch_resnet",
    "torch_resnet_weights", "keras_resnet", "jax_resnet", "PolicyValueConvNet",
    "threat_planes", "FeaturedNet",
]
