"""Starting or joining Ray, for every module that uses it."""

from __future__ import annotations

import os

__all__ = ["ensure_ray"]


def ensure_ray(address: str | None = None):
    """Ray, initialised: joins ``address`` if given, else starts Ray on this machine with
    its CPUs and no dashboard (unless Ray is already running in this process)."""
    import ray

    if not ray.is_initialized():
        if address is not None:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    return ray
