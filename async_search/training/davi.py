"""A learned sliding-puzzle heuristic by approximate value iteration (DeepCubeA's DAVI).

Each round draws states scrambled 1..K random moves from the goal, computes the target
``min over neighbours of 1 + h_target(neighbour)`` (0 for the goal itself, and for a
neighbour that is the goal), adds them to the replay buffer and trains. When the loss of
a round falls below ``loss_threshold`` the target net takes the trained weights. With a
``save_dir`` each round is committed like an AlphaZero iteration (``RunFolder``, the
same checkpoints and buffer), and ``resume=True`` continues a killed run. States,
neighbours and encodings are whole arrays: one round is a few NumPy calls, not a loop
over states.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, List, Optional

import numpy as np

from async_search.checks import check_float, check_instance, check_int, plain_fields
from async_search.errors import CheckpointError, ModelOutputError
from async_search.problems.nets import NetConfig
from async_search.problems.sliding_puzzle import SlidingPuzzle
from async_search.schema import config_from_json, record_from_json
from async_search.training.replay import ReplayBuffer
from async_search.training.run_folder import (ENVELOPE, RunFolder, SavedNet,
                                               check_same_config, resume_folder)
from async_search.training.trainer import Trainer


@dataclasses.dataclass(frozen=True)
class DaviConfig:
    """Parameters of a DAVI run.

    Attributes:
        size: the puzzle's side (4: the 15-puzzle).
        rounds: rounds of generating, training and (maybe) refreshing the target.
        states_per_round: states drawn per round.
        max_scramble: K: states are 1..K random moves from the goal.
        train_steps: optimizer steps per round.
        loss_threshold: refresh the target net when a round's value loss is below it.
        hidden_sizes, batch_size, learning_rate, l2: the trainer's.
        buffer_capacity: replay buffer size.
        residual: learn a correction added to the Manhattan distance.
        seed: seeds everything.
    """

    size: int = 4
    rounds: int = 250
    states_per_round: int = 20_000
    max_scramble: int = 300
    train_steps: int = 300
    loss_threshold: float = 0.5
    hidden_sizes: tuple = (256, 256)
    batch_size: int = 512
    learning_rate: float = 1e-3
    l2: float = 1e-6
    buffer_capacity: int = 100_000
    residual: bool = True
    seed: int = 0

    def __post_init__(self):
        plain_fields(self)
        for name in ("rounds", "states_per_round", "max_scramble", "train_steps",
                     "batch_size", "buffer_capacity"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("size", self.size, minimum=2)
        check_int("seed", self.seed, minimum=0)
        check_float("loss_threshold", self.loss_threshold, minimum=0.0, strict=True)
        check_float("learning_rate", self.learning_rate, minimum=0.0, strict=True)
        check_float("l2", self.l2, minimum=0.0)
        if not isinstance(self.residual, (bool, np.bool_)):  # "False" is truthy
            raise ValueError(f"DaviConfig.residual must be True or False, got "
                             f"{self.residual!r}")
        # NetConfig checks the widths before int(), which would split "256" into
        # digits and round 1.5 to 1.
        object.__setattr__(self, "hidden_sizes", self.net.hidden_sizes)

    @property
    def net(self) -> NetConfig:
        return NetConfig("heuristic", "sliding_puzzle", self.hidden_sizes, self.size,
                         self.residual)


@dataclasses.dataclass(frozen=True)
class DaviRecord:
    """One round of DAVI."""

    round: int
    value_loss: float
    """Mean squared error (moves squared) over the round's steps."""
    target_updates: int
    """Times the target net was refreshed so far."""
    mean_target: float
    """Mean target over the round's states."""
    seconds: float


