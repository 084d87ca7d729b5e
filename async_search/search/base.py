"""What every search shares: the Status of a result, the checks of evaluate, outputs."""

from __future__ import annotations

import enum
import numbers
import operator
import sys
from typing import Any, Tuple

import numpy as np

# The check of what evaluate returns is the base module's (routing's cache uses it too).
from async_search.base import check_awaitable, evaluated  # noqa: F401 - for the searches
from async_search.checks import check_float
from async_search.errors import ModelOutputError

#: The largest exploration or scale constant an MCTS takes (c_puct, c_visit, c_scale,
#: gumbel_scale): past it, scores overflow to inf and every action ties, or a NaN policy
#: comes back, with no error.
MAX_SEARCH_CONSTANT = 1e6


class Status(str, enum.Enum):
    """How a search ended."""

    GOAL_FOUND = "goal_found"
    """A goal was reached; the result holds the path to it."""
    BUDGET_EXHAUSTED = "budget_exhausted"
    """The search spent its budget (evaluations, depth) without reaching a goal."""
    SPACE_EXHAUSTED = "space_exhausted"
    """Nothing was left to expand (the reachable space, or a rollout's dead end)."""


def bad_step_cost(problem: Any, cost: Any) -> ValueError:
    """The error for a step cost that is not a finite number > 0."""
    return ValueError(f"{type(problem).__name__}: a step costs {cost!r}; the searches "
                      f"take step costs that are finite numbers > 0 (real ones: an int, "
                      f"a float, a Fraction or a NumPy scalar; not a bool, a Decimal or "
                      f"an array: the SearchProblem protocol)")


#: The largest step cost, and path cost: past it a sum of costs is no float (inf, or an
#: int of 400 digits).
MAX_STEP_COST = sys.float_info.max


def path_cost_overflow(problem: Any, cost: Any, weight: float = 1.0) -> ValueError:
    """The error for a path whose cost passes ``MAX_STEP_COST`` (divided by A*'s
    ``weight`` where above 1): as inf, every such path, or priority ``weight * g``,
    would tie with every other (a goal reached would not beat "none found")."""
    try:
        shown = f"{float(cost):g}"
    except OverflowError:  # an int (a Fraction) past the floats
        shown = "more than any float"
    if weight > 1:
        return ValueError(f"{type(problem).__name__}: a path costs {shown}, past the "
                          f"largest float ({MAX_STEP_COST:g}) over the weight "
                          f"({weight:g}) that a path cost may be, as weight * cost "
                          f"orders the nodes; scale the step costs down, or lower the "
                          f"weight")
    return ValueError(f"{type(problem).__name__}: a path costs {shown}, past the "
                      f"largest float ({MAX_STEP_COST:g}) that a path cost may be; "
                      f"scale the step costs down")


def check_step_cost(problem: Any, cost: Any) -> float:
    """``cost`` as a Python int or float; ValueError (``bad_step_cost``) unless it is a
    real number (not a bool) in (0, ``MAX_STEP_COST``]: a negative cycle would loop
    forever, and a NaN, a text, a Decimal or an array would make every sum meaningless
    or fail deep in a search. A NumPy scalar becomes Python's number, so that path
    costs are summed exactly as Python sums: a ``uint8`` or ``float16`` sum would wrap
    around or overflow to inf at its own type's range."""
    if isinstance(cost, bool) or not isinstance(cost, numbers.Real):
        raise bad_step_cost(problem, cost)
    try:
        plain = int(cost) if isinstance(cost, numbers.Integral) else float(cost)
        ok = 0 < plain <= MAX_STEP_COST  # False for NaN
    except (OverflowError, TypeError, ValueError):
        ok = False
    if not ok:
        raise bad_step_cost(problem, cost)
    return plain


def encoded(owner: Any, x: Any, n: int,
            protocol: str = "the SearchProblem and Game protocols") -> Any:
    """``x``, ``owner.encode`` of ``n`` states, once its rows are checked: a row count
    other than ``n`` is the problem's ValueError, where the model's outputs would be
    blamed for it (one value per element expected) a step later. (An array of any
    kind; a tensor or another type is the user's evaluate's to take.)"""
    if isinstance(x, np.ndarray) and x.ndim and len(x) != n:
        raise ValueError(f"{type(owner).__name__}.encode gave {len(x)} rows for {n} "
                         f"states: it gives one row per state, [len(states), "
                         f"*input_spec.shape] ({protocol})")
    return x


