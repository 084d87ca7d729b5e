"""Weights swapped in place: the adapters of one net take turns on its device weights.

``update_model(weights, version)`` calls ``model.with_weights(weights)`` on the event
loop, while a device thread may still be running a batch on the old model: the old batch
must finish on the old weights, and every later batch must run on the new ones.
Captured CUDA graphs, ``torch.compile`` and traced TensorFlow functions read the net's
weights where they are, so the new weights are copied into the same tensors, not into
new ones (nothing is traced or captured again).

So ``with_weights`` only stages the new values (checked, copied on the host); the new
adapter copies them into the net at its first batch, in the device thread, under the
lock the adapters of one net share. An adapter keeps computing with its own weights:
when another adapter's weights replace its own while it is still referenced (the model
a user made first, say), a copy of its values is taken first, and it puts them back at
its next call. An adapter nobody references any more costs nothing.

``OwnWeightsModel`` is the run of the adapters built on this (TensorFlow, PyTorch): each
batch under the net's lock, on the adapter's own weights. Two adapters made on one net
with the same options (a served one and a reference, say) share its runner as
``with_weights``' copies do, each computing with the weights it was made with; one
with other options is refused while the first is in use (give it a copy of the net).
"""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any, Callable, Dict

import numpy as np

from async_search.base import Outputs
from async_search.models.buckets import BucketedModel


class OwnWeights:
    """One adapter's weights: ``values`` (in the order of the net's weight tensors), or
    None while they are the ones in the net."""

    __slots__ = ("values", "ref", "__weakref__")

    def __init__(self, values: Any = None):
        self.values = values
        #: A weak reference to these weights: ``SharedWeights.holder`` when they are
        #: in the net (one test of identity, where a batch checks it).
        self.ref = weakref.ref(self)


class SharedWeights:
    """The weight tensors of one net on one device, and whose values are in them.

    Args:
        read: a copy of the values now in the net (taken when an adapter still in use
            loses them).
        write: copies values (as staged by an adapter's ``with_weights``, or as ``read``
            returned them) into the net's tensors.

    Example:
        >>> store = {"w": 1}
        >>> shared = SharedWeights(lambda: store["w"], lambda v: store.update(w=v))
        >>> first = shared.first()
        >>> second = OwnWeights(2)
        >>> with shared.lock:
        ...     shared.use(second)
        >>> store["w"], first.values
        (2, 1)
    """

    def __init__(self, read: Callable[[], Any], write: Callable[[Any], None]):
        self._read = read
        self._write = write
        #: Held around every use of the net's tensors (and of the buffers the adapters
        #: of the net share): one batch or one copy at a time.
        self.lock = threading.Lock()
        #: ``OwnWeights.ref`` of the weights in the net, or None (read under ``lock``).
        self.holder: "weakref.ref[OwnWeights] | None" = None

    def first(self) -> OwnWeights:
        """The weights of the adapter made with the net: those in its tensors now."""
        own = OwnWeights()
        self.holder = own.ref
        return own

    def join(self) -> OwnWeights:
        """The weights of another adapter made on the net later: a copy of those in its
        tensors now, which stay the holder's (or those tensors, when nobody holds
        them)."""
        with self.lock:
            holder = self.holder() if self.holder is not None else None
            if holder is None:
                return self.first()
            return OwnWeights(self._read())

    def use(self, own: OwnWeights) -> None:
        """Puts ``own``'s values in the net, unless they are there already (call under
        ``lock``). The adapter whose values they replace keeps a copy if it still exists.
        """
        if self.holder is own.ref:
            return
        holder = self.holder() if self.holder is not None else None
        if holder is not None and holder.values is None:
            holder.values = self._read()
        # Nobody's until the copy is complete: after a copy that failed half way, the
        # next call writes whole values again, whoever makes it.
        self.holder = None
        self._write(own.values)
        own.values = None
        self.holder = own.ref

    def values_of(self, own: OwnWeights) -> Any:
        """``own``'s values: staged or kept, or read from the net when they are in it
        (call under ``lock``)."""
        return self._read() if self.holder is own.ref else own.values


