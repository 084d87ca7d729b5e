"""Trained models shipped in the package, and the published 15-puzzle instances.

``pretrained(name)`` loads a checkpoint committed under ``problems/pretrained/`` (written
by ``python main.py --train ...``; docs/training.md says how each was trained, and
docs/benchmarks.md what it scores). ``korf100()`` gives Korf's 100 random 15-puzzle
instances with their optimal solution lengths (Korf 1985), for held-out evaluation.
"""

from __future__ import annotations

import os
from typing import Any, List, NamedTuple

from async_search.checks import is_int
from async_search.problems.checkpoints import load_checkpoint
from async_search.schema import read_json


_HERE = os.path.dirname(os.path.abspath(__file__))

#: Name -> what it is. ``pretrained(name)`` accepts exactly these names.
PRETRAINED = {
    "connect_four": "AlphaZero policy-value net for Connect Four: a residual policy "
                    "with an MLP value, reading threat planes (PolicyValueConvNet)",
    "15-puzzle": "DAVI cost-to-go heuristic for the 15-puzzle (LearnedHeuristic)",
}


def pretrained_path(name: str) -> str:
    """The checkpoint folder of a shipped model; ValueError listing the known names."""
    if not isinstance(name, str) or name not in PRETRAINED:
        known = ", ".join(repr(n) for n in PRETRAINED)
        raise ValueError(f"no pretrained model named {name!r}; known: {known}")
    return os.path.join(_HERE, "pretrained", name)


def pretrained(name: str) -> Any:
    """A trained NumPy model shipped with the package.

    ``"connect_four"``: a ``PolicyValueConvNet`` (residual 16x1 policy, MLP 256x256
    value, reading the threat planes: a ``FeaturedNet``) giving ``(logits [n, 7],
    value [n, 1])``;
    ``"15-puzzle"``: a ``LearnedHeuristic`` giving costs to go ``[n, 1]``. Both are on
    the exact grid of ``models.MLP`` (batch-independent rows); ``problems.tf_twin``
    gives their TensorFlow twins. The model's ``checkpoint_metadata`` says how it was
    trained.

    Raises:
        ValueError: for an unknown name (the message lists the known ones), or a
            missing or corrupt checkpoint (``CheckpointError``).

    Example:
        >>> from async_search import problems
        >>> net = problems.pretrained("connect_four")
        >>> game = problems.ConnectFour()
        >>> logits, value = net(game.encode([game.initial_state()]))
        >>> logits.shape, value.shape
        ((1, 7), (1, 1))
    """
    return load_checkpoint(pretrained_path(name))


class KorfInstance(NamedTuple):
    """One of Korf's 100 instances, in this project's convention (goal 1..15, blank)."""

    id: int
    state: bytes
    """The start, for ``SlidingPuzzle(4)``."""
    optimal: int
    """The optimal solution length in moves (Korf 1985)."""


def korf100() -> List[KorfInstance]:
    """Korf's 100 random 15-puzzle instances with their optimal solution lengths.

    The shipped file is checked as it is read: ids 1..100, each start a solvable
    permutation of the tiles, each length at least its Manhattan distance and of the
    same parity (every move changes that distance by one).

    Raises:
        ValueError: the shipped file is damaged (the message names the file and the
            first bad instance).

    Example:
        >>> instances = korf100()
        >>> len(instances), instances[0].optimal
        (100, 57)
    """
    return read_korf_instances(os.path.join(_HERE, "data", "korf100.json"))


def read_korf_instances(path: str) -> List[KorfInstance]:
    """The instances of a file laid out as ``korf100.json``, each checked (see
    ``korf100``).

    Raises:
        ValueError: naming ``path`` and what is wrong in it.
    """
    from async_search.problems.sliding_puzzle import SlidingPuzzle

    def bad(why: str) -> ValueError:
        return ValueError(f"{path}: not Korf's 100 instances: {why}")

    data = read_json(path)
    rows = data.get("instances") if isinstance(data, dict) else None
    if not isinstance(rows, list) or len(rows) != 100:
        raise bad("'instances' must be a list of 100 entries")
    puzzle = SlidingPuzzle(4)
    instances = []
    for place, row in enumerate(rows, start=1):
        try:
            instance = KorfInstance(row["id"], bytes(row["state"]), row["optimal"])
            if not (is_int(instance.id) and is_int(instance.optimal)):
                raise TypeError("id and optimal must be integers")
            puzzle.check_state(instance.state)
        except (KeyError, TypeError, ValueError) as e:
            raise bad(f"entry {place} ({row!r:.120}): {type(e).__name__}: {e}") from None
        if instance.id != place:
            raise bad(f"entry {place} has id {instance.id}: ids run 1..100 in order")
        lower = puzzle.manhattan_distance(instance.state)
        if instance.optimal < lower or (instance.optimal - lower) % 2:
            raise bad(f"instance {place}: an optimal length of {instance.optimal} moves "
                      f"cannot be, with a Manhattan distance of {lower} (at least that "
                      f"many moves, of the same parity)")
        instances.append(KorfInstance(int(instance.id), instance.state,
                                      int(instance.optimal)))
    return instances
