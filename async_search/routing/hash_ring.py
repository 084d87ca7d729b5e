"""Consistent hashing with virtual nodes: which node owns a key, stable as nodes change.

Each node owns many points on a ring of 64-bit hashes; a key belongs to the node of the
first point at or after the key's hash (wrapping around). Adding or removing one of N
nodes moves only about 1/N of the keys, all to or from that node. The router's
``ConsistentHash`` policy uses a ring to send each element to the same server (and that
server's cache) every time.
"""

from __future__ import annotations

import bisect
import hashlib
from typing import Collection, Dict, List, Sequence, Tuple

import numpy as np


def _hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


#: The most points a node may have on the ring.
MAX_VIRTUAL_NODES = 4096
#: The most rings of some of the nodes kept (each a copy of their points): sets of the
#: servers whose breakers admit requests, seen again while the breakers stay put.
MAX_SUBRINGS = 16


def _node_list(nodes: Sequence[str]) -> List[str]:
    """``nodes`` as a list; a str is one node's name, not a sequence of names."""
    if isinstance(nodes, (str, bytes)):
        raise TypeError(f"nodes is a sequence of names ([{nodes!r}] for one), got "
                        f"{nodes!r}")
    return list(nodes)


class HashRing:
    """Consistent hashing with virtual nodes: each node owns many points on a ring.

    A key belongs to the node of the first point at or after the key's hash (wrapping
    around). With ``virtual_nodes`` points per node the keys spread evenly, and a node
    that joins or leaves takes or gives only its own share.

    Args:
        nodes: the nodes on the ring at first.
        virtual_nodes: points per node on the ring.

    Example:
        >>> ring = HashRing(["a", "b", "c"], virtual_nodes=64)
        >>> ring.node_for(b"some element") in {"a", "b", "c"}
        True
        >>> ring.node_for(b"x", among={"b"})
        'b'
    """

    def __init__(self, nodes: Sequence[str] = (), *, virtual_nodes: int = 128):
        if not isinstance(virtual_nodes, int) or isinstance(virtual_nodes, bool) or not (
                1 <= virtual_nodes <= MAX_VIRTUAL_NODES):
            # more points spread the keys no better, and every add rehashes them all
            raise ValueError(f"virtual_nodes must be an integer from 1 to "
                             f"{MAX_VIRTUAL_NODES}, got {virtual_nodes!r}")
        self.virtual_nodes = virtual_nodes
        self._nodes: List[str] = []
        self._hashes: Dict[str, np.ndarray] = {}  # node -> its points, hashed once
        self._points = np.empty(0, np.uint64)
        self._owners: List[str] = []
        self._subrings: Dict[frozenset, Tuple[np.ndarray, List[str]]] = {}
        for node in _node_list(nodes):
            self._join(node)
        self._rebuild()

    @property
    def nodes(self) -> Tuple[str, ...]:
        """The nodes on the ring, in the order they joined."""
        return tuple(self._nodes)

    def add(self, node: str) -> None:
        """Give ``node`` its points on the ring."""
        self._join(node)
        self._rebuild()

    def remove(self, node: str) -> None:
        """Take ``node``'s points off the ring: its keys go to their next node."""
        if node not in self._hashes:
            raise KeyError(f"node {node!r} is not on the ring; nodes: {self._nodes}")
        self._nodes.remove(node)
        del self._hashes[node]
        self._rebuild()

    def update(self, nodes: Sequence[str]) -> None:
        """Makes the ring hold ``nodes``: those gone leave, new ones join (in their
        order), and the ring is sorted once (a node added at a time sorted it each
        time: minutes for a thousand nodes).

        Example:
            >>> ring = HashRing(["a", "b"], virtual_nodes=8)
            >>> ring.update(["b", "c", "d"]); ring.nodes
            ('b', 'c', 'd')
        """
        nodes = _node_list(nodes)
        if len(set(nodes)) != len(nodes):  # as the constructor refuses them
            raise ValueError(f"nodes must differ, got {nodes}")
        keep = set(nodes)
        for node in [n for n in self._nodes if n not in keep]:
            self._nodes.remove(node)
            del self._hashes[node]
        for node in nodes:
            if node not in self._hashes:
                self._join(node)
        self._rebuild()

    def _join(self, node: str) -> None:
        if not isinstance(node, str):  # 1 and "1" would hash to the same points
            raise TypeError(f"a node is named by a str, got {type(node).__name__} "
                            f"{node!r}")
        if node in self._hashes:
            raise ValueError(f"node {node!r} is already on the ring")
        self._hashes[node] = np.fromiter(
            (_hash(f"{node}#{i}".encode()) for i in range(self.virtual_nodes)),
            np.uint64, self.virtual_nodes)
        self._nodes.append(node)

    def _rebuild(self) -> None:
        """The ring's points in order, ties between nodes broken by their names."""
        names = sorted(self._nodes, key=str)  # (any names: a mix of types sorts too)
        if not names:
            self._points, self._owners = np.empty(0, np.uint64), []
        else:
            points = np.concatenate([self._hashes[n] for n in names])
            rank = np.repeat(np.arange(len(names)), self.virtual_nodes)
            order = np.lexsort((rank, points))
            self._points = points[order]
            self._owners = [names[i] for i in rank[order].tolist()]
        self._subrings = {}

    def _ring(self, among: Collection[str] | None) -> Tuple[np.ndarray, List[str]]:
        if among is None:
            return self._points, self._owners
        key = frozenset(among)  # its nodes on the ring: duplicates or strangers add none
        ring = self._subrings.get(key)
        if ring is None:
            if key.issuperset(self._nodes):
                ring = self._points, self._owners
            else:
                keep = [i for i, n in enumerate(self._owners) if n in key]
                ring = self._points[keep], [self._owners[i] for i in keep]
            if len(self._subrings) >= MAX_SUBRINGS:
                # The oldest goes: breakers flapping among many servers made a new set
                # of the available ones again and again (a copy of the ring each).
                del self._subrings[next(iter(self._subrings))]
            self._subrings[key] = ring
        return ring

    def node_for(self, key: bytes, among: Collection[str] | None = None) -> str:
        """The node that owns ``key``; with ``among``, the first such node clockwise."""
        points, owners = self._ring(among)
        if not owners:
            raise LookupError(f"no node on the ring among {sorted(among or [])}")
        i = bisect.bisect_left(points, _hash(key))
        return owners[i % len(owners)]

    def nodes_for(self, keys: Sequence[bytes], among: Collection[str] | None = None,
                  ) -> List[str]:
        """``node_for`` of many keys, with one vectorised search of the ring."""
        points, owners = self._ring(among)
        if not owners:
            raise LookupError(f"no node on the ring among {sorted(among or [])}")
        hashes = np.fromiter((_hash(k) for k in keys), np.uint64, len(keys))
        index = np.searchsorted(points, hashes) % len(owners)
        return [owners[i] for i in index.tolist()]