def check_hashable(problem: Any, state: Any, source: str = "as the start") -> None:
    """TypeError unless ``state`` is hashable, as the SearchProblem protocol asks (the
    searches keep states in dicts and sets): Python's own says only "unhashable type",
    from deep in a search. ``source`` says where the state came from."""
    try:
        hash(state)
    except TypeError:
        raise TypeError(f"{type(problem).__name__}: states must be hashable (the "
                        f"SearchProblem protocol: searches keep them in dicts), got a "
                        f"{type(state).__name__} {source}; use bytes (a.tobytes()) or "
                        f"a tuple") from None


def check_num_actions(game: Any) -> int:
    """The game's ``num_actions``, an int >= 1, or TypeError naming the Game protocol
    (a missing one, or a method, failed deep in the tree)."""
    value = getattr(game, "num_actions", None)
    try:  # an int of any kind (NumPy's, a 0-d array, a tensor), never a float or a text
        count = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        count = None
    if count is None or count < 1:
        raise TypeError(f"game must be a Game (the protocol of problems.Game) whose "
                        f"num_actions is an int >= 1, the size of its policy; "
                        f"{type(game).__name__}.num_actions is {value!r}")
    return count


def check_evaluate(evaluate: Any) -> None:
    """Refuses an ``evaluate`` that cannot be called, before any search starts.

    A model is callable too, so passing one where ``asr.immediate(model)`` was meant
    passes this check; what it returns cannot be awaited, and ``check_awaitable``
    names that at the search's first request.

    Raises:
        ValueError: if ``evaluate`` is not callable (a model's output or a number
            passed for it, for one).
    """
    if not callable(evaluate):
        raise ValueError(f"evaluate must be an awaitable callable such as "
                         f"asr.immediate(model), got {evaluate!r}")
    if isinstance(evaluate, type):  # calling it would make an instance, not outputs
        raise ValueError(f"evaluate must be an awaitable callable such as "
                         f"asr.immediate(model), got the class {evaluate.__name__}")


#: The methods of each protocol that the searches call.
PROBLEM_METHODS = ("check_state", "neighbors", "is_goal", "encode")
GAME_METHODS = ("check_state", "legal_actions", "play", "terminal_value", "encode")


def check_protocol(name: str, value: Any, methods: Tuple[str, ...], protocol: str,
                   example: str) -> None:
    """TypeError naming ``name`` unless ``value`` is an object with each of ``methods``
    (a class passed for an instance is the usual slip), before any search starts; the
    error names what is missing instead of an AttributeError deep in the search.

    Example:
        >>> check_protocol("game", object(), GAME_METHODS, "Game", "problems.ConnectFour()")
        Traceback (most recent call last):
        ...
        TypeError: game must be a Game (problems.ConnectFour(), say), got an object without check_state, legal_actions, play, terminal_value, encode
    """
    if isinstance(value, type):
        raise TypeError(f"{name} must be a {protocol} instance ({example}, say), got the "
                        f"class {value.__name__}")
    missing = [m for m in methods if not callable(getattr(value, m, None))]
    if missing:
        raise TypeError(f"{name} must be a {protocol} ({example}, say), got "
                        f"{'an' if type(value).__name__[:1].lower() in 'aeiou' else 'a'} "
                        f"{type(value).__name__} without {', '.join(missing)}")


def check_search_constant(name: str, value: Any, *, strict: bool = False) -> float:
    """``value`` as a float >= 0 (> 0 when ``strict``) and at most MAX_SEARCH_CONSTANT.

    Example:
        >>> check_search_constant("c_puct", 1.5)
        1.5
    """
    number = check_float(name, value, minimum=0.0, strict=strict)
    if number > MAX_SEARCH_CONSTANT:
        raise ValueError(f"{name} must be at most {MAX_SEARCH_CONSTANT:g} (past it the "
                         f"scores overflow and every action ties), got {value!r}")
    return number


def _as_array(y: Any, what: str) -> np.ndarray:
    """``np.asarray(y)``; ModelOutputError naming ``what`` for what cannot be one (a
    tensor that requires grad, say)."""
    try:
        return np.asarray(y)
    except Exception as e:  # (each framework words its own refusal)
        raise ModelOutputError(f"{what} must be a NumPy array, got a "
                               f"{type(y).__name__} that is not one: {e}") from None


def check_dirichlet_alpha(value: Any) -> float:
    """``value`` as a float > 0 and at most MAX_SEARCH_CONSTANT: past it the root noise
    is uniform anyway, and far past it NumPy's gamma draws overflow and the noise is
    all zeros (the priors then sum to less than 1).

    Example:
        >>> check_dirichlet_alpha(0.3)
        0.3
    """
    number = check_float("dirichlet_alpha", value, minimum=0.0, strict=True)
    if number > MAX_SEARCH_CONSTANT:
        raise ValueError(f"dirichlet_alpha must be at most {MAX_SEARCH_CONSTANT:g} (past "
                         f"it the noise is uniform, and far past it NumPy's draws "
                         f"overflow to zeros), got {value!r}")
    return number


