"""A training run's folder: one commit point, leftovers removed, damaged files named, and
a run killed at every file-system operation of its saves resuming with the same rows."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from async_search.errors import CheckpointError, FileWriteError
from async_search.training import NetConfig, ReplayBuffer, initial_weights
from async_search.training.run_folder import RunFolder, SavedNet, held

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NET = NetConfig("heuristic", "sliding_puzzle", (8,), size=3)


def buffer_of(n: int, seed: int = 0) -> ReplayBuffer:
    buffer = ReplayBuffer(50, seed)
    rng = np.random.default_rng(seed)
    buffer.add(rng.random((n, 9, 9), dtype=np.float32), None, rng.random(n))
    return buffer


def commit(run: RunFolder, step: int, **record):
    run.commit({"step": step, **record},
               checkpoints={"net": SavedNet(initial_weights(NET, step), NET, {"step": step})},
               buffers={"samples": buffer_of(step + 1, step)}, exports=("net",))


def test_a_commit_is_read_back_whole_with_its_nets_and_buffers(tmp_path):
    run = RunFolder(tmp_path / "run", "test")
    commit(run, 1)
    commit(run, 2)
    saved = RunFolder(tmp_path / "run", "test").load()
    assert saved.fields.int("step") == 2
    assert saved.checkpoint("net").metadata == {"step": 2}
    assert len(saved.buffer("samples")) == 3
    names = sorted(os.listdir(tmp_path / "run"))
    assert names == ["gen-000001", "net", "state.json"]  # the previous generation is gone
    assert os.path.basename(saved.generation) == "gen-000001"


def test_the_export_is_a_checkpoint_of_the_last_commit(tmp_path):
    from async_search.training import read_checkpoint

    run = RunFolder(tmp_path, "test")
    commit(run, 1)
    commit(run, 2)
    assert read_checkpoint(tmp_path / "net").metadata == {"step": 2}
    assert len(os.listdir(tmp_path / "net")) == 2  # config.json and one weights file


def test_another_trainers_run_is_refused_naming_the_state_file(tmp_path):
    commit(RunFolder(tmp_path, "test"), 1)
    with pytest.raises(CheckpointError, match=r"state\.json.*'trainer'.*\['davi'\]"):
        RunFolder(tmp_path, "davi").load()


def test_a_record_that_is_not_json_is_refused_before_the_disk_is_touched(tmp_path):
    run = RunFolder(tmp_path / "run", "test")
    commit(run, 1)
    before = sorted(os.listdir(tmp_path / "run"))
    with pytest.raises(TypeError):
        run.commit({"step": object()})
    with pytest.raises(ValueError, match="the folder writes them"):
        run.commit({"generation": 3})
    with pytest.raises(ValueError, match="cannot name"):
        run.commit({}, buffers={"../x": buffer_of(1)})
    assert sorted(os.listdir(tmp_path / "run")) == before


@pytest.mark.parametrize("record", [{"history": {1: "a", "1": "b"}},
                                    {"flags": [{True: 1, "true": 2}]}])
def test_a_record_with_two_keys_written_as_one_is_refused_before_the_disk_is_touched(
        tmp_path, record):
    # Committed (the previous generation removed), then refused by load: the last good
    # iteration was lost.
    run = RunFolder(tmp_path / "run", "test")
    commit(run, 1)
    before = sorted(os.listdir(tmp_path / "run"))
    with pytest.raises(ValueError, match="twice"):
        run.commit(record)
    assert sorted(os.listdir(tmp_path / "run")) == before
    assert RunFolder(tmp_path / "run", "test").load().fields.int("step") == 1


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_record_holding_nan_or_infinity_is_refused_before_the_disk_is_touched(tmp_path,
                                                                                 bad):
    # json.dumps writes them as NaN/Infinity, which strict JSON readers refuse.
    run = RunFolder(tmp_path / "run", "test")
    commit(run, 1)
    before = sorted(os.listdir(tmp_path / "run"))
    state = (tmp_path / "run" / "state.json").read_bytes()
    with pytest.raises(ValueError, match=r"RunFolder\.commit: the record must be JSON"):
        commit(run, 2, best_elo=bad)
    with pytest.raises(ValueError, match="must be JSON"):
        run.commit({"history": [{"loss": bad}]})
    assert sorted(os.listdir(tmp_path / "run")) == before
    assert (tmp_path / "run" / "state.json").read_bytes() == state
    assert RunFolder(tmp_path / "run", "test").load().fields.int("step") == 1


def test_clean_removes_leftovers_and_unnamed_generations_only(tmp_path):
    run = RunFolder(tmp_path, "test")
    commit(run, 1)
    dead = _dead_pid()
    (tmp_path / f"state.json.tmp-{dead}").write_text("{")
    (tmp_path / f"best.old-{dead}").mkdir()
    (tmp_path / "gen-000007").mkdir()  # a save killed before its commit
    (tmp_path / "notes.txt").write_text("mine")
    removed = RunFolder(tmp_path, "test").clean()
    assert sorted(removed) == sorted([f"state.json.tmp-{dead}", f"best.old-{dead}",
                                      "gen-000007"])
    assert sorted(os.listdir(tmp_path)) == ["gen-000000", "net", "notes.txt",
                                            "state.json"]


def test_clean_removes_no_generation_when_the_state_file_is_damaged(tmp_path):
    run = RunFolder(tmp_path, "test")
    commit(run, 1)
    (tmp_path / "state.json").write_text("{")
    RunFolder(tmp_path, "test").clean()
    assert "gen-000000" in os.listdir(tmp_path)  # reported at load, not deleted


def test_a_commit_after_a_damaged_state_file_never_writes_into_a_named_generation(tmp_path):
    run = RunFolder(tmp_path, "test")
    commit(run, 1)
    commit(run, 2)
    (tmp_path / "state.json").write_text("")
    fresh = RunFolder(tmp_path, "test")
    commit(fresh, 3)
    assert fresh.load().generation.endswith("gen-000002")
    assert sorted(os.listdir(tmp_path)) == ["gen-000002", "net", "state.json"]


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


# -- every file damaged every way ---------------------------------------------------------


def _set(path, key, value):
    def damage(data):
        node = data
        for part in path:
            node = node[part]
        node[key] = value
        return data
    return damage


def _drop(path, key):
    def damage(data):
        node = data
        for part in path:
            node = node[part]
        del node[key]
        return data
    return damage


#: (name, bytes -> bytes or a function of the parsed JSON) for a JSON file.
JSON_DAMAGE = [
    ("truncated", lambda b: b[: len(b) // 2]),
    ("empty", lambda b: b""),
    ("random bytes", lambda b: np.random.default_rng(0).bytes(len(b))),
    ("not utf-8", lambda b: b"\xff\xfe" + b[2:]),
    ("an empty object", lambda b: b"{}"),
    ("a list", lambda b: b"[1, 2]"),
]


def damage_json(file, how) -> None:
    data = open(file, "rb").read()
    if isinstance(how, tuple):  # (field path, key, value) or (field path, key) to drop
        parsed = json.loads(data)
        damaged = (_set(*how) if len(how) == 3 else _drop(*how))(parsed)
        data = json.dumps(damaged).encode()
    else:
        data = how(data)
    with open(file, "wb") as f:
        f.write(data)


def assert_refused(load, file, problem):
    with pytest.raises(CheckpointError) as info:
        load()
    message = str(info.value)
    assert os.fspath(file) in message, message
    assert re.search(problem, message), message
    assert "\n" not in message


@pytest.mark.parametrize("name, how", JSON_DAMAGE)
def test_a_damaged_state_file_is_refused_naming_it(tmp_path, name, how):
    run = RunFolder(tmp_path, "test")
    commit(run, 1)
    damage_json(tmp_path / "state.json", how)
    problem = {"truncated": "not valid JSON", "empty": "empty", "random bytes":
               "not UTF-8|not valid JSON", "not utf-8": "not UTF-8",
               "an empty object": "format", "a list": "JSON object"}[name]
    assert_refused(lambda: RunFolder(tmp_path, "test").load(), tmp_path / "state.json",
                   problem)


@pytest.mark.parametrize("how, problem", [
    (((), "generation"), "'generation' is missing"),
    (((), "generation", 7), "'generation' must be a string"),
    (((), "generation", "gen-999999"), "is missing"),
    (((), "checkpoints", "net"), "'checkpoints' must be a list"),
    (((), "format", "async_search.training_run/0"), "format"),
])
def test_a_state_file_with_a_bad_envelope_is_refused_naming_the_field(tmp_path, how,
                                                                       problem):
    run = RunFolder(tmp_path, "test")
    commit(run, 1)
    damage_json(tmp_path / "state.json", how)
    assert_refused(lambda: RunFolder(tmp_path, "test").load(), tmp_path / "state.json",
                   problem)


def test_a_state_file_from_before_the_commit_point_says_so(tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({"config": {}, "history": []}))
    assert_refused(lambda: RunFolder(tmp_path, "test").load(), tmp_path / "state.json",
                   "older version")


# -- a failed write leaves the previous commit whole --------------------------------------


def test_a_full_disk_during_a_commit_leaves_the_previous_commit_whole(tmp_path):
    script = f"""
