"""Where the Ray backend's server actors go on the cluster's GPUs.

Ray hands out fractional GPUs by packing: actors that each ask for 0.25 of a GPU fill
GPU 0 before GPU 1, so fractional requests alone leave the other GPUs idle. To spread
the servers over every GPU, the Ray backend reserves one whole GPU per placement-group
bundle and schedules server ``i`` into bundle ``i mod U`` (``U`` = the GPUs used, at
most one per server), where it asks for its share of that GPU. Ray then sets the
actor's ``CUDA_VISIBLE_DEVICES`` to that GPU, so a model factory that takes the first
CUDA device (``TorchModel``'s and ``JaxModel``'s default) uses it.

``total_gpu_frac`` keeps its meaning per GPU: the servers on a GPU together ask for that
fraction of it. With a single GPU in use, no placement group is made and the rest of
the GPU stays free for other Ray work (several servers on one GPU, as before); with
several, the whole GPUs are reserved for the run (Ray cannot pin a fraction of a given
GPU), and released when it ends. When the whole GPUs cannot be reserved in time
(another job holds part of some), the servers spread over the GPUs that are free whole
then (``ray.available_resources()``); with fewer than two, they ask for their fractions
without a placement group: ``total_gpu_frac / num_servers`` of a GPU each, as before
the spread, and Ray packs them.

Example:
    >>> place_servers(cluster_gpus=4, num_servers=6, total_gpu_frac=None)
    GpuPlacement(num_gpus=(0.5, 0.5, 1.0, 1.0, 0.5, 0.5), bundles=(0, 1, 2, 3, 0, 1), fraction=1.0)
    >>> place_servers(cluster_gpus=1, num_servers=4, total_gpu_frac=0.5).num_gpus
    (0.125, 0.125, 0.125, 0.125)
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Any, Dict, Mapping, Tuple

from async_search.checks import check_float, check_int


#: Seconds ``reserve_gpus`` waits for whole GPUs before it lets Ray pack the servers.
RESERVE_WAIT_S = 30.0

# Ray keeps resource quantities to 4 decimals: shares are rounded down to that grid,
# so that the servers on a GPU never ask for more than it has.
_GRID = 10_000


@dataclasses.dataclass(frozen=True)
class GpuPlacement:
    """The GPU request of each of a run's server actors.

    Attributes:
        num_gpus: per server, the fraction of a GPU it asks Ray for (0.0 on a cluster
            without GPUs).
        bundles: per server, the placement-group bundle (one whole GPU each) it is
            scheduled into; None when no placement group is needed (no GPU, or all the
            servers on one GPU).
        fraction: ``total_gpu_frac``: the fraction of each GPU in use that its servers
            share (1.0 when None was given).
    """

    num_gpus: Tuple[float, ...]
    bundles: Tuple[int, ...] | None
    fraction: float = 1.0

    @property
    def num_bundles(self) -> int:
        """Whole GPUs the run reserves: the placement group's bundles (0 when none)."""
        return 0 if self.bundles is None else max(self.bundles) + 1

    def packed(self) -> "GpuPlacement":
        """Without a placement group: ``fraction / num_servers`` of a GPU each (what
        the servers asked for before they were spread), which Ray packs wherever
        they fit."""
        if self.bundles is None:
            return self
        share = _floor(self.fraction / len(self.num_gpus))
        return GpuPlacement((share,) * len(self.num_gpus), None, self.fraction)

    def actor_options(self, server: int, group: Any = None) -> Dict[str, Any]:
        """``ray.remote(...).options`` keywords for server number ``server``: its
        ``num_gpus``, and its bundle of ``group`` (the reserved placement group, or None
        when the servers ask without one)."""
        options: Dict[str, Any] = {"num_gpus": self.num_gpus[server]}
        if group is not None and self.bundles is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=self.bundles[server])
        return options


