"""Self-play positions for the inference-architecture experiment, in slots of games.

Each game is training's (``training.selfplay_game``, set up by a
``training.SelfPlayConfig``): a deterministic function of its id, the seed and the
model's outputs, so every inference topology must produce the same positions.

Work is split into *slots*: slot ``s`` plays games ``s, s + num_slots, ...`` one after
another until it holds ``quota`` positions. A client process runs its slots
concurrently; the positions of all slots, in slot order and cut to ``num_samples``, are
the result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from async_search.checks import check_int
from async_search.training.selfplay import GameRecord, SelfPlayConfig, selfplay_game


@dataclasses.dataclass(frozen=True)
class SamplesConfig:
    """How many self-play positions to produce, and how the games are played.

    Attributes:
        num_samples: positions to produce, over all clients.
        games_per_client: games each client plays at once (its slots).
        selfplay: how each game searches and samples (``training.SelfPlayConfig``:
            simulations per move, leaves per round, sampled opening moves, noise, seed).
    """

    num_samples: int = 1000
    games_per_client: int = 8
    selfplay: SelfPlayConfig = SelfPlayConfig()

    def __post_init__(self) -> None:
        check_int("SamplesConfig.num_samples", self.num_samples, minimum=1)
        check_int("SamplesConfig.games_per_client", self.games_per_client, minimum=1)
        if not isinstance(self.selfplay, SelfPlayConfig):
            raise ValueError(f"SamplesConfig.selfplay must be a training.SelfPlayConfig, "
                             f"got {type(self.selfplay).__name__}")

    def describe(self) -> str:
        """One line: positions, simulations, leaves per round, games per client."""
        s = self.selfplay
        return (f"{self.num_samples} self-play positions of Connect Four, MCTS with "
                f"{s.simulations} simulations per move ({s.num_parallel} leaves per "
                f"round), {self.games_per_client} games per client")


def slot_quota(num_samples: int, num_slots: int) -> int:
    """Positions each slot plays for."""
    return math.ceil(num_samples / num_slots)


async def play_slot(game: Any, evaluate: Any, *, slot: int, num_slots: int,
                    config: SamplesConfig,
                    on_game: Optional[Callable[[int], None]] = None) -> List[GameRecord]:
    """Slot ``slot``'s games, in turn, until they hold its quota of positions.

    ``on_game(n)`` is called after each game with its number of positions.
    """
    quota = slot_quota(config.num_samples, num_slots)
    records: List[GameRecord] = []
    positions = 0
    game_id = slot
    while positions < quota:
        record = await selfplay_game(game_id, evaluate, game=game, config=config.selfplay)
        records.append(record)
        positions += len(record.moves)
        game_id += num_slots
        if on_game is not None:
            on_game(len(record.moves))
    return records


def samples_digest(per_slot: Sequence[Sequence[GameRecord]], num_samples: int) -> str:
    """A digest of the positions of all slots, in slot order, cut to ``num_samples``:
    their encodings, policy targets and value targets, bit for bit."""
    records = [r for slot in per_slot for r in slot]
    h = hashlib.sha256()
    if records:
        for field in ("x", "policy", "value"):
            rows = np.concatenate([getattr(r, field) for r in records])[:num_samples]
            h.update(repr((field, rows.dtype.str, rows.shape)).encode())
            h.update(np.ascontiguousarray(rows).tobytes())
    return h.hexdigest()[:16]