import resource, signal, sys
sys.path.insert(0, {ROOT!r})
from tests.training.test_run_folder import commit
from async_search.training.run_folder import RunFolder
run = RunFolder({str(tmp_path)!r}, "test")
commit(run, 1)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (600, 600))
try:
    commit(run, 2)
except OSError as e:
    print(type(e).__name__, e.errno, e)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("FileWriteError 27 cannot write"), out.stdout
    assert "gen-000001" in out.stdout and "File too large" in out.stdout
    saved = RunFolder(tmp_path, "test").load()
    assert saved.fields.int("step") == 1 and len(saved.buffer("samples")) == 2
    assert not [n for root, dirs, files in os.walk(tmp_path) for n in dirs + files
                if ".tmp-" in n]
    RunFolder(tmp_path, "test").clean()  # the partial generation goes at the next start
    assert sorted(os.listdir(tmp_path)) == ["gen-000000", "net", "state.json"]


def test_a_partial_generation_is_never_written_into_and_goes_after_the_commit(tmp_path):
    run = RunFolder(tmp_path, "test")
    commit(run, 1)
    os.mkdir(tmp_path / "gen-000001")  # a save killed before its commit
    (tmp_path / "gen-000001" / "samples.npz").mkdir()  # in the way of a buffer
    commit(RunFolder(tmp_path, "test"), 2)
    saved = RunFolder(tmp_path, "test").load()
    assert saved.fields.int("step") == 2 and saved.generation.endswith("gen-000002")
    assert sorted(os.listdir(tmp_path)) == ["gen-000002", "net", "state.json"]