def place_servers(cluster_gpus: float, num_servers: int,
                  total_gpu_frac: float | None = None) -> GpuPlacement:
    """Spreads ``num_servers`` servers over a cluster's GPUs.

    Server ``i`` goes on GPU ``i mod U``, ``U = min(num_servers, GPUs)``; the servers on
    a GPU share ``total_gpu_frac`` of it (None: all of it) equally. A cluster with less
    than one GPU (a fraction declared) counts as one GPU of that size.

    Args:
        cluster_gpus: the cluster's GPUs (``ray.cluster_resources()["GPU"]``).
        num_servers: server actors to place.
        total_gpu_frac: the fraction of each GPU in use that its servers ask for, in
            (0, 1]; None means 1.

    Raises:
        ValueError: a negative GPU count, fewer than one server, or a fraction outside
            (0, 1].

    Example:
        >>> place_servers(0, 2, None).num_gpus
        (0.0, 0.0)
        >>> place_servers(2, 2, None)
        GpuPlacement(num_gpus=(1.0, 1.0), bundles=(0, 1), fraction=1.0)
    """
    cluster_gpus = check_float("cluster_gpus", cluster_gpus, minimum=0.0)
    num_servers = check_int("num_servers", num_servers, minimum=1)
    fraction = 1.0 if total_gpu_frac is None else check_float(
        "total_gpu_frac", total_gpu_frac, minimum=0.0, strict=True, maximum=1.0)
    if cluster_gpus == 0.0:
        return GpuPlacement((0.0,) * num_servers, None, fraction)
    used = min(num_servers, max(1, int(cluster_gpus)))
    if used == 1:  # one GPU: a fraction of it, no reservation (as Ray packs anyway)
        share = _floor(fraction * min(cluster_gpus, 1.0) / num_servers)
        return GpuPlacement((share,) * num_servers, None, fraction)
    bundles = tuple(i % used for i in range(num_servers))
    per_gpu = [bundles.count(b) for b in range(used)]
    return GpuPlacement(tuple(_floor(fraction / per_gpu[b]) for b in bundles), bundles,
                        fraction)


def _floor(share: float) -> float:
    # Never 0: a share that small still asks for Ray's smallest unit of a GPU.
    # (The 1e-6 keeps 0.6 / 3 = 0.19999999999999998 at 0.2.)
    return max(math.floor(share * _GRID + 1e-6) / _GRID, 1.0 / _GRID)


def bundle_resources(placement: GpuPlacement,
                     server_resources: Mapping[str, float] | None = None) -> list:
    """The placement group's bundles: one whole GPU each, and the custom resources
    (``RayPlacement.server_resources``) of every server scheduled into it, since Ray
    refuses an actor whose request does not fit its bundle.

    Example:
        >>> bundle_resources(place_servers(2, 3), {"lab": 1.0})
        [{'GPU': 1.0, 'lab': 2.0}, {'GPU': 1.0, 'lab': 1.0}]
    """
    bundles = placement.bundles or ()
    return [{"GPU": 1.0, **{name: amount * bundles.count(b)
                            for name, amount in (server_resources or {}).items()}}
            for b in range(placement.num_bundles)]


async def reserve_gpus(ray: Any, placement: GpuPlacement, wait_s: float | None = None,
                       server_resources: Mapping[str, float] | None = None,
                       ) -> Tuple[GpuPlacement, Any]:
    """``(placement to use, placement group or None)``: reserves one whole GPU per
    bundle of ``placement``, with the ``server_resources`` of the servers it will hold.
    When the reservation is not ready within ``wait_s`` seconds (None:
    ``RESERVE_WAIT_S``; the GPUs are partly taken), it is released, and the servers
    spread over the GPUs free whole then (another ``wait_s`` at most), or ask without a
    reservation (``placement.packed()``), so a run never waits on it forever."""
    wait_s = RESERVE_WAIT_S if wait_s is None else wait_s
    group = await _reserved(ray, placement, wait_s, server_resources)
    if group is not None or placement.bundles is None:
        return placement, group
    # Ray's count of free GPUs is read only now: it lags a moment behind actors that
    # ended (a run just before this one), and would spread over too few.
    free = math.floor(ray.available_resources().get("GPU", 0.0) + 1e-6)
    if 2 <= free < placement.num_bundles:  # a GPU another job holds part of idled
        fewer = place_servers(free, len(placement.num_gpus), placement.fraction)
        group = await _reserved(ray, fewer, wait_s, server_resources)
        if group is not None:
            return fewer, group
    return placement.packed(), None


async def _reserved(ray: Any, placement: GpuPlacement, wait_s: float,
                    server_resources: Mapping[str, float] | None) -> Any:
    """The placement group of ``placement``'s bundles once ready; None when it needs
    none, or when it was not ready within ``wait_s`` seconds (it is released then)."""
    if placement.bundles is None:
        return None
    from ray.util.placement_group import placement_group

    group = placement_group(bundle_resources(placement, server_resources),
                            strategy="PACK")
    try:
        await asyncio.wait_for(group.ready(), wait_s)
    except asyncio.TimeoutError:
        release_gpus(ray, group)
        return None
    except BaseException:
        release_gpus(ray, group)
        raise
    return group


def release_gpus(ray: Any, group: Any) -> None:
    """Removes a placement group made by ``reserve_gpus`` (None: nothing to do)."""
    if group is not None:
        ray.util.remove_placement_group(group)
