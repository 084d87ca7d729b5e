"""An evaluate function at a priority: the same server, its requests batched first.

``evaluate.at_priority(p)`` (``BatchingServer.at_priority``) gives one. A search takes it
as it takes any evaluate (``await urgent(x)``), so the search code does not change; the
plain ``evaluate`` stays at priority 0. A batch is filled from the highest priority
queued down, round robin within each level (``batchers.FairBatcher``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Hashable, Tuple

import numpy as np

from async_search.base import Outputs

if TYPE_CHECKING:  # the server imports this module
    import asyncio

    from async_search.servers.batching import BatchingServer


class PriorityEvaluate:
    """``server``'s evaluate function for requests at ``priority`` (higher goes first).

    Example:
        >>> import asyncio
        >>> import async_search as asr
        >>> from async_search.models import MLP
        >>> async def main():
        ...     async with asr.serve(MLP((4,))) as evaluate:
        ...         urgent = evaluate.at_priority(1)
        ...         x = np.zeros((2, 4), np.float32)
        ...         y = await urgent(x)              # batched before priority-0 requests
        ...         y, version = await urgent.with_version(x)
        ...         return y.shape, version
        >>> asyncio.run(main())
        ((2, 1), 0)
    """

    def __init__(self, server: "BatchingServer", priority: int):
        self._server = server
        self.priority = priority

    def __call__(self, x: np.ndarray, timeout: float | None = None,
                 ) -> "asyncio.Future[Outputs]":
        """Queue ``x[n, ...]`` at this priority (``timeout``: its deadline); as calling
        the server does.

        Raises:
            InputSpecError, ServerClosedError: as calling the server does.
        """
        return self._server._call(x, self.priority, timeout)

    async def with_version(self, x: np.ndarray, timeout: float | None = None,
                           ) -> Tuple[Outputs, Hashable]:
        """``(outputs, version)``, as the server's ``with_version``."""
        return await self._server._versioned(self(x, timeout))

    @property
    def version(self) -> Hashable:
        """The version of the model that new batches run on."""
        return self._server.version

    @property
    def model(self) -> Any:
        """The model that new batches run on (a new object at each swap: what a
        ``CachedEvaluate`` in front of this evaluate tells swaps by)."""
        return self._server.model

    def __repr__(self) -> str:
        return f"PriorityEvaluate(priority={self.priority})"
