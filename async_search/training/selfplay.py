"""Self-play: one game of MCTS against itself, as training arrays.

Each move searches with PUCT (``search.mcts``, Dirichlet noise at the root, the policy
target the visit distribution) or Gumbel AlphaZero (``search.gumbel_mcts``, Gumbel noise
at the root, the policy target the improved policy). A game is a deterministic function
of its id, the seed and the model's outputs (the noise and the sampled opening moves are
seeded by both), so it is the same on every backend and in a resumed run. It is a plain
coroutine over ``evaluate``: any number of games run concurrently and their requests
batch in the server.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from async_search import search
from async_search.checks import check_float, check_int, plain_fields
from async_search.search.base import check_dirichlet_alpha
from async_search.search.completed_q import root_improved_policy


#: The searches self-play (and the evaluation agent) can use.
POLICIES = ("puct", "gumbel")

#: PUCT's policy targets: its root visit distribution (AlphaZero), or the improved policy
#: ``softmax(logits + sigma(completed Q))`` of its root (Gumbel AlphaZero's target).
POLICY_TARGETS = ("visits", "improved")


@dataclasses.dataclass(frozen=True)
class SelfPlayConfig:
    """How a self-play game searches and samples.

    Attributes:
        simulations: search simulations per move (Gumbel learns well with 16-32).
        num_parallel: leaves in flight per MCTS round (one request per round).
        sampling_moves: PUCT: the first moves are drawn in proportion to the visit
            counts (temperature 1); later moves take the most visited action. Gumbel
            ignores it: its root noise samples every move, as in the paper.
        dirichlet_alpha: PUCT's root noise concentration (AlphaZero used 0.3 for chess; about
            10 / legal moves suits Connect Four).
        dirichlet_fraction: weight of the noise in the root prior, in [0, 1].
        c_puct: PUCT's exploration constant.
        value_target: ``outcome``: the game's result z for the player to move;
            ``mixed``: the mean of z and the search's root value q, a less noisy target
            that speeds up early learning.
        seed: seeds every game's noise and sampling, with the game id.
        policy: ``"puct"``: ``search.mcts``, the visit distribution as the policy
            target; ``"gumbel"``: ``search.gumbel_mcts`` with its noise on, the move it
            chooses played and its improved policy as the policy target.
        reuse_tree: pass the subtree under each move played to the next move's search
            (``reuse=``), so its statistics are not searched again.
        max_num_considered_actions: Gumbel's ``k``: root actions sampled (>= 1).
        c_visit, c_scale: Gumbel's ``sigma`` constants (>= 0).
        random_opening_moves: each game starts after a number of uniformly random
            moves drawn uniformly from 0..this (never a move that ends the game), so
            that the net also learns from the unbalanced, threat-rich positions its
            own games seldom reach; the opening's positions are not samples. 0: every
            game from the empty board.
        solve: PUCT proves values as it searches (``search.mcts``'s ``solve``): near
            the end of a game, simulations stop at solved positions, and the visit
            targets follow the proofs. Gumbel ignores it.
        policy_target: PUCT's policy target: ``"visits"``, the root's visit
            distribution (AlphaZero); ``"improved"``, the improved policy of its root
            from the network's prior (without the noise) and the completed Q-values
            (``search.completed_q.root_improved_policy``, ``c_visit`` and ``c_scale``),
            which gives little of the target to moves the search found bad. The moves
            played still follow the visits. Gumbel's target is always its improved
            policy.
    """

    simulations: int = 64
    num_parallel: int = 4
    sampling_moves: int = 10
    dirichlet_alpha: float = 1.0
    dirichlet_fraction: float = 0.25
    c_puct: float = 1.5
    value_target: str = "outcome"
    seed: int = 0
    policy: str = "puct"
    reuse_tree: bool = False
    max_num_considered_actions: int = 16
    c_visit: float = 50.0
    c_scale: float = 0.1
    random_opening_moves: int = 0
    solve: bool = False
    policy_target: str = "visits"

    def __post_init__(self):
        plain_fields(self)
        check_int("simulations", self.simulations, minimum=1)
        check_int("num_parallel", self.num_parallel, minimum=1)
        check_int("sampling_moves", self.sampling_moves, minimum=0)
        check_dirichlet_alpha(self.dirichlet_alpha)
        # A weight: checked here, before a Commander starts workers that would each
        # meet it inside search.mcts.
        check_float("dirichlet_fraction", self.dirichlet_fraction, minimum=0.0,
                    maximum=1.0)
        check_float("c_puct", self.c_puct, minimum=0.0, strict=True)
        check_int("seed", self.seed, minimum=0)
        if self.value_target not in ("outcome", "mixed"):
            raise ValueError(f"value_target must be 'outcome' or 'mixed', got "
                             f"{self.value_target!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {list(POLICIES)}, got "
                             f"{self.policy!r}")
        if self.policy_target not in POLICY_TARGETS:
            raise ValueError(f"policy_target must be one of {list(POLICY_TARGETS)}, got "
                             f"{self.policy_target!r}")
        if not isinstance(self.reuse_tree, bool):
            raise ValueError(f"reuse_tree must be True or False, got {self.reuse_tree!r}")
        if not isinstance(self.solve, bool):
            raise ValueError(f"solve must be True or False, got {self.solve!r}")
        check_int("max_num_considered_actions", self.max_num_considered_actions,
                  minimum=1)
        check_float("c_visit", self.c_visit, minimum=0.0)
        check_float("c_scale", self.c_scale, minimum=0.0)
        # Capped so that drawing the opening's length never overflows NumPy's int64.
        check_int("random_opening_moves", self.random_opening_moves, minimum=0,
                  maximum=2 ** 31 - 1)


class GameRecord(NamedTuple):
    """One self-play game as training arrays (``n`` positions)."""

    x: np.ndarray
    """float32 ``[n, *input_shape]``: each position, encoded for the player to move."""
    policy: np.ndarray
    """float32 ``[n, num_actions]``: the root's visit counts (PUCT; each row sums to
    the simulations: ``ReplayBuffer.add`` normalises them) or the improved policy
    (Gumbel)."""
    value: np.ndarray
    """float32 ``[n]``: the game's result for the player to move (1, 0 or -1); with
    ``value_target="mixed"``, its mean with the search's root value there."""
    moves: tuple
    """The actions searched and played, in order, one per position (after
    ``opening``)."""
    winner: int
    """+1 if the first player won, -1 the second, 0 a draw."""
    opening: tuple = ()
    """The random moves played from the initial state before the first position
    (``SelfPlayConfig.random_opening_moves``): the game is ``opening + moves``."""


