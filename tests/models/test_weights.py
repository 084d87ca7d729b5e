import gc

import pytest

from async_search.models.weights import OwnWeights, SharedWeights

pytestmark = pytest.mark.timeout(60)


class Net:
    """One value, read and written by SharedWeights, counting the reads."""

    def __init__(self, value):
        self.value, self.reads, self.fail = value, 0, False

    def read(self):
        self.reads += 1
        return self.value

    def write(self, value):
        if self.fail:
            self.value = "torn"
            raise RuntimeError("copy failed half way")
        self.value = value


def test_each_owner_computes_with_its_own_values():
    net = Net("a")
    shared = SharedWeights(net.read, net.write)
    first, second = shared.first(), OwnWeights("b")
    with shared.lock:
        shared.use(second)
        assert net.value == "b" and first.values == "a"  # a copy taken for first
        shared.use(first)
        assert net.value == "a" and first.values is None and second.values == "b"


def test_no_copy_is_kept_for_an_owner_nobody_references():
    net = Net("a")
    shared = SharedWeights(net.read, net.write)
    first = shared.first()
    del first
    gc.collect()
    with shared.lock:
        shared.use(OwnWeights("b"))
    assert net.reads == 0 and net.value == "b"


def test_a_copy_that_failed_half_way_is_redone_by_the_next_owner():
    net = Net("a")
    shared = SharedWeights(net.read, net.write)
    first, second = shared.first(), OwnWeights("b")
    net.fail = True
    with shared.lock, pytest.raises(RuntimeError):
        shared.use(second)
    net.fail = False
    assert net.value == "torn"
    with shared.lock:
        shared.use(first)  # its values were read before the failed copy
    assert net.value == "a"
