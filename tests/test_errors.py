import inspect
import pickle

import pytest

from async_search import errors

pytestmark = pytest.mark.timeout(60)

CLASSES = [obj for _, obj in inspect.getmembers(errors, inspect.isclass)
           if issubclass(obj, BaseException) and obj.__module__ == errors.__name__]


def test_every_exception_has_a_docstring():
    assert all(c.__doc__ and c.__doc__.strip() for c in CLASSES)


def test_the_repository_errors_share_a_base_and_keep_their_meaning():
    for kind in (errors.ModelNotFoundError, errors.ModelNotReadyError,
                 errors.ModelLoadError, errors.LoadParametersError):
        assert issubclass(kind, errors.RepositoryError)
    assert issubclass(errors.ModelNotFoundError, LookupError)
    assert issubclass(errors.LoadParametersError, ValueError)  # a caller's error


def test_every_exception_is_exported_at_the_top_and_a_long_answer_is_an_output_error():
    import async_search as asr
    assert {c.__name__ for c in CLASSES} <= set(asr.__all__)
    assert issubclass(errors.ResponseTooLongError, errors.ModelOutputError)


def test_a_protocol_error_keeps_its_status_through_pickle():
    error = pickle.loads(pickle.dumps(errors.ProtocolError("no such output", 404)))
    assert str(error) == "no such output" and error.status == 404
    assert errors.ProtocolError("bad body").status == 400


def test_describe_names_the_type_and_survives_a_hostile_str():
    class Hostile(Exception):
        def __str__(self):
            raise RuntimeError("no")

    assert errors.describe(ValueError("x")) == "ValueError: x"
    assert errors.describe(Hostile()) == "Hostile"


def test_add_note_keeps_notes_that_are_no_list_and_survives_a_hostile_str():
    # add_note raised TypeError on such notes; a str was then split into characters,
    # and a note whose __str__ raised made the caller raise.
    from async_search.errors import add_note

    class Hostile:
        def __str__(self):
            raise RuntimeError("no str")

    for notes, kept in [("one note", ["one note"]), (("a", "b"), ["a", "b"]),
                        ((Hostile(),), ["<a Hostile note>"]), (7, ["7"])]:
        error = ValueError("x")
        error.__notes__ = notes
        add_note(error, "where")
        assert error.__notes__ == [*kept, "where"]
    error = ValueError("y")
    add_note(error, "plain")
    assert error.__notes__ == ["plain"]
