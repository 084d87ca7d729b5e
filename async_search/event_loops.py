"""The event loop a run's processes use: asyncio's, or uvloop's when asked for."""

from __future__ import annotations

import asyncio
from typing import Callable, Optional


def loop_factory(use_uvloop: bool, *, required: bool = False,
                 ) -> Optional[Callable[[], asyncio.AbstractEventLoop]]:
    """uvloop's loop factory when asked for and installed, else None (asyncio's), for
    ``asyncio.Runner(loop_factory=...)``.

    Raises:
        ImportError: when uvloop is ``required`` but not installed.
    """
    if not use_uvloop:
        return None
    try:
        import uvloop
    except ImportError:
        if required:
            raise
        return None
    return uvloop.new_event_loop
