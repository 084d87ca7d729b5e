"""main.py --train: --resume for both trainers, a run killed mid-way that resumes with the
same rows, and damaged saved files reported in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAVI = ["--train", "sliding_puzzle", "--iterations", "3", "--train_steps", "2",
        "--hidden_sizes", "8", "--gnn_budget", "20", "--noprogress"]


def main(*args, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "main.py", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)


def error_lines(out) -> list:
    """stderr without TensorFlow's and absl's start-up noise."""
    return [line for line in out.stderr.splitlines()
            if line.startswith(("main.py", "Traceback", "  ", "async_search", "ValueError"))]


def rows(json_path) -> list:
    return [{k: v for k, v in r.items() if k != "seconds"}
            for r in json.load(open(json_path))["rounds"]]


def test_resume_with_nothing_beside_the_plot_names_where_it_looked_and_why(tmp_path):
    # Without --save_dir the run is saved beside --save_path's plot: a --resume with
    # another --save_path looked elsewhere, and said only "run without --resume first".
    out = main("--train", "sliding_puzzle", "--resume",
               "--save_path", str(tmp_path / "p.png"))
    assert out.returncode == 2
    (line,) = error_lines(out)
    assert f"no saved run in {tmp_path / 'train_sliding_puzzle'}" in line
    assert "beside --save_path's plot" in line


@pytest.mark.parametrize("problem", ["sliding_puzzle", "connect_four"])
def test_resume_with_nothing_saved_is_one_line_and_exit_2(tmp_path, problem):
    out = main("--train", problem, "--resume", "--save_dir", str(tmp_path / "none"),
               "--save_path", str(tmp_path / "p.png"))
    assert out.returncode == 2
    assert error_lines(out) == [f"main.py: error: --resume: no saved run in "
                                f"{tmp_path / 'none'} (state.json is missing); run "
                                f"without --resume first"]
    assert not os.path.exists(tmp_path / "none")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    folder = tmp_path_factory.mktemp("davi")
    out = main(*DAVI, "--save_dir", str(folder / "run"), "--save_path",
               str(folder / "p.png"))
    assert out.returncode == 0, out.stderr[-2000:]
    return folder


def test_a_puzzle_run_killed_mid_way_resumes_with_the_same_rows(tmp_path, finished):
    args = [*DAVI, "--save_dir", str(tmp_path / "run"), "--save_path",
            str(tmp_path / "p.png")]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    process = subprocess.Popen([sys.executable, "main.py", *args], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = tmp_path / "run" / "state.json"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if json.loads(state.read_text())["round"] >= 1:
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=60)
    assert json.loads(state.read_text())["round"] < 3, "the run finished before the kill"
    out = main(*args, "--resume")
    assert out.returncode == 0, out.stderr[-2000:]
    assert rows(tmp_path / "p.json") == rows(finished / "p.json")
    assert not [n for n in os.listdir(tmp_path / "run") if ".tmp-" in n]


def test_a_complete_run_resumed_says_so(finished):
    out = main(*DAVI, "--save_dir", str(finished / "run"), "--save_path",
               str(finished / "again.png"), "--resume")
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"The run in {finished / 'run'} is already complete (3 of 3 rounds)" in out.stdout
    assert rows(finished / "again.json") == rows(finished / "p.json")


def test_resuming_with_fewer_rounds_than_saved_is_refused_naming_them(finished):
    """--resume with --iterations below what the run has done would print "complete (3
    of 2 rounds)" and label 3 rounds as 2: one line, exit 2, before any work."""
    state = (finished / "run" / "state.json").read_bytes()
    out = main(*DAVI, "--iterations", "2", "--save_dir", str(finished / "run"),
               "--save_path", str(finished / "fewer.png"), "--resume")
    assert out.returncode == 2
    assert error_lines(out) == [f"main.py: error: --resume: the run in {finished / 'run'} "
                                f"has 3 rounds saved, more than --iterations=2: pass "
                                f"--iterations=3 to evaluate it again, or more to "
                                f"continue it"]
    assert out.stdout == "" and not (finished / "fewer.json").exists()
    assert (finished / "run" / "state.json").read_bytes() == state


@pytest.fixture
def copy(finished, tmp_path):
    import shutil

    shutil.copytree(finished / "run", tmp_path / "run")
    return tmp_path / "run"


def test_a_damaged_state_file_is_one_line_naming_it_and_exit_2(copy):
    (copy / "state.json").write_text('{"format": "async_search.training_run/1"')
    out = main(*DAVI, "--save_dir", str(copy), "--save_path", str(copy / "p.png"),
               "--resume")
    assert out.returncode == 2
    lines = error_lines(out)
    assert len(lines) == 1 and lines[0].startswith(
        f"main.py: error: '{copy / 'state.json'}' is not valid JSON (truncated or "
        f"corrupt)"), lines


