"""The commander: AlphaZero iterations of self-play, training, evaluation, promotion.

Each iteration (the seed's loop, with its names):

1. **self-play**: ``games_per_iteration`` games of the best net against itself, run
   concurrently through ``run_searches_async`` on the chosen backend; their samples go
   to the replay buffer, which is saved at once (a crash later loses no sample).
2. **training**: ``train_steps`` minibatches, in a thread, so that the event loop (and
   any server in it) keeps running.
3. **evaluation**: an arena of the candidate against the best (both the evaluation
   agent: PUCT or Gumbel search without noise, alternating the first player from seeded
   random openings), matches against fixed baselines (one-ply, UCT-300 and optionally
   UCT-1000), and the candidate's move accuracy on a subset of the solver-labelled
   Connect Four positions (``problems.connect_four_positions``), the net alone and the
   evaluation agent's search.
4. **promotion**: when the arena score passes the gate, the candidate becomes the best,
   with a new version, and its weights are pushed to every server that is serving:
   the commander's own evaluation server and every run registered through ``on_servers``.

The run's state (the best and latest nets, the replay buffer, the history) is committed
in ``save_dir`` after self-play and at the end of each iteration, each time in one atomic
step (``training.RunFolder``): killed at any instant, ``Commander(..., resume=True)``
continues from the last commit with the rows of an uninterrupted run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import os
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from async_search.checks import check_float, check_int, plain_fields
from async_search.errors import CheckpointError, describe
from async_search.problems.connect_four import ConnectFour
from async_search.problems.nets import NetConfig
from async_search.schema import config_from_json, record_from_json
from async_search.search.accuracy import (gumbel_chooser, mcts_chooser, move_accuracy,
                                          policy_chooser)
from async_search.training.arena import gate, play_match
from async_search.training.players import (GumbelPlayer, MCTSPlayer, OnePlyPlayer,
                                           PolicyPlayer, RandomPlayer, UCTPlayer)
from async_search.training.ratings import elo_difference
from async_search.training.replay import ReplayBuffer, mirror_columns
from async_search.training.run_folder import (ENVELOPE, RunFolder, SavedNet,
                                               check_same_config, resume_folder)
from async_search.training.selfplay import POLICIES, SelfPlayConfig, selfplay_game
from async_search.training.trainer import Trainer


_TRAINER = "alphazero"  # a run folder's trainer: another trainer's run is refused

#: The ranges of an ``IterationRecord``'s numbers, checked when a run is resumed.
_RANGES = {name: (0, None) for name in (
    "iteration", "samples", "buffer_size", "selfplay_s", "samples_per_s",
    "s_per_1000_samples", "policy_loss", "value_loss", "l2_loss", "total_loss", "train_s",
    "best_version", "pushed_to", "eval_s", "iteration_s", "accuracy_s")}
_RANGES.update(iteration=(1, None), arena_score=(0, 1), scores=(0, 1), accuracy=(0, 1))

#: The solver-labelled sets of ``problems.connect_four_positions`` the accuracy is
#: measured on, and the seed of the subset drawn from each (fixed, so that runs with
#: other seeds are measured on the same positions).
ACCURACY_STAGES = ("end", "middle")
_ACCURACY_SUBSET_SEED = 0

#: ``progress(phase, done, total)``: ``done`` units of ``phase`` finished since the last
#: call (games, steps); ``total`` the phase's units. Phases: selfplay (positions
#: evaluated, total 0: unknown), train (steps), evaluate (arena and baseline games),
#: accuracy (positions asked).
PhaseProgress = Callable[[str, int, int], None]


@dataclasses.dataclass(frozen=True)
class CommanderConfig:
    """The parameters of an AlphaZero training run on Connect Four.

    Attributes:
        iterations: iterations to run (a resumed run counts those already done).
        games_per_iteration: self-play games per iteration, all played concurrently.
        selfplay: how self-play games search (``SelfPlayConfig``; its seed is the run's).
        train_steps: optimizer steps per iteration.
        batch_size, learning_rate, l2: the trainer's.
        buffer_capacity: replay buffer size (samples).
        hidden_sizes: the policy-value MLP's hidden widths.
        architecture: the net: ``mlp`` (``hidden_sizes``), or ``conv`` / ``residual``
            (``problems.conv_nets``: ``blocks`` plain or residual blocks of two 3x3
            convolutions, ``channels`` wide, ``value_hidden`` in the value head).
        channels, blocks, value_hidden: the convolutional net's sizes.
        value_planes: the planes of the convolutional net's value head
            (``NetConfig.value_planes``).
        value_net: the convolutional net's value (``NetConfig.value_net``): ``head``
            (AlphaZero's) or ``mlp`` (dense layers of ``hidden_sizes`` on the input).
        features: what the net reads (``NetConfig.features``): ``threats`` (the
            stones and the cells where each player would make four at once), or
            ``planes`` (the stones alone; runs saved before this field existed).
        arena_games: candidate-against-best games per iteration; the gate needs
            min(40, arena_games) of them (fewer than 40 make a noisy gate).
        gate_threshold: the arena score that promotes the candidate to self-play and
            to ``best``: 0 (the default) promotes every candidate, as AlphaZero does,
            so self-play always plays the newest net and the arena only rates it;
            0.55 is AlphaGo Zero's gate.
        eval_games: games against each baseline per iteration (0: none).
        eval_simulations: MCTS simulations of the agent in the arena and evaluations.
        eval_c_puct, eval_num_parallel: the evaluation agent's PUCT constant and leaves
            in flight per round (fewer leaves in flight search better per simulation).
        uct_rollouts: rollouts per move of the UCT baseline.
        strong_uct_rollouts, strong_uct_games: the stronger UCT baseline (UCT-1000) and
            the games against it per iteration (0: none; about 1 s a game on a core).
        eval_policy: the evaluation agent's search: ``"puct"`` (``MCTSPlayer``) or
            ``"gumbel"`` (``GumbelPlayer``, no noise); both use ``eval_simulations``
            and ``eval_num_parallel``.
        eval_reuse_tree: the evaluation agent keeps its tree between its moves.
        eval_solve: the evaluation agent (PUCT) proves values as it searches
            (``search.mcts``'s ``solve``).
        accuracy_positions: positions of each solver-labelled set (end game, middle
            game; 200 each shipped) the candidate's move accuracy is measured on per
            iteration, the net alone and the evaluation agent (0: none). The same
            seeded subset every iteration and every run.
        backend, num_procs: where self-play runs (``run_searches``).
        max_batch_size: the servers' batch size.
        seed: seeds everything (weights, buffer, games).
        overlap: start the next iteration's self-play when training starts, so that
            self-play keeps the servers busy while the trainer trains and the arena
            plays; a promotion is pushed into that running self-play (one made while
            its servers start is pushed to them once they serve). Faster, but the
            games then depend on when the push lands, so a run is no longer a
            deterministic function of the seed (resume still loses no saved sample).
    """

    iterations: int = 50
    games_per_iteration: int = 300
    selfplay: SelfPlayConfig = SelfPlayConfig(value_target="mixed")
    train_steps: int = 1000
    batch_size: int = 256
    learning_rate: float = 1e-3
    l2: float = 1e-4
    buffer_capacity: int = 200_000
    hidden_sizes: tuple = (256, 256)
    arena_games: int = 40
    gate_threshold: float = 0.0
    eval_games: int = 20
    eval_simulations: int = 100
    eval_c_puct: float = 2.0
    eval_num_parallel: int = 2
    uct_rollouts: int = 300
    backend: str = "process"
    num_procs: int = 2
    max_batch_size: int = 512
    seed: int = 0
    overlap: bool = False
    strong_uct_rollouts: int = 1000
    strong_uct_games: int = 0
    eval_policy: str = "puct"
    eval_reuse_tree: bool = False
    eval_solve: bool = False
    accuracy_positions: int = 50
    architecture: str = "mlp"
    channels: int = 16
    blocks: int = 2
    value_hidden: int = 64
    features: str = "threats"
    value_planes: int = 1
    value_net: str = "head"

    def __post_init__(self):
        plain_fields(self)
        for name in ("iterations", "games_per_iteration", "train_steps", "batch_size",
                     "buffer_capacity", "arena_games", "eval_simulations", "uct_rollouts",
                     "eval_num_parallel", "strong_uct_rollouts",
                     "num_procs", "max_batch_size"):
            check_int(name, getattr(self, name), minimum=1)
        for name in ("eval_games", "strong_uct_games", "accuracy_positions"):
            check_int(name, getattr(self, name), minimum=0)
        if self.eval_policy not in POLICIES:
            raise ValueError(f"eval_policy must be one of {list(POLICIES)}, got "
                             f"{self.eval_policy!r}")
        if not isinstance(self.eval_solve, bool):
            raise ValueError(f"eval_solve must be True or False, got {self.eval_solve!r}")
        if not isinstance(self.eval_reuse_tree, bool):
            raise ValueError(f"eval_reuse_tree must be True or False, got "
                             f"{self.eval_reuse_tree!r}")
        if self.eval_games and self.strong_uct_games and (
                self.uct_rollouts == self.strong_uct_rollouts):
            raise ValueError(f"uct_rollouts and strong_uct_rollouts are both "
                             f"{self.uct_rollouts}: the two UCT baselines' scores are "
                             f"kept by rollouts, so one would overwrite the other; give "
                             f"them different rollouts, or strong_uct_games=0")
        check_int("seed", self.seed, minimum=0)
        check_float("learning_rate", self.learning_rate, minimum=0.0, strict=True)
        check_float("l2", self.l2, minimum=0.0)
        check_float("eval_c_puct", self.eval_c_puct, minimum=0.0, strict=True)
        if not 0.0 <= check_float("gate_threshold", self.gate_threshold, minimum=0.0) <= 1:
            raise ValueError(f"gate_threshold must be in [0, 1], got {self.gate_threshold}")
        if self.backend not in ("local", "process", "ray"):
            raise ValueError(f"backend must be local, process or ray, got {self.backend!r}")
        # NetConfig checks the widths before int(), which would split "256" into
        # digits and round 1.5 to 1.
        object.__setattr__(self, "hidden_sizes", self.net.hidden_sizes)
        if self.selfplay.seed != self.seed:
            object.__setattr__(self, "selfplay",
                               dataclasses.replace(self.selfplay, seed=self.seed))
        _ = self.net  # NetConfig checks the net's fields (ValueError)

    @property
    def net(self) -> NetConfig:
        return NetConfig("policy_value", "connect_four", self.hidden_sizes,
                         architecture=self.architecture, channels=self.channels,
                         blocks=self.blocks, value_hidden=self.value_hidden,
                         features=self.features, value_planes=self.value_planes,
                         value_net=self.value_net)

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["hidden_sizes"] = list(self.hidden_sizes)
        return data

    @classmethod
    def from_json(cls, data: dict) -> "CommanderConfig":
        data = dict(data)
        data["selfplay"] = SelfPlayConfig(**data["selfplay"])
        data["hidden_sizes"] = tuple(data["hidden_sizes"])
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class IterationRecord:
    """What one iteration did (times in seconds, scores in [0, 1] for the agent)."""

    iteration: int
    samples: int
    """Positions self-play added to the buffer."""
    buffer_size: int
    selfplay_s: float
    samples_per_s: float
    """Self-play positions per second."""
    s_per_1000_samples: float
    """Self-play seconds per 1000 positions (the AlphaZero seed's figure of merit)."""
    policy_loss: float
    value_loss: float
    l2_loss: float
    total_loss: float
    train_s: float
    arena_score: float
    """The candidate's score against the best, over ``arena_games``."""
    promoted: bool
    best_version: int
    """The version of the best net after this iteration (0: the untrained net)."""
    scores: Dict[str, float]
    """The candidate's (evaluation agent's) score against each baseline (``one_ply``,
    ``uct<rollouts>`` for UCT-300 and, with ``strong_uct_games``, UCT-1000), and
    ``policy_vs_random``: the net alone (greedy on its policy) against the random
    player."""
    elo: float
    """The candidate's Elo-style rating: the best's plus what the arena score implies;
    the untrained net is 0."""
    pushed_to: int
    """Server groups that received the promoted weights (the evaluation server, and a
    running self-play run in overlap mode); 0 without a promotion. A self-play run
    whose servers were still starting gets them once they serve, uncounted here."""
    eval_s: float
    """Seconds of the evaluation: the matches and the move accuracy."""
    iteration_s: float
    accuracy: Dict[str, float]
    """The candidate's move accuracy in [0, 1] on ``accuracy_positions`` positions of
    each solver-labelled set: ``net_end``, ``net_middle`` (the net alone, greedy on its
    policy) and ``mcts_end``, ``mcts_middle`` (the evaluation agent's search at
    ``eval_simulations``, no noise); empty with ``accuracy_positions=0``."""
    accuracy_s: float
    """Seconds the move accuracy took (part of ``eval_s``)."""


class Commander:
    """Runs AlphaZero iterations on Connect Four and pushes promoted nets to servers.

    Args:
        config: the run's parameters.
        save_dir: the run's folder (``RunFolder``: ``state.json``, the committed
            generation with the ``best`` and ``latest`` checkpoints and the replay buffer,
            and ``best/``, a copy of the best net); None keeps nothing on disk (and cannot
            resume).
        resume: continue the run saved in ``save_dir`` (its config is used; a new one
            may only change ``iterations``). Every file is checked as it is read back.
        progress: ``progress(phase, done, total)`` hook (a progress bar), or None.

    Raises:
        ValueError: ``resume`` with no run in ``save_dir``, or with other parameters.
        CheckpointError: a damaged saved file, named, with what is wrong with it.
        FileWriteError: a save that failed (the disk is full...): the previous commit is
            whole.

    Example:
        Two iterations of self-play, learning and arena, saved under ``runs/c4``
        (minutes of training, so not run in the tests):

        ```python
        commander = Commander(CommanderConfig(iterations=2), save_dir="runs/c4")
        records = asyncio.run(commander.run())
        ```
    """

    def __init__(self, config: CommanderConfig,
                 save_dir: str | os.PathLike[str] | None = None, *,
                 resume: bool = False, progress: Optional[PhaseProgress] = None) -> None:
        self.save_dir = save_dir
        self.progress = progress
        self.game = ConnectFour()
        self.history: List[IterationRecord] = []
        self._phase_done = None  # "selfplay" when this iteration's samples are saved
        self._selfplay_s = 0.0  # how long those samples took (a resumed record reports it)
        # What ended an iteration between its committed samples and its record: the
        # trainer, buffer and best net are then mid-iteration, and a rerun here would
        # commit rows an uninterrupted run never has (a fresh resume starts clean).
        self._broken: BaseException | None = None
        self._targets: List[Any] = []  # servers that receive promoted weights
        self._next_selfplay: Optional[asyncio.Task] = None  # overlap: next iteration's
        self._folder = None if save_dir is None else RunFolder(save_dir, _TRAINER)
        self._exported: int | None = None  # the best version copied to save_dir/best
        if resume:
            self._folder = resume_folder(save_dir, _TRAINER)
            self._folder.clean()
            config = self._load(config)
        else:
            self.config = config
            self.trainer = Trainer(config.net, learning_rate=config.learning_rate,
                                   l2=config.l2, batch_size=config.batch_size,
                                   seed=config.seed)
            self.best = self.trainer.model()
            self.best_version = 0
            self.best_elo = 0.0
            self.buffer = ReplayBuffer(config.buffer_capacity, config.seed,
                                       augment=mirror_columns)
            if self._folder is not None:
                self._folder.clean()
                self._save_state()

    # -- persistence ----------------------------------------------------------------------

    def _save_state(self) -> None:
        """Commits the run's state: one atomic step (``RunFolder.commit``)."""
        if self._folder is None:
            return
        config = self.config
        meta = {"iteration": self.iteration, "version": self.best_version}
        record = {"config": config.to_json(), "iteration": self.iteration,
                  "phase_done": self._phase_done, "selfplay_s": self._selfplay_s,
                  "best_version": self.best_version,
                  "best_elo": self.best_elo,
                  "history": [dataclasses.asdict(r) for r in self.history]}
        fresh = self._exported != self.best_version  # best/ is copied when it changes
        self._folder.commit(record, checkpoints={
            "best": SavedNet(self.best, config.net, {**meta, "elo": self.best_elo}),
            "latest": SavedNet(self.trainer.weights, config.net, meta),
        }, buffers={"buffer": self.buffer}, exports=("best",) if fresh else ())
        self._exported = self.best_version

    @staticmethod
    def check_resume(config: CommanderConfig, save_dir: str | os.PathLike[str]) -> int:
        """Checks, before any work, that the run saved in ``save_dir`` can continue with
        ``config`` (``state.json`` only: the nets and the buffer are checked when the
        run loads them). Returns the iterations it has done.

        Raises:
            ValueError: no run is saved there, or it has other parameters.
            CheckpointError: ``state.json`` is damaged (named, with what is wrong).
        """
        folder = resume_folder(save_dir, _TRAINER)
        history = _read_record(config, folder.load().fields, folder)[0]
        return len(history)

    def _load(self, config: CommanderConfig) -> CommanderConfig:
        saved = self._folder.load()
        fields, file = saved.fields, self._folder.state_file
        history, phase_done, best_version, best_elo, selfplay_s = _read_record(
            config, fields, self._folder)
        best, latest = saved.checkpoint("best"), saved.checkpoint("latest")
        for name, checkpoint in (("best", best), ("latest", latest)):
            where = os.path.join(saved.generation, name)
            if checkpoint.config != config.net:
                raise CheckpointError(f"checkpoint {where!r} holds a {checkpoint.config}, "
                                      f"not this run's {config.net}")
            # Each net is saved with the iteration and best version of its commit: a net
            # of another run (or the two swapped) with the same config is not this one.
            meta = checkpoint.metadata
            if (meta.get("iteration"), meta.get("version")) != (len(history), best_version):
                raise CheckpointError(
                    f"checkpoint {where!r} was saved at iteration {meta.get('iteration')}, "
                    f"best version {meta.get('version')}; the run in {file!r} is at "
                    f"iteration {len(history)}, best version {best_version}: it is not "
                    f"this run's")
        buffer = saved.buffer("buffer", augment=mirror_columns)
        buffer_file = os.path.join(saved.generation, "buffer.npz")
        samples = sum(r.samples for r in history)
        if (buffer.capacity, buffer.seed) != (config.buffer_capacity, config.seed) or (
                buffer.added < samples or (phase_done is None and buffer.added != samples)):
            raise CheckpointError(
                f"replay buffer file {buffer_file!r} (capacity {buffer.capacity}, seed "
                f"{buffer.seed}, {buffer.added} samples added) does not belong to the run "
                f"in {file!r} (capacity {config.buffer_capacity}, seed {config.seed}, "
                f"{samples} samples in its history)")
        self.config = config
        self.history = history
        self._phase_done, self._selfplay_s = phase_done, selfplay_s
        self.best_version, self.best_elo = best_version, best_elo
        self.best = best.model()
        self.trainer = Trainer(config.net, weights=latest.weights,
                               learning_rate=config.learning_rate, l2=config.l2,
                               batch_size=config.batch_size, seed=config.seed)
        self.buffer = buffer
        self._folder.export("best", best)  # a save killed after its commit left it stale
        self._exported = best_version
        return config

    @property
    def iteration(self) -> int:
        """Iterations completed."""
        return len(self.history)

    # -- pushing weights ------------------------------------------------------------------

    def add_target(self, servers: Any) -> None:
        """Registers servers (anything with ``update_model(model, version)``, sync or
        async) to receive every promoted net until the run ends."""
        self._targets.append(servers)

    def remove_target(self, servers: Any) -> None:
        if servers in self._targets:
            self._targets.remove(servers)

    async def push(self, model: Any, version: int) -> int:
        """Sends ``model`` and ``version`` to every registered server; returns once each
        has it (requests made after this return are served by ``model``). Returns how
        many targets it reached: one whose run has ended (``closed``), before the push
        or during it, is passed over (an overlapped self-play run closes its servers a
        few loop turns before it stops being a target)."""
        reached = 0
        for target in list(self._targets):
            if getattr(target, "closed", False):
                continue
            try:
                result = target.update_model(model, version)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                if getattr(target, "closed", False):  # it ended meanwhile: nothing to do
                    continue
                raise
            reached += 1
        return reached

    # -- phases ---------------------------------------------------------------------------

    def _report(self, phase: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(phase, done, total)

    async def _selfplay(self, iteration: int) -> tuple:
        """Plays the iteration's games; returns (records, seconds)."""
        from async_search.backends import run_searches_async

        config = self.config
        selfplay = dataclasses.replace(config.selfplay,
                                       seed=config.seed * 100_003 + iteration)
        play = functools.partial(selfplay_game, game=self.game, config=selfplay)
        ours: List[Any] = []  # this run's servers, and no one else's
        started_on = self.best

        def on_servers(servers: Any) -> Any:
            ours.append(servers)
            self.add_target(servers)
            if self.best is not started_on:  # promoted while its servers started (an
                # overlapped run): the push went to targets it was not yet among
                return servers.update_model(self.best, self.best_version)
            return None
        # In overlap mode the bars belong to the foreground phases.
        progress = None if config.overlap else (lambda n: self._report("selfplay", n, 0))
        start = time.perf_counter()
        try:
            records = await run_searches_async(
                play, list(range(config.games_per_iteration)), _ModelFactory(self.best),
                backend=config.backend, num_procs=config.num_procs,
                max_batch_size=config.max_batch_size, progress=progress,
                on_servers=on_servers)
        finally:  # the run's servers are gone: stop pushing to them
            for servers in ours:
                self.remove_target(servers)
        return records, time.perf_counter() - start

    def _agent(self, evaluate: Any, name: str) -> Any:
        """The evaluation agent: ``eval_policy``'s search without noise."""
        config = self.config
        search = dict(simulations=config.eval_simulations,
                      num_parallel=config.eval_num_parallel, name=name,
                      reuse_tree=config.eval_reuse_tree)
        if config.eval_policy == "gumbel":
            return GumbelPlayer(evaluate, **search)
        return MCTSPlayer(evaluate, c_puct=config.eval_c_puct, solve=config.eval_solve,
                          **search)

    def _chooser(self, evaluate: Any) -> Any:
        """The evaluation agent's search as a ``move_accuracy`` chooser."""
        config = self.config
        search = dict(num_simulations=config.eval_simulations,
                      num_parallel=config.eval_num_parallel)
        if config.eval_policy == "gumbel":
            return gumbel_chooser(self.game, evaluate, **search)
        return mcts_chooser(self.game, evaluate, c_puct=config.eval_c_puct,
                            solve=config.eval_solve, **search)

    async def _accuracy(self, evaluate: Any) -> Dict[str, float]:
        """Move accuracy of the net alone and of the evaluation agent on each
        solver-labelled subset; the positions of a set are asked at once, so their
        requests batch in the server."""
        accuracy: Dict[str, float] = {}
        n = self.config.accuracy_positions
        if not n:
            return accuracy
        for stage, positions in accuracy_subsets(n).items():
            for kind, choose in (("net", policy_chooser(self.game, evaluate)),
                                 ("mcts", self._chooser(evaluate))):
                result = await move_accuracy(choose, positions)
                accuracy[f"{kind}_{stage}"] = result.accuracy
                self._report("accuracy", len(positions), 2 * n * len(ACCURACY_STAGES))
        return accuracy

    async def _evaluate(self, candidate: Any, iteration: int) -> tuple:
        import async_search as asr

        config = self.config
        game = self.game
        seed = config.seed * 100_003 + iteration
        total = config.arena_games + 3 * config.eval_games + config.strong_uct_games
        tick = lambda: self._report("evaluate", 1, total)  # noqa: E731
        async with asr.serve(candidate, max_batch_size=config.max_batch_size) as ev_new, \
                asr.serve(self.best, max_batch_size=config.max_batch_size) as ev_best:
            self.add_target(ev_best)
            try:
                agent = self._agent(ev_new, "candidate")
                arena = await play_match(game, agent, self._agent(ev_best, "best"),
                                         num_games=config.arena_games, seed=seed,
                                         opening_moves=2, on_game=tick)
                scores: Dict[str, float] = {}
                baselines = []
                if config.eval_games:
                    baselines += [("one_ply", OnePlyPlayer(), config.eval_games),
                                  (f"uct{config.uct_rollouts}",
                                   UCTPlayer(config.uct_rollouts), config.eval_games)]
                if config.strong_uct_games:
                    baselines.append((f"uct{config.strong_uct_rollouts}",
                                      UCTPlayer(config.strong_uct_rollouts),
                                      config.strong_uct_games))
                for name, opponent, games in baselines:
                    result = await play_match(game, agent, opponent, num_games=games,
                                              seed=seed, on_game=tick)
                    scores[name] = result.score
                if config.eval_games:
                    result = await play_match(game, PolicyPlayer(ev_new), RandomPlayer(),
                                              num_games=config.eval_games, seed=seed,
                                              on_game=tick)
                    scores["policy_vs_random"] = result.score
                t = time.perf_counter()
                accuracy = await self._accuracy(ev_new)
                accuracy_s = time.perf_counter() - t
                promoted = gate(arena, threshold=config.gate_threshold,
                                min_games=min(40, config.arena_games))
                elo = self.best_elo + elo_difference(arena.score, arena.games)
                pushed = 0
                if promoted:
                    self.best, self.best_version, self.best_elo = (
                        candidate, self.best_version + 1, elo)
                    pushed = await self.push(candidate, self.best_version)
            finally:
                self.remove_target(ev_best)
        return arena, scores, promoted, elo, pushed, accuracy, accuracy_s

    async def run_iteration(self) -> IterationRecord:
        """Runs one iteration and checkpoints it; returns its record."""
        config = self.config
        iteration = self.iteration
        if self._broken is not None:
            again = (f"Commander(config, save_dir={self.save_dir!r}, resume=True) goes on "
                     f"from its last commit" if self._folder is not None else
                     "a new Commander starts over")
            raise RuntimeError(f"iteration {iteration + 1} of this Commander failed "
                               f"({describe(self._broken)}) midway, which leaves its "
                               f"trainer and best net mid-iteration: {again}")
        start = time.perf_counter()
        samples, selfplay_s = 0, 0.0
        if self._phase_done != "selfplay":
            if self._next_selfplay is not None:  # overlap: started last iteration
                task, self._next_selfplay = self._next_selfplay, None
                records, selfplay_s = await task
            else:
                records, selfplay_s = await self._selfplay(iteration)
            for r in records:
                self.buffer.add(r.x, r.policy, r.value)
            samples = sum(len(r.x) for r in records)
            self._phase_done, self._selfplay_s = "selfplay", selfplay_s
            self._save_state()  # the samples are safe before anything else can fail
        else:  # resumed after a crash: this iteration's samples are in the buffer
            samples = self.buffer.added - sum(r.samples for r in self.history)
            selfplay_s = self._selfplay_s  # as committed with them (0 before it was)
        self._broken = _MIDWAY  # until the record is committed below
        if config.overlap and iteration + 1 < config.iterations:
            self._next_selfplay = asyncio.ensure_future(self._selfplay(iteration + 1))
        try:
            t = time.perf_counter()
            self.trainer.reset_optimizer()
            losses = await asyncio.to_thread(self._train)
            candidate = self.trainer.model()
            train_s = time.perf_counter() - t
            t = time.perf_counter()
            arena, scores, promoted, elo, pushed, accuracy, accuracy_s = (
                await self._evaluate(candidate, iteration))
            eval_s = time.perf_counter() - t
        except BaseException as e:
            self._broken = e
            await self._cancel_next_selfplay()
            raise
        record = IterationRecord(
            iteration=iteration + 1, samples=samples, buffer_size=len(self.buffer),
            selfplay_s=selfplay_s, samples_per_s=samples / selfplay_s if selfplay_s else 0.0,
            s_per_1000_samples=1000 * selfplay_s / samples if samples and selfplay_s else 0.0,
            policy_loss=losses.policy, value_loss=losses.value, l2_loss=losses.l2,
            total_loss=losses.total, train_s=train_s, arena_score=arena.score,
            promoted=promoted, best_version=self.best_version, scores=scores, elo=elo,
            pushed_to=pushed, eval_s=eval_s, iteration_s=time.perf_counter() - start,
            accuracy=accuracy, accuracy_s=accuracy_s)
        self.history.append(record)
        self._phase_done, self._selfplay_s = None, 0.0
        self._save_state()
        self._broken = None
        return record

    async def _cancel_next_selfplay(self) -> None:
        task, self._next_selfplay = self._next_selfplay, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _train(self):
        config = self.config
        chunk = max(1, config.train_steps // 20)
        done, sums = 0, np.zeros(4)
        while done < config.train_steps:
            n = min(chunk, config.train_steps - done)
            terms = self.trainer.train_steps(self.buffer, n)
            sums += n * np.array([terms.policy, terms.value, terms.l2, terms.total])
            done += n
            self._report("train", n, config.train_steps)
        from async_search.training.trainer import LossTerms
        p, v, l2, total = (sums / done).tolist()
        return LossTerms(p, v, l2, total, done)

    async def run(self, on_iteration: Optional[Callable[[IterationRecord], None]] = None
                  ) -> List[IterationRecord]:
        """Runs iterations until ``config.iterations`` are done; returns every record."""
        try:
            while self.iteration < self.config.iterations:
                record = await self.run_iteration()
                if on_iteration is not None:
                    on_iteration(record)
        finally:  # nothing outlives the run
            await self._cancel_next_selfplay()
        return list(self.history)


#: What ``Commander._broken`` holds while an iteration runs past its committed samples:
#: an exception that escapes before its record is committed leaves it set.
_MIDWAY = RuntimeError("an exception between its committed samples and its record")


def _read_record(config: CommanderConfig, fields: Any, folder: RunFolder) -> tuple:
    """``(history, phase_done, best_version, best_elo, selfplay_s)`` from ``state.json``,
    every field checked (``selfplay_s``, the committed self-play's time, is 0 in a file
    written before it was kept).

    Raises:
        CheckpointError: a field missing, of the wrong type or out of range (named).
        ValueError: the saved run's config is not ``config`` but for ``iterations``.
    """
    file = folder.state_file
    stored = config_from_json(CommanderConfig, fields.raw("config"), file, "config",
                              nested={"selfplay": SelfPlayConfig},
                              added=("architecture", "channels", "blocks",
                                     "value_hidden", "selfplay.random_opening_moves",
                                     "eval_solve", "selfplay.solve", "features",
                                     "value_planes", "selfplay.policy_target",
                                     "value_net"),
                              earlier={"features": "planes"})
    check_same_config(stored, config, "iterations", CommanderConfig.to_json, folder)
    history = [record_from_json(IterationRecord, r, file, f"history[{i}]", _RANGES)
               for i, r in enumerate(fields.list("history"))]
    for i, r in enumerate(history):
        if r.iteration != i + 1 or r.best_version > r.iteration:
            raise fields.error(f"must be iteration {i + 1} with a best version of at "
                               f"most {i + 1}, got iteration {r.iteration} and version "
                               f"{r.best_version}", f"history[{i}]")
    fields.int("iteration", minimum=len(history), maximum=len(history))
    phase_done = fields.raw("phase_done")
    if phase_done not in (None, "selfplay"):
        raise fields.error(f"must be null or 'selfplay', got {phase_done!r}", "phase_done")
    version = history[-1].best_version if history else 0
    best_version = fields.int("best_version", minimum=version, maximum=version)
    best_elo = fields.float("best_elo")
    selfplay_s = fields.float("selfplay_s", minimum=0) if "selfplay_s" in fields.data \
        else 0.0
    fields.exactly([*ENVELOPE, "config", "iteration", "phase_done", "selfplay_s",
                    "best_version", "best_elo", "history"])
    return history, phase_done, best_version, best_elo, selfplay_s


def accuracy_subsets(size: int) -> Dict[str, list]:
    """``size`` positions of each solver-labelled Connect Four set (``ACCURACY_STAGES``;
    all of a set if it has fewer), drawn with a fixed seed and kept in the set's order:
    the same subset in every iteration and every run, and the positions of a smaller
    size are among those of a larger one."""
    from async_search.problems.solved_positions import connect_four_positions

    subsets = {}
    for stage in ACCURACY_STAGES:
        positions = connect_four_positions(stage)
        order = np.random.default_rng(_ACCURACY_SUBSET_SEED).permutation(len(positions))
        subsets[stage] = [positions[i] for i in sorted(order[:size].tolist())]
    return subsets


class _ModelFactory:
    """A picklable factory for the self-play servers: the best net at the time."""

    def __init__(self, model: Any):
        self.model = model

    def __call__(self) -> Any:
        return self.model
