"""Progress bars over model evaluations, fed by the runners' ``progress`` callbacks."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator, Optional

from async_search.extras import import_extra


@contextlib.contextmanager
def progress_bar(desc: str, total: Optional[int] = None, *, enabled: bool = True,
                 unit: str = "eval") -> Iterator[Optional[Callable[[int], None]]]:
    """A tqdm bar counting evaluated elements; yields its ``update`` (None if disabled).

    ``total`` is an estimate, or None where none is known (a search that stops at its
    goal): the bar then shows a count and a rate. A count that passes the total raises
    the total with it (no "1.24k/1k"), and the total is set to the final count on close,
    so a run that evaluates more or fewer elements than expected still ends at 100 %. The
    bar shows on a terminal only (tqdm's ``disable=None``), so logs and CI output stay
    clean, and it is erased when done: the printed report takes its place.

    Example:
        >>> with progress_bar("demo", 10, enabled=False) as update:
        ...     update is None
        True
    """
    if not enabled:
        yield None
        return
    # the plain bar: it works in terminals and notebooks alike
    tqdm = import_extra("tqdm", "a progress bar (show_progress=False for none)").tqdm

    bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=False,
               dynamic_ncols=True, file=sys.stderr, mininterval=0.2, disable=None)

    def update(n: int) -> None:
        bar.update(n)
        if bar.total is not None and bar.n > bar.total:
            bar.total = bar.n  # drawn with the next update

    try:
        yield update
    finally:
        bar.total = bar.n
        bar.refresh()
        bar.close()
