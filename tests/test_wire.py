import pickle

import pytest

from async_search import errors, wire
from async_search.errors import RemoteError
from tests.faults import faulty


def raised(error):
    try:
        raise error
    except BaseException as e:
        return e


def test_an_exception_that_round_trips_travels_as_itself_with_its_traceback():
    failure = wire.pack_error(raised(KeyError("k")))
    error = wire.unpack_error(pickle.loads(pickle.dumps(failure)), "start 2")
    assert type(error) is KeyError and error.__notes__ == ["start 2"]
    assert "Traceback (most recent call last)" in error.remote_traceback
    assert "in raised" in error.remote_traceback
    assert isinstance(error.__cause__, errors.RemoteTraceback)


@pytest.mark.parametrize("error", [faulty.UnpicklableError("holding a lock"),
                                   faulty.UnloadableError(3, "cannot load")])
def test_an_exception_that_cannot_travel_becomes_a_remote_error(error):
    failure = wire.pack_error(raised(error))
    got = wire.unpack_error(pickle.loads(pickle.dumps(failure)), "start 0")
    assert isinstance(got, RemoteError)
    assert got.type_name == f"tests.faults.faulty.{type(error).__name__}"
    assert str(error) in str(got) and "in raised" in got.remote_traceback
    assert "builtins.Exception" in got.remote_mro


def test_a_remote_error_always_pickles_with_its_notes():
    error = RemoteError("mod.Error", "message", "Traceback ...", ("mod.Error",))
    error.add_note("start 4")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.type_name, copy.message, copy.remote_traceback, copy.remote_mro,
            copy.__notes__) == ("mod.Error", "message", "Traceback ...", ("mod.Error",),
                                ["start 4"])


@pytest.mark.parametrize("value, word", [(faulty.UnpicklableResult(), "cannot pickle"),
                                         (faulty.UnloadableResult(), "refuses")])
def test_a_value_that_cannot_travel_is_packed_as_a_failure_saying_why(value, word):
    ok, payload = wire.pack(value)
    assert not ok
    failure = pickle.loads(payload)
    assert isinstance(failure, wire.Failure) and word in str(failure.error)
    assert wire.pack([1, 2]) == (True, pickle.dumps([1, 2]))


def test_a_failure_whose_notes_are_no_list_arrives_with_its_note():
    # add_note raised TypeError on it: the run raised that, return_exceptions or not.
    import pickle

    from async_search.wire import arrived, pack_error

    error = ValueError("the search failed")
    error.__notes__ = ("set by hand",)
    index, ok, got = arrived(1, False, pickle.dumps(pack_error(error)), "client 0")
    assert (index, ok) == (1, False) and isinstance(got, ValueError)
    assert got.__notes__ == ["set by hand", "in the search of start 1, in client 0"]


@pytest.mark.parametrize("payload", [5, None, "text"])
def test_a_failure_that_is_no_exception_arrives_as_a_search_error(payload):
    # AttributeError ('int' object has no attribute 'add_note') escaped the run.
    import pickle

    from async_search.wire import arrived

    index, ok, got = arrived(2, False, pickle.dumps(payload), "client 0")
    assert (index, ok) == (2, False) and isinstance(got, errors.SearchError)
    assert "could not be read: it is" in str(got) and "not an exception" in str(got)