# Numbers held as objects: NumPy's bool is no numbers.Real (Python's is), and NumPy
# counts a time span as an integer (numbers.Real), which is not a value.
_REALS = (numbers.Real, np.bool_)
_TIMES = (np.timedelta64, np.datetime64)


def values_of(y: Any, n: int, what: str) -> list:
    """The ``n`` scalar outputs of a model (shape ``[n]`` or ``[n, 1]``) as Python floats.

    Raises:
        ModelOutputError: if ``y`` does not hold exactly one finite value per element.
    """
    if (type(y) is np.ndarray and y.dtype.kind == "f" and y.dtype.itemsize <= 8
            and y.shape in ((n,), (n, 1))):
        # The common case, in a few C calls: a float array of the right shape. A sum
        # is finite when every value is (one inf or nan makes it inf or nan); a finite
        # sum can still overflow, and then the full check below decides.
        values = y.reshape(n).tolist()
        total = sum(values)
        if total - total == 0:
            return values
    if isinstance(y, (tuple, list, dict)):
        raise ModelOutputError(f"{what} must be one array of shape [{n}] or [{n}, 1], got "
                               f"a {type(y).__name__} of outputs; is it a policy-value "
                               f"model?")
    values = _as_array(y, what)
    # Real numbers only: a cast would drop a complex part, read text ("3") as a number,
    # dates and time spans as counts of their unit, and NaT (their NaN) as a finite
    # -9.2e18. Objects pass when each is a real number. A longdouble is cast too: past
    # the floats it becomes inf, refused below, and results hold Python floats.
    if not (values.dtype.kind in "fiub" or (values.dtype.kind == "O" and all(
            isinstance(v, _REALS) and not isinstance(v, _TIMES) for v in values.flat))):
        raise ModelOutputError(f"{what} must be real numbers, got an array of "
                               f"{values.dtype}")
    try:
        with np.errstate(over="ignore"):  # a longdouble past the floats: inf, refused below
            values = values.astype(np.float64, copy=False)
    except OverflowError:  # a Python int past the floats, held as an object
        raise ModelOutputError(f"{what} must be finite, got an integer past the "
                               f"floats") from None
    if values.size != n or (values.ndim and values.shape[0] != n):
        raise ModelOutputError(f"{what} must have one value per element, shape [{n}] or "
                               f"[{n}, 1]; got shape {values.shape}")
    values = values.reshape(n)
    if not np.isfinite(values).all():
        bad = values[~np.isfinite(values)][:3]
        raise ModelOutputError(f"{what} must be finite, got {bad}")
    return values.tolist()


def policy_logits_of(y: Any, n: int, num_actions: int) -> np.ndarray:
    """The policy logits ``[n, num_actions]`` of a policy-value model's outputs ``y``,
    the tuple ``(policy_logits [n, num_actions], value [n, 1])``.

    Raises:
        ModelOutputError: for outputs of another form, logits of another shape, or
            logits that are not real numbers.
    """
    if not (isinstance(y, (tuple, list)) and len(y) == 2):
        raise ModelOutputError(f"a policy-value model must return the tuple "
                               f"(policy_logits [n, {num_actions}], value [n, 1]), got "
                               f"{type(y).__name__}")
    logits = _as_array(y[0], "the policy logits")
    if logits.shape != (n, num_actions):
        raise ModelOutputError(f"policy logits must have shape [{n}, {num_actions}], got "
                               f"{logits.shape}")
    if logits.dtype.kind not in "fiub":
        raise ModelOutputError(f"policy logits must be real numbers, got dtype "
                               f"{logits.dtype}")
    return logits


def split_policy_value(y: Any, n: int, num_actions: int) -> Tuple[np.ndarray, list]:
    """A policy-value model's outputs for ``n`` states: ``(logits [n, num_actions],
    values)``, the values as Python floats.

    Raises:
        ModelOutputError: unless ``y`` is the tuple ``(policy_logits [n, num_actions],
            value [n, 1] or [n])`` of real logits and finite values in [-1, 1].
    """
    logits = policy_logits_of(y, n, num_actions)
    values = values_of(y[1], n, "the policy-value model's value")
    # Values are backed up as sums: one far outside [-1, 1] (say -1.7e308) overflows
    # them to inf and then NaN, silently; it is a broken model, not a strong opinion.
    if values and (min(values) < -1.0 or max(values) > 1.0):
        bad = [v for v in values if not -1.0 <= v <= 1.0][:3]
        raise ModelOutputError(f"the policy-value model's value must be in [-1, 1] (for "
                               f"the player to move), got {bad}")
    return logits, values
