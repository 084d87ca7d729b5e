"""``python main.py`` end to end on tiny flags, and its refusals of bad flags."""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--model=numpy", "--untrained", "--hidden_sizes=16", "--num_searches=3",
        "--gnn_budget=150", "--noprogress"]

pytestmark = pytest.mark.timeout(180)


def main_py(*args, timeout=150):
    return subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_default_experiment_on_tiny_flags_prints_checks_and_saves(tmp_path):
    save = tmp_path / "out" / "results.png"
    run = main_py(*TINY, "--backends=local,process", f"--save_path={save}")
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    for name in ("sync", "async", "process x1", "process x2"):
        assert f"Finished {name} (" in out
    assert out.count("Results equal the reference run's: yes") == 3
    for figure in ("Total search time:", "Total model time :", "Fraction in model:",
                   "num_batches:", "num elements:", "size mean:", "size std:"):
        assert out.count(figure) == 4, figure
    assert "speed-up" in out and f"Saved the plot to {save}" in out
    assert save.stat().st_size > 10_000
    data = json.loads(save.with_suffix(".json").read_text())
    assert [r["name"] for r in data["runs"]] == ["sync", "async", "process x1", "process x2"]
    assert all(r["matches_baseline"] in (None, True) for r in data["runs"])
    assert "--gnn_budget=150" in data["command"]
    summaries = [r["summary"] for r in data["runs"]]
    assert all(s["solved"] == 0 and s["mean_path_length"] is None for s in summaries)