def test_a_file_in_the_way_of_the_folder_is_a_file_write_error_naming_it(tmp_path):
    (tmp_path / "state.json").write_text("a file")
    with pytest.raises(FileWriteError, match="a file has its name") as info:
        RunFolder(tmp_path / "state.json" / "x", "test").commit({})
    assert str(tmp_path / "state.json") in str(info.value)


# -- every kill point, both trainers ------------------------------------------------------


def _normal(names) -> list:
    return sorted(re.sub(r"gen-\d+", "gen-N", n) for n in names)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("trainer", ["alphazero", "davi"])
def test_a_run_killed_at_any_file_operation_of_a_save_resumes_with_the_same_rows(
        tmp_path, trainer):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, os.path.join(HERE, "kill_points.py"), trainer,
                          str(tmp_path)], capture_output=True, text=True, timeout=840,
                         env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.load(open(tmp_path / "report.json"))
    reference = report["reference"]
    saves = report["saves"]
    # The operations were found by wrapping them, and a save does each kind.
    assert len(saves) == (2 if trainer == "alphazero" else 1)
    for ops in saves:
        kinds = {op.split()[0] for op in ops}
        assert {"open", "write", "fsync", "replace", "mkdir", "rmtree", "unlink",
                "rmdir"} <= kinds, kinds
    assert len(report["kills"]) == sum(len(ops) + 1 for ops in saves)
    for kill in report["kills"]:
        where = f"killed at operation {kill['kill_at']} ({kill['op']}) of save {kill['save']}"
        assert kill["status"] == 0, where
        assert kill["digest_again"] == kill["digest"], where  # its run's start, again
        assert kill["rows"] == reference["rows"], where
        assert kill["buffer_size"] == reference["buffer_size"], where
        assert kill["buffer_added"] == sum(r.get("samples", 0) for r in reference["rows"]
                                           ) or trainer == "davi", where
        assert kill["buffer_sha256"] == reference["buffer_sha256"], where  # none twice
        assert _normal(kill["folder"]) == _normal(reference["folder"]), where
        assert not [n for n in kill["after_start"] if ".tmp-" in n or ".old-" in n], where
        generations = {n.split(os.sep)[0] for n in kill["after_start"]
                       if n.startswith("gen-")}
        assert len(generations) == 1, (where, kill["after_start"])


