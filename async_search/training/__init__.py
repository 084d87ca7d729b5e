"""Training: AlphaZero self-play for Connect Four and DAVI for the sliding puzzle.

Needs the ``tf`` extra (TensorFlow): ``pip install "async_search[tf]"`` (in a clone:
``pip install -e ".[tf]"``). The rest of the package
imports with NumPy alone; this package imports TensorFlow only when a ``Trainer`` is made.

- ``ReplayBuffer``: training samples as arrays; uniform minibatches, symmetry, save/load.
- ``Trainer``: a Keras MLP fitted with cross-entropy + squared error + L2; ``model()``
  gives the NumPy net that ``serve`` and the searches take (``problems.tf_twin`` its
  TensorFlow twin, bitwise equal).
- ``save_checkpoint`` / ``load_checkpoint``: versioned npz weights + JSON config.
- ``RunFolder``: a training run's folder, one atomic commit point per iteration for
  both trainers; killed at any instant, a run resumes with the rows of an
  uninterrupted one.
- ``Commander``: self-play, training, evaluation (arena, baselines, Elo), promotion
  with the new weights pushed to every server.
- ``play_match`` / ``play_games``: matches between players (scores, or each game's
  moves); ``turning_points``: where a Connect Four game's solved value changed.
- ``Davi``: a learned cost-to-go heuristic by approximate value iteration.

Example:
    >>> from async_search.training import ReplayBuffer, Trainer, NetConfig
    >>> trainer = Trainer(NetConfig("policy_value", "connect_four", (32,)))
    >>> trainer.model()   # doctest: +ELLIPSIS
    <async_search.problems.policy_value.PolicyValueMLP object at ...>
"""

from async_search.problems.checkpoints import (Checkpoint, CheckpointError, load_checkpoint,
                                               read_checkpoint, save_checkpoint)
from async_search.problems.nets import (NetConfig, config_of, initial_weights, to_model,
                                        weights_of)
from async_search.training.arena import MatchGame, gate, play_games, play_match, tally
from async_search.training.commander import (Commander, CommanderConfig, IterationRecord,
                                             PhaseProgress)
from async_search.training.davi import (Davi, DaviConfig, DaviRecord, bellman_targets,
                                        scrambled_states)
from async_search.training.players import (GumbelPlayer, MCTSPlayer, OnePlyPlayer, Player,
                                           PolicyPlayer, RandomPlayer, UCTPlayer)
from async_search.training.ratings import (RANDOM_RATING, MatchResult, elo_difference,
                                           fit_rating)
from async_search.training.replay import Minibatch, ReplayBuffer, mirror_columns
from async_search.training.run_folder import RunFolder, SavedNet, SavedRun
from async_search.training.selfplay import GameRecord, SelfPlayConfig, selfplay_game
from async_search.training.trainer import LossTerms, Trainer
from async_search.training.turns import Turn, game_values, turning_points

__all__ = [
    "ReplayBuffer", "Minibatch", "mirror_columns",
    "Trainer", "LossTerms", "NetConfig", "initial_weights", "to_model", "weights_of",
    "config_of",
    "save_checkpoint", "load_checkpoint", "read_checkpoint", "Checkpoint",
    "CheckpointError", "RunFolder", "SavedNet", "SavedRun",
    "Commander", "CommanderConfig", "IterationRecord", "PhaseProgress",
    "SelfPlayConfig", "GameRecord", "selfplay_game",
    "Player", "RandomPlayer", "OnePlyPlayer", "UCTPlayer", "MCTSPlayer", "GumbelPlayer",
    "PolicyPlayer",
    "MatchResult", "play_match", "gate", "elo_difference", "fit_rating", "RANDOM_RATING",
    "MatchGame", "play_games", "tally", "Turn", "game_values", "turning_points",
    "Davi", "DaviConfig", "DaviRecord", "scrambled_states", "bellman_targets",
]