class _Runners:
    """net -> (options, the runner of the adapters made on it), weakly: a net whose
    adapters are gone leaves it. Keyed by the net's identity, so that a net's own
    ``__hash__`` and ``__eq__`` (which a module may define, or make raise) are never
    called; nets that cannot be weakly referenced are not kept (their adapters do not
    share). Used under ``lock``, which is held while a runner is made (reentrant: a
    runner may make adapters of other nets)."""

    def __init__(self):
        self.lock = threading.RLock()
        #: id(net) -> (a weak reference to the net, options, a weak reference to the
        #: runner); an entry leaves when its net is collected.
        self._kept: Dict[int, tuple] = {}

    def find(self, net: Any, options: Any) -> tuple:
        """``(runner, None)`` of the runner of ``net`` in use when it was made with
        ``options``; ``(None, its options)`` when with others; ``(None, None)``."""
        kept = self._kept.get(id(net))
        if kept is None or kept[0]() is not net:  # none, or another net's old id
            return None, None
        runner = kept[2]()
        if runner is None:
            return None, None
        if values_equal(kept[1], options):
            return runner, None
        return None, kept[1]

    def keep(self, net: Any, options: Any, runner: Any) -> None:
        key, kept = id(net), self._kept

        def forget(dead: Any) -> None:  # at the net's collection, in any thread
            if kept.get(key, (None,))[0] is dead:
                kept.pop(key, None)

        try:
            ref = weakref.ref(net, forget)
        except TypeError:  # no weak references: not kept
            return
        kept[key] = (ref, options, weakref.ref(runner))


def values_equal(a: Any, b: Any) -> bool:
    """``a == b``, False where the comparison itself fails (an array inside)."""
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - ambiguous truth values, hostile __eq__
        return False


#: The runners of the nets adapters are made on (a weak cache, not state: an adapter
#: made on a net finds what another adapter of it already built).
_RUNNERS = _Runners()


class OwnWeightsModel(BucketedModel):
    """An adapter whose runner (``_runner``: its ``weights``, a ``SharedWeights``, and
    ``run(batch)``, which ``_run`` calls) is shared with the adapters ``with_weights``
    made: each batch runs under the runner's lock, once this adapter's weights
    (``_own``) are in the net. (``TensorFlowModel`` runs its batches in its own call,
    its runner holding no ``run``.)"""

    _runner: Any
    _own: OwnWeights

    def _start(self, net: Any, options: Any, make_runner: Callable[[], Any],
               rejoin: Callable[[Any], None] | None = None) -> None:
        """Runs on a runner of ``net``, with the weights in it now as this adapter's
        own: the runner of an adapter made on ``net`` with the same ``options`` that
        is still in use (sharing its lock, buffers and traces; ``rejoin(runner)`` is
        called under its lock, to prepare the net again as a new adapter does, and may
        refuse it), else a new one, ``make_runner()``.

        Raises:
            ValueError: an adapter made on ``net`` with other options is in use: each
                runner writes the net's tensors its own way (traces that hold derived
                state, a compiled copy's buffers, a device), so two would compute with
                each other's weights.
        """
        with _RUNNERS.lock:  # one runner per net, whichever threads make adapters
            runner, other = _RUNNERS.find(net, options)
            if other is not None:  # maybe only garbage in a reference cycle: collect
                gc.collect()
                runner, other = _RUNNERS.find(net, options)
            if other is not None:
                differ = sorted(k for k in options if not values_equal(
                    other.get(k), options[k])) if isinstance(other, dict) else []
                said = ", ".join(f"{k} {other.get(k)!r} there, {options[k]!r} here"
                                 for k in differ) or repr(other)
                raise ValueError(
                    f"{type(self).__name__}: an adapter made on this net with other "
                    f"options is in use ({said}); two would compute with each other's "
                    f"weights: give this one a copy of the net (copy.deepcopy of a "
                    f"module, tf.keras.models.clone_model, or the first adapter's "
                    f"on_device), make it with the same options, or drop the first "
                    f"adapter (and what serves it) first")
            if runner is not None:
                if rejoin is not None:  # first: it may find the net changed, and refuse
                    with runner.weights.lock:
                        rejoin(runner)
                self._runner = runner
                self._own = runner.weights.join()
                return
            runner = make_runner()
            self._runner = runner
            self._own = runner.weights.first()
            _RUNNERS.keep(net, options, runner)

    def _with_staged(self, weights: Any) -> Any:
        """A copy of this adapter (sharing its runner) whose own weights are
        ``weights``, as the runner's ``stage`` checks them and copies them to the host:
        the body of the adapters' ``with_weights``."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new._own = OwnWeights(self._runner.stage(weights))
        return new

    def _run(self, batch: np.ndarray) -> Outputs:
        runner = self._runner
        weights, own = runner.weights, self._own
        with weights.lock:
            if weights.holder is not own.ref:  # (the usual case: nothing to put back)
                weights.use(own)
            return runner.run(batch)
