"""main.py's up-front refusals of flags that used to fail only after the work (or
never): formats matplotlib cannot write here, clashing outputs, unbounded sizes, a
dead Ray address, and client counts reported as started."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

flags = pytest.importorskip("absl.flags")  # the main extra

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def main(monkeypatch):
    monkeypatch.syspath_prepend(ROOT)
    import main

    main.FLAGS.unparse_flags()
    yield main
    main.FLAGS.unparse_flags()


def parse(main, *args):
    main.FLAGS.unparse_flags()
    main.FLAGS(["main.py", *args])


def main_py(*args, timeout=120):
    return subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(shutil.which("xelatex") is not None, reason="LaTeX writes .pgf here")
def test_a_listed_format_that_cannot_be_written_here_is_refused_up_front(main, tmp_path):
    parse(main, f"--save_path={tmp_path}/x.pgf")
    with pytest.raises(ValueError, match=r"--save_path=.*x\.pgf: matplotlib cannot write "
                                         r"a plot as \.pgf here"):
        main.check_outputs(None)


@pytest.mark.parametrize("save_dir, plot", [
    ("t.json", "t.png"), ("t.png", "t.png"), ("t.png/run", "t.png"),
    (".", "state.png"),  # its JSON, state.json, is the run's record
    (".", "best"), (".", "gen-000001"), (".", "heuristic/p.png"),
])
def test_a_save_dir_clashing_with_the_plot_or_json_is_refused(main, tmp_path, save_dir,
                                                               plot):
    parse(main, "--train=sliding_puzzle", f"--save_path={tmp_path}/{plot}",
          f"--save_dir={tmp_path}/{save_dir}")
    with pytest.raises(ValueError, match=r"^--save_dir=.*same path or one holds the other"):
        main.check_outputs(main.build_training())


@pytest.mark.parametrize("save_dir", ["run", "."])  # a plot of its own name inside: fine
def test_a_save_dir_apart_from_the_plot_passes(main, tmp_path, save_dir):
    parse(main, "--train=sliding_puzzle", f"--save_path={tmp_path}/t.png",
          f"--save_dir={tmp_path}/{save_dir}")
    main.check_outputs(main.build_training())


@pytest.mark.parametrize("args, names", [
    (["--max_batch_size=100000000"], "--max_batch_size must be an integer in [1, 65,536]"),
    (["--architecture=client", "--num_procs=100000"], "--num_procs must be at most 256"),
    (["--train=connect_four", "--num_procs=1000"], "--num_procs must be at most 256"),
    (["--train=connect_four", "--policy=gumbel", "--solve"], "--solve is PUCT's"),
    (["--train=sliding_puzzle", "--save_dir="], "--save_dir must be a folder"),
    (["--scramble=10000000"], "--scramble must be at most 1,000,000"),
    # Each hung or failed only after start-up: blocks are listed one by one to count
    # a net's weights, searches and games are made in Python before any work.
    (["--train=connect_four", "--blocks=10000000"], "--blocks must be an integer in [0, "
                                                    "1,000]"),
    (["--num_searches=99999999999999999999"], "--num_searches must be at most 100,000"),
    # passed, and every rollout search failed with an OverflowError inside
    (["--search=rollout", "--num_rollouts=99999999999999999999"],
     "--num_rollouts must be at most 65,536"),
    # inf passed the flag's check and failed later without naming the flag
    (["--weight=inf"], "--weight must be a finite number >= 0"),
    (["--max_delay=1e400"], "--max_delay must be a number of seconds in [0, 60]"),
    # an hour's wait for company passed, and left a run's last searches idle that long
    (["--max_delay=3600"], "--max_delay must be a number of seconds in [0, 60]"),
    (["--max_delay=-0.1"], "--max_delay must be a number of seconds in [0, 60]"),
    (["--architecture=client", "--games_per_client=9223372036854775807"],
     "--games_per_client must be at most 100,000"),
    # One UCT baseline's score overwrote the other's (and its final match was never
    # played): equal rollouts are refused while both are played.
    (["--train=connect_four", "--uct_rollouts=1000"],
     "--uct_rollouts and --strong_uct_rollouts are both 1000"),
])
def test_out_of_range_flags_are_refused_by_the_parser(main, args, names):
    with pytest.raises(flags.Error, match=None) as e:
        parse(main, *args)
    assert names in str(e.value)


def test_the_caps_themselves_pass(main):
    parse(main, "--max_batch_size=65536", "--scramble=1000000", "--num_searches=100000",
          "--max_delay=60")
    parse(main, "--search=rollout", "--num_rollouts=65536")
    parse(main, "--train=connect_four", "--net=residual", "--blocks=1000")
    # the command docs/training.md gives
    parse(main, "--train=connect_four", "--net=residual", "--channels=16", "--blocks=2",
          "--value_net=head", "--value_planes=1")
    parse(main, "--architecture=client", "--num_procs=256")


def test_more_accuracy_positions_than_the_sets_hold_are_refused(main):
    parse(main, "--train=connect_four", "--accuracy_positions=201")
    with pytest.raises(ValueError, match=r"--accuracy_positions=201 is more than .* 200"):
        main.build_training()
    parse(main, "--train=connect_four", "--accuracy_positions=200")
    main.build_training()


def test_a_dead_ray_address_is_one_line_and_exit_2_in_seconds(tmp_path):
    pytest.importorskip("ray")  # (else main.py says first that it needs it)
    start = time.monotonic()
    run = main_py("--multi_server", "--model=numpy", "--num_searches=1", "--skip_sync",
                  "--noprogress", "--address=127.0.0.1:1", f"--save_path={tmp_path}/m.png")
    assert run.returncode == 2 and time.monotonic() - start < 60
    lines = run.stderr.strip().splitlines()
    assert lines == [lines[-1]] and lines[0].startswith(
        "main.py: error: --address=127.0.0.1:1: no Ray cluster answers at 127.0.0.1:1")
    assert run.stdout == "" and os.listdir(tmp_path) == []


def test_check_reachable_leaves_auto_and_local_to_ray():
    from async_search.ray_init import check_reachable

    for address in (None, "auto", "local"):
        check_reachable(address)
    with pytest.raises(ConnectionError, match="ray://127.0.0.1:1"):
        check_reachable("ray://127.0.0.1:1")


@pytest.mark.parametrize("address", ["foo", "host:abc", ":6379", "ray://"])
def test_an_address_of_no_form_ray_takes_is_refused_before_any_run(address):
    # It was left to ray.init: with the default backends the sync, async and process
    # runs went first, then each Ray run failed with "Invalid address format".
    from async_search.ray_init import check_reachable

    with pytest.raises(ConnectionError, match=f"^{re.escape(repr(address))} is no Ray "
                                              f"cluster address: give host:port"):
        check_reachable(address)


@pytest.mark.parametrize("answer, speaks", [
    (None, False),                                      # listens, says nothing
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", False),     # a web server: Ray's dashboard
    (bytes([0, 0, 6, 4, 0, 0, 0, 0, 0]) + bytes(6), True),  # an HTTP/2 SETTINGS frame
])
def test_check_reachable_asks_whether_the_port_speaks_grpc(answer, speaks):
    # A port that took TCP but was not Ray's kept ray.init retrying for minutes, deaf
    # to SIGTERM.
    import socket
    import threading

    from async_search.ray_init import check_reachable

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        connection, _ = listener.accept()
        with connection:
            try:
                connection.recv(64)
                if answer is not None:
                    connection.sendall(answer)
                connection.recv(64)  # until the checker hangs up (or its timeout)
            except OSError:  # it hung up first
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        if speaks:
            check_reachable(f"127.0.0.1:{port}", timeout=5)
        else:
            with pytest.raises(ConnectionError, match="does not speak gRPC"):
                check_reachable(f"127.0.0.1:{port}", timeout=1)
    finally:
        thread.join(10)
        listener.close()


def test_the_client_processes_reported_are_those_started(tmp_path):
    save = tmp_path / "r.png"
    run = main_py("--model=numpy", "--untrained", "--hidden_sizes=16", "--num_searches=1",
                  "--gnn_budget=50", "--noprogress", "--backends=process",
                  f"--save_path={save}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "process backend, 1 client process," in run.stdout
    assert "2 client processes" not in run.stdout
    runs = {r["name"]: r for r in json.loads(save.with_suffix(".json").read_text())["runs"]}
    assert (runs["process x2"]["num_procs"], runs["process x2"]["num_procs_requested"]) == (
        1, 2)
    assert runs["process x1"]["num_procs"] == 1


def test_a_stop_after_trainings_last_commit_names_the_figures_it_saved(main, tmp_path):
    # The committed iterations took the line's place: the JSON written after them,
    # with the final evaluation, went unmentioned.
    parse(main, "--train=sliding_puzzle")
    done = main.Done()
    done.expect("rounds", 2)
    run = tmp_path / "run"
    run.mkdir()
    (run / "state.json").write_text('{"round": 2}')
    figures = tmp_path / "davi.json"
    figures.write_text("{}")
    done.outputs, done.save_dir = [str(tmp_path / "davi.png"), str(figures)], str(run)
    assert done.describe() == (f"2 of 2 rounds are saved in {run} (--resume continues "
                               f"the run); saved {figures}")


@pytest.mark.parametrize("args, module", [
    ([], "tensorflow"),  # --model tf, the default
    (["--model=numpy"], "ray"),  # --backends local,process,ray, the default
    (["--model=numpy", "--multi_server"], "ray"),
    (["--train=sliding_puzzle"], "tensorflow"),
    (["--train=connect_four", "--backend=ray", "--model=numpy"], "ray"),
    (["--model=numpy", "--backends=local"], "seaborn"),
    (["--model=numpy", "--backends=local"], "tqdm"),
])
def test_a_module_the_run_needs_is_checked_before_any_work(main, monkeypatch, args, module):
    import importlib.util

    parse(main, *args)
    missing = [m for m in main.needed_modules() if importlib.util.find_spec(m) is None]
    if missing:  # one the run needs is not installed here: it is named first
        pytest.skip(f"{missing} not installed")
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    with pytest.raises(ValueError, match=rf"this run needs {module} \(.*\), which is not "
                                         rf"installed: pip install -e '\.\[\w+\]'"):
        main.check_installed()


@pytest.mark.parametrize("args, module", [
    (["--model=numpy", "--backends=local,process"], "tensorflow"),
    (["--model=numpy", "--backends=local,process"], "ray"),
    (["--model=numpy", "--backends=local", "--noprogress"], "tqdm"),
    (["--architecture=pipe", "--model=numpy"], "seaborn"),
    (["--continuous", "--model=numpy"], "ray"),  # a worker process: --backends not read
])
def test_a_module_the_run_does_not_need_may_be_missing(main, monkeypatch, args, module):
    parse(main, *args)
    monkeypatch.setitem(sys.modules, module, None)
    main.check_installed()


def test_main_py_without_absl_is_one_line_and_exit_2():
    code = ("import runpy, sys; sys.modules['absl'] = None; sys.argv = ['main.py']; "
            "runpy.run_path('main.py', run_name='__main__')")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert run.stderr == ("main.py: error: main.py needs absl-py, which is not installed: "
                          "pip install -e '.[all]' (or '.[main,plot]' and the extras a run "
                          "uses)\n")


def test_main_py_names_a_missing_framework_in_one_line_before_any_work():
    code = ("import runpy, sys; sys.modules['tensorflow'] = None; "
            "sys.argv = ['main.py', '--noprogress']; "
            "runpy.run_path('main.py', run_name='__main__')")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    assert run.stderr.startswith("main.py: error: this run needs tensorflow (--model tf; "
                                 "--model numpy runs without it), which is not installed")