def test_resuming_from_a_state_json_that_is_not_a_file_says_so(tmp_path):
    from async_search.training.run_folder import resume_folder

    (tmp_path / "state.json").mkdir()
    with pytest.raises(ValueError, match="state.json' is not a file"):
        resume_folder(str(tmp_path), "connect_four")
    with pytest.raises(ValueError, match="no saved run"):
        resume_folder(str(tmp_path / "empty"), "connect_four")


_TRY_TO_HOLD = """
import sys
from async_search.training.run_folder import RunFolderBusyError, held
try:
    with held(sys.argv[1]):
        print("held", flush=True)
        if len(sys.argv) > 2:
            sys.stdin.read()   # holds it until the test kills it
except RunFolderBusyError as e:
    print("busy:", e)
"""


def _try_to_hold(folder, *extra, **kw):
    return subprocess.Popen([sys.executable, "-c", _TRY_TO_HOLD, str(folder), *extra],
                            stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True, **kw)


def test_a_run_folder_is_held_by_one_process_at_a_time(tmp_path):
    with held(tmp_path / "run") as folder:
        out, _ = _try_to_hold(folder).communicate(timeout=60)
        assert out.startswith(f"busy: {folder!r} is in use by another run (pid "
                              f"{os.getpid()})")
    out, _ = _try_to_hold(folder).communicate(timeout=60)
    assert out == "held\n"


def test_a_killed_holder_lets_go_of_its_run_folder(tmp_path):
    holder = _try_to_hold(tmp_path, "wait")
    try:
        assert holder.stdout.readline() == "held\n"
        out, _ = _try_to_hold(tmp_path).communicate(timeout=60)
        assert out.startswith("busy:") and f"(pid {holder.pid})" in out
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
        out, _ = _try_to_hold(tmp_path).communicate(timeout=60)
        assert out == "held\n"
    finally:
        holder.kill()
        holder.wait(timeout=60)


@pytest.mark.parametrize("lock", ["folder", "fifo"])
def test_a_lock_file_that_cannot_be_written_is_a_file_write_error_naming_it(tmp_path,
                                                                            lock):
    # A raw OSError escaped: main.py printed a traceback, not its one line.
    if lock == "folder":
        (tmp_path / ".lock").mkdir()
    else:
        os.mkfifo(tmp_path / ".lock")
    with pytest.raises(FileWriteError, match=r"cannot lock the run folder: .*\.lock"):
        with held(tmp_path):
            pass


def test_what_is_no_checkpoint_buffer_or_name_is_refused_before_the_disk_is_touched(
        tmp_path):
    # An int for a buffer got as far as an AttributeError after the generation folder
    # was made; "latest" for exports was read letter by letter; a trainer of 5 committed
    # a run that load refused.
    run = RunFolder(tmp_path / "run", "test")
    commit(run, 1)
    before = sorted(os.listdir(tmp_path / "run"))
    with pytest.raises(TypeError, match="each of buffers must be a ReplayBuffer"):
        run.commit({}, buffers={"b": 5})
    with pytest.raises(TypeError, match="each of checkpoints must be a SavedNet"):
        run.commit({}, checkpoints={"net": object()})
    with pytest.raises(ValueError, match="cannot name"):
        run.commit({}, buffers={1: buffer_of(1)})
    with pytest.raises(ValueError, match=r"exports is a sequence of names \(\['latest'\]"):
        run.commit({}, exports="latest")
    assert sorted(os.listdir(tmp_path / "run")) == before
    with pytest.raises(ValueError, match="trainer must be a name"):
        RunFolder(tmp_path / "other", 5)
