"""What a run of searches is: the backend, processes, servers and batching, validated."""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import numpy as np

from async_search.checks import check_float, check_int
from async_search.machine import usable_cpus
from async_search.servers.policy import DispatchPolicy
from async_search.servers.workers import placement_of


BACKENDS = ("local", "process", "ray")

#: ``run_searches``'s ``retries``: as Ray's own default for tasks, so that a run at scale
#: outlives a few lost nodes or worker processes; only a worker's death costs an attempt
#: (a search that raises is never run again).
DEFAULT_RETRIES = 3

#: The most ``retries`` a run takes: Ray's servers hold an answer queue per client and
#: attempt (about 2.5 KB each), made when they start, so a huge number cost gigabytes
#: per server before any search ran; a hundred lost workers per start is a broken run.
MAX_RETRIES = 100

#: ``RayPlacement.server_gpus``'s choices.
SERVER_GPUS = ("auto", "required", "none")


@dataclasses.dataclass(frozen=True)
class RayPlacement:
    """Where the Ray backend puts its client tasks and server actors on a cluster.

    Attributes:
        spread_clients: True (default): the client tasks are spread over the nodes
            (round robin over the live nodes, soft, for first attempts; Ray's
            ``SPREAD`` for retries and with ``client_resources``), so the searches use
            every node; False: Ray's default, which fills the driver's node first.
        spread_servers: the same for the server actors (spread, a lost node takes at
            most its share of the servers with it). Servers spread over several GPUs
            by a placement group (``gpu_placement``) keep that placement.
        server_gpus: ``"auto"`` (default): each server asks for its share of a GPU
            when the cluster has any, so it runs on a GPU node; ``"required"``: the
            same, and the run fails before anything starts when the cluster has no GPU;
            ``"none"``: the servers ask for no GPU (a CPU model beside GPU work).
        server_resources: Ray custom resources each server actor asks for besides,
            e.g. a node's label ``{"big_node": 0.01}`` (``ray start --resources``).
        client_resources: the same for each client task.

    Example:
        >>> RayPlacement(server_gpus="required").server_gpus
        'required'
        >>> RayPlacement(server_gpus="some")
        Traceback (most recent call last):
        ...
        ValueError: server_gpus must be one of auto, required, none, got 'some'
    """

    spread_clients: bool = True
    spread_servers: bool = True
    server_gpus: str = "auto"
    server_resources: Mapping[str, float] = dataclasses.field(default_factory=dict)
    client_resources: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        for name in ("spread_clients", "spread_servers"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got "
                                 f"{getattr(self, name)!r}")
        if self.server_gpus not in SERVER_GPUS:
            raise ValueError(f"server_gpus must be one of {', '.join(SERVER_GPUS)}, got "
                             f"{self.server_gpus!r}")
        for name in ("server_resources", "client_resources"):
            value = getattr(self, name)
            if not isinstance(value, Mapping):
                raise ValueError(f"{name} must be a mapping of resource names to amounts, "
                                 f"got {value!r}")
            amounts = {}
            for key, amount in value.items():
                if not isinstance(key, str) or not key:
                    raise ValueError(f"{name} keys must be resource names, got {key!r}")
                if key in ("CPU", "GPU"):  # Ray refuses them there, once started
                    raise ValueError(f"{name} names custom resources; {key} is Ray's own "
                                     f"(servers ask for GPUs through server_gpus and "
                                     f"total_gpu_frac)")
                amount = check_float(f"{name}[{key!r}]", amount, minimum=0.0)
                if 0 < amount < 1e-4:  # Ray's rule, checked before it starts
                    raise ValueError(f"{name}[{key!r}] must be 0 or at least 0.0001 (Ray "
                                     f"keeps 4 decimals of a resource), got {amount!r}")
                amounts[key] = amount
            # a copy the caller cannot change after the check
            object.__setattr__(self, name, amounts)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """How ``run_searches`` places searches and servers.

    Attributes:
        backend: ``local`` (everything in this process), ``process`` (searches in
            ``num_procs`` worker processes, servers here) or ``ray`` (searches in Ray
            tasks, servers as Ray actors).
        num_procs: client processes (or Ray tasks) the starts are split over,
            round-robin (the process backend starts at most ``MAX_CLIENT_PROCESSES``).
        num_servers: model servers, each with its own model from the factory, taking
            batches from one request stream.
        policy: batch size, delay and pipeline depth of every server.
        use_uvloop: run event loops on uvloop when it is installed.
        address: Ray: the address of an existing cluster; None starts a local one.
        total_gpu_frac: Ray: the fraction of each GPU in use that the servers on it
            share (None: all of it); the servers are spread over every GPU.
        model_thread: where each server's model runs: "auto" (default: a device
            thread, or the server's loop while a batch takes under 200 us), True
            (device threads), False (the loop).
        return_exceptions: a failed start holds its exception in place among the
            results (the others are kept, as with ``asyncio.gather``); False (default)
            raises SearchError naming every failed start.
        retries: how many times a start whose worker died (client process, Ray task,
            its node, or every server it could reach) runs again in a new worker
            (``DEFAULT_RETRIES``); 0: never; at most ``MAX_RETRIES`` (100). Ignored by
            the local backend (it has no workers to lose).
        timeout: seconds the whole run may take, from the call (None: no limit);
            searches unfinished by then fail with SearchTimeoutError.
        search_timeout: seconds each attempt of a search may run, from its start in
            its worker (None: no limit); it then fails with SearchTimeoutError.
        placement: Ray: where the client tasks and server actors go.
        client_waves: process and Ray: a client's message leaves as soon as it holds
            ``ceil(searches / client_waves)`` requests (its searches, one request each
            a step: this many messages in flight; on Ray, to each server its share),
            so that it computes one
            wave's next steps while the server evaluates another, instead of waiting on
            each round trip. 1 (default): one message a loop iteration, all its
            searches waiting on it. More waves mean smaller messages (more of them for
            the server to read).
    """

    backend: str = "local"
    num_procs: int = 1
    num_servers: int = 1
    policy: DispatchPolicy = DispatchPolicy()
    use_uvloop: bool = False
    address: str | None = None
    total_gpu_frac: float | None = None
    model_thread: bool | str = "auto"
    return_exceptions: bool = False
    retries: int = DEFAULT_RETRIES
    timeout: float | None = None
    search_timeout: float | None = None
    placement: RayPlacement = RayPlacement()
    client_waves: int = 1

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got "
                             f"{self.backend!r}")
        # Plain ints kept (a NumPy integer is taken as any integer is, and the run's
        # stats hold them: JSON cannot write a NumPy integer).
        for name, minimum, maximum in (("num_procs", 1, None), ("num_servers", 1, None),
                                       ("retries", 0, MAX_RETRIES),
                                       ("client_waves", 1, None)):
            object.__setattr__(self, name, check_int(name, getattr(self, name),
                                                     minimum=minimum, maximum=maximum))
        if self.backend == "process" and self.num_procs > MAX_CLIENT_PROCESSES:
            raise ValueError(f"num_procs={self.num_procs} is more client processes than "
                             f"the process backend starts (at most "
                             f"{MAX_CLIENT_PROCESSES}, one per start at most: more than a "
                             f"few per core only share it)")
        if not isinstance(self.use_uvloop, (bool, np.bool_)):
            raise ValueError(f"use_uvloop must be True or False, got {self.use_uvloop!r}")
        object.__setattr__(self, "use_uvloop", bool(self.use_uvloop))
        limit = max_servers(self.backend)
        if self.num_servers > limit:
            raise ValueError(f"num_servers={self.num_servers} is more than the {self.backend} "
                             f"backend can start here (at most {limit})")
        if self.total_gpu_frac is not None:  # (a bool, a string: refused by name too)
            object.__setattr__(self, "total_gpu_frac", check_float(
                "total_gpu_frac", self.total_gpu_frac, minimum=0.0, strict=True,
                maximum=1.0))
        if not isinstance(self.return_exceptions, bool):
            raise ValueError(f"return_exceptions must be True or False, got "
                             f"{self.return_exceptions!r}")
        if self.client_waves > 1 and self.backend == "local":
            raise ValueError("client_waves is the process and Ray backends' (their "
                             "clients' messages); the local backend sends none: leave "
                             "it at 1")
        for name in ("timeout", "search_timeout"):
            if getattr(self, name) is not None:
                check_float(name, getattr(self, name), minimum=0.0, strict=True)
        if not isinstance(self.placement, RayPlacement):
            raise ValueError(f"placement must be a RayPlacement, got {self.placement!r}")
        if placement_of(self.model_thread) == "loop" and self.backend != "ray" and (
                self.num_servers > 1):
            raise ValueError("num_servers > 1 needs model_thread=True or 'auto' (the "
                             "servers are device threads of one server)")


#: The most client processes the process backend starts (each a Python interpreter
#: of tens of MB: ``num_procs=10**9`` over 10**5 starts would fork 10**5).
MAX_CLIENT_PROCESSES = 256


def max_servers(backend: str) -> int:
    """How many servers a backend can start on this machine (one thread or actor each;
    more than a few per core only queue behind each other)."""
    return 4 * usable_cpus()


#: ``progress(elements)``: called in the calling process as batches complete, with the
#: number of elements evaluated since the last call.
Progress = Callable[[int], None]
