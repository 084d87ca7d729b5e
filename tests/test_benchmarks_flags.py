"""benchmarks/*.py: a flag out of range (0, negative, past a limit) is refused at once,
as argparse refuses a bad flag: exit status 2 and one ``error:`` line on stderr, not a
traceback from the middle of a run (and not a run that does nothing, then reports)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: (script, flags): each case names one bad value; the others are left as they are or
#: set small, so that a script that took the bad value would start its work.
CASES = [
    ("fairness", ["--seconds", "0.3", "--rounds", "1", "--fifo_rounds", "0",
                  "--models", "accelerator"]),
    ("fairness", ["--seconds", "0.1", "--rounds", "1", "--fifo_rounds", "0",
                  "--models", "accelerator"]),
    ("fairness", ["--small", "0", "--rounds", "1", "--fifo_rounds", "0",
                  "--models", "accelerator"]),
    ("fairness", ["--rounds", "-1", "--models", "accelerator"]),
    ("overhead", ["--coroutines", "0", "--no_ray_serve"]),
    ("overhead", ["--repeats", "0", "--no_ray_serve"]),
    ("overhead", ["--requests", "-1", "--no_ray_serve"]),
    ("search_cost", ["--repeats", "0"]),
    ("search_cost", ["--simulations", "0"]),
    ("search_speedup", ["--searches", "0", "--skip-mcts"]),
    ("search_speedup", ["--repeat", "0", "--skip-mcts"]),
    ("search_speedup", ["--hidden", "256,0", "--skip-mcts"]),
    ("selfplay_training", ["--games", "0"]),
    ("selfplay_training", ["--simulations", "-1"]),
    ("deadlines", ["--rounds", "0", "--no_ray"]),
    ("deadlines", ["--timeout", "-1", "--no_ray", "--rounds", "1"]),
    ("remote_evaluate", ["--rounds", "0"]),
    ("remote_evaluate", ["--coroutines", "0", "--rounds", "1"]),
    ("backends", ["--coroutines", "0", "--no_ray"]),
    ("backends", ["--ray_ratio", "-1"]),
    ("backends", ["--requests", "1", "--no_ray"]),
    ("fraction", ["--batch_size", "0"]),
    ("fraction", ["--coroutines", "0"]),
    ("fraction", ["--pipeline_depth", "0", "--steps", "1"]),
    ("korf100", ["--instances", "0", "--budget", "100"]),
    ("korf100", ["--budget", "0", "--instances", "1"]),
    ("korf100", ["--ids", "101", "--budget", "10"]),
    ("korf100", ["--buffer_sizes", "0", "--instances", "1", "--budget", "10"]),
    ("adapters", ["--rounds", "0", "--frameworks", "torch"]),
    ("adapter_calls", ["--framework", "torch", "--side", "direct", "--input", "0"]),
    ("chaos", ["--requests", "0", "--no_ray"]),
    ("checkpoint_save", ["--other", ROOT, "--saves", "0", "--rounds", "1"]),
    ("compare_trees", ["--other", ROOT, "--rounds", "0", "--figure", "x", "--",
                       "benchmarks/search_cost.py"]),
    ("gumbel_strength", ["--simulations", "0", "--seeds", "1", "--games", "1"]),
    ("http_load", ["--clients", "0", "--duration", "0.5"]),
    ("http_load", ["--duration", "0"]),
    ("net_inputs", ["--positions", "0"]),
    ("net_inputs", ["--stones", "37", "28"]),
    ("solve_strength", ["--games", "0"]),
    ("solver", ["--per_depth", "0"]),
    ("solver", ["--stones", "50", "--skip_times"]),
    # NaN passed every "< 0" check: search_speedup aborted the interpreter at its first
    # GIL wait, fraction printed NaN (no JSON), the others ended in a traceback.
    ("search_speedup", ["--switch-interval", "nan", "--skip-mcts"]),
    ("fraction", ["--cpu_us", "nan", "--steps", "1"]),
    ("fake_device", ["--ms", "nan"]),
    ("fake_device", ["--us-per-row", "nan"]),
    ("chaos", ["--run_bound_s", "nan", "--no_ray"]),
    ("http_load", ["--warmup", "nan", "--duration", "0.5"]),
    # A folder that is no checkout: measured whatever `import async_search` found
    ("checkpoint_save", ["--other", os.path.dirname(ROOT), "--saves", "1",
                         "--rounds", "1"]),
    ("compare_trees", ["--other", os.path.dirname(ROOT), "--rounds", "1", "--figure",
                       "x", "--", "benchmarks/search_cost.py"]),
    ("http_load", ["--compare", os.path.join(ROOT, "no such tree")]),
]


#: The scripts with an --out flag (pointed into the test's folder, never results/).
OUT_FLAG = {"fairness", "overhead", "deadlines", "remote_evaluate", "korf100", "adapters",
            "compare_trees", "gumbel_strength", "net_inputs", "solve_strength", "solver",
            "checkpoint_save"}


@pytest.mark.parametrize("script, flags", CASES,
                         ids=[f"{s}:{' '.join(f)}" for s, f in CASES])
def test_a_flag_out_of_range_is_refused_before_any_work(script, flags, tmp_path):
    out = ["--out", str(tmp_path / "out.json")] if script in OUT_FLAG else []
    command = [sys.executable, os.path.join(ROOT, "benchmarks", f"{script}.py"),
               *out, *flags]
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    try:  # in tmp_path: a script that took the value would write its results there
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{script} {' '.join(flags)} ran past 30 s instead of refusing")
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith(f"{script}.py: error: --"), done.stderr[-2000:]
    assert not done.stdout.strip()
