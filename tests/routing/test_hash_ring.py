import collections

import numpy as np
import pytest

from async_search.routing.hash_ring import MAX_VIRTUAL_NODES, HashRing

pytestmark = pytest.mark.timeout(60)


def elements(n, seed=0, width=3):
    return np.random.default_rng(seed).standard_normal((n, width)).astype(np.float32)


KEYS = [k.tobytes() for k in elements(5000, seed=1)]


def owners(ring):
    return dict(zip(KEYS, ring.nodes_for(KEYS)))


def test_ring_spreads_keys_evenly_and_agrees_with_single_lookups():
    ring = HashRing(["a", "b", "c", "d"], virtual_nodes=128)
    placed = owners(ring)
    shares = collections.Counter(placed.values())
    assert set(shares) == {"a", "b", "c", "d"}
    assert all(0.17 < n / len(KEYS) < 0.33 for n in shares.values()), shares
    assert all(ring.node_for(k) == placed[k] for k in KEYS[:200])


def test_adding_a_server_moves_about_one_nth_of_the_keys_all_to_it():
    ring = HashRing(["a", "b", "c", "d"], virtual_nodes=128)
    before = owners(ring)
    ring.add("e")
    after = owners(ring)
    moved = [k for k in KEYS if before[k] != after[k]]
    assert 0.12 < len(moved) / len(KEYS) < 0.28  # about 1/5
    assert all(after[k] == "e" for k in moved)


def test_removing_a_server_moves_only_its_keys():
    ring = HashRing(["a", "b", "c", "d"], virtual_nodes=128)
    before = owners(ring)
    ring.remove("c")
    after = owners(ring)
    moved = [k for k in KEYS if before[k] != after[k]]
    assert set(moved) == {k for k in KEYS if before[k] == "c"}
    assert 0.15 < len(moved) / len(KEYS) < 0.35  # about 1/4


def test_excluding_a_node_reassigns_only_its_keys():
    ring = HashRing(["a", "b", "c"], virtual_nodes=64)
    full = owners(ring)
    partial = dict(zip(KEYS, ring.nodes_for(KEYS, among={"a", "c"})))
    assert all(partial[k] == full[k] for k in KEYS if full[k] != "b")
    assert "b" not in partial.values()


def test_a_ring_refuses_a_bad_size_a_second_copy_and_an_unknown_node():
    for bad in (0, -1, 2.0, True, MAX_VIRTUAL_NODES + 1, 300_000):
        with pytest.raises(ValueError, match="virtual_nodes must be an integer from 1 to"):
            HashRing(virtual_nodes=bad)
    ring = HashRing(["a"])
    with pytest.raises(ValueError, match="already on the ring"):
        ring.add("a")
    with pytest.raises(KeyError, match="not on the ring"):
        ring.remove("b")
    with pytest.raises(LookupError, match="no node on the ring"):
        HashRing().node_for(b"x")


@pytest.mark.parametrize("among", [["a", "a"], {"a", "zzz"}, ("a", "a", "zzz")])
def test_among_names_its_nodes_whatever_duplicates_or_strangers_it_holds(among):
    # As many names as the ring has nodes is not every node: only "a" may be chosen.
    ring = HashRing(["a", "b"], virtual_nodes=64)
    assert set(ring.nodes_for(KEYS[:500], among=among)) == {"a"}
    assert {ring.node_for(k, among=among) for k in KEYS[:100]} == {"a"}


def test_among_with_every_node_and_a_stranger_is_the_whole_ring():
    ring = HashRing(["a", "b"], virtual_nodes=64)
    assert ring.nodes_for(KEYS[:500], among=["b", "a", "zzz"]) == ring.nodes_for(KEYS[:500])


def test_each_nodes_points_are_hashed_once_however_the_ring_is_built(monkeypatch):
    # Every add hashed and sorted every point again: a ring of 1,024 nodes took minutes,
    # in a router's first request, with the event loop blocked.
    from async_search.routing import hash_ring

    calls = []
    real = hash_ring._hash
    monkeypatch.setattr(hash_ring, "_hash", lambda data: calls.append(1) or real(data))
    ring = HashRing([f"n{i}" for i in range(40)], virtual_nodes=16)
    assert len(calls) == 40 * 16
    ring.update([f"n{i}" for i in range(10, 60)])
    ring.add("x")
    ring.remove("n10")
    assert len(calls) == (40 + 20 + 1) * 16
    assert ring.nodes == tuple(f"n{i}" for i in range(11, 60)) + ("x",)


def test_the_rings_kept_for_sets_of_nodes_are_bounded():
    # One kept for every set of available servers seen, each a copy of their points:
    # breakers flapping among 64 servers grew it without end (598 rings, 77 MiB).
    from async_search.routing.hash_ring import MAX_SUBRINGS

    names = [f"s{i}" for i in range(12)]
    ring = HashRing(names, virtual_nodes=8)
    everyone = {key: ring.node_for(key) for key in (b"a", b"b", b"c", b"d")}
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            among = [n for n in names if n not in (names[i], names[j])]
            for key, owner in everyone.items():
                got = ring.node_for(key, among)
                assert got in among and (owner not in among or got == owner)
    assert len(ring._subrings) <= MAX_SUBRINGS


def test_a_ring_refuses_a_name_for_a_list_names_that_are_no_str_and_duplicates_to_update():
    # "abc" became the nodes a, b and c; 1 and "1" hashed to the same points (every key
    # went to one of them); update dropped a second copy that the constructor refuses.
    with pytest.raises(TypeError, match=r"\['abc'\] for one"):
        HashRing("abc")
    with pytest.raises(TypeError, match="a node is named by a str, got int 1"):
        HashRing([1, "1"])
    ring = HashRing(["a"], virtual_nodes=8)
    with pytest.raises(ValueError, match="nodes must differ"):
        ring.update(["a", "a"])
    assert ring.nodes == ("a",)
