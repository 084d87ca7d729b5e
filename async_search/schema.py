"""Reading saved JSON back: every field checked, every failure a ``CheckpointError``.

A file a training run reads back (a checkpoint's ``config.json``, a replay buffer's
header, a run's ``state.json``) may be truncated, empty, not text, not JSON, another
program's, or edited by hand. ``read_json`` and ``Fields`` turn each of these into a
``CheckpointError`` that names the file and what is wrong with it (the field, the type
or range it needs, what it holds), instead of a ``KeyError`` or ``TypeError`` from deep
inside a constructor.

Example:
    >>> fields = Fields({"iteration": 3}, "state.json")
    >>> fields.int("iteration", minimum=0)
    3
    >>> fields.int("generation")
    Traceback (most recent call last):
    ...
    async_search.errors.CheckpointError: 'state.json': the field 'generation' is missing
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import typing
from typing import Any, Dict, Iterable, List, Tuple, Type, TypeVar

from async_search.checks import is_int
from async_search.errors import CheckpointError
from async_search.files import read_file


_T = TypeVar("_T")

#: The largest JSON file ``read_json`` reads: a run's state with thousands of
#: iterations takes a few megabytes.
MAX_JSON_BYTES = 64 << 20

#: ``{field: (minimum, maximum)}`` for a record's numbers (None: unbounded that side).
Ranges = Dict[str, Tuple[float | None, float | None]]


def read_json(file: str | os.PathLike) -> Any:
    """The JSON value in ``file``.

    Raises:
        CheckpointError: naming the file: missing, not a regular file, larger than
            ``MAX_JSON_BYTES``, empty, not UTF-8 text, or not JSON (truncated or
            corrupt), or JSON that this project never writes: ``NaN``, ``Infinity``
            or a number past the floats, or a key written twice in one object.
    """
    file = os.fspath(file)
    try:
        data = read_file(file, MAX_JSON_BYTES)
    except FileNotFoundError:
        raise CheckpointError(f"{file!r} is missing") from None
    except (OSError, ValueError) as e:  # ValueError: a FIFO, a device, past the limit
        raise CheckpointError(f"{file!r} cannot be read: {e}") from e
    if not data.strip():
        raise CheckpointError(f"{file!r} is empty (a save was interrupted, or the disk "
                              f"lost it)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{file!r} is not UTF-8 text (corrupt, or not the file it "
                              f"should be): {e}") from e
    try:
        return loads_strict(text)
    except NeverWrittenError as e:
        raise CheckpointError(f"{file!r} holds JSON that this project never writes "
                              f"(edited by hand, or by another program?): {e}") from e
    except (ValueError, RecursionError, MemoryError) as e:  # ValueError: JSON's, and
        # an integer past Python's 4,300 digits
        raise CheckpointError(f"{file!r} is not valid JSON (truncated or corrupt): "
                              f"{e}") from e


class NeverWrittenError(ValueError):
    """JSON that no writer of this project makes: ``NaN``, ``Infinity`` or a number
    past the floats (read as inf), or a key written twice in one object."""


def loads_strict(text: str) -> Any:
    """``json.loads``, as strict as this project's writers (``allow_nan=False``, each key
    once): ``NeverWrittenError`` for what they never write, ``ValueError`` for what is
    not JSON.

    Example:
        >>> loads_strict('{"a": [1, 2.5]}')
        {'a': [1, 2.5]}
    """
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite,
                      object_pairs_hook=_each_key_once)


def _no_constant(name: str) -> Any:
    raise NeverWrittenError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: past the floats, read as inf
        raise NeverWrittenError(f"{text} is past the largest float")
    return value


def _each_key_once(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    """An object whose keys are all different: of a key written twice, a plain reader
    would keep one value without a word."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise NeverWrittenError(f"the key {twice!r} is written twice in one object")
    return out


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null", int: "an integer", float: "a number"}.get(
                type(value), type(value).__name__)