def test_a_damaged_buffer_is_one_line_naming_it_exit_1_and_a_traceback_with_v(copy):
    generation = json.loads((copy / "state.json").read_text())["generation"]
    buffer = copy / generation / "buffer.npz"
    buffer.write_bytes(buffer.read_bytes()[:100])
    args = [*DAVI, "--iterations", "4", "--save_dir", str(copy), "--save_path",
            str(copy / "p.png"), "--resume"]
    out = main(*args)
    assert out.returncode == 1
    lines = error_lines(out)
    assert len(lines) == 1 and lines[0].startswith(
        f"main.py: error: replay buffer file '{buffer}' is corrupt, truncated"), lines
    verbose = main(*args, "-v", "1")
    assert verbose.returncode == 1 and "Traceback" in verbose.stderr


# -- --policy and --reuse_tree --------------------------------------------------------------

TINY_C4 = ["--train", "connect_four", "--iterations", "1", "--games_per_iteration", "2",
           "--simulations", "4", "--train_steps", "2", "--hidden_sizes", "8",
           "--eval_games", "1", "--strong_uct_games", "1", "--strong_uct_rollouts", "8",
           "--uct_rollouts", "4", "--final_games", "1", "--accuracy_positions", "3",
           "--arena_games", "2", "--backend", "local", "--noprogress"]


