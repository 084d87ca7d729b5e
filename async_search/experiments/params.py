"""The parameter groups of an experiment, as frozen dataclasses (flags live in main.py).

An experiment is a workload (``SearchParams``: what every search does, on which starts;
``ModelParams``: the network that guides it) run under several placements
(``RunSpec``: the synchronous baseline, or a backend of ``run_searches`` with its
processes, servers and batching). Every field has a default that the tests and
``main.py`` override; ``check()`` raises ValueError naming the field and what it
accepts, before anything runs.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

from async_search.backends.config import BACKENDS, RunConfig
from async_search.checks import check_int, is_int
from async_search.servers.policy import DispatchPolicy

__all__ = ["SEARCHES", "MODELS", "SearchParams", "ModelParams", "RunSpec"]

#: The searches an experiment can run; ``continuous`` is continuous A* (``--continuous``).
SEARCHES = ("astar", "rollout", "mcts", "continuous")
#: The networks: TensorFlow, or its bitwise-equal NumPy twin.
MODELS = ("tf", "numpy", "pretrained")


@dataclasses.dataclass(frozen=True)
class SearchParams:
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
    gnn_budget: int = 10_000
    batch_size: int = 4
    num_rollouts: int = 4
    rollout_depth: int = 24
    max_in_flight: int = 256
    puzzle_size: int = 4
    scramble: int = 100
    opening_moves: int = 6
    seed: int = 0

    def check(self) -> "SearchParams":
        """Raises ValueError for a bad field; returns self."""
        if self.search not in SEARCHES:
            raise ValueError(f"SearchParams.search must be one of {', '.join(SEARCHES)}, "
                             f"got {self.search!r}")
        for name in ("num_searches", "gnn_budget", "batch_size", "num_rollouts",
                     "rollout_depth", "max_in_flight"):
            check_int(f"SearchParams.{name}", getattr(self, name), minimum=1)
        if not is_int(self.puzzle_size) or not 2 <= self.puzzle_size <= 8:
            raise ValueError(f"SearchParams.puzzle_size must be an integer from 2 to 8, "
                             f"got {self.puzzle_size!r}")
        for name in ("scramble", "opening_moves", "seed"):
            check_int(f"SearchParams.{name}", getattr(self, name), minimum=0)
        return self


@dataclasses.dataclass(frozen=True)
class ModelParams:
    """The network that guides the searches (seeded or trained, row-independent).

    Attributes:
        kind: ``tf`` (an untrained TensorFlow net), ``numpy`` (its bitwise-equal NumPy
            twin), or ``pretrained`` (the trained NumPy net shipped in the package,
            ``problems.pretrained``; hidden_sizes and seed do not apply).
        hidden_sizes: widths of the ReLU hidden layers.
        seed: seeds the weights.
        max_batch_size: the largest batch the TensorFlow net is traced for (batches are
            padded to powers of two up to it).
        warm_up: trace every padded batch size when the model is built, so that no
            run pays for tracing inside its timing.
    """

    kind: str = "tf"
    hidden_sizes: Tuple[int, ...] = (256, 256)
    seed: int = 0
    max_batch_size: int = 1024
    warm_up: bool = True

    def check(self) -> "ModelParams":
        """Raises ValueError for a bad field; returns self."""
        if self.kind not in MODELS:
            raise ValueError(f"ModelParams.kind must be one of {', '.join(MODELS)}, got "
                             f"{self.kind!r}")
        if not self.hidden_sizes:
            raise ValueError("ModelParams.hidden_sizes needs at least one layer width")
        for i, width in enumerate(self.hidden_sizes):
            check_int(f"ModelParams.hidden_sizes[{i}]", width, minimum=1)
        check_int("ModelParams.max_batch_size", self.max_batch_size, minimum=1)
        return self


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One placement of the workload: the baseline, or one call of ``run_searches``.

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

    @property
    def is_baseline(self) -> bool:
        """True for the synchronous baseline."""
        return self.backend is None

    def check(self) -> "RunSpec":
        """Raises ValueError for what ``run_searches`` would refuse; returns self."""
        if self.backend is None:
            DispatchPolicy(self.max_batch_size, self.max_delay, self.pipeline_depth)
            return self
        if self.backend not in BACKENDS:
            raise ValueError(f"RunSpec.backend must be None (the baseline) or one of "
                             f"{', '.join(BACKENDS)}, got {self.backend!r}")
        RunConfig(self.backend, self.num_procs, self.num_servers,
                  DispatchPolicy(self.max_batch_size, self.max_delay,
                                 self.pipeline_depth),
                  self.use_uvloop, self.address, self.total_gpu_frac)
        return self

    def runner_kwargs(self) -> dict:
        """The keyword arguments of ``run_searches`` for this run."""
        return dict(backend=self.backend, num_procs=self.num_procs,
                    num_servers=self.num_servers, max_batch_size=self.max_batch_size,
                    max_delay=self.max_delay, pipeline_depth=self.pipeline_depth,
                    use_uvloop=self.use_uvloop, address=self.address,
                    total_gpu_frac=self.total_gpu_frac)