class Fields:
    """The fields of one JSON object read from ``file``, each taken with a check.

    Args:
        data: the object (anything else is refused at once).
        file: the file it came from, for messages.
        where: where in the file it is (``"history[3]"``); empty for the whole file.
    """

    def __init__(self, data: Any, file: str, where: str = ""):
        self.file, self.where = file, where
        if not isinstance(data, dict):
            raise self.error(f"must be a JSON object, got {_type_name(data)}")
        self.data = data

    def error(self, problem: str, name: str | None = None) -> CheckpointError:
        place = ".".join(p for p in (self.where, name) if p)
        subject = f"the field {place!r}" if place else "its content"
        return CheckpointError(f"{self.file!r}: {subject} {problem}")

    def _get(self, name: str) -> Any:
        if name not in self.data:
            raise self.error("is missing", name)
        return self.data[name]

    def _bad(self, name: str, value: Any, want: str) -> CheckpointError:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        return self.error(f"must be {want}, got {_type_name(value)} {shown}", name)

    def int(self, name: str, *, minimum: int | None = None,
            maximum: int | None = None) -> int:
        value = self._get(name)
        if not is_int(value) or (minimum is not None and value < minimum) or (
                maximum is not None and value > maximum):
            raise self._bad(name, value, _rule("an integer", minimum, maximum))
        return int(value)

    def float(self, name: str, *, minimum: float | None = None,
              maximum: float | None = None, nan: bool = False) -> float:
        """A number (an integer is one); ``nan``: NaN is accepted too (a loss)."""
        value = self._get(name)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and math.isnan(value):
            ok = nan
        elif ok:
            ok = math.isfinite(value) and (minimum is None or value >= minimum) and (
                maximum is None or value <= maximum)
        if not ok:
            raise self._bad(name, value, _rule("a finite number", minimum, maximum))
        return float(value)

    def bool(self, name: str) -> bool:
        value = self._get(name)
        if not isinstance(value, bool):
            raise self._bad(name, value, "true or false")
        return value

    def str(self, name: str, *, choices: Iterable[str] | None = None,
            pattern: str | None = None) -> str:
        value = self._get(name)
        choices = None if choices is None else tuple(choices)
        if not isinstance(value, str) or (choices is not None and value not in choices) or (
                pattern is not None and not re.fullmatch(pattern, value)):
            want = (f"one of {list(choices)}" if choices is not None
                    else "a string" + (f" matching {pattern!r}" if pattern else ""))
            raise self._bad(name, value, want)
        return value

    def list(self, name: str) -> List[Any]:
        value = self._get(name)
        if not isinstance(value, list):
            raise self._bad(name, value, "a list")
        return value

    def object(self, name: str) -> "Fields":
        value = self._get(name)
        if not isinstance(value, dict):
            raise self._bad(name, value, "an object")
        return Fields(value, self.file, ".".join(p for p in (self.where, name) if p))

    def raw(self, name: str) -> Any:
        """The value as it is (the caller checks it)."""
        return self._get(name)

    def exactly(self, names: Iterable[str]) -> None:
        """Refuses fields other than ``names`` (another version's file, or a typo)."""
        extra = sorted(set(self.data) - set(names))
        if extra:
            raise self.error(f"has unknown fields {extra} (written by another version?)")


def _rule(kind: str, minimum: Any, maximum: Any) -> str:
    if minimum is not None and maximum is not None:
        return f"{kind} in [{minimum}, {maximum}]"
    if minimum is not None:
        return f"{kind} >= {minimum}"
    if maximum is not None:
        return f"{kind} <= {maximum}"
    return kind


def record_from_json(cls: Type[_T], data: Any, file: str, where: str,
                     ranges: Ranges | None = None) -> _T:
    """A dataclass record (``IterationRecord``, ``DaviRecord``...) from its JSON object,
    with every field present, of its annotated type (``int``, ``float``, ``bool``,
    ``str``, ``Dict[str, float]``), within ``ranges``, and no other field.

    Raises:
        CheckpointError: naming the file, the record and the field.
    """
    fields = Fields(data, file, where)
    hints = typing.get_type_hints(cls)
    ranges = ranges or {}
    values = {}
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        low, high = ranges.get(field.name, (None, None))
        if hint is bool:
            values[field.name] = fields.bool(field.name)
        elif hint is int:
            values[field.name] = fields.int(field.name, minimum=low, maximum=high)
        elif hint is float:
            values[field.name] = fields.float(field.name, minimum=low, maximum=high,
                                              nan=field.name.endswith("loss"))
        elif hint is str:
            values[field.name] = fields.str(field.name)
        elif typing.get_origin(hint) in (dict, Dict):
            inner = fields.object(field.name)
            values[field.name] = {key: inner.float(key, minimum=low, maximum=high)
                                  for key in inner.data}
        else:  # pragma: no cover - a record type this reader does not know
            raise TypeError(f"record_from_json: {cls.__name__}.{field.name}: {hint}")
    fields.exactly(values)
    return cls(**values)


def config_from_json(cls: Type[_T], data: Any, file: str, where: str,
                     nested: Dict[str, type] | None = None,
                     added: Iterable[str] = (),
                     earlier: Dict[str, Any] | None = None) -> _T:
    """A frozen config dataclass (``CommanderConfig``, ``DaviConfig``...) from its JSON
    object: every field present and no other, booleans and strings of their type, lists
    for tuples, and the class's own checks (ranges) passed; ``nested`` maps a field to
    the config class of its object; the fields in ``added`` (added by a later version;
    ``"selfplay.x"`` names field ``x`` of the nested ``selfplay``) may be absent, and
    then take their defaults, or the value in ``earlier`` (a top-level field whose
    default changed when it was added: the value that files without it meant).

    Raises:
        CheckpointError: naming the file, the config and the field or the check.
    """
    fields = Fields(data, file, where)
    hints = typing.get_type_hints(cls)
    values = {}
    added = set(added)
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if field.name in added and field.name not in fields.data:
            if earlier and field.name in earlier:  # what that version did
                values[field.name] = earlier[field.name]
            continue  # an earlier version's file: the default
        if nested and field.name in nested:
            prefix = f"{field.name}."
            values[field.name] = config_from_json(
                nested[field.name], fields.raw(field.name), file,
                f"{where}.{field.name}",
                added=[a[len(prefix):] for a in added if a.startswith(prefix)])
        elif hint is bool:
            values[field.name] = fields.bool(field.name)
        elif hint is str:
            values[field.name] = fields.str(field.name)
        elif hint is tuple or typing.get_origin(hint) is tuple:
            items = fields.list(field.name)
            if not all(is_int(v) for v in items):
                raise fields.error(f"must be a list of integers, got {items!r}", field.name)
            values[field.name] = tuple(items)
        else:  # numbers: the class's __post_init__ checks type and range
            values[field.name] = fields.raw(field.name)
    fields.exactly(values)
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise fields.error(f"is not a valid {cls.__name__}: {e}") from e