def _move_table(puzzle: SlidingPuzzle) -> np.ndarray:
    """``[cells, 4]``: the positions the blank can swap with, -1 padded."""
    table = np.full((puzzle.num_cells, 4), -1, np.int64)
    for p in range(puzzle.num_cells):
        moves = [q for q in range(puzzle.num_cells)
                 if abs(q // puzzle.size - p // puzzle.size)
                 + abs(q % puzzle.size - p % puzzle.size) == 1]
        table[p, :len(moves)] = moves
    return table


def scrambled_states(puzzle: SlidingPuzzle, n: int, max_moves: int,
                     rng: np.random.Generator) -> np.ndarray:
    """``[n, cells]`` uint8 boards, each ``k ~ U{1..max_moves}`` random moves from the
    goal (no move undoing the one before); ``n = 0`` gives ``[0, cells]``, which
    ``bellman_targets`` and ``ReplayBuffer.add`` take as they take any batch.

    Raises:
        ValueError: ``n`` not an integer >= 0, or ``max_moves`` not one >= 1.
        TypeError: ``rng`` not a ``np.random.Generator``.
    """
    n = check_int("n", n, minimum=0)
    max_moves = check_int("max_moves", max_moves, minimum=1)
    check_instance("rng", rng, np.random.Generator, "np.random.default_rng(0)")
    table = _move_table(puzzle)
    boards = np.tile(np.frombuffer(puzzle.goal, np.uint8), (n, 1))
    blank = np.full(n, puzzle.num_cells - 1, np.int64)
    previous = np.full(n, -1, np.int64)
    lengths = rng.integers(1, max_moves + 1, n)
    rows = np.arange(n)
    for step in range(int(lengths.max()) if n else 0):  # max() of nothing raises
        live = lengths > step
        options = table[blank]  # [n, 4]
        allowed = (options >= 0) & (options != previous[:, None])
        # A random allowed option per row: argmax of random keys over allowed slots.
        keys = np.where(allowed, rng.random(options.shape), -1.0)
        target = options[rows, keys.argmax(axis=1)]
        target = np.where(live, target, blank)
        tiles = boards[rows, target]
        boards[rows, blank] = tiles
        boards[rows, target] = 0
        previous = np.where(live, blank, previous)
        blank = target
    return boards


_CHUNK = 8192  # boards per h_target call


def _encode(puzzle: SlidingPuzzle, boards: np.ndarray) -> np.ndarray:
    tiles = np.arange(puzzle.num_cells, dtype=np.uint8)
    return (boards[:, None, :] == tiles[None, :, None]).astype(np.float32)


def bellman_targets(puzzle: SlidingPuzzle, boards: np.ndarray,
                    h_target: Callable[[np.ndarray], np.ndarray],
                    chunk: int = _CHUNK) -> np.ndarray:
    """``[n]`` float32: 0 for the goal, else ``min over neighbours nb of 1 + h(nb)``
    with ``h`` = 0 at the goal and ``h_target(encode(nb))`` elsewhere.

    Args:
        puzzle: the puzzle the boards are of.
        boards: ``[n, cells]`` integer boards (row-major tiles, 0 the blank), each a
            solvable arrangement of ``0..cells - 1``, as ``scrambled_states`` gives.
        h_target: the heuristic: ``[k, cells, cells]`` encoded neighbours to one value
            each, ``[k, 1]`` or ``[k]``.
        chunk: boards per ``h_target`` call (>= 1).

    Raises:
        ValueError: ``boards`` not of that shape, a board that is not one of
            ``puzzle``'s (named, with the puzzle's reason), or ``chunk`` < 1.
        ModelOutputError: ``h_target`` returned other than one value per neighbour.
    """
    chunk = check_int("chunk", chunk, minimum=1)
    return _targets(puzzle, _checked_boards(puzzle, boards), h_target, chunk)


def _targets(puzzle: SlidingPuzzle, boards: np.ndarray,
             h_target: Callable[[np.ndarray], np.ndarray], chunk: int) -> np.ndarray:
    """``bellman_targets`` of boards known to be valid: ``Davi.run_round``'s come from
    ``scrambled_states``, and checking them one by one would add a third to a half of
    the time their targets take with a net (with a free heuristic, several times it)."""
    table = _move_table(puzzle)
    goal = np.frombuffer(puzzle.goal, np.uint8)
    n, cells = boards.shape
    out = np.empty(n, np.float32)
    for lo in range(0, n, chunk):
        b = boards[lo:lo + chunk]
        m = len(b)
        blank = np.argmax(b == 0, axis=1)
        options = table[blank]  # [m, 4]
        valid = options >= 0
        rows, slots = np.nonzero(valid)
        nb = b[rows].copy()
        swap = options[rows, slots]
        nb[np.arange(len(rows)), blank[rows]] = nb[np.arange(len(rows)), swap]
        nb[np.arange(len(rows)), swap] = 0
        is_goal = (nb == goal).all(axis=1)
        h = _one_per_neighbour(h_target(_encode(puzzle, nb)), len(nb))
        h = np.where(is_goal, 0.0, h)
        cost = np.full((m, 4), np.inf)
        cost[rows, slots] = 1.0 + h
        targets = cost.min(axis=1)
        targets[(b == goal).all(axis=1)] = 0.0
        out[lo:lo + m] = targets
    return out


def _checked_boards(puzzle: SlidingPuzzle, boards) -> np.ndarray:
    """``boards`` as uint8 ``[n, cells]``; ValueError naming the first board that
    ``puzzle.state`` refuses (a tile out of range or repeated, unsolvable)."""
    boards = np.asarray(boards)
    if boards.ndim != 2 or boards.shape[1] != puzzle.num_cells:
        raise ValueError(f"bellman_targets: boards must be an array [n, "
                         f"{puzzle.num_cells}] (a row of tiles per board of {puzzle!r}), "
                         f"got shape {boards.shape}")
    for i, tiles in enumerate(boards.tolist()):  # Python ints: the puzzle's own checks
        try:
            puzzle.state(tiles)
        except ValueError as e:
            raise ValueError(f"bellman_targets: boards[{i}] is not a board: {e}") from e
    return boards.astype(np.uint8, copy=False)


def _one_per_neighbour(h, k: int) -> np.ndarray:
    """``h_target``'s output as float64 ``[k]``; ModelOutputError unless it is one value
    per neighbour: broadcasting would spread one row over all of them."""
    if np.iscomplexobj(h):  # the cast would drop the imaginary part, with a warning
        raise ModelOutputError(f"bellman_targets: h_target returned complex values")
    try:
        h = np.asarray(h, np.float64)
    except (TypeError, ValueError) as e:
        raise ModelOutputError(f"bellman_targets: h_target returned "
                               f"{type(h).__name__}, not an array of numbers: {e}") from e
    if h.shape not in ((k,), (k, 1)):
        raise ModelOutputError(f"bellman_targets: h_target returned an array of shape "
                               f"{h.shape} for a batch of {k} neighbours: it must return "
                               f"one value per neighbour ([{k}, 1] or [{k}])")
    if not np.isfinite(h).all():  # the targets would be NaN or inf, without a word
        raise ModelOutputError(f"bellman_targets: h_target returned a NaN or an infinity "
                               f"for {int((~np.isfinite(h)).sum())} of {k} neighbours")
    return h.reshape(k)


class Davi:
    """Trains a ``LearnedHeuristic`` for the sliding puzzle by DAVI.

    Args:
        config: the run's parameters.
        weights: initial ``(w, b)`` layers; default from ``config.seed``.
        save_dir: the run's folder (``RunFolder``): each round is committed there in one
            atomic step (the trained and target nets, the replay buffer, the random
            state, the history); None keeps nothing on disk (and cannot resume).
        resume: continue the run saved in ``save_dir`` (a new config may only change
            ``rounds``); killed at any instant, a resumed run gives the rows of an
            uninterrupted one. Every file is checked as it is read back.

    Raises:
        ValueError: ``resume`` with no run in ``save_dir``, with other parameters, or
            with ``weights``.
        CheckpointError: a damaged saved file, named, with what is wrong with it.
        FileWriteError: a save that failed: the previous commit is whole.

    Example:
        Two rounds on the 2x2 puzzle with a small net (a real run uses the defaults):

        >>> config = DaviConfig(size=2, rounds=2, states_per_round=64, max_scramble=10,
        ...                     train_steps=5, hidden_sizes=(16,), batch_size=32,
        ...                     buffer_capacity=256)
        >>> davi = Davi(config)          # save_dir="runs/davi" keeps it resumable
        >>> records = davi.run()
        >>> [r.round for r in records]
        [1, 2]
        >>> type(davi.model()).__name__  # NumPy
        'LearnedHeuristic'
    """

    def __init__(self, config: DaviConfig, *, weights: Any = None,
                 save_dir: str | os.PathLike[str] | None = None,
                 resume: bool = False) -> None:
        check_instance("config", config, DaviConfig, "DaviConfig(rounds=10)")
        if not isinstance(resume, (bool, np.bool_)):
            raise ValueError(f"Davi resume must be True or False, got {resume!r}")
        self.puzzle = SlidingPuzzle(config.size)
        self.history: List[DaviRecord] = []
        self.target_updates = 0
        self._folder = None if save_dir is None else RunFolder(save_dir, _TRAINER)
        if resume:
            if weights is not None:
                raise ValueError("Davi: a resumed run continues from its saved weights; "
                                 "pass no weights")
            self._folder = resume_folder(save_dir, _TRAINER)
            self._folder.clean()
            self._load(config)
            return
        self.config = config
        self.trainer = Trainer(config.net, weights=weights,
                               learning_rate=config.learning_rate, l2=config.l2,
                               batch_size=config.batch_size, seed=config.seed)
        self.target = self.trainer.model()
        self.buffer = ReplayBuffer(config.buffer_capacity, config.seed)
        self.rng = np.random.default_rng([config.seed, 1])
        if self._folder is not None:
            self._folder.clean()
            self._save_state()

    @property
    def rounds_done(self) -> int:
        """Rounds completed (a resumed run counts those done before)."""
        return len(self.history)

    def model(self) -> Any:
        """The trained heuristic (NumPy, exact grid)."""
        return self.trainer.model()

    def run_round(self) -> DaviRecord:
        """Runs one round and commits it (with a ``save_dir``); returns its record."""
        config = self.config
        start = time.perf_counter()
        boards = scrambled_states(self.puzzle, config.states_per_round,
                                  config.max_scramble, self.rng)
        targets = _targets(self.puzzle, boards, self.target, _CHUNK)
        self.buffer.add(_encode(self.puzzle, boards), None, targets)
        self.trainer.reset_optimizer()
        losses = self.trainer.train_steps(self.buffer, config.train_steps)
        if losses.value < config.loss_threshold:
            self.target = self.trainer.model()
            self.target_updates += 1
        record = DaviRecord(len(self.history) + 1, losses.value, self.target_updates,
                            float(targets.mean()), time.perf_counter() - start)
        self.history.append(record)
        self._save_state()
        return record

    def run(self, on_round: Optional[Callable[[DaviRecord], None]] = None
            ) -> List[DaviRecord]:
        """Runs rounds until ``config.rounds`` are done; returns every record."""
        while len(self.history) < self.config.rounds:
            record = self.run_round()
            if on_round is not None:
                on_round(record)
        return list(self.history)

    # -- persistence ----------------------------------------------------------------------

    def _save_state(self) -> None:
        if self._folder is None:
            return
        config = self.config
        meta = {"round": len(self.history), "target_updates": self.target_updates}
        record = {"config": _config_json(config), "round": len(self.history),
                  "target_updates": self.target_updates,
                  "rng": self.rng.bit_generator.state,
                  "history": [dataclasses.asdict(r) for r in self.history]}
        self._folder.commit(record, checkpoints={
            "latest": SavedNet(self.trainer.weights, config.net, meta),
            "target": SavedNet(self.target, config.net, meta),
        }, buffers={"buffer": self.buffer})

    @staticmethod
    def check_resume(config: DaviConfig, save_dir: str | os.PathLike[str]) -> int:
        """Checks, before any work, that the run saved in ``save_dir`` can continue with
        ``config`` (``state.json`` only: the nets and the buffer are checked when the
        run loads them). Returns the rounds it has done.

        Raises:
            ValueError: no run is saved there, or it has other parameters.
            CheckpointError: ``state.json`` is damaged (named, with what is wrong).
        """
        folder = resume_folder(save_dir, _TRAINER)
        history, _, _ = _read_record(config, folder.load().fields, folder)
        return len(history)

    def _load(self, config: DaviConfig) -> None:
        saved = self._folder.load()
        fields, file = saved.fields, self._folder.state_file
        history, self.target_updates, rng = _read_record(config, fields, self._folder)
        latest, target = saved.checkpoint("latest"), saved.checkpoint("target")
        for name, checkpoint in (("latest", latest), ("target", target)):
            if checkpoint.config != config.net:
                raise CheckpointError(f"checkpoint {os.path.join(saved.generation, name)!r}"
                                      f" holds a {checkpoint.config}, not this run's "
                                      f"{config.net}")
        buffer = saved.buffer("buffer")
        added = len(history) * config.states_per_round
        if (buffer.capacity, buffer.seed, buffer.added) != (
                config.buffer_capacity, config.seed, added):
            raise CheckpointError(
                f"replay buffer file {os.path.join(saved.generation, 'buffer.npz')!r} "
                f"(capacity {buffer.capacity}, seed {buffer.seed}, {buffer.added} samples "
                f"added) does not belong to the run in {file!r} (capacity "
                f"{config.buffer_capacity}, seed {config.seed}, {added} samples added)")
        self.config = config
        self.history = history
        self.trainer = Trainer(config.net, weights=latest.weights,
                               learning_rate=config.learning_rate, l2=config.l2,
                               batch_size=config.batch_size, seed=config.seed)
        self.target = target.model()
        self.buffer = buffer
        self.rng = rng


_TRAINER = "davi"  # a run folder's trainer: another trainer's run is refused
_RANGES = {"round": (1, None), "value_loss": (0, None), "target_updates": (0, None),
           "mean_target": (0, None), "seconds": (0, None)}


def _config_json(config: DaviConfig) -> dict:
    data = dataclasses.asdict(config)
    data["hidden_sizes"] = list(config.hidden_sizes)
    return data


def _read_record(config: DaviConfig, fields, folder: RunFolder) -> tuple:
    """``(history, target_updates, rng)`` from ``state.json``, every field checked.

    Raises:
        CheckpointError: a field missing, of the wrong type or out of range (named).
        ValueError: the saved run's config is not ``config`` but for ``rounds``.
    """
    file = folder.state_file
    stored = config_from_json(DaviConfig, fields.raw("config"), file, "config")
    check_same_config(stored, config, "rounds", _config_json, folder)
    history = [record_from_json(DaviRecord, r, file, f"history[{i}]", _RANGES)
               for i, r in enumerate(fields.list("history"))]
    for i, r in enumerate(history):
        if r.round != i + 1 or r.target_updates > r.round:
            raise fields.error(f"must be round {i + 1} with at most {i + 1} target "
                               f"updates, got round {r.round} with {r.target_updates}",
                               f"history[{i}]")
    fields.int("round", minimum=len(history), maximum=len(history))
    updates = history[-1].target_updates if history else 0
    target_updates = fields.int("target_updates", minimum=updates, maximum=updates)
    rng = np.random.default_rng()
    state = fields.object("rng").data
    try:
        if state.get("bit_generator") != type(rng.bit_generator).__name__:
            raise ValueError(f"a {state.get('bit_generator')!r} state")
        rng.bit_generator.state = state
    except (TypeError, ValueError, KeyError, OverflowError) as e:
        # OverflowError: a number past the generator's C integers (-1, 2**200)
        raise fields.error(f"is not a {type(rng.bit_generator).__name__} state: {e}",
                           "rng") from e
    fields.exactly([*ENVELOPE, "config", "round", "target_updates", "rng", "history"])
    return history, target_updates, rng
