"""experiments.flag_scope: which experiment reads which main.py flag."""

import pytest

from async_search.experiments.flag_scope import (EXPERIMENTS, SCOPES, Choice,
                                                 out_of_scope, why_unread)

C4 = Choice("train connect_four")
PUZZLE = Choice("train sliding_puzzle")


def test_flags_outside_the_table_are_read_everywhere():
    for experiment in EXPERIMENTS:
        assert out_of_scope(["seed", "save_path", "progress", "verbosity"],
                            Choice(experiment)) == []


def test_a_training_flag_is_refused_by_a_searches_experiment_naming_its_readers():
    (line,) = out_of_scope(["iterations"], Choice("default"))
    assert line == ("--iterations does not apply to the default experiment: it is read "
                    "by --train connect_four and --train sliding_puzzle")
    assert why_unread("iterations", C4) is None and why_unread("iterations", PUZZLE) is None


def test_the_search_experiments_flags_are_refused_by_training():
    for name in ("model", "untrained", "backends", "num_searches", "skip_sync", "address"):
        assert why_unread(name, C4).startswith(f"--{name} does not apply to --train")


@pytest.mark.parametrize("name, reads, ignores", [
    ("num_rollouts", "rollout", "astar"),
    ("rollout_depth", "rollout", "mcts"),
    ("weight", "astar", "mcts"),
    ("scramble", "rollout", "mcts"),
    ("batch_size", "mcts", "rollout"),
    ("num_searches", "astar", "continuous"),
])
def test_a_searchs_own_flags_are_refused_by_other_searches(name, reads, ignores):
    experiment = "continuous" if reads == "continuous" else "default"
    assert why_unread(name, Choice(experiment, search=reads)) is None
    experiment = "continuous" if ignores == "continuous" else "multi_server"
    line = why_unread(name, Choice(experiment, search=ignores))
    assert line.startswith(f"--{name} does not apply to ") and reads in line


def test_a_search_flag_outside_the_searches_keeps_its_experiment_scope():
    # --batch_size is the self-play batch of --architecture and the A* buffer of the
    # heuristic's comparison: the search kind does not matter there.
    assert why_unread("batch_size", Choice("architecture", search="rollout")) is None
    assert why_unread("weight", Choice("train sliding_puzzle", search="mcts")) is None
    assert why_unread("weight", C4).startswith("--weight does not apply")


def test_hidden_sizes_needs_an_untrained_net_outside_training():
    assert "add --untrained" in why_unread("hidden_sizes", Choice("default"))
    assert why_unread("hidden_sizes", Choice("default", untrained=True)) is None
    assert why_unread("hidden_sizes", Choice("architecture", untrained=True)) is None
    assert why_unread("hidden_sizes", C4) is None and why_unread("hidden_sizes", PUZZLE) is None


def test_hidden_sizes_does_not_size_a_convolutional_net():
    line = why_unread("hidden_sizes", Choice("train connect_four", net="conv"))
    assert line == ("--hidden_sizes sizes an MLP: --net conv is sized by --channels and "
                    "--blocks (and its --value_net mlp by --hidden_sizes)")


def test_hidden_sizes_sizes_a_convolutional_nets_mlp_value():
    choice = Choice("train connect_four", net="residual", value_net="mlp")
    assert why_unread("hidden_sizes", choice) is None
    assert why_unread("value_net", choice) is None
    assert why_unread("value_net", C4) == ("--value_net sizes a convolutional net: add "
                                           "--net conv or --net residual")


def test_value_planes_sizes_only_alphazeros_value_head():
    head = Choice("train connect_four", net="residual", value_net="head")
    assert why_unread("value_planes", head) is None
    mlp_value = Choice("train connect_four", net="residual", value_net="mlp")
    assert why_unread("value_planes", mlp_value) == (
        "--value_planes sizes AlphaZero's value head: add --value_net head (--value_net "
        "mlp is sized by --hidden_sizes)")
    assert "--net conv or --net residual" in why_unread("value_planes", C4)


def test_channels_and_blocks_need_a_convolutional_net():
    for name in ("channels", "blocks"):
        assert "--net conv or --net residual" in why_unread(name, C4)
        assert why_unread(name, Choice("train connect_four", net="residual")) is None
        assert why_unread(name, Choice("train sliding_puzzle", net="conv")).startswith(
            f"--{name} does not apply to --train sliding_puzzle")


def test_every_flag_out_of_scope_gets_a_line_in_order():
    lines = out_of_scope(["cache_capacity", "seed", "total_gpu_frac"], Choice("default"))
    assert [line.split()[0] for line in lines] == ["--cache_capacity", "--total_gpu_frac"]


def test_every_scope_names_known_experiments_and_searches():
    for name, scope in SCOPES.items():
        assert scope.experiments and scope.experiments <= set(EXPERIMENTS), name
        assert scope.searches is None or scope.searches <= {
            "astar", "rollout", "mcts", "continuous"}, name


def test_address_is_read_only_where_ray_runs():
    assert why_unread("address", Choice("default")) is None  # ray is among the backends
    assert why_unread("address", Choice("multi_server")) is None
    assert why_unread("address", Choice("continuous", search="continuous")).startswith(
        "--address does not apply to --continuous: it is read by the default experiment "
        "and --multi_server")
    assert why_unread("address", Choice("default", backends=("local", "process"))) == (
        "--address is Ray's: --backends local,process runs no Ray (add ray to "
        "--backends, or use --multi_server)")


def test_num_procs_is_refused_when_self_play_runs_in_this_process():
    assert why_unread("num_procs", Choice("train connect_four", backend="process")) is None
    assert why_unread("num_procs", Choice("train connect_four", backend="ray")) is None
    assert why_unread("num_procs", Choice("train connect_four", backend="local")) == (
        "--num_procs counts self-play workers: --backend local plays self-play in this "
        "process (use --backend process or ray)")
    # --backend is --train connect_four's: it does not narrow the other experiments
    assert why_unread("num_procs", Choice("multi_server", backend="local")) is None
