"""Self-play with MCTS on Connect Four: games as coroutines over ``evaluate``.

A game plays MCTS moves until the end and returns one ``Sample`` per position: the
position, the root's visit counts, and the final outcome for the player to move. The
first ``sampling_moves`` moves are drawn in proportion to the visits (seeded per game),
later ones are the most visited action, so a game is a deterministic function of its id,
the seed and the model's outputs: every inference topology must produce the same samples.

Work is split into *slots*: slot ``s`` plays games ``s, s + num_slots, ...`` one after
another until it holds ``quota`` samples. A client process runs its slots concurrently;
the samples of all slots, in slot order and cut to ``num_samples``, are the result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import pickle
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from async_search import search
from async_search.checks import check_int

__all__ = ["SelfPlayParams", "Sample", "play_game", "play_slot", "slot_quota",
           "samples_digest"]


@dataclasses.dataclass(frozen=True)
class SelfPlayParams:
    """What self-play produces, and how hard each move searches.

    Attributes:
        num_samples: positions to produce, over all clients.
        simulations: MCTS simulations per move.
        num_parallel: MCTS leaves in flight per round (one request each round).
        games_per_client: games each client plays at once (its slots).
        sampling_moves: moves drawn in proportion to visits before play turns greedy.
        seed: seeds the games (noise and move sampling).
    """

    num_samples: int = 1000
    simulations: int = 64
    num_parallel: int = 4
    games_per_client: int = 8
    sampling_moves: int = 8
    seed: int = 0

    def check(self) -> "SelfPlayParams":
        """Raises ValueError for a bad field; returns self."""
        for name in ("num_samples", "simulations", "num_parallel", "games_per_client"):
            check_int(f"SelfPlayParams.{name}", getattr(self, name), minimum=1)
        for name in ("sampling_moves", "seed"):
            check_int(f"SelfPlayParams.{name}", getattr(self, name), minimum=0)
        return self

    def describe(self) -> str:
        return (f"{self.num_samples} self-play positions of Connect Four, MCTS with "
                f"{self.simulations} simulations per move ({self.num_parallel} leaves "
                f"per round), {self.games_per_client} games per client")


class Sample(NamedTuple):
    """One training position."""

    state: Any
    """The position (a ConnectFourState)."""
    visit_counts: Tuple[int, ...]
    """The root's visit counts per action: the policy target."""
    outcome: float
    """The game's result for the player to move here: 1 win, -1 loss, 0 draw."""


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])


async def play_game(game: Any, evaluate: Any, *, game_id: int,
                    params: SelfPlayParams) -> List[Sample]:
    """Plays one game with MCTS for both players; one sample per position."""
    rng = np.random.default_rng([params.seed, game_id])
    state = game.initial_state()
    history: List[Tuple[Any, Tuple[int, ...]]] = []
    while game.terminal_value(state) is None:
        move = len(history)
        r = await search.mcts(game, state, evaluate, num_simulations=params.simulations,
                              num_parallel=params.num_parallel,
                              seed=_seed(params.seed, game_id, move))
        history.append((state, r.visit_counts))
        if move < params.sampling_moves:
            visits = np.asarray(r.visit_counts, np.float64)
            action = int(rng.choice(len(visits), p=visits / visits.sum()))
        else:
            action = r.action
        state = game.play(state, action)
    final = game.terminal_value(state)  # for the player to move at the end
    n = len(history)
    return [Sample(s, v, final if (n - i) % 2 == 0 else -final)
            for i, (s, v) in enumerate(history)]


def slot_quota(num_samples: int, num_slots: int) -> int:
    """Samples each slot plays for."""
    return math.ceil(num_samples / num_slots)


async def play_slot(game: Any, evaluate: Any, *, slot: int, num_slots: int,
                    params: SelfPlayParams,
                    on_game: Optional[Callable[[int], None]] = None) -> List[Sample]:
    """Slot ``slot``'s games, in turn, until it holds its quota of samples."""
    quota = slot_quota(params.num_samples, num_slots)
    samples: List[Sample] = []
    game_id = slot
    while len(samples) < quota:
        played = await play_game(game, evaluate, game_id=game_id, params=params)
        samples += played
        game_id += num_slots
        if on_game is not None:
            on_game(len(played))
    return samples


def samples_digest(per_slot: Sequence[Sequence[Sample]], num_samples: int) -> str:
    """A digest of the samples of all slots, in slot order, cut to ``num_samples``."""
    samples = [s for slot in per_slot for s in slot][:num_samples]
    h = hashlib.sha256()
    for s in samples:
        h.update(pickle.dumps((tuple(s.state), s.visit_counts, s.outcome), protocol=4))
    return h.hexdigest()[:16]
