"""The settings of an experiment, as frozen dataclasses (flags live in main.py).

An experiment is a workload (``SearchConfig``: what every search does, on which starts;
``ModelConfig``: the network that guides it) run under several placements
(``RunSpec``: the synchronous baseline, or a backend of ``run_searches`` with its
processes, servers and batching). Every field has a default that the tests and
``main.py`` override. Like the training settings (``training.SelfPlayConfig``,
``CommanderConfig``), each is checked when it is made: a bad field raises ValueError
naming the field and what it accepts, before anything runs.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

from async_search.backends.config import BACKENDS, RunConfig
from async_search.checks import check_float, check_int, is_int
from async_search.servers.policy import DispatchPolicy


#: The searches an experiment can run; ``continuous`` is continuous A* (``--continuous``).
SEARCHES = ("astar", "rollout", "mcts", "continuous")
#: The frameworks a net runs on: TensorFlow, or NumPy (the two compute the same bits).
MODELS = ("tf", "numpy")


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """What each search of the workload does.

    Attributes:
        search: ``astar`` (batched A* on the sliding puzzle), ``rollout`` (rounds of
            lockstep rollouts on the sliding puzzle until the budget is spent),
            ``mcts`` (AlphaZero MCTS on Connect Four) or ``continuous`` (continuous A*).
        num_searches: searches (starts) in the workload.
        gnn_budget: model evaluations each search may spend (A*, rollouts: states sent
            to the model; MCTS: simulations, each at most one evaluation).
        batch_size: nodes a search expands per request: A*'s buffer, MCTS's leaves in
            flight per round.
        weight: the weight of the path cost g in A*'s priority ``weight * g + h``
            (``astar``, ``continuous``). Below 1 is batch-weighted A*: the trained
            heuristic overestimates a little, and with 0.3 it solves every default
            puzzle (100 random moves) in under 5,000 evaluations, where 1 spends
            20,000 on all but one without reaching the goal.
        num_rollouts: rollouts run in lockstep per round (``rollout``).
        rollout_depth: the most steps of one rollout (``rollout``).
        max_in_flight: requests continuous A* keeps outstanding (``continuous``).
        puzzle_size: side of the sliding puzzle (4: the 15-puzzle).
        scramble: random moves from the goal to each puzzle start.
        opening_moves: random moves from the empty board to each Connect Four start.
        seed: seeds the starts (start ``i`` uses ``seed + i``) and the searches.
    """

    search: str = "astar"
    num_searches: int = 8
    gnn_budget: int = 20_000
    batch_size: int = 4
    weight: float = 0.3
    num_rollouts: int = 4
    rollout_depth: int = 24
    max_in_flight: int = 256
    puzzle_size: int = 4
    scramble: int = 100
    opening_moves: int = 6
    seed: int = 0

    def __post_init__(self) -> None:
        if self.search not in SEARCHES:
            raise ValueError(f"SearchConfig.search must be one of {', '.join(SEARCHES)}, "
                             f"got {self.search!r}")
        for name in ("num_searches", "gnn_budget", "batch_size", "num_rollouts",
                     "rollout_depth", "max_in_flight"):
            check_int(f"SearchConfig.{name}", getattr(self, name), minimum=1)
        check_float("SearchConfig.weight", self.weight, minimum=0.0)
        if not is_int(self.puzzle_size) or not 2 <= self.puzzle_size <= 8:
            raise ValueError(f"SearchConfig.puzzle_size must be an integer from 2 to 8, "
                             f"got {self.puzzle_size!r}")
        for name in ("scramble", "opening_moves", "seed"):
            check_int(f"SearchConfig.{name}", getattr(self, name), minimum=0)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The network that guides the searches (row-independent on both frameworks).

    Attributes:
        kind: ``tf`` (on TensorFlow: ``problems.tf_twin`` of the NumPy net) or
            ``numpy`` (the NumPy net); both compute bitwise the same outputs.
        trained: the trained net shipped in the package (``problems.pretrained``: the
            15-puzzle heuristic, the Connect Four policy-value net); False: an
            untrained net, seeded, of ``hidden_sizes`` (the searches it guides find
            little: it shows the machinery, not the point).
        hidden_sizes: widths of the untrained net's ReLU hidden layers.
        seed: seeds the untrained net's weights.
        max_batch_size: the largest batch the TensorFlow net is traced for (batches are
            padded to powers of two up to it).
        warm_up: trace every padded batch size when the model is built, so that no
            run pays for tracing inside its timing.
    """

    kind: str = "tf"
    trained: bool = True
    hidden_sizes: Tuple[int, ...] = (256, 256)
    seed: int = 0
    max_batch_size: int = 1024
    warm_up: bool = True

    def __post_init__(self) -> None:
        if self.kind not in MODELS:
            raise ValueError(f"ModelConfig.kind must be one of {', '.join(MODELS)}, got "
                             f"{self.kind!r}")
        if not isinstance(self.trained, bool):
            raise ValueError(f"ModelConfig.trained must be True or False, got "
                             f"{self.trained!r}")
        if not self.hidden_sizes:
            raise ValueError("ModelConfig.hidden_sizes needs at least one layer width")
        for i, width in enumerate(self.hidden_sizes):
            check_int(f"ModelConfig.hidden_sizes[{i}]", width, minimum=1)
        check_int("ModelConfig.seed", self.seed, minimum=0)
        check_int("ModelConfig.max_batch_size", self.max_batch_size, minimum=1)

    def describe(self) -> str:
        """``trained tf net`` or ``untrained numpy net 256x256 (seed 0)``."""
        if self.trained:
            return f"trained {self.kind} net"
        hidden = "x".join(str(h) for h in self.hidden_sizes)
        return f"untrained {self.kind} net {hidden} (seed {self.seed})"


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One placement of the workload: the baseline, or one call of ``run_searches``.

    Checked when made, with the backends' own checks (``backends.config.RunConfig``).

    Attributes:
        name: how reports, tables and legends call the run (``process x2``).
        group: the plot panel the run is drawn in (``multiprocessing``).
        backend: None for the synchronous baseline (``asr.immediate``, one search after
            another), else a backend of ``run_searches``: local, process or ray.
        num_procs: client processes (Ray tasks) the searches are split over.
        num_servers: model servers.
        max_batch_size: the most elements a server puts in one batch.
        max_delay: seconds a partial batch may wait for company; None: none.
        pipeline_depth: batches in flight per server.
        use_uvloop: run the event loops on uvloop (when installed).
        total_gpu_frac: Ray: the GPU fraction the servers share, when a GPU exists.
        address: Ray: the address of a running cluster; None starts one here.
    """

    name: str
    group: str
    backend: str | None = None
    num_procs: int = 1
    num_servers: int = 1
    max_batch_size: int = 256
    max_delay: float | None = None
    pipeline_depth: int = 2
    use_uvloop: bool = False
    total_gpu_frac: float | None = None
    address: str | None = None

    def __post_init__(self) -> None:
        policy = DispatchPolicy(self.max_batch_size, self.max_delay, self.pipeline_depth)
        if self.backend is None:
            return
        if self.backend not in BACKENDS:
            raise ValueError(f"RunSpec.backend must be None (the baseline) or one of "
                             f"{', '.join(BACKENDS)}, got {self.backend!r}")
        RunConfig(self.backend, self.num_procs, self.num_servers, policy,
                  self.use_uvloop, self.address, self.total_gpu_frac)

    @property
    def is_baseline(self) -> bool:
        """True for the synchronous baseline."""
        return self.backend is None

    def runner_kwargs(self) -> dict:
        """The keyword arguments of ``run_searches`` for this run."""
        return dict(backend=self.backend, num_procs=self.num_procs,
                    num_servers=self.num_servers, max_batch_size=self.max_batch_size,
                    max_delay=self.max_delay, pipeline_depth=self.pipeline_depth,
                    use_uvloop=self.use_uvloop, address=self.address,
                    total_gpu_frac=self.total_gpu_frac)