def test_a_gumbel_run_with_tree_reuse_prints_the_accuracy_and_carries_the_flags(tmp_path):
    out = main(*TINY_C4, "--policy", "gumbel", "--reuse_tree", "--save_dir",
               str(tmp_path / "run"), "--save_path", str(tmp_path / "p.png"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "(Gumbel MCTS, 4 simulations, tree reuse)" in out.stdout
    header = next(line for line in out.stdout.splitlines()
                  if line.strip().startswith("it "))
    assert all(k in header for k in ("uct1k", "net end", "net mid", "mcts end",
                                     "mcts mid", "acc s"))
    data = json.load(open(tmp_path / "p.json"))
    config = data["config"]
    assert (config["selfplay"]["policy"], config["selfplay"]["reuse_tree"]) == (
        "gumbel", True)
    assert (config["eval_policy"], config["eval_reuse_tree"]) == ("gumbel", True)
    assert config["accuracy_positions"] == 3
    [row] = data["iterations"]
    assert set(row["accuracy"]) == {"net_end", "net_middle", "mcts_end", "mcts_middle"}
    assert "uct8" in row["scores"] and "mcts_vs_uct8" in data["final_evaluation"]["trained"]
    # --resume with the other policy is refused before any work, in one line.
    again = main(*TINY_C4, "--resume", "--save_dir", str(tmp_path / "run"),
                 "--save_path", str(tmp_path / "p.png"))
    assert again.returncode == 2 and "selfplay" in error_lines(again)[0]


@pytest.mark.parametrize("args,match", [
    (["--train", "sliding_puzzle", "--net", "residual"], "--net"),
    (["--train", "sliding_puzzle", "--features", "threats"], "--features"),
    (["--train", "connect_four", "--net", "residual", "--channels", "0"], "channels"),
    (["--train", "connect_four", "--net", "conv", "--blocks", "-1"], "blocks"),
    (["--train", "connect_four", "--net", "residual", "--value_planes", "0"],
     "--value_planes"),
    (["--train", "connect_four", "--gate_threshold", "1.5"], "--gate_threshold"),
    (["--train", "connect_four", "--gate_threshold", "-0.1"], "--gate_threshold"),
    (["--train", "connect_four", "--random_opening_moves", "-1"], "--random_opening_moves"),
    (["--train", "connect_four", "--net", "mlp", "--value_net", "mlp"], "--value_net"),
    (["--train", "connect_four", "--net", "residual", "--value_net", "dense"],
     "--value_net"),
    (["--train", "connect_four", "--net", "residual", "--value_net", "head",
      "--hidden_sizes", "64"], "--hidden_sizes"),
    (["--train", "connect_four", "--net", "conv", "--hidden_sizes", "64"],
     "--hidden_sizes"),
    (["--train", "connect_four", "--value_planes", "2"], "--value_net head"),
    (["--train", "connect_four", "--net", "residual", "--value_net", "mlp",
      "--hidden_sizes", "100000,1000"], "--hidden_sizes"),
])
def test_a_training_flag_out_of_range_is_one_line_and_exit_2(tmp_path, args, match):
    out = main(*args, "--save_dir", str(tmp_path / "run"), "--save_path",
               str(tmp_path / "p.png"))
    assert out.returncode == 2
    lines = error_lines(out)
    assert len(lines) == 1 and match in lines[0], out.stderr[-2000:]
    assert not os.path.exists(tmp_path / "run")


def test_gate_threshold_zero_promotes_every_candidate_and_openings_and_solve_are_used(
        tmp_path):
    # One run for both (each main.py run costs about 12 s of CI): random openings and
    # --solve reach self-play and the agent, and are printed.
    out = main(*TINY_C4, "--iterations", "2", "--gate_threshold", "0",
               "--random_opening_moves", "6", "--solve", "--save_dir",
               str(tmp_path / "run"), "--save_path", str(tmp_path / "p.png"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "(promote at 0.0)" in out.stdout
    assert "after 0-6 random moves, proving values)" in out.stdout
    assert "1 leaves per round, proving values)" in out.stdout  # the final evaluation
    data = json.load(open(tmp_path / "p.json"))
    config = data["config"]
    assert config["gate_threshold"] == 0.0
    assert config["selfplay"]["random_opening_moves"] == 6
    assert config["selfplay"]["solve"] and config["eval_solve"]
    assert [(r["promoted"], r["best_version"]) for r in data["iterations"]] == [
        (True, 1), (True, 2)]
    # --resume with fewer iterations than the 2 saved is refused before any work
    fewer = main(*TINY_C4, "--gate_threshold", "0", "--random_opening_moves", "6",
                 "--solve", "--resume", "--save_dir",
                 str(tmp_path / "run"), "--save_path", str(tmp_path / "q.png"))
    assert fewer.returncode == 2 and fewer.stdout == ""
    assert error_lines(fewer) == [f"main.py: error: --resume: the run in "
                                  f"{tmp_path / 'run'} has 2 iterations saved, more than "
                                  f"--iterations=1: pass --iterations=2 to evaluate it "
                                  f"again, or more to continue it"]
    assert not (tmp_path / "q.json").exists()


def train_residual_4x1(tmp_path, *args):
    """One tiny iteration of ``--train connect_four --net residual`` 4x1, and ``args``."""
    return main("--train", "connect_four", "--net", "residual", "--channels", "4",
                "--blocks", "1", *args, "--iterations", "1", "--games_per_iteration", "4",
                "--train_steps", "4", "--simulations", "4", "--eval_games", "2",
                "--strong_uct_games", "0", "--final_games", "2", "--accuracy_positions",
                "2", "--uct_rollouts", "4", "--arena_games", "2", "--noprogress", "--save_dir",
                str(tmp_path / "run"), "--save_path", str(tmp_path / "p.png"))


def test_train_connect_four_with_a_residual_net_on_threats_trains_and_saves_it(tmp_path):
    out = train_residual_4x1(tmp_path, "--features", "threats", "--value_net", "head",
                             "--value_planes", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "a residual 4x1 (value 2 planes) + threats policy-value net" in out.stdout
    config = json.load(open(tmp_path / "run" / "best" / "config.json"))["config"]
    assert (config["architecture"], config["channels"], config["blocks"],
            config["features"], config["value_planes"]) == ("residual", 4, 1, "threats", 2)


def test_train_connect_four_with_an_mlp_value_beside_a_residual_policy(tmp_path):
    out = train_residual_4x1(tmp_path, "--value_net", "mlp", "--hidden_sizes", "16,8")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "a residual 4x1 + mlp value 16x8 + threats policy-value net" in out.stdout
    from async_search.training import read_checkpoint

    saved = read_checkpoint(tmp_path / "run" / "best")
    assert (saved.config.value_net, saved.config.hidden_sizes) == ("mlp", (16, 8))
    assert saved.weights["value.mlp.0.weight"].shape == (16, 4 * 42)


def test_a_run_into_a_folder_another_run_holds_is_one_line_and_exit_2(tmp_path):
    # Two runs into one folder removed each other's saves in progress (a generation
    # that state.json does not name yet is a killed save's leftover to the other).
    from async_search.training.run_folder import held
    run = tmp_path / "run"
    with held(run):
        out = main(*DAVI, "--save_dir", str(run), "--save_path", str(tmp_path / "p.png"))
    assert out.returncode == 2
    assert error_lines(out) == [
        f"main.py: error: --save_dir: {str(run)!r} is in use by another run (pid "
        f"{os.getpid()}): two runs into one folder would undo each other's saves; give "
        f"this one its own folder (--save_dir), or wait for that one to end"]
    assert sorted(os.listdir(run)) == [".lock"] and "Finished in" not in out.stdout
    out = main(*DAVI, "--save_dir", str(run), "--save_path", str(tmp_path / "p.png"))
    assert out.returncode == 0, out.stderr[-2000:]  # let go of: the next run takes it


def test_clients_past_the_open_file_limit_are_one_line_and_exit_1(tmp_path):
    # A 28-frame traceback from inside multiprocessing's os.pipe, before.
    import resource

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    args = [a if a != "local" else "process" for a in TINY_C4]
    out = subprocess.run(
        [sys.executable, "main.py", *args, "--num_procs", "20", "--games_per_iteration",
         "20", "--save_dir",
         str(tmp_path / "run"), "--save_path", str(tmp_path / "t.png")],
        capture_output=True, text=True, timeout=300, cwd=ROOT, preexec_fn=low_limit,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert out.returncode == 1, out.stderr[-3000:]
    lines = error_lines(out)
    assert len(lines) == 1 and lines[0].startswith(
        "main.py: error: [Errno 24] the process backend ran out of file descriptors"), lines