def test_the_default_net_is_the_trained_heuristic_and_it_solves_the_puzzles(tmp_path):
    save = tmp_path / "results.png"
    run = main_py("--model=numpy", "--num_searches=2", "--backends=local", "--noprogress",
                  f"--save_path={save}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "trained numpy net" in run.stdout and "weight 0.3" in run.stdout
    assert run.stdout.count("Results: 2 searches: 2 solved (mean path ") == 2
    rows = [line.split() for line in run.stdout.splitlines()
            if line.startswith(("sync ", "async "))]
    assert [row[1] for row in rows] == ["2/2", "2/2"] and rows[0][2] == rows[1][2]
    data = json.loads(save.with_suffix(".json").read_text())
    for r in data["runs"]:
        assert r["summary"]["solved"] == 2 and r["summary"]["goal_found"] == 2
        assert r["summary"]["mean_path_length"] == float(rows[0][2])
    assert data["params"]["model"]["trained"] is True


def test_continuous_and_architecture_experiments_on_tiny_flags(tmp_path):
    run = main_py("--continuous", "--model=numpy", "--untrained", "--hidden_sizes=16",
                  "--gnn_budget=300",
                  "--max_in_flight=16", "--noprogress", f"--save_path={tmp_path}/c.png")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Finished continuous (process backend, 1 client process" in run.stdout
    assert "Fraction in model:" in run.stdout and (tmp_path / "c.json").exists()
    run = main_py("--architecture=client", "--model=numpy", "--untrained", "--hidden_sizes=16",
                  "--num_samples=20", "--simulations=8", "--games_per_client=2",
                  "--num_procs=1", "--num_servers=1", "--noprogress",
                  f"--save_path={tmp_path}/a.png")
    assert run.returncode == 0, run.stderr[-3000:]
    # Slots play whole games: the positions played, more than asked for, are reported
    played = re.search(r"Time to play (\d+) positions \(whole games; 20 asked for\)",
                       run.stdout)
    assert played and int(played.group(1)) > 20, run.stdout
    assert " positions/s; start-up " in run.stdout
    header = [line for line in run.stdout.splitlines() if line.startswith("architecture")]
    assert header and "cache hit rate" in header[0] and "mean batch size" in header[0]
    [figures] = json.loads((tmp_path / "a.json").read_text())["architectures"]
    assert (figures["samples"], figures["samples_asked"]) == (int(played.group(1)), 20)


@pytest.mark.parametrize("args, names", [
    (["--search=dfs"], "--search"),
    (["--gnn_budget=0"], "--gnn_budget must be an integer >= 1"),
    (["--num_servers=100000"], "--num_servers=100000 is more than"),
    (["--model=torch"], "--model"),
    (["--model=pretrained"], "--model"),
    (["--weight=-0.1"], "--weight must be a finite number >= 0"),
    (["--untrained=maybe"], "--untrained"),
    (["--architecture=ring"], "--architecture"),
    (["--continuous", "--search=mcts"], "--continuous"),
    (["--no_such_flag"], "no_such_flag"),
    (["stray"], "unexpected arguments"),
    (["--train=chess"], "--train"),
    (["--train=connect_four", "--iterations=0"], "--iterations must be an integer >= 1"),
    (["--train=connect_four", "--games_per_iteration=-3"],
     "--games_per_iteration must be an integer >= 1"),
    (["--train=connect_four", "--train_steps=0"], "--train_steps must be an integer >= 1"),
    (["--train=connect_four", "--simulations=0"], "--simulations must be an integer >= 1"),
    (["--train=connect_four", "--eval_games=-1"], "--eval_games must be an integer >= 0"),
    (["--train=connect_four", "--arena_games=0"], "--arena_games must be an integer >= 1"),
    (["--arena_games=4"], "--arena_games does not apply to the default experiment"),
    (["--train=connect_four", "--backend=gpu"], "--backend"),
    (["--train=sliding_puzzle", "--weight=-1"], "--weight must be a finite number >= 0"),
    (["--train=connect_four", "--continuous"], "separate experiments"),
    # a net too large to build: refused before any allocation
    (["--train=connect_four", "--hidden_sizes=99999999999"],
     "--hidden_sizes 99999999999: a net of about"),
    (["--train=connect_four", "--net=residual", "--channels=100000"],
     "main.py builds nets of at most 50,000,000"),
    (["--train=connect_four", "--channels=4000", "--blocks=2"],  # the default --net
     "--channels, --blocks, --hidden_sizes 4000, 2, 256,256: a net of about"),
    # a flag the chosen experiment would not read (experiments.flag_scope)
    (["--iterations=3"], "--iterations does not apply to the default experiment"),
    (["--train=connect_four", "--model=tf"], "--model does not apply to --train"),
    (["--search=mcts", "--scramble=5"], "--scramble does not apply to --search mcts"),
    (["--hidden_sizes=64"], "--hidden_sizes sizes the untrained net"),
    (["--train=connect_four", "--net=mlp", "--blocks=1"],
     "--blocks sizes a convolutional net"),
    (["--train=connect_four", "--net=mlp", "--value_planes=4"],
     "--value_planes sizes a convolutional net"),
    (["--train=connect_four", "--policy=gumbel", "--policy_target=improved"],
     "--policy_target is PUCT's"),
    (["--policy_target=improved"], "--policy_target does not apply to the default"),
    # Ray's address: not empty, and only where Ray runs
    (["--address="], "--address must be the address of a running Ray cluster"),
    (["--multi_server", "--address= "], "--address must be the address of a running Ray"),
    (["--continuous", "--address=127.0.0.1:1"],
     "--address does not apply to --continuous"),
    (["--backends=local", "--address=127.0.0.1:1"],
     "--address is Ray's: --backends local runs no Ray"),
    # self-play in this process has no workers to count
    (["--train=connect_four", "--backend=local", "--num_procs=7"],
     "--num_procs counts self-play workers: --backend local plays self-play in this"),
    # --architecture starts its own server processes, not Ray's
    (["--architecture=client", "--num_servers=100000"],
     "--num_servers=100000 is more than --architecture can start here (at most"),
])
def test_bad_flags_are_one_line_and_exit_status_2(tmp_path, args, names):
    save = tmp_path / "never.png"
    run = main_py(*args, f"--save_path={save}", timeout=60)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("main.py: error: ")
    assert names in lines[0]
    assert run.stdout == "" and not save.exists()  # nothing ran
    if "--architecture=client" in args:
        assert "ray" not in lines[0].lower()  # it starts no Ray


def tiny_flags_for(experiment: str) -> list:
    """Tiny settings that the experiment chosen by ``experiment`` (its first flag) reads:
    main.py refuses a flag the chosen experiment would not read."""
    if experiment == "--train=connect_four":
        return TINY_TRAIN[1:]
    if experiment == "--train=sliding_puzzle":
        return ["--iterations=1", "--train_steps=2", "--hidden_sizes=8", "--gnn_budget=20",
                "--noprogress"]
    if experiment.startswith("--architecture"):
        return ["--model=numpy", "--untrained", "--hidden_sizes=16", "--num_samples=20",
                "--noprogress"]
    if experiment == "--continuous":
        return [flag for flag in TINY if not flag.startswith("--num_searches")]
    return TINY


@pytest.mark.parametrize("args", [
    ["--save_path={file}/x/r.png"],                                    # the searches
    ["--continuous", "--save_path={file}/x/c.png"],
    ["--architecture=client", "--save_path={file}/a.png"],
    ["--train=sliding_puzzle", "--save_dir={file}/x", "--save_path={tmp}/new/h.png"],
    ["--train=connect_four", "--save_dir={file}/x", "--save_path={tmp}/new/t.png"],
    ["--train=connect_four", "--save_dir={tmp}/new/run", "--save_path={file}/t.png"],
    ["--train=connect_four", "--save_path={file}/t.png"],  # --save_dir not given
    ["--train=sliding_puzzle", "--save_path={file}/h.png"],
    ["--save_path={tmp}/new/"],                                        # a folder
    ["--save_path={tmp}"],
])
def test_an_output_that_cannot_be_written_stops_before_any_work(tmp_path, args):
    """A typo in an output flag (a path under a file, a folder for a file) is one line
    and exit 2 before the searches, a DAVI run or AlphaZero start: nothing ran, and the
    check leaves no folder behind."""
    file = tmp_path / "run.json"
    file.write_text("{}")
    args = [a.format(file=file, tmp=tmp_path) for a in args]
    run = main_py(*args, *tiny_flags_for(args[0]), timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("main.py: error: --save_"), lines
    assert "cannot be written" in lines[0] or "names a folder" in lines[0]
    named = lines[0][len("main.py: error: "):].split("=")[0]
    assert any(a.startswith(f"{named}=") for a in args), lines  # a flag the user gave
    assert run.stdout == ""  # nothing ran
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]
    assert file.read_text() == "{}"


@pytest.mark.parametrize("args", [
    ["--save_path={tmp}/r.json"],           # the plot's path is the JSON's own
    ["--save_path={tmp}/r.txt"],            # a format matplotlib does not write
    ["--continuous", "--save_path={tmp}/c.JSON"],
    ["--train=sliding_puzzle", "--save_path={tmp}/t.txt"],
    ["--train=connect_four", "--save_path={tmp}/t.json"],
])
def test_a_plot_path_matplotlib_cannot_write_stops_before_any_work(tmp_path, args):
    """The plot's format is its extension: one that matplotlib cannot write (or the JSON
    beside it) is one line and exit 2 before any work, not a traceback after it."""
    args = [a.format(tmp=tmp_path) for a in args]
    run = main_py(*args, *tiny_flags_for(args[0]), timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("main.py: error: --save_path="), lines
    assert "matplotlib cannot write" in lines[0] or "names the JSON" in lines[0]
    assert run.stdout == "" and os.listdir(tmp_path) == []  # nothing ran


@pytest.mark.parametrize("ext", [".svg", ".pdf", ""])
def test_a_plot_path_of_another_format_or_none_passes_the_checks(monkeypatch, ext):
    monkeypatch.syspath_prepend(ROOT)
    import main

    try:
        main.FLAGS.unparse_flags()
        main.FLAGS(["main.py", f"--save_path=/tmp/r{ext}"])
        main.check_outputs(None)
    finally:
        main.FLAGS.unparse_flags()


def test_another_search_or_net_does_not_overwrite_the_default_figures(tmp_path):
    """Left at its default, --save_path is results/results.png, the A* default's figures:
    --search mcts (or rollout, or --untrained) writes its own files beside them."""
    run = subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), "--search=mcts",
                          "--backends=local", "--skip_sync", "--num_searches=1",
                          "--gnn_budget=8", "--model=numpy", "--noprogress"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=150)
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(os.listdir(tmp_path / "results")) == ["results_mcts.json",
                                                        "results_mcts.png"]
    assert "Saved the plot to results/results_mcts.png" in run.stdout


def test_output_folders_are_made_when_missing(tmp_path):
    save = tmp_path / "a" / "b" / "r.png"
    run = main_py(*TINY, "--backends=local", f"--save_path={save}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert save.exists() and save.with_suffix(".json").exists()


def test_flags_build_the_experiments_they_name(monkeypatch):
    monkeypatch.syspath_prepend(ROOT)
    import main

    def parse(*args):
        main.FLAGS.unparse_flags()
        main.FLAGS(["main.py", *args])

    try:
        parse()
        exp = main.build_experiment()
        assert [r.name for r in exp.runs] == ["sync", "async", "process x1", "process x2",
                                              "ray x1", "ray x2"]
        assert exp.model.kind == "tf" and exp.search.search == "astar"
        assert exp.model.trained and exp.search.weight == 0.3
        assert exp.search.gnn_budget == 20_000 and exp.search.num_searches == 8
        assert all(r.use_uvloop == main.FLAGS.uvloop for r in exp.runs)
        parse("--multi_server", "--num_servers=3", "--num_procs=4", "--total_gpu_frac=0.5",
              "--skip_sync", "--search=mcts")
        (ray,) = main.build_experiment().runs
        assert (ray.backend, ray.num_servers, ray.num_procs, ray.total_gpu_frac) == (
            "ray", 3, 4, 0.5)
        assert main.save_path("multi_server").endswith(os.path.join("results",
                                                                    "multi_server.png"))
        parse("--continuous", "--max_delay=0.001")
        exp = main.build_experiment()
        assert exp.search.search == "continuous" and exp.search.num_searches == 1
        assert exp.runs[-1].max_batch_size == 1024
        assert all(r.max_delay == 0.001 for r in exp.runs)
        parse("--untrained", "--model=numpy", "--hidden_sizes=32,8", "--weight=1")
        exp = main.build_experiment()
        assert not exp.model.trained and exp.model.hidden_sizes == (32, 8)
        assert exp.model.kind == "numpy" and exp.search.weight == 1.0
        parse("--save_path=/tmp/x.png", "--continuous")
        assert main.save_path("continuous") == "/tmp/x.png"
        # each search and net of the searches experiments has its own default files
        for args, png in ((), "results.png"), (("--search=mcts",), "results_mcts.png"), (
                ("--search=rollout", "--untrained"), "results_rollout_untrained.png"), (
                ("--multi_server", "--search=mcts"), "multi_server_mcts.png"), (
                ("--continuous", "--untrained"), "continuous_untrained.png"), (
                ("--continuous",), "continuous.png"):
            parse(*args)
            assert main._outputs(None)[0] == [os.path.join("results", png[:-4] + ".json"),
                                           os.path.join("results", png)], args
        parse("--search=mcts", "--save_path=/tmp/x.png")  # given: used as it is
        assert main._outputs(None)[0] == ["/tmp/x.json", "/tmp/x.png"]
    finally:
        main.FLAGS.unparse_flags()


def test_train_connect_four_runs_the_half_hour_of_iterations_of_the_net_chosen(
        monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(ROOT)
    import main
    from async_search.training import CommanderConfig

    assert main.HALF_HOUR["mlp"].iterations == CommanderConfig().iterations
    try:
        for net in main.FLAGS["net"].parser.enum_values:  # every --net has its half hour
            main.FLAGS.unparse_flags()
            main.FLAGS(["main.py", "--train=connect_four", f"--net={net}",
                        f"--save_dir={tmp_path}"])
            config = main.build_training()[0]
            recipe = main.HALF_HOUR[net]
            assert config.iterations == recipe.iterations
            assert config.games_per_iteration == recipe.games_per_iteration
            assert config.selfplay.simulations == recipe.simulations
            assert config.architecture == net
            if net != "mlp":
                assert config.blocks == recipe.blocks and config.value_net == recipe.value_net
        # The default: the shipped net's recipe, a residual 16x1 policy beside an MLP value.
        main.FLAGS.unparse_flags()
        main.FLAGS(["main.py", "--train=connect_four", f"--save_dir={tmp_path}"])
        config = main.build_training()[0]
        assert (config.architecture, config.channels, config.blocks, config.value_net,
                config.hidden_sizes) == ("residual", 16, 1, "mlp", (256, 256))
        assert (config.iterations, config.games_per_iteration,
                config.selfplay.simulations) == (28, 600, 32)
        # The arena only rates when every candidate is promoted: 20 games; a gate, 40.
        assert (config.gate_threshold, config.arena_games) == (0.0, 20)
        for flags, games in ((["--gate_threshold=0.55"], 40), (["--arena_games=6"], 6),
                             (["--gate_threshold=0.55", "--arena_games=50"], 50)):
            main.FLAGS.unparse_flags()
            main.FLAGS(["main.py", "--train=connect_four", *flags, f"--save_dir={tmp_path}"])
            assert main.build_training()[0].arena_games == games
        main.FLAGS.unparse_flags()
        main.FLAGS(["main.py", "--train=connect_four", "--net=residual", "--iterations=3",
                    "--value_planes=8", "--value_net=head", "--blocks=2",
                    "--simulations=16", "--games_per_iteration=10",
                    f"--save_dir={tmp_path}"])
        config = main.build_training()[0]
        assert config.iterations == 3 and config.net.value_planes == 8
        assert (config.value_net, config.blocks, config.selfplay.simulations,
                config.games_per_iteration) == ("head", 2, 16, 10)
    finally:
        main.FLAGS.unparse_flags()


def test_every_flag_of_main_py_has_a_scope(monkeypatch):
    monkeypatch.syspath_prepend(ROOT)
    import main
    from async_search.experiments import flag_scope

    own = {flag.name for flag in main.FLAGS.get_key_flags_for_module(main)}
    assert own and own <= set(flag_scope.SCOPES) | flag_scope.ALWAYS, (
        own - set(flag_scope.SCOPES) - flag_scope.ALWAYS)


def documented_commands():
    """The ``python main.py ...`` command lines of the README, docs and main.py: inline
    code spans (which may wrap across lines) and lines of code blocks."""
    import glob
    import re
    import shlex

    found = {}
    for path in ["README.md", "main.py", *glob.glob(os.path.join(ROOT, "docs", "*.md"))]:
        with open(os.path.join(ROOT, path)) as f:
            text = f.read()
        commands = [m.group(1) for m in re.finditer(r"`(python3? main\.py[^`]*)`", text)]
        commands += [m.group(1) for m in re.finditer(
            r"^\s*(?:\$ )?(python3? main\.py[^#\n]*)", text, re.MULTILINE)]
        for command in commands:
            # placeholders ("--train ...", "--seed 0|1|2") are not commands to run
            if not any(mark in command for mark in ("...", "|", "--helpshort")):
                args = shlex.split(" ".join(command.split()[2:]))
                found[" ".join(args)] = args
    return list(found.values())


def test_every_documented_command_passes_the_flag_checks(monkeypatch):
    monkeypatch.syspath_prepend(ROOT)
    import main

    commands = documented_commands()
    assert len(commands) >= 10 and [] in commands  # the plain `python main.py`
    try:
        for args in commands:
            main.FLAGS.unparse_flags()
            main.FLAGS(["main.py", *args])
            main.check_flag_scope()
    finally:
        main.FLAGS.unparse_flags()


TINY_TRAIN = ["--train=connect_four", "--iterations=1", "--games_per_iteration=4",
              "--simulations=4", "--train_steps=3", "--hidden_sizes=16", "--eval_games=2",
              "--final_games=2", "--uct_rollouts=4", "--arena_games=2",
              "--strong_uct_games=1", "--strong_uct_rollouts=8", "--accuracy_positions=3",
              "--backend=local", "--noprogress"]


@pytest.mark.timeout(400)
def test_train_connect_four_on_tiny_flags_prints_the_table_saves_and_resumes(tmp_path):
    save, run_dir = tmp_path / "t.png", tmp_path / "run"
    run = main_py(*TINY_TRAIN, f"--save_dir={run_dir}", f"--save_path={save}",
                  timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    header = [line for line in out.splitlines() if line.strip().startswith("it ")]
    assert header and all(k in header[0] for k in ("samples", "smp/s", "policy", "value",
                                                   "arena", "one-ply", "uct", "train s"))
    assert "Final evaluation" in out and "mcts_vs_uct4" in out and "net_vs_random" in out
    assert save.stat().st_size > 10_000
    data = json.loads(save.with_suffix(".json").read_text())
    assert len(data["iterations"]) == 1 and data["iterations"][0]["samples"] > 0
    assert set(data["final_evaluation"]) == {"untrained", "trained"}
    assert (run_dir / "best" / "config.json").exists()  # it names its weights file
    # --resume with one more iteration continues from the saved state.
    run = main_py(*[a for a in TINY_TRAIN if not a.startswith("--iterations")],
                  "--iterations=2", "--resume", f"--save_dir={run_dir}",
                  f"--save_path={save}", timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(json.loads(save.with_suffix(".json").read_text())["iterations"]) == 2


def test_train_resume_without_a_saved_run_is_refused(tmp_path):
    run = main_py(*TINY_TRAIN, "--resume", f"--save_dir={tmp_path}/none",
                  f"--save_path={tmp_path}/t.png", timeout=120)
    assert run.returncode == 2
    assert "no saved run" in run.stderr and run.stdout == ""


@pytest.mark.timeout(400)
def test_train_sliding_puzzle_on_tiny_flags_compares_with_manhattan(tmp_path, monkeypatch):
    save = tmp_path / "h.png"
    run = main_py("--train=sliding_puzzle", "--iterations=2", "--train_steps=5",
                  "--hidden_sizes=16", "--gnn_budget=300", "--noprogress",
                  f"--save_dir={tmp_path}/run", f"--save_path={save}", timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Korf's 100" in run.stdout and "manhattan" in run.stdout
    assert "learned / Manhattan expansions" in run.stdout
    data = json.loads(save.with_suffix(".json").read_text())
    assert data["korf100"]["manhattan"]["instances"] == 100
    assert (tmp_path / "run" / "heuristic" / "config.json").exists()


def test_the_gnn_budget_help_names_what_the_hardest_default_search_needs():
    # The help's figure, recomputed: the default workload's searches with the shipped
    # heuristic (its NumPy twin computes bitwise what the TensorFlow net does).
    import asyncio

    import async_search as asr
    from async_search.experiments import ModelConfig, SearchConfig, make_workload

    help_text = main_py("--helpshort").stdout
    stated = re.search(r"--weight\s+0\.3\s+\((\d+)\s+evaluations\)", help_text)
    times = re.search(r"(\d+)\s+is\s+(\d+)\s+times\s+what\s+the\s+hardest", help_text)
    assert stated and times, help_text
    work = make_workload(SearchConfig(), ModelConfig(kind="numpy"))
    model = work.model_factory()

    async def evaluations():
        return [(await work.search_fn(s, asr.immediate(model))).evaluations
                for s in work.starts]

    needed = asyncio.run(evaluations())
    assert int(stated.group(1)) == max(needed)
    assert int(times.group(1)) == SearchConfig().gnn_budget
    assert int(times.group(2)) == SearchConfig().gnn_budget // max(needed)


def test_a_plot_the_disk_cannot_hold_is_one_line_naming_it_and_exit_1(tmp_path):
    # The check before the run writes an empty probe; the PNG failed at the end with a
    # traceback (--train said one line for the same fault).
    script = (f"import resource, runpy, signal, sys\n"
              f"signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              f"resource.setrlimit(resource.RLIMIT_FSIZE, (8000, 8000))\n"
              f"sys.argv = ['main.py', *sys.argv[1:]]\n"
              f"runpy.run_path({os.path.join(ROOT, 'main.py')!r}, run_name='__main__')\n")
    save = tmp_path / "r.png"
    run = subprocess.run([sys.executable, "-c", script, *TINY, "--backends=local",
                          f"--save_path={save}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=150)
    assert run.returncode == 1, run.stderr[-3000:]
    lines = [line for line in run.stderr.splitlines() if line.startswith(("main.py",
                                                                          "Traceback"))]
    assert len(lines) == 1 and lines[0].startswith(f"main.py: error: cannot write "
                                                   f"'{save}'"), run.stderr[-3000:]
    assert "Finished in" not in run.stdout
    assert json.loads(save.with_suffix(".json").read_text())["plot"] is None
    assert sorted(os.listdir(tmp_path)) == ["r.json"]


def test_a_path_the_output_encoding_cannot_spell_is_printed_escaped(tmp_path):
    save = tmp_path / "r\u00e9sultats" / "r.png"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), *TINY,
                          "--backends=local", f"--save_path={save}"],
                         cwd=ROOT, capture_output=True, timeout=150,
                         env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert run.returncode == 0, run.stderr.decode("ascii", "replace")[-3000:]
    assert b"Saved the plot to " in run.stdout and b"r\\xe9sultats" in run.stdout
    assert save.stat().st_size > 10_000
