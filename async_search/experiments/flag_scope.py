"""Which ``main.py`` experiment reads which flag, so that a flag the chosen experiment
would ignore is refused before any work rather than silently doing nothing.

Example:
    >>> choice = Choice("default", search="astar")
    >>> out_of_scope(["weight", "iterations"], choice)
    ['--iterations does not apply to the default experiment: it is read by --train connect_four and --train sliding_puzzle']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, List, Optional, Tuple

#: The experiments main.py runs, as ``Choice.experiment`` names them.
DEFAULT, CONTINUOUS, MULTI_SERVER = "default", "continuous", "multi_server"
ARCHITECTURE = "architecture"
TRAIN_C4, TRAIN_PUZZLE = "train connect_four", "train sliding_puzzle"
EXPERIMENTS = (DEFAULT, CONTINUOUS, MULTI_SERVER, ARCHITECTURE, TRAIN_C4, TRAIN_PUZZLE)

#: How each experiment is named in a message.
_NAMES = {DEFAULT: "the default experiment", CONTINUOUS: "--continuous",
          MULTI_SERVER: "--multi_server", ARCHITECTURE: "--architecture",
          TRAIN_C4: "--train connect_four", TRAIN_PUZZLE: "--train sliding_puzzle"}

_SEARCHES = frozenset({DEFAULT, CONTINUOUS, MULTI_SERVER})  # batched searches, measured
_TRAIN = frozenset({TRAIN_C4, TRAIN_PUZZLE})
_SEARCH_ORDER = ("astar", "rollout", "mcts", "continuous")

#: Flags every experiment reads, and the ones that choose the experiment.
ALWAYS = frozenset({"seed", "save_path", "progress", "continuous", "multi_server",
                    "architecture", "train"})


@dataclass(frozen=True)
class Choice:
    """What the flags chose: the experiment, the search of a searches experiment
    (``astar``, ``rollout``, ``mcts``; ``continuous`` for --continuous), whether the
    net is untrained, the trained architecture (--net) and its value (--value_net), the
    default experiment's backends (--backends) and where --train connect_four plays
    self-play (--backend)."""

    experiment: str
    search: str = "astar"
    untrained: bool = False
    net: str = "mlp"
    value_net: str = "head"
    backends: Tuple[str, ...] = ("local", "process", "ray")
    backend: str = "process"


@dataclass(frozen=True)
class Scope:
    """Where a flag is read: these experiments; within the searches experiments, only
    these searches (None: all of them); and ``untrained_only``/``conv_only``/``mlp_only``:
    only with --untrained outside training, only with --net conv|residual, not with it;
    ``head_only``: only with AlphaZero's value head (--value_net head); ``ray_only``:
    in the default experiment, only with ray among --backends; ``workers_only``: in
    --train connect_four, only with self-play outside this process (--backend process
    or ray)."""

    experiments: FrozenSet[str]
    searches: Optional[FrozenSet[str]] = None
    untrained_only: bool = False
    conv_only: bool = False
    mlp_only: bool = False
    head_only: bool = False
    ray_only: bool = False
    workers_only: bool = False


def _scope(*experiments: str, searches: Iterable[str] | None = None,
           untrained_only: bool = False, conv_only: bool = False,
           mlp_only: bool = False, head_only: bool = False, ray_only: bool = False,
           workers_only: bool = False) -> Scope:
    return Scope(frozenset(experiments), None if searches is None else frozenset(searches),
                 untrained_only, conv_only, mlp_only, head_only, ray_only, workers_only)


_C4_TRAINING = ("games_per_iteration", "backend", "value_target", "overlap",
                "eval_games", "final_games", "uct_rollouts", "policy", "gate_threshold",
                "random_opening_moves", "reuse_tree", "solve", "accuracy_positions",
                "strong_uct_rollouts", "strong_uct_games", "net", "features",
                "policy_target", "arena_games")

SCOPES: Dict[str, Scope] = {
    "search": _scope(*_SEARCHES),
    "backends": _scope(DEFAULT),
    "skip_sync": _scope(*_SEARCHES),
    "num_searches": _scope(*_SEARCHES, searches=("astar", "rollout", "mcts")),
    "gnn_budget": _scope(*_SEARCHES, TRAIN_PUZZLE),
    "batch_size": _scope(*_SEARCHES, ARCHITECTURE, TRAIN_PUZZLE, searches=("astar", "mcts")),
    "num_rollouts": _scope(*_SEARCHES, searches=("rollout",)),
    "rollout_depth": _scope(*_SEARCHES, searches=("rollout",)),
    "max_in_flight": _scope(CONTINUOUS),
    "scramble": _scope(*_SEARCHES, searches=("astar", "continuous", "rollout")),
    "weight": _scope(*_SEARCHES, TRAIN_PUZZLE, searches=("astar", "continuous")),
    "model": _scope(*_SEARCHES, ARCHITECTURE),
    "untrained": _scope(*_SEARCHES, ARCHITECTURE),
    "hidden_sizes": _scope(*_SEARCHES, ARCHITECTURE, *_TRAIN, untrained_only=True,
                           mlp_only=True),
    "channels": _scope(TRAIN_C4, conv_only=True),
    "blocks": _scope(TRAIN_C4, conv_only=True),
    "value_planes": _scope(TRAIN_C4, conv_only=True, head_only=True),
    "value_net": _scope(TRAIN_C4, conv_only=True),
    "max_batch_size": _scope(*_SEARCHES, ARCHITECTURE, *_TRAIN),
    "max_delay": _scope(*_SEARCHES, ARCHITECTURE),
    "num_procs": _scope(MULTI_SERVER, ARCHITECTURE, TRAIN_C4, workers_only=True),
    "num_servers": _scope(MULTI_SERVER, ARCHITECTURE),
    "total_gpu_frac": _scope(MULTI_SERVER),
    "address": _scope(DEFAULT, MULTI_SERVER, ray_only=True),  # --continuous: no Ray
    "uvloop": _scope(*_SEARCHES, ARCHITECTURE),
    "num_samples": _scope(ARCHITECTURE),
    "games_per_client": _scope(ARCHITECTURE),
    "cache_capacity": _scope(ARCHITECTURE),
    "simulations": _scope(ARCHITECTURE, TRAIN_C4),
    "iterations": _scope(*_TRAIN),
    "train_steps": _scope(*_TRAIN),
    "save_dir": _scope(*_TRAIN),
    "resume": _scope(*_TRAIN),
    **{name: _scope(TRAIN_C4) for name in _C4_TRAINING},
}


def _join(names: List[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _readers(scope: Scope) -> str:
    return _join([_NAMES[e] for e in EXPERIMENTS if e in scope.experiments])


def _search_name(search: str) -> str:
    return "--continuous (continuous A*)" if search == "continuous" else f"--search {search}"


def why_unread(name: str, choice: Choice) -> Optional[str]:
    """Why ``choice`` would ignore the flag ``name`` (one line), or None when it reads
    it (flags not in ``SCOPES`` are read by every experiment)."""
    scope = SCOPES.get(name)
    if scope is None:
        return None
    flag = f"--{name}"
    if choice.experiment not in scope.experiments:
        return (f"{flag} does not apply to {_NAMES[choice.experiment]}: it is read by "
                f"{_readers(scope)}")
    if (choice.experiment in _SEARCHES and scope.searches is not None
            and choice.search not in scope.searches):
        readers = _join([_search_name(s) for s in _SEARCH_ORDER if s in scope.searches])
        return (f"{flag} does not apply to {_search_name(choice.search)}: it is read by "
                f"{readers}")
    if scope.untrained_only and choice.experiment not in _TRAIN and not choice.untrained:
        return (f"{flag} sizes the untrained net: add --untrained (the trained net "
                f"shipped in the package has its own sizes)")
    if scope.mlp_only and choice.net != "mlp" and choice.value_net != "mlp":
        return (f"{flag} sizes an MLP: --net {choice.net} is sized by --channels and "
                f"--blocks (and its --value_net mlp by --hidden_sizes)")
    if scope.conv_only and choice.net == "mlp":
        return f"{flag} sizes a convolutional net: add --net conv or --net residual"
    if scope.head_only and choice.value_net != "head":
        return (f"{flag} sizes AlphaZero's value head: add --value_net head (--value_net "
                f"{choice.value_net} is sized by --hidden_sizes)")
    if scope.ray_only and choice.experiment == DEFAULT and "ray" not in choice.backends:
        return (f"{flag} is Ray's: --backends {','.join(choice.backends)} runs no Ray "
                f"(add ray to --backends, or use --multi_server)")
    if scope.workers_only and choice.experiment == TRAIN_C4 and choice.backend == "local":
        return (f"{flag} counts self-play workers: --backend local plays self-play in "
                f"this process (use --backend process or ray)")
    return None


def out_of_scope(present: Iterable[str], choice: Choice) -> List[str]:
    """One line for each flag of ``present`` (names given on the command line) that
    ``choice`` would not read, in the order given."""
    return [line for line in (why_unread(name, choice) for name in present) if line]
