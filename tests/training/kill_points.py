"""Kills a training run at every file-system operation of its saves, then resumes it.

Run as a script by ``test_run_folder.py``: ``python kill_points.py TRAINER WORKDIR``
writes ``WORKDIR/report.json``. This process imports TensorFlow and the trainers but runs
no TensorFlow op, so it can fork fresh children cheaply (a child that forks after TF has
run would find its thread pools gone):

1. a *reference* child runs the tiny run uninterrupted and records its rows;
2. a *prepared* child runs the first iteration; at each save of the second iteration it
   forks a counting grandchild (which performs the save with every file-system
   operation wrapped and recorded: each write, sync, rename, delete, folder made), then
   one grandchild per operation, SIGKILLed by itself just before that operation (and
   one just after the last), each on a copy of the folder as it was before the save;
3. for every killed folder, a fresh child resumes the run there and records what was
   left in the folder once the run started (leftovers must be gone) and a digest of
   it; for each distinct digest, one more child resumes there, runs it to the end and
   records its rows, its buffer and its folder, which stand for every kill that left
   that folder (the rest of a run depends on its folder alone).

The test compares every resumed run with the reference.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import sys
import traceback

import numpy as np

#: The operations wrapped: everything that changes what a folder holds.
OPERATIONS = {
    "os": ["open", "write", "fsync", "replace", "rename", "unlink", "remove", "rmdir",
           "mkdir", "link", "symlink", "truncate", "ftruncate"],
    "shutil": ["rmtree", "move", "copyfile", "copytree"],
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class Recorder:
    """Wraps the operations; while armed, records each and kills the process (SIGKILL)
    just before the ``kill_at``-th (1-based)."""

    def __init__(self, *, sync: bool = True):
        self.sync = sync  # False: fsync is recorded but skipped (SIGKILL keeps the page
        # cache, so a kill test needs no sync to disk; skipping it saves seconds)
        self.armed = False
        self.kill_at: int | None = None
        self.ops: list = []
        self._real = {}
        for module_name, names in OPERATIONS.items():
            module = sys.modules[module_name]
            for name in names:
                real = getattr(module, name)
                self._real[(module_name, name)] = real
                setattr(module, name, self._wrapper(name, real))

    def arm(self, kill_at: int | None = None) -> None:
        """Starts recording afresh; with ``kill_at``, kills before that operation."""
        self.ops, self.kill_at, self.armed = [], kill_at, True

    def uninstall(self) -> None:
        """Puts the real operations back."""
        for (module_name, name), real in self._real.items():
            setattr(sys.modules[module_name], name, real)

    def _wrapper(self, name, real):
        def wrapped(*args, **kwargs):
            if self.armed and self._counts(name, args, kwargs):
                self.ops.append(f"{name} {_shown(name, args)}")
                if self.kill_at is not None and len(self.ops) >= self.kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
            if name == "fsync" and not self.sync:
                return None
            return real(*args, **kwargs)
        return wrapped

    @staticmethod
    def _counts(name, args, kwargs) -> bool:
        if name == "open":  # opening to read (a folder to sync it) changes nothing
            flags = args[1] if len(args) > 1 else kwargs.get("flags", 0)
            return bool(flags & _WRITE_FLAGS)
        return True


def _shown(name, args) -> str:
    if name in ("write", "fsync", "ftruncate"):
        return f"fd {args[0]}" + (f" {len(args[1])} bytes" if name == "write" else "")
    return " ".join(os.path.basename(os.fspath(a)) for a in args[:2]
                    if isinstance(a, (str, os.PathLike)))


# -- the two trainers, on tiny parameters ------------------------------------------------


def _alphazero():
    from async_search.training import Commander, CommanderConfig, SelfPlayConfig

    config = CommanderConfig(
        iterations=2, games_per_iteration=3,
        selfplay=SelfPlayConfig(simulations=4, num_parallel=2, sampling_moves=4),
        train_steps=4, batch_size=16, buffer_capacity=2000, hidden_sizes=(8,),
        arena_games=2, eval_games=0, eval_simulations=4, uct_rollouts=4,
        gate_threshold=0.0, max_batch_size=64, seed=3, backend="local", num_procs=1)
    timing = {"selfplay_s", "samples_per_s", "s_per_1000_samples", "train_s", "eval_s",
              "iteration_s", "accuracy_s"}

    def make(folder, resume):
        return Commander(config, folder, resume=resume)

    def step(trainer):
        asyncio.run(trainer.run_iteration())

    def rows(trainer):
        return [{k: v for k, v in dataclasses.asdict(r).items() if k not in timing}
                for r in trainer.history]

    return make, step, rows, config.iterations, "iteration"


def _davi():
    from async_search.training import Davi, DaviConfig

    config = DaviConfig(size=3, rounds=2, states_per_round=48, max_scramble=12,
                        train_steps=3, hidden_sizes=(8,), batch_size=16,
                        buffer_capacity=80, loss_threshold=100.0, seed=5)

    def make(folder, resume):
        return Davi(config, save_dir=folder, resume=resume)

    def step(trainer):
        trainer.run_round()

    def rows(trainer):
        return [{k: v for k, v in dataclasses.asdict(r).items() if k != "seconds"}
                for r in trainer.history]

    return make, step, rows, config.rounds, "round"


SCENARIOS = {"alphazero": _alphazero, "davi": _davi}


def _done(trainer) -> int:
    return len(trainer.history)


def _summary(trainer, rows) -> dict:
    """What a finished run left: its rows, its buffer (digest of every sample held) and
    what is in its folder."""
    arrays = trainer.buffer.arrays()
    digest = hashlib.sha256()
    for array in arrays:
        if array is not None:
            digest.update(array.tobytes())
    return {"rows": rows(trainer), "buffer_size": len(trainer.buffer),
            "buffer_added": trainer.buffer.added, "buffer_sha256": digest.hexdigest(),
            "folder": _listing(trainer._folder.path)}


def _held(trainer, rows) -> bytes:
    """What a started trainer holds in memory: its rows, its buffer, its net's weights
    and counters, its random state (a start could load a leftover of the kill into
    memory, then delete it)."""
    summary = {k: v for k, v in _summary(trainer, rows).items() if k != "folder"}
    digest = hashlib.sha256(json.dumps(summary, sort_keys=True, default=repr).encode())
    weights = trainer.trainer.weights
    layers = [v for _, v in sorted(weights.items())] if isinstance(weights, dict) else weights
    for layer in layers:
        for array in layer if isinstance(layer, (tuple, list)) else (layer,):
            digest.update(np.asarray(array).tobytes())
    rng = getattr(trainer, "rng", None)
    state = {"rng": None if rng is None else rng.bit_generator.state,
             **{name: getattr(trainer, name, None)
                for name in ("target_updates", "best_version", "best_elo")}}
    digest.update(json.dumps(state, sort_keys=True, default=repr).encode())
    return digest.digest()


def _digest(folder, held: bytes = b"") -> str:
    """A digest of what ``folder`` holds (every name and every file's bytes), and of
    ``held``."""
    digest = hashlib.sha256(held)
    for name in _listing(folder):
        path = os.path.join(folder, name)
        digest.update(name.encode() + b"\0")
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()


def _listing(folder) -> list:
    out = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        rel = os.path.relpath(root, folder)
        out += [os.path.normpath(os.path.join(rel, n)) for n in sorted(dirs + files)]
    return sorted(out)


def _fork(job) -> int:
    """Starts ``job()`` in a forked child; returns its pid."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            job()
        except BaseException:  # noqa: BLE001 - reported through the status
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return pid


def _in_child(job) -> int:
    """Runs ``job()`` in a forked child; returns its wait status."""
    return os.waitpid(_fork(job), 0)[1]


def _in_children(jobs, parallel: int) -> list:
    """Runs each job in a forked child of its own, at most ``parallel`` at once; their
    wait statuses, in the jobs' order."""
    statuses = [None] * len(jobs)
    running = {}
    for i, job in enumerate(jobs):
        if len(running) >= parallel:
            pid, status = os.wait()
            statuses[running.pop(pid)] = status
        running[_fork(job)] = i
    while running:
        pid, status = os.wait()
        statuses[running.pop(pid)] = status
    return statuses


def _write(path, data) -> None:
    with open(path, "w") as f:
        json.dump(data, f)


def main(trainer_name: str, workdir: str) -> None:
    import tensorflow  # noqa: F401 - imported here, run only in the children

    recorder = Recorder(sync=False)
    make, step, rows, total, _ = SCENARIOS[trainer_name]()
    report = {"trainer": trainer_name, "saves": [], "kills": []}

    def reference():
        trainer = make(os.path.join(workdir, "reference"), False)
        while _done(trainer) < total:
            step(trainer)
        _write(os.path.join(workdir, "reference.json"), _summary(trainer, rows))

    if _in_child(reference) != 0:
        raise SystemExit("the reference run failed")
    report["reference"] = json.load(open(os.path.join(workdir, "reference.json")))

    killed_root = os.path.join(workdir, "killed")
    os.makedirs(killed_root)

    def prepared():
        folder = os.path.join(workdir, "prepared")
        trainer = make(folder, False)
        step(trainer)  # the first iteration, committed
        run = trainer._folder
        real_commit = run.commit
        saves = []

        def commit(*args, **kwargs):
            save = len(saves)
            pristine = folder + ".pristine"
            shutil.rmtree(pristine, ignore_errors=True)
            shutil.copytree(folder, pristine, symlinks=True)
            ops_file = os.path.join(workdir, f"ops-{save}.json")

            def count():
                recorder.arm()
                real_commit(*args, **kwargs)
                recorder.armed = False
                _write(ops_file, recorder.ops)

            if _in_child(count) != 0:
                raise RuntimeError("the counting save failed")
            ops = json.load(open(ops_file))
            saves.append(ops)

            def restore():
                shutil.rmtree(folder)
                shutil.copytree(pristine, folder, symlinks=True)

            restore()
            for kill_at in range(1, len(ops) + 2):
                def kill():
                    recorder.arm(kill_at)
                    real_commit(*args, **kwargs)
                    os.kill(os.getpid(), signal.SIGKILL)  # just after the last one

                status = _in_child(kill)
                if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
                    raise RuntimeError(f"save {save}, kill point {kill_at}: the child was "
                                       f"not killed (status {status})")
                shutil.move(folder, os.path.join(killed_root, f"{save}-{kill_at}"))
                shutil.copytree(pristine, folder, symlinks=True)
            shutil.rmtree(pristine)
            return real_commit(*args, **kwargs)

        run.commit = commit
        while _done(trainer) < total:
            step(trainer)
        _write(os.path.join(workdir, "saves.json"), saves)

    if _in_child(prepared) != 0:
        raise SystemExit("the prepared run failed")
    report["saves"] = json.load(open(os.path.join(workdir, "saves.json")))

    # Each killed folder's resume starts in a child of its own: the start must clear
    # what the kill left (after_start), and the child reports a digest of the folder it
    # leaves. The rest of a run depends on that folder alone (the trainers keep every
    # state there, seeds included), so one run to the end per distinct folder stands
    # for every kill that left it; it starts again on that folder, which must then be
    # unchanged. (Each kill ran to the end before: minutes of the suite on 2 cores.)
    kills, starts = [], []
    for save, ops in enumerate(report["saves"]):
        for kill_at in range(1, len(ops) + 2):
            folder = os.path.join(killed_root, f"{save}-{kill_at}")
            out = os.path.join(workdir, f"started-{save}-{kill_at}.json")
            op = ops[kill_at - 1] if kill_at <= len(ops) else "(after the last)"

            def start(folder=folder, out=out):
                trainer = make(folder, True)
                _write(out, {"after_start": _listing(folder),
                             "digest": _digest(folder, _held(trainer, rows))})

            kills.append(({"save": save, "kill_at": kill_at, "op": op}, folder, out))
            starts.append(start)
    parallel = max(1, min(2, os.cpu_count() or 1))
    statuses = _in_children(starts, parallel)
    ends: dict = {}  # digest -> the folder whose run to the end stands for it
    for (entry, folder, out), status in zip(kills, statuses):
        entry["status"] = status
        if status == 0:
            entry.update(json.load(open(out)))
            ends.setdefault(entry["digest"], folder)
    report["runs_to_the_end"] = len(ends)
    finished = {}
    for digest, folder in ends.items():
        out = os.path.join(workdir, f"resumed-{digest}.json")

        def resume(folder=folder, out=out):
            trainer = make(folder, True)
            again = _digest(folder, _held(trainer, rows))
            while _done(trainer) < total:
                step(trainer)
            _write(out, {**_summary(trainer, rows), "digest_again": again})

        finished[digest] = out, resume
    statuses = _in_children([job for _, job in finished.values()], parallel)
    for (digest, (out, _)), status in zip(finished.items(), statuses):
        finished[digest] = json.load(open(out)) if status == 0 else {"status": status}
    for entry, folder, _ in kills:
        if entry["status"] == 0:
            entry.update(finished[entry["digest"]])
        report["kills"].append(entry)
        shutil.rmtree(folder)
    _write(os.path.join(workdir, "report.json"), report)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main(sys.argv[1], sys.argv[2])