async def selfplay_game(game_id: int, evaluate: Any, *, game: Any,
                        config: SelfPlayConfig) -> GameRecord:
    """Plays game ``game_id`` with MCTS for both players and returns its samples.

    The signature fits ``run_searches``: ``functools.partial(selfplay_game, game=game,
    config=config)`` is a search function whose starts are game ids.

    Example:
        >>> import asyncio, async_search as asr
        >>> from async_search import problems
        >>> game = problems.ConnectFour()
        >>> ev = asr.immediate(problems.PolicyValueMLP(game, seed=0))
        >>> record = asyncio.run(selfplay_game(0, ev, game=game,
        ...                      config=SelfPlayConfig(simulations=8)))
        >>> record.x.shape[0] == len(record.moves)
        True
    """
    rng = np.random.default_rng([config.seed, game_id])
    state, opening = random_opening(game, config.random_opening_moves,
                                    np.random.default_rng([config.seed, game_id, 1]))
    states, targets, moves, root_values = [], [], [], []
    kept = None  # the subtree under the last move played (reuse_tree)
    while game.terminal_value(state) is None:
        move = len(moves)
        seed = int(rng.integers(2 ** 63))
        if config.policy == "gumbel":
            r = await search.gumbel_mcts(
                game, state, evaluate, num_simulations=config.simulations,
                max_num_considered_actions=config.max_num_considered_actions,
                num_parallel=config.num_parallel, c_visit=config.c_visit,
                c_scale=config.c_scale, seed=seed, reuse=kept,
                keep_tree=config.reuse_tree)
            # The Gumbel noise already sampled the move: no temperature on top.
            target, action = r.policy, r.action
        else:
            r = await search.mcts(
                game, state, evaluate, num_simulations=config.simulations,
                num_parallel=config.num_parallel, c_puct=config.c_puct,
                dirichlet_alpha=config.dirichlet_alpha,
                dirichlet_fraction=config.dirichlet_fraction, seed=seed, reuse=kept,
                keep_tree=config.reuse_tree, solve=config.solve)
            if config.policy_target == "improved":
                target = _improved_target(r, game.legal_actions(state), config)
            else:
                target = r.visit_counts
            if move < config.sampling_moves:
                counts = np.asarray(r.visit_counts, np.float64)
                action = int(rng.choice(len(counts), p=counts / counts.sum()))
            else:
                action = r.action
        states.append(state)
        targets.append(target)
        root_values.append(r.root_value)
        kept = r.subtree(action) if config.reuse_tree else None
        moves.append(action)
        state = game.play(state, action)
    final = game.terminal_value(state)  # for the player to move at the end
    n = len(states)
    # The player to move at position i is the one to move at the end iff n - i is even.
    value = np.array([final if (n - i) % 2 == 0 else -final for i in range(n)], np.float32)
    if config.value_target == "mixed":
        value = (0.5 * (value + np.asarray(root_values, np.float64))).astype(np.float32)
    winner = int(game.winner(state)) if hasattr(game, "winner") else 0
    return GameRecord(game.encode(states), np.asarray(targets, np.float32), value,
                      tuple(moves), winner, opening)


def _improved_target(result: Any, legal: Any, config: SelfPlayConfig) -> list:
    """The improved policy of a PUCT search's root over every action (0 where not
    ``legal``)."""
    legal = [int(a) for a in legal]
    policy = root_improved_policy(
        [result.network_prior[a] for a in legal],
        [result.visit_counts[a] for a in legal],
        [result.action_values[a] for a in legal], result.network_value,
        c_visit=config.c_visit, c_scale=config.c_scale)
    target = [0.0] * len(result.visit_counts)
    for a, p in zip(legal, policy):
        target[a] = p
    return target


def random_opening(game: Any, most: int, rng: np.random.Generator) -> tuple:
    """``(state, moves)``: the state after a number of uniformly random moves drawn
    uniformly from ``0..most``, each among the legal moves that do not end the game
    (the opening stops early where every move would); ``most=0`` draws nothing.

        >>> from async_search import problems
        >>> state, moves = random_opening(problems.ConnectFour(), 6,
        ...                               np.random.default_rng(0))
        >>> len(moves) <= 6 and state == problems.ConnectFour().from_moves(moves)
        True
    """
    state, moves = game.initial_state(), []
    for _ in range(int(rng.integers(most + 1))):
        open_moves = [a for a in game.legal_actions(state)
                      if game.terminal_value(game.play(state, a)) is None]
        if not open_moves:
            break
        action = int(open_moves[int(rng.integers(len(open_moves)))])
        moves.append(action)
        state = game.play(state, action)
    return state, tuple(moves)

