"""Experiments of async_search: batched neural-guided search across processes and Ray.

    python main.py                    # baseline vs async, processes and Ray (A*, 15-puzzle)
    python main.py --search mcts      # the same with MCTS on Connect Four
    python main.py --continuous       # continuous A*, batches up to 1024, worker process
    python main.py --multi_server     # Ray with several servers and client processes
    python main.py --architecture all # self-play through pipe, queue, client topologies
    python main.py --train connect_four     # AlphaZero from scratch: self-play, train, arena
    python main.py --train connect_four --policy gumbel --simulations 32 --reuse_tree
    python main.py --train sliding_puzzle   # a learned 15-puzzle heuristic (DAVI) vs Manhattan
    python main.py --untrained        # the same searches guided by an untrained net

Each run prints its search time, model time, fraction in the model and batch sizes, with
a progress bar over model evaluations while it runs; every run's results are checked
against the baseline's. The plot goes to --save_path, the figures to a JSON beside it.
Bad flags stop the script before anything runs, with one line naming the flag and what
it accepts, and exit status 2; so do a flag the chosen experiment would not read (it
says which experiments read it), an output path that cannot be written (each
output's folder is made and written to before any work) and a module the run needs
that is not installed (it names the extra to install). Ctrl-C and SIGTERM stop a run
with one line that says what had finished and what was saved, exit status 130 and 143
(``-v 1`` adds the traceback), and leave none of its processes, Ray's included.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import math
import os
import re
import signal
import sys
import time

if __name__ == "__main__":  # until main() takes over: nothing has started, nothing to save
    def _stopped_before_start(signum, frame) -> None:
        os.write(2, b"main.py: interrupted before anything ran; nothing was saved\n")
        os._exit(128 + signum)

    signal.signal(signal.SIGINT, _stopped_before_start)
    signal.signal(signal.SIGTERM, _stopped_before_start)

# Quiet TensorFlow's C++ and Python logs before anything imports it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Ray's native crash handler, once its driver connects, prints a stack dump for a SIGTERM
# that lands while Ray starts (before main.py's handler is back): the stop is one line.
os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
logging.getLogger("tensorflow").setLevel(logging.ERROR)

try:
    from absl import app, flags  # noqa: E402
except ModuleNotFoundError as _e:  # a bare install: say what to add, not a traceback
    if _e.name != "absl":
        raise
    sys.stderr.write("main.py: error: main.py needs absl-py, which is not installed: pip "
                     "install -e '.[all]' (or '.[main,plot]' and the extras a run uses)\n")
    sys.exit(2)

from async_search.backends.config import RunConfig  # noqa: E402
from async_search.experiments import config as config_lib  # noqa: E402

FLAGS = flags.FLAGS


def _uvloop_installed() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


# -- what to run ------------------------------------------------------------------------
flags.DEFINE_enum("search", "astar", ["astar", "rollout", "mcts"],
                  "The search: batched A* or budgeted rollouts on the 15-puzzle, or "
                  "AlphaZero MCTS on Connect Four.")
flags.DEFINE_bool("continuous", False, "Run continuous A* from one start, batches up to "
                  "1024, searches in a worker process and the server here.")
flags.DEFINE_bool("multi_server", False, "Run on Ray with --num_servers servers and "
                  "--num_procs client processes.")
flags.DEFINE_enum("architecture", None, ["pipe", "queue", "client", "all"],
                  "Self-play with MCTS on Connect Four through an inference topology: "
                  "pipe (load balancer), queue (central cache manager), client (a cache "
                  "per client), or all three.")
flags.DEFINE_enum("train", None, ["connect_four", "sliding_puzzle"],
                  "Train a net from scratch: AlphaZero self-play on Connect Four, or a "
                  "15-puzzle cost-to-go heuristic by approximate value iteration (DAVI).")
flags.DEFINE_list("backends", ["local", "process", "ray"],
                  "Default experiment: the backends to compare with the baseline.")
flags.DEFINE_bool("skip_sync", False, "Skip the synchronous baseline; results are then "
                  "checked against the first run's.")

# -- the workload -----------------------------------------------------------------------
flags.DEFINE_integer("num_searches", 8, "Searches (starts) per run.")
flags.DEFINE_integer("gnn_budget", None, "Model evaluations each search may spend "
                     "(MCTS: simulations per search); default 20000, 100000 with "
                     "--continuous (one search). 20000 is 17 times what the hardest "
                     "default A* search needs with the trained heuristic at --weight "
                     "0.3 (1155 evaluations): every search solves its puzzle.")
flags.DEFINE_integer("batch_size", 4, "Nodes a search expands per request (A* buffer, "
                     "MCTS leaves per round).")
flags.DEFINE_integer("num_rollouts", 4, "Rollouts per round, in lockstep (--search "
                     "rollout).")
flags.DEFINE_integer("rollout_depth", 24, "Steps of one rollout at most.")
flags.DEFINE_integer("max_in_flight", 512, "Requests continuous A* keeps in flight.")
flags.DEFINE_integer("scramble", 100, "Random moves from the goal to each puzzle start "
                     "(at most 1000000).")
flags.DEFINE_integer("seed", 0, "Seeds the starts, the searches and the network.")
flags.DEFINE_enum("model", "tf", ["tf", "numpy"], "Where the network runs: "
                  "TensorFlow (problems.tf_twin of the NumPy net) or NumPy; the two "
                  "compute bitwise the same outputs. The net is the trained one shipped "
                  "in the package (problems.pretrained: the 15-puzzle heuristic, the "
                  "Connect Four policy-value net) unless --untrained.")
flags.DEFINE_bool("untrained", False, "Guide the searches with an untrained net, seeded "
                  "by --seed, of --hidden_sizes, instead of the trained one: it shows "
                  "the machinery (batches, processes, Ray) but not the point, since its "
                  "A* searches spend their whole budget without solving a puzzle.")
flags.DEFINE_list("hidden_sizes", ["256", "256"], "Widths of the network's hidden "
                  "layers: the untrained net's (--untrained), and the net --train "
                  "trains.")
flags.DEFINE_enum("net", "residual", ["mlp", "conv", "residual"], "--train connect_four: "
                  "the policy-value net: a convolutional net (a 3x3 stem, --blocks plain "
                  "or residual blocks of two 3x3 convolutions, --channels wide, "
                  "AlphaZero's policy head, the value from --value_net), or an MLP of "
                  "--hidden_sizes. Each --net has its own half-hour defaults of "
                  "--iterations, --games_per_iteration, --simulations, --blocks and "
                  "--value_net (HALF_HOUR in main.py).")
flags.DEFINE_enum("features", None, ["planes", "threats"], "--train connect_four: what "
                  "the net reads: the board's planes, or also the cells where each player "
                  "would make four at once (problems.connect_four_threats; the default).")
flags.DEFINE_integer("channels", 16, "--net conv|residual: convolution channels.")
flags.DEFINE_integer("blocks", None, "--net conv|residual: blocks of two 3x3 convolutions "
                     "(default 1 for residual, 2 for conv).")
flags.DEFINE_enum("value_net", None, ["head", "mlp"], "--net conv|residual: the value: "
                  "AlphaZero's head on the trunk, or an MLP of --hidden_sizes on the "
                  "board itself, beside the convolutional policy (default mlp for "
                  "residual, head for conv).")
flags.DEFINE_integer("value_planes", 1, "--net conv|residual: planes the value head reads "
                     "(AlphaZero's 1 squeezes a narrow trunk's board into one plane).")

# -- serving and placement --------------------------------------------------------------
flags.DEFINE_integer("max_batch_size", None, "Most elements per batch (default 256; "
                     "1024 with --continuous; at most 65536).")
flags.DEFINE_float("max_delay", None, "Seconds a partial batch may wait for company "
                   "(default: none, batches leave as soon as the model is free; at most 60).")
flags.DEFINE_integer("num_procs", 2, "Client processes (--multi_server, --architecture; "
                     "--train connect_four: self-play workers; at most 256).")
flags.DEFINE_integer("num_servers", 2, "Model servers (--multi_server, --architecture).")
flags.DEFINE_float("total_gpu_frac", 0.6, "The fraction of each GPU in use that the Ray "
                   "servers on it share, when the cluster has GPUs (--multi_server).")
flags.DEFINE_string("address", None, "Ray: address of a running cluster (default: start "
                    "one here).")
flags.DEFINE_bool("uvloop", _uvloop_installed(), "Run event loops on uvloop (default on "
                  "when installed).")

# -- self-play (--architecture) ---------------------------------------------------------
flags.DEFINE_integer("num_samples", 1000, "Self-play positions to produce.")
flags.DEFINE_integer("simulations", None, "MCTS simulations per self-play move (default "
                     "64; --train connect_four: 32 for --net residual, 64 otherwise).")
flags.DEFINE_integer("games_per_client", 8, "Games each self-play client plays at once.")
flags.DEFINE_integer("cache_capacity", 100_000, "Entries of each result cache (0: none "
                     "kept, in-flight duplicates still merged).")

# -- training (--train) ----------------------------------------------------------------
flags.DEFINE_integer("iterations", None, "--train connect_four: AlphaZero iterations "
                     "(default: about half an hour on 2 cores, 28 for --net residual, 50 "
                     "for mlp, 14 for conv); sliding_puzzle: DAVI rounds (default 250).")
flags.DEFINE_integer("games_per_iteration", None, "--train connect_four: self-play games "
                     "per iteration, played concurrently (default 600 for --net residual, "
                     "300 otherwise).")
flags.DEFINE_integer("train_steps", None, "Optimizer steps per iteration (default 1000) "
                     "or per DAVI round (default 300).")
flags.DEFINE_enum("backend", "process", ["local", "process", "ray"], "--train "
                  "connect_four: where self-play runs: --num_procs worker processes "
                  "(default, the searches' Python on every core), this process, or Ray.")
flags.DEFINE_string("save_dir", None, "Checkpoints, replay buffer and run state (default "
                    "train_<problem> in the folder of --save_path: "
                    "results/train_<problem> when --save_path is left as it is).")
flags.DEFINE_enum("value_target", "mixed", ["outcome", "mixed"], "--train "
                  "connect_four: the value target: the game's result, or its mean with "
                  "the search's root value.")
flags.DEFINE_bool("overlap", False, "--train connect_four: play the next iteration's "
                  "self-play games while the trainer trains and the arena plays; "
                  "promotions are pushed into the running self-play servers (faster, "
                  "not bitwise reproducible).")
flags.DEFINE_bool("resume", False, "--train: continue the run saved in --save_dir.")
flags.DEFINE_integer("eval_games", 20, "--train connect_four: games against each "
                     "baseline per iteration (0: none).")
flags.DEFINE_integer("final_games", 40, "--train connect_four: games per match in the "
                     "final evaluation.")
flags.DEFINE_integer("uct_rollouts", 300, "--train connect_four: rollouts per move of "
                     "the UCT baseline.")
flags.DEFINE_enum("policy", "puct", ["puct", "gumbel"], "--train connect_four: the "
                  "search of self-play and of the evaluation agent: AlphaZero's PUCT "
                  "(visit counts as the policy target) or Gumbel AlphaZero (the improved "
                  "policy as the target; its paper learns with 16-32 simulations, which did not "
                  "match PUCT at 64 here: docs/benchmarks.md).")
flags.DEFINE_enum("policy_target", "visits", ["visits", "improved"], "--train "
                  "connect_four --policy puct: the policy target: the root's visit "
                  "counts (AlphaZero), or its improved policy from the completed "
                  "Q-values (Gumbel AlphaZero's target; the moves still follow the "
                  "visits).")
flags.DEFINE_float("gate_threshold", None, "--train connect_four: the arena score against "
                   "the best net that promotes a candidate to play self-play (default "
                   "0: every candidate, as AlphaZero; 0.55: AlphaGo Zero's gate).")
flags.DEFINE_integer("arena_games", None, "--train connect_four: candidate-against-best "
                     "games per iteration (default 20, which rate the candidate: its Elo; "
                     "40 with --gate_threshold above 0, which promotes on them).")
flags.DEFINE_integer("random_opening_moves", 0, "--train connect_four: each self-play "
                     "game starts after 0..N uniformly random moves (diverse, unbalanced "
                     "positions; the opening's positions are not samples). 0: none.")
flags.DEFINE_bool("reuse_tree", False, "--train connect_four: keep the subtree under "
                  "each move played for the next move's search, in self-play and in the "
                  "evaluation agent's games.")
flags.DEFINE_bool("solve", False, "--train connect_four: MCTS proves values as it "
                  "searches (MCTS-Solver: search.mcts's solve), in self-play and in the "
                  "evaluation agent; positions the terminal ones below settle are not "
                  "searched again.")
flags.DEFINE_integer("accuracy_positions", 50, "--train connect_four: solver-labelled "
                     "positions of each set (end game, middle game; 200 each, the most "
                     "accepted) on which "
                     "the candidate's move accuracy is measured per iteration, the net "
                     "alone and the evaluation agent (0: none).")
flags.DEFINE_integer("strong_uct_rollouts", 1000, "--train connect_four: rollouts per "
                     "move of the stronger UCT baseline.")
flags.DEFINE_integer("strong_uct_games", 10, "--train connect_four: games against the "
                     "stronger UCT baseline per iteration (0: none); the final "
                     "evaluation plays --final_games against it unless this is 0.")
flags.DEFINE_float("weight", 0.3, "Weight of the path cost g in A*'s priority weight * "
                   "g + h (--search astar, --continuous, and the comparison of "
                   "heuristics on Korf's 100 after --train sliding_puzzle). Below 1 is "
                   "batch-weighted A*: the trained heuristic overestimates a little, and "
                   "at 0.3 every default search solves its puzzle in under 5000 "
                   "evaluations, where plain A* (1) spends the 20000 budget on 7 of the "
                   "8 without reaching the goal.")

# -- output -----------------------------------------------------------------------------
flags.DEFINE_string("save_path", "results/results.png", "Where the plot goes, in the "
                    "format its extension names (PNG without one; any matplotlib writes: "
                    ".png, .pdf, .svg, ...); the JSON of every printed figure goes beside "
                    "it (.json). Left at its default, --continuous, --multi_server and "
                    "--architecture write results/continuous.png, "
                    "results/multi_server.png and results/architectures.json instead, "
                    "another --search or --untrained adds its own suffix "
                    "(results/results_mcts.png, results/results_untrained.png, "
                    "results/multi_server_rollout.png), and --train writes "
                    "results/train_<problem>.png, so that no experiment overwrites "
                    "another's.")
flags.DEFINE_bool("progress", True, "Show progress bars.")

_POSITIVE = {
    "num_searches": "searches per run", "gnn_budget": "model evaluations per search",
    "batch_size": "nodes expanded per request", "num_rollouts": "rollouts per round",
    "rollout_depth": "steps per rollout", "max_in_flight": "requests in flight",
    "num_procs": "client processes", "num_servers": "model servers",
    "arena_games": "games per iteration",
    "num_samples": "self-play positions", "simulations": "MCTS simulations per move",
    "games_per_client": "games per client", "iterations": "iterations",
    "games_per_iteration": "games per iteration", "train_steps": "steps per iteration",
    "final_games": "games per match", "uct_rollouts": "rollouts per move",
    "strong_uct_rollouts": "rollouts per move",
}


def _check(name: str, ok, accepts: str) -> None:
    """Registers a validator whose error reads ``--name must be <accepts>, got <value>``."""
    def checker(value) -> bool:
        try:
            good = ok(value)
        except (TypeError, ValueError):
            good = False
        if not good:
            shown = ",".join(value) if isinstance(value, list) else value
            if isinstance(shown, str) and not shown.strip():
                shown = repr(shown)  # an empty value, seen
            raise flags.ValidationError(f"--{name} must be {accepts}, got {shown}")
        return True
    flags.register_validator(name, checker)


#: Caps that turn a typo into a one-line refusal, not a crash after minutes of work: the
#: servers warm the net up at every power of two up to --max_batch_size, each client
#: process holds open files and pipes, and starts are scrambled in Python (about 2 s
#: per million moves).
MAX_BATCH_SIZE = 65_536
MAX_PROCS = 256
MAX_SCRAMBLE = 1_000_000
#: The longest --max_delay: a partial batch waits at most this long for company.
MAX_DELAY_S = 60.0
#: Searches of a run and games of a client are made in Python before any work; a net's
#: blocks are listed one by one to count its weights (AlphaZero's has 19 or 39).
MAX_SEARCHES = 100_000
MAX_BLOCKS = 1_000
#: Rollouts of a round are walks made in Python before its first step, one row each
#: in every request (past a SeedSequence's count, an OverflowError inside the search).
MAX_ROLLOUTS = 65_536

for _name, _what in _POSITIVE.items():
    _check(_name, lambda v: v is None or v >= 1, f"an integer >= 1 ({_what})")
for _name in ("scramble", "seed", "cache_capacity", "eval_games", "accuracy_positions",
              "strong_uct_games", "random_opening_moves"):
    _check(_name, lambda v: v >= 0, "an integer >= 0")
_check("max_batch_size", lambda v: v is None or 1 <= v <= MAX_BATCH_SIZE,
       f"an integer in [1, {MAX_BATCH_SIZE:,}] (elements)")
_check("num_procs", lambda v: v is None or v <= MAX_PROCS,
       f"at most {MAX_PROCS} (client processes)")
_check("scramble", lambda v: v <= MAX_SCRAMBLE, f"at most {MAX_SCRAMBLE:,} (random moves)")
_check("save_dir", lambda v: v is None or bool(v.strip()), "a folder for the run's "
       "checkpoints (leave it out for the default)")
_check("weight", lambda v: 0 <= v < math.inf, "a finite number >= 0 (the weight of the "
       "path cost)")
_check("gate_threshold", lambda v: v is None or 0 <= v <= 1, "an arena score in [0, 1]")
_check("max_delay", lambda v: v is None or 0 <= v <= MAX_DELAY_S,
       f"a number of seconds in [0, {MAX_DELAY_S:g}] (a partial batch that waits longer "
       f"leaves a run's last searches idle)")
_check("total_gpu_frac", lambda v: v is None or 0 < v <= 1, "a fraction in (0, 1]")
_check("backends", lambda v: bool(v) and set(v) <= {"local", "process", "ray"},
       "a comma-separated subset of local,process,ray")
_check("hidden_sizes", lambda v: bool(v) and all(int(w) >= 1 for w in v),
       "comma-separated integers >= 1 (layer widths)")
_check("channels", lambda v: v >= 1, "an integer >= 1")
_check("blocks", lambda v: v is None or 0 <= v <= MAX_BLOCKS,
       f"an integer in [0, {MAX_BLOCKS:,}] (residual blocks)")
_check("num_searches", lambda v: v <= MAX_SEARCHES,
       f"at most {MAX_SEARCHES:,} (searches per run)")
_check("games_per_client", lambda v: v <= MAX_SEARCHES,
       f"at most {MAX_SEARCHES:,} (games per client)")
_check("num_rollouts", lambda v: v <= MAX_ROLLOUTS,
       f"at most {MAX_ROLLOUTS:,} (rollouts per round)")
_check("value_planes", lambda v: v >= 1, "an integer >= 1")
_check("address", lambda v: v is None or bool(v.strip()), "the address of a running Ray "
       "cluster (host:port, ray://host:port or auto)")

#: The most weights a net that main.py builds may have (200 MB in float32): a typo such
#: as --hidden_sizes 99999999999 gets a clear refusal, not a memory error minutes later.
MAX_NET_WEIGHTS = 50_000_000


@dataclasses.dataclass(frozen=True)
class HalfHour:
    """--train connect_four's defaults for one --net, for the flags not given: what
    fits half an hour on 2 cores (docs/benchmarks.md#training-runs)."""

    iterations: int
    games_per_iteration: int
    simulations: int
    blocks: int  # --net conv|residual
    value_net: str  # --net conv|residual


#: By --net. residual: the recipe of the shipped net, a residual 16x1 policy beside an
#: MLP value, 28 iterations of 600 games at 32 simulations (0.90-0.95 against UCT-1000
#: over 4 seeds); mlp: 50 iterations of the 256x256 MLP; conv: 14 of a plain 16x2.
HALF_HOUR = {"residual": HalfHour(28, 600, 32, 1, "mlp"),
             "mlp": HalfHour(50, 300, 64, 2, "head"),
             "conv": HalfHour(14, 300, 64, 2, "head")}

def arena_games(gate_threshold: float) -> int:
    """--arena_games when not given: 40 games where the arena promotes (a gate above 0),
    20 where it only rates (a third of an iteration was evaluation with 40: the arena's
    MCTS-100 on both sides is most of it)."""
    return 40 if gate_threshold > 0 else 20


#: MCTS simulations per move of --architecture's self-play.
SELFPLAY_SIMULATIONS = 64


def c4_flag(name: str):
    """--name as given, else --net's half-hour default (``HALF_HOUR``)."""
    value = FLAGS[name].value
    return getattr(HALF_HOUR[FLAGS.net], name) if value is None else value


def _net_weights(**sizes) -> int:
    """The weights of the largest net main.py would build with these sizes: Connect
    Four's policy-value net (threat planes) or, for an MLP, the 15-puzzle heuristic."""
    from async_search.problems.nets import NetConfig

    configs = [NetConfig("policy_value", "connect_four", features="threats", **sizes)]
    if sizes.get("architecture", "mlp") == "mlp":
        configs.append(NetConfig("heuristic", "sliding_puzzle", **sizes))
    return max(config.parameter_count for config in configs)


def _at_most_max_weights(flag: str, value: str, weights: int) -> bool:
    if weights > MAX_NET_WEIGHTS:
        raise flags.ValidationError(
            f"{flag} {value}: a net of about {weights:,} weights; main.py builds nets of "
            f"at most {MAX_NET_WEIGHTS:,}")
    return True


@flags.validator("hidden_sizes", message="")
def _hidden_sizes_fit(v) -> bool:
    try:
        weights = _net_weights(hidden_sizes=tuple(int(w) for w in v))
    except (TypeError, ValueError):  # not integers >= 1: the check above says so
        return True
    return _at_most_max_weights("--hidden_sizes", ",".join(v), weights)


@flags.multi_flags_validator(["net", "channels", "blocks", "value_planes", "value_net",
                              "hidden_sizes"], message="")
def _conv_net_fits(v) -> bool:
    half_hour = HALF_HOUR[v["net"]]
    blocks = half_hour.blocks if v["blocks"] is None else v["blocks"]
    value_net = half_hour.value_net if v["value_net"] is None else v["value_net"]
    try:
        weights = _net_weights(architecture="residual", channels=v["channels"],
                               blocks=blocks, value_planes=v["value_planes"],
                               value_net=value_net,
                               hidden_sizes=tuple(int(w) for w in v["hidden_sizes"]))
    except (TypeError, ValueError):  # out of range: the checks above say so
        return True
    if value_net == "mlp":
        return _at_most_max_weights("--channels, --blocks, --hidden_sizes",
                                    f"{v['channels']}, {blocks}, "
                                    f"{','.join(v['hidden_sizes'])}", weights)
    return _at_most_max_weights("--channels, --blocks, --value_planes",
                                f"{v['channels']}, {blocks}, {v['value_planes']}",
                                weights)


@flags.multi_flags_validator(["continuous", "multi_server", "architecture", "train"],
                             message="choose one experiment")
def _one_experiment(v) -> bool:
    chosen = [f"--{k}" for k in ("continuous", "multi_server") if v[k]]
    for name in ("architecture", "train"):
        if v[name]:
            chosen.append(f"--{name}={v[name]}")
    if len(chosen) > 1:
        raise flags.ValidationError(f"{' and '.join(chosen)} are separate experiments: "
                                    f"pass one of them")
    return True


@flags.multi_flags_validator(["continuous", "search"], message="")
def _continuous_is_astar(v) -> bool:
    if v["continuous"] and v["search"] != "astar":
        raise flags.ValidationError(f"--continuous runs continuous A*; it takes no "
                                    f"--search={v['search']}")
    return True


@flags.multi_flags_validator(["policy", "policy_target"], message="")
def _improved_target_is_puct(v) -> bool:
    if v["policy"] == "gumbel" and v["policy_target"] != "visits":
        raise flags.ValidationError("--policy_target is PUCT's: --policy gumbel's target "
                                    "is always its improved policy")
    return True


@flags.multi_flags_validator(["policy", "solve"], message="")
def _solve_is_puct(v) -> bool:
    if v["policy"] == "gumbel" and v["solve"]:
        raise flags.ValidationError("--solve is PUCT's: --policy gumbel's search does not "
                                    "prove values")
    return True


@flags.multi_flags_validator(["uct_rollouts", "strong_uct_rollouts", "strong_uct_games"],
                             message="")
def _two_uct_baselines(v) -> bool:
    if v["strong_uct_games"] and v["uct_rollouts"] == v["strong_uct_rollouts"]:
        raise flags.ValidationError(
            f"--uct_rollouts and --strong_uct_rollouts are both {v['uct_rollouts']}: the "
            f"two UCT baselines are scored apart, so give them different rollouts (or "
            f"--strong_uct_games=0 for one baseline)")
    return True


@flags.multi_flags_validator(["num_servers", "num_procs", "total_gpu_frac", "address",
                              "architecture"], message="")
def _servers_fit(v) -> bool:
    if v["architecture"] is not None:  # server processes of its own, no Ray
        from async_search.backends.config import max_servers

        limit = max_servers("process")
        if v["num_servers"] is not None and v["num_servers"] > limit:
            raise flags.ValidationError(
                f"--num_servers={v['num_servers']} is more than --architecture can "
                f"start here (at most {limit} server processes)")
        return True
    if not (v["address"] is None or v["address"].strip()):
        return True  # an empty --address: its own check says so
    try:  # the backends' own check: how many servers they can start here
        for backend in ("ray", "process"):
            RunConfig(backend=backend, num_procs=v["num_procs"] or 1,
                      num_servers=v["num_servers"] or 1,
                      total_gpu_frac=v["total_gpu_frac"], address=v["address"])
    except ValueError as e:
        raise flags.ValidationError(f"--{e}")
    return True


def parse_flags(argv):
    """absl's parsing, but a bad flag is one line on stderr and exit status 2."""
    try:
        rest = FLAGS(argv)
    except flags.Error as e:
        message = " ".join(str(e).split())
        # absl prefixes "flag --x=value: " (or "flags a=.., b=..: "); our own messages
        # already name the flag and the value, so keep just them.
        prefix, _, own = message.partition(": --")
        if own and prefix.startswith("flag"):
            message = "--" + own
        if "Unknown command line flag" in message:
            message += " (see python main.py --helpshort)"
        sys.stderr.write(f"main.py: error: {message}\n")
        sys.exit(2)
    if len(rest) > 1:
        sys.stderr.write(f"main.py: error: unexpected arguments {rest[1:]}: every option "
                         f"is a --flag (see python main.py --helpshort)\n")
        sys.exit(2)
    return rest


def check_outputs(plan) -> None:
    """Raises ValueError (one line: the flag, its value, what is in the way) unless every
    file and folder the run will write can be: checked before any work, so that a typo
    in an output flag costs nothing."""
    from async_search.experiments.outputs import check_output_file, check_output_folder
    from async_search.experiments.suites import json_path_for

    shown = FLAGS.save_path
    if FLAGS.train:
        files = [save_path(f"train_{FLAGS.train}")]
    elif FLAGS.architecture:
        files = []
    else:
        files = [searches_save_path()]
    if files:
        check_plot_format(files[0], json_path_for(files[0]))
        files.append(json_path_for(files[0]))
    else:
        files.append(json_path_for(save_path("architectures")))
    for path in files:
        check_output_file(path, "--save_path", value=shown)
    if FLAGS.train:
        save_dir = plan[2]
        _check_save_dir_apart(save_dir, files)
        if FLAGS.save_dir is not None:
            check_output_folder(save_dir, "--save_dir", value=FLAGS.save_dir)
        else:  # the folder beside the plot: --save_path is what the user gave
            try:
                check_output_folder(save_dir, "--save_path", value=FLAGS.save_path)
            except ValueError as e:
                raise ValueError(f"{e} (the run is saved in {save_dir}, beside the plot, "
                                 f"unless --save_dir says where)") from None


def _check_save_dir_apart(save_dir: str, files: list) -> None:
    """Raises ValueError (one line) when the training folder is the plot's or the JSON's
    path, lies inside one, or holds one where the run writes its own (``state.json``,
    ``gen-<n>``, ``best``, ``heuristic``): the run would train, then fail to write. A
    plot of another name inside the folder is fine."""
    def norm(path):
        return os.path.normcase(os.path.abspath(path))

    folder = norm(save_dir)
    for path, what in zip(files, ("plot", "JSON of figures")):
        file = norm(path)
        inside = file.startswith(folder + os.sep)
        top = os.path.relpath(file, folder).split(os.sep)[0] if inside else ""
        if folder == file or folder.startswith(file + os.sep) or (inside and _run_writes(top)):
            flag, value = (("--save_dir", FLAGS.save_dir) if FLAGS.save_dir is not None
                           else ("--save_path", FLAGS.save_path))
            raise ValueError(f"{flag}={value}: the training folder {save_dir} and the "
                             f"{what} {path} are the same path or one holds the other "
                             f"where the run writes; give them apart")


def _run_writes(name: str) -> bool:
    """Whether a training run writes ``name`` at the top of its folder."""
    from async_search.training.run_folder import STATE

    return (os.path.normcase(name) in (os.path.normcase(STATE), "best", "heuristic")
            or re.fullmatch(r"gen-\d{6,}", name) is not None)


def check_plot_format(path: str, json_path: str) -> None:
    """Raises ValueError (one line) unless matplotlib can write a plot at ``path`` in the
    format its extension names (PNG without one), and ``path`` is not the JSON of
    figures that goes beside it."""
    from matplotlib.backend_bases import FigureCanvasBase

    if os.path.normcase(os.path.abspath(path)) == os.path.normcase(
            os.path.abspath(json_path)):
        raise ValueError(f"--save_path={FLAGS.save_path} names the JSON of figures that "
                         f"goes beside the plot; give the plot's path (e.g. .png)")
    kind = os.path.splitext(path)[1][1:].lower() or "png"
    formats = FigureCanvasBase.get_supported_filetypes()
    if kind not in formats:
        raise ValueError(f"--save_path={FLAGS.save_path}: matplotlib cannot write a plot "
                         f"as .{kind}; use one of "
                         f"{', '.join('.' + f for f in sorted(formats))} (or none: PNG)")
    # A listed format may still need what is not here (.pgf: LaTeX, for its text): a
    # tiny figure with a label, written to memory, finds out now, not after the work.
    import io

    from matplotlib.figure import Figure

    try:
        figure = Figure(figsize=(1, 1))
        figure.text(0.5, 0.5, "x")
        figure.savefig(io.BytesIO(), format=kind)
    except Exception as e:
        reason = " ".join(str(e).split()) or type(e).__name__
        raise ValueError(f"--save_path={FLAGS.save_path}: matplotlib cannot write a plot "
                         f"as .{kind} here ({reason[:200]}); use .png, .pdf or .svg"
                         ) from None


def save_path(experiment: str, variant: str = "") -> str:
    """--save_path, or, when the flag was left at its default, the experiment's own file
    (``default``: the flag's ``results/results.png``), with ``variant`` after its name."""
    if FLAGS["save_path"].present:
        return FLAGS.save_path
    folder, name = os.path.split(FLAGS.save_path)
    stem = os.path.splitext(name)[0] if experiment == "default" else experiment
    return os.path.join(folder, f"{stem}{variant}.png")


def searches_kind() -> str:
    """The searches experiment chosen: default, continuous or multi_server."""
    return ("continuous" if FLAGS.continuous else "multi_server" if FLAGS.multi_server
            else "default")


def searches_save_path() -> str:
    """Where a searches experiment's plot goes: ``save_path`` of its kind, and, unless
    --save_path was given, the search and the net after the name when they are not the
    default's (``results/results_mcts.png``, ``results/results_untrained.png``), so that
    no run overwrites the A* default's figures."""
    variant = "" if FLAGS.continuous or FLAGS.search == "astar" else f"_{FLAGS.search}"
    if FLAGS.untrained:
        variant += "_untrained"
    return save_path(searches_kind(), variant)


def _command() -> str:
    return "python " + " ".join(os.path.basename(a) if i == 0 else a
                                for i, a in enumerate(sys.argv))


def _search_config(search: str) -> config_lib.SearchConfig:
    continuous = search == "continuous"
    budget = FLAGS.gnn_budget or (100_000 if continuous else 20_000)
    return config_lib.SearchConfig(
        search=search, num_searches=1 if continuous else FLAGS.num_searches,
        gnn_budget=budget, batch_size=FLAGS.batch_size, weight=FLAGS.weight,
        num_rollouts=FLAGS.num_rollouts, rollout_depth=FLAGS.rollout_depth,
        max_in_flight=FLAGS.max_in_flight, scramble=FLAGS.scramble, seed=FLAGS.seed)


def _model_config(max_batch_size: int) -> config_lib.ModelConfig:
    return config_lib.ModelConfig(kind=FLAGS.model, trained=not FLAGS.untrained,
                                  hidden_sizes=tuple(int(w) for w in FLAGS.hidden_sizes),
                                  seed=FLAGS.seed, max_batch_size=max(1024, max_batch_size))


_TITLES = {"astar": "batched A* on the 15-puzzle", "rollout": "rollouts on the 15-puzzle",
           "mcts": "MCTS on Connect Four", "continuous": "continuous A* on the 15-puzzle"}


def build_experiment():
    """The experiment the flags ask for (checked: ValueError before anything runs)."""
    from async_search.experiments import suites

    if FLAGS.continuous:
        batch = FLAGS.max_batch_size or 1024
        runs = suites.continuous_runs(max_batch_size=batch, use_uvloop=FLAGS.uvloop,
                                      skip_sync=FLAGS.skip_sync)
        search = "continuous"
        title = f"--continuous: {_TITLES[search]}, batches up to {batch}"
    elif FLAGS.multi_server:
        batch = FLAGS.max_batch_size or 256
        runs = suites.multi_server_runs(
            num_procs=FLAGS.num_procs, num_servers=FLAGS.num_servers,
            total_gpu_frac=FLAGS.total_gpu_frac, max_batch_size=batch,
            use_uvloop=FLAGS.uvloop, skip_sync=FLAGS.skip_sync, address=FLAGS.address)
        search = FLAGS.search
        title = f"--multi_server: {_TITLES[search]} on Ray"
    else:
        batch = FLAGS.max_batch_size or 256
        runs = suites.default_runs(max_batch_size=batch, use_uvloop=FLAGS.uvloop,
                                   skip_sync=FLAGS.skip_sync, backends=FLAGS.backends)
        search = FLAGS.search
        title = f"{_TITLES[search]}: baseline vs batched serving"
    if FLAGS.max_delay is not None:
        runs = tuple(dataclasses.replace(r, max_delay=FLAGS.max_delay) for r in runs)
    if FLAGS.address is not None:
        runs = tuple(dataclasses.replace(r, address=FLAGS.address)
                     if r.backend == "ray" else r for r in runs)
        _check_address(FLAGS.address)
    return suites.Experiment(title, _search_config(search), _model_config(batch), runs)


def _check_address(address: str) -> None:
    """Raises ValueError (one line) when --address, host:port or ray://host:port, takes
    no connection: before any work, not after ray.init's minutes of retries."""
    from async_search.ray_init import check_reachable

    try:
        check_reachable(address)
    except ConnectionError as e:
        raise ValueError(f"--address={address}: {e}") from None


def run_searches_experiment(experiment, done: "Done | None" = None) -> int:
    """Runs a checked Experiment, printing each run; returns the exit status."""
    from async_search.experiments import format_report, format_table, run_experiment
    from async_search.experiments.workloads import make_workload

    done = done or Done()
    done.expect("runs", len(experiment.runs),
                f" ({experiment.search.num_searches} searches each)")
    print(experiment.title)
    workload = make_workload(experiment.search, experiment.model)  # the starts, once
    print(workload.describe())
    print(flush=True)

    def on_report(report):
        done.finished += 1
        print(format_report(report), flush=True)

    def on_failure(name, error):
        done.finished += 1
        print(f"FAILED {name}: {error}", flush=True)

    from async_search.errors import FileWriteError

    try:
        result = run_experiment(experiment, save_path=searches_save_path(),
                                show_progress=FLAGS.progress, on_report=on_report,
                                on_failure=on_failure, command=_command(),
                                workload=workload)
    except FileWriteError as e:  # a full disk: what was written is whole, and named
        return _one_line_error(e)
    print()
    print(format_table(result.reports))
    if result.png_path:
        print(f"\nSaved the plot to {result.png_path} and the figures to "
              f"{result.json_path}")
    mismatched = [r for r in result.reports if r.matches_baseline is False]
    for r in mismatched:
        print(f"ERROR: {r.name}'s results differ from the reference run's: {r.mismatch}",
              file=sys.stderr)
    for name, error in result.failures:
        print(f"ERROR: {name} failed: {error}", file=sys.stderr)
    return 0 if result.ok else 1


def build_architectures():
    """What --architecture asks for: (names, self-play, topology, model), checked."""
    from async_search.experiments import architectures

    names = (architectures.ARCHITECTURES if FLAGS.architecture == "all"
             else (FLAGS.architecture,))
    from async_search.training.selfplay import SelfPlayConfig

    samples = architectures.SamplesConfig(
        num_samples=FLAGS.num_samples, games_per_client=FLAGS.games_per_client,
        selfplay=SelfPlayConfig(simulations=FLAGS.simulations or SELFPLAY_SIMULATIONS,
                                num_parallel=FLAGS.batch_size, seed=FLAGS.seed))
    topology = architectures.TopologyConfig(
        num_clients=FLAGS.num_procs, num_servers=FLAGS.num_servers,
        cache_capacity=FLAGS.cache_capacity, max_batch_size=FLAGS.max_batch_size or 256,
        max_delay=FLAGS.max_delay, use_uvloop=FLAGS.uvloop)
    return names, samples, topology, _model_config(topology.max_batch_size)


def run_architecture_experiment(plan, done: "Done | None" = None) -> int:
    """Runs the self-play topologies, printing each; returns the exit status."""
    from async_search.experiments import architectures

    names, samples, topology, model = plan
    done = done or Done()
    done.expect("architectures", len(names))
    print(f"--architecture={FLAGS.architecture}: {samples.describe()}; "
          f"{topology.describe()}; {model.describe()}\n", flush=True)

    def on_report(report):
        done.finished += 1
        print(architectures.format_architecture(report), flush=True)

    from async_search.errors import FileWriteError

    try:
        result = architectures.run_architectures(
            names, samples, topology, model, save_path=save_path("architectures"),
            show_progress=FLAGS.progress, command=_command(), on_report=on_report)
    except FileWriteError as e:  # a full disk: what was written is whole, and named
        return _one_line_error(e)
    print()
    print(architectures.format_architecture_table(result.reports))
    if result.json_path:
        print(f"\nSaved the figures to {result.json_path}")
    if not result.samples_equal:
        print("ERROR: the architectures produced different samples (the model is "
              "row-independent, so they must not)", file=sys.stderr)
    for name, error in result.failures:
        print(f"ERROR: {name} failed: {error}", file=sys.stderr)
    return 0 if result.ok else 1


def build_training():
    """What --train asks for: (config, held-out config or None, save_dir), checked."""
    save_dir = FLAGS.save_dir if FLAGS.save_dir is not None else os.path.join(
        os.path.dirname(FLAGS.save_path) or ".", f"train_{FLAGS.train}")
    if FLAGS.train == "connect_four":
        from async_search.training import CommanderConfig

        _check_accuracy_positions()
        defaults = CommanderConfig()
        gate_threshold = (defaults.gate_threshold if FLAGS.gate_threshold is None
                          else FLAGS.gate_threshold)
        config = CommanderConfig(
            iterations=c4_flag("iterations"),
            games_per_iteration=c4_flag("games_per_iteration"),
            selfplay=dataclasses.replace(defaults.selfplay,
                                         simulations=c4_flag("simulations"),
                                         value_target=FLAGS.value_target,
                                         policy=FLAGS.policy, reuse_tree=FLAGS.reuse_tree,
                                         random_opening_moves=FLAGS.random_opening_moves,
                                         solve=FLAGS.solve,
                                         policy_target=FLAGS.policy_target),
            eval_policy=FLAGS.policy, eval_reuse_tree=FLAGS.reuse_tree,
            eval_solve=FLAGS.solve,
            accuracy_positions=FLAGS.accuracy_positions,
            strong_uct_rollouts=FLAGS.strong_uct_rollouts,
            strong_uct_games=FLAGS.strong_uct_games,
            train_steps=FLAGS.train_steps or defaults.train_steps,
            hidden_sizes=tuple(int(w) for w in FLAGS.hidden_sizes),
            architecture=FLAGS.net, channels=FLAGS.channels, blocks=c4_flag("blocks"),
            value_planes=FLAGS.value_planes, value_net=c4_flag("value_net"),
            features=FLAGS.features or defaults.features,
            eval_games=FLAGS.eval_games, uct_rollouts=FLAGS.uct_rollouts,
            backend=FLAGS.backend,
            num_procs=FLAGS.num_procs if FLAGS.backend != "local" else 1,
            max_batch_size=FLAGS.max_batch_size or defaults.max_batch_size,
            seed=FLAGS.seed, overlap=FLAGS.overlap, gate_threshold=gate_threshold,
            arena_games=FLAGS.arena_games or arena_games(gate_threshold))
        if FLAGS.resume:
            from async_search.training import Commander
            _check_resume(Commander, config, save_dir)
        return config, None, save_dir
    from async_search.experiments.heuristic_training import HeldOutConfig
    from async_search.training import Davi, DaviConfig

    defaults = DaviConfig()
    config = DaviConfig(rounds=FLAGS.iterations or defaults.rounds,
                        train_steps=FLAGS.train_steps or defaults.train_steps,
                        hidden_sizes=tuple(int(w) for w in FLAGS.hidden_sizes),
                        seed=FLAGS.seed)
    held_out = HeldOutConfig(weight=FLAGS.weight, budget=FLAGS.gnn_budget or 20_000,
                             buffer_size=FLAGS.batch_size if FLAGS["batch_size"].present
                             else 16, max_batch_size=FLAGS.max_batch_size or 1024)
    if FLAGS.resume:
        _check_resume(Davi, config, save_dir)
    return config, held_out, save_dir


def _check_accuracy_positions() -> None:
    """Raises ValueError (one line) for --accuracy_positions above the size of the
    solver-labelled sets: the run would use fewer than it reports."""
    from async_search.problems.solved_positions import connect_four_positions
    from async_search.training.commander import ACCURACY_STAGES

    most = min(len(connect_four_positions(stage)) for stage in ACCURACY_STAGES)
    if FLAGS.accuracy_positions > most:
        raise ValueError(f"--accuracy_positions={FLAGS.accuracy_positions} is more than "
                         f"the solver-labelled sets hold (at most {most} each)")


def _check_resume(trainer, config, save_dir: str) -> None:
    """--resume, before any work: a run is saved in save_dir, its state.json is whole,
    its parameters are these and it has done no more iterations (rounds) than
    --iterations asks for (ValueError, or CheckpointError naming the file: one line,
    exit 2)."""
    if not os.path.exists(os.path.join(save_dir, "state.json")):
        where = "" if FLAGS.save_dir is not None else (
            "; without --save_dir the run is beside --save_path's plot: give the run's "
            "--save_path, or its folder as --save_dir")
        raise ValueError(f"--resume: no saved run in {save_dir} (state.json is "
                         f"missing){where}; run without --resume first")
    done = trainer.check_resume(config, save_dir)  # the iterations (rounds) it has done
    asked = config.iterations if FLAGS.train == "connect_four" else config.rounds
    if done > asked:
        unit = "iterations" if FLAGS.train == "connect_four" else "rounds"
        given = (f"--iterations={asked}" if FLAGS["iterations"].present
                 else f"--iterations (default {asked})")
        raise ValueError(f"--resume: the run in {save_dir} has {done} {unit} saved, "
                         f"more than {given}: pass --iterations={done} to evaluate it "
                         f"again, or more to continue it")


def run_training_experiment(plan) -> int:
    """Runs --train; prints the tables; returns the exit status. A damaged saved file
    or a file that cannot be written ends it with one line naming the file (``-v 1``
    adds the traceback) and status 1; what was committed stays for --resume. A folder
    that another run holds ends it at once with one line and status 2."""
    from async_search.errors import CheckpointError, FileWriteError
    from async_search.training.run_folder import RunFolderBusyError, held

    try:
        with held(plan[2]):  # one run at a time in a folder
            return _run_training(plan)
    except RunFolderBusyError as e:
        sys.stderr.write(f"main.py: error: --save_dir: {e}\n")
        return 2
    except (CheckpointError, FileWriteError) as e:
        return _one_line_error(e)
    except OSError as e:  # the machine's limit, not a fault: say so as the others do
        if e.errno in (errno.EMFILE, errno.ENFILE):
            return _one_line_error(e)
        raise


def _one_line_error(e: BaseException) -> int:
    """Prints ``e`` as one line (``-v 1`` adds the traceback); returns exit status 1."""
    sys.stdout.flush()
    if FLAGS.verbosity >= 1:
        import traceback
        traceback.print_exception(e)
    sys.stderr.write(f"main.py: error: {' '.join(str(e).split())}\n")
    return 1


def _run_training(plan) -> int:
    config, held_out, save_dir = plan
    png = save_path(f"train_{FLAGS.train}")
    if FLAGS.train == "connect_four":
        from async_search.experiments.training import (format_final,
                                                       run_connect_four_training)

        search = {"puct": "MCTS", "gumbel": "Gumbel MCTS"}[config.selfplay.policy]
        reuse = ", tree reuse" if config.selfplay.reuse_tree else ""
        if config.selfplay.random_opening_moves:
            reuse += f", after 0-{config.selfplay.random_opening_moves} random moves"
        if config.selfplay.solve:
            reuse += ", proving values"
        if config.selfplay.policy == "puct" and config.selfplay.policy_target == "improved":
            reuse += ", the improved policy as the target"
        print(f"--train connect_four: a {config.net.describe()} policy-value net, "
              f"{config.iterations} iterations of "
              f"{config.games_per_iteration} self-play games ({search}, "
              f"{config.selfplay.simulations} simulations{reuse}), {config.train_steps} "
              f"training steps, arena of {config.arena_games} games (promote at "
              f"{config.gate_threshold}), {config.eval_games} games against each baseline "
              f"({config.strong_uct_games} against UCT-{config.strong_uct_rollouts}), move "
              f"accuracy on {config.accuracy_positions} end-game and middle-game "
              f"positions; self-play on {config.backend}; saved in {save_dir}\n",
              flush=True)
        result = run_connect_four_training(
            config, save_dir=save_dir, resume=FLAGS.resume, png_path=png,
            final_games=FLAGS.final_games, final_simulations=config.eval_simulations,
            show_progress=FLAGS.progress, command=_command(),
            print_fn=lambda line: print(line, flush=True),
            final_strong_uct_games=FLAGS.final_games if config.strong_uct_games else 0)
        print()
        print(format_final(result["final_evaluation"], FLAGS.final_games,
                           config.eval_simulations, solve=config.eval_solve))
        print(f"\nBest net: version {result['best_version']}, checkpoint "
              f"{os.path.join(save_dir, 'best')}")
    else:
        from async_search.experiments.heuristic_training import (format_comparison,
                                                                 run_heuristic_training)

        print(f"--train sliding_puzzle: DAVI, {config.rounds} rounds of "
              f"{config.states_per_round} states (1..{config.max_scramble} moves from the "
              f"goal), {config.train_steps} steps each; saved in {save_dir}\n", flush=True)
        result = run_heuristic_training(config, held_out, save_dir=save_dir, png_path=png,
                                        resume=FLAGS.resume,
                                        show_progress=FLAGS.progress, command=_command(),
                                        print_fn=lambda line: print(line, flush=True))
        print()
        print(format_comparison(result["korf100"], held_out))
        print(f"\nHeuristic checkpoint: {result['checkpoint']}")
    print(f"\nSaved the plot to {result['png_path']} and the figures to "
          f"{result['json_path']}")
    return 0


class Done:
    """What a run has finished and where it writes: the line that a stop prints."""

    def __init__(self) -> None:
        self.unit, self.total, self.each = "", 0, ""
        self.finished = 0
        self.outputs: list = []  # the files the run writes when its work is done
        self.save_dir: str | None = None  # --train: where each iteration is committed
        self.since = time.time()

    def expect(self, unit: str, total: int, each: str = "") -> None:
        self.unit, self.total, self.each = unit, total, each

    def describe(self) -> str:
        """``2 of 4 runs finished (8 searches each); nothing was saved``, or what was."""
        parts = []
        if self.unit and self.save_dir is None:  # --train: what is committed counts
            parts.append(f"{self.finished} of {self.total} {self.unit} finished{self.each}")
        saved = [p for p in self.outputs
                 if os.path.isfile(p) and os.path.getmtime(p) >= self.since]
        committed = self._committed()
        if committed:
            parts.append(committed)
        if saved:  # --train's figures too, written after its last commit
            parts.append("saved " + " and ".join(saved))
        elif not committed:
            parts.append("nothing was saved")
        return "; ".join(parts)

    def _committed(self) -> str:
        """--train: the iterations saved in --save_dir, which --resume continues."""
        if self.save_dir is None:
            return ""
        state = os.path.join(self.save_dir, "state.json")
        if not os.path.isfile(state) or (os.path.getmtime(state) < self.since
                                         and not FLAGS.resume):
            return ""  # none yet, or an earlier run's that this one starts over
        try:
            import json

            with open(state) as f:
                data = json.load(f)
            count = next(data[k] for k in ("iteration", "round", "rounds_done")
                         if isinstance(data.get(k), int))
        except Exception:  # another layout, or torn: say where without the count
            return f"the run saved in {self.save_dir} continues with --resume"
        total = f" of {self.total}" if self.total else ""
        return (f"{count}{total} {self.unit} are saved in {self.save_dir} (--resume "
                f"continues the run)")


def _outputs(plan) -> tuple:
    """(files written when the work is done, the training folder or None)."""
    from async_search.experiments.suites import json_path_for

    if FLAGS.train:
        png = save_path(f"train_{FLAGS.train}")
        return [json_path_for(png), png], plan[2]
    if FLAGS.architecture:
        return [json_path_for(save_path("architectures"))], None
    png = searches_save_path()
    return [json_path_for(png), png], None


def check_flag_scope() -> None:
    """Raises ValueError (one line) for a flag given on the command line that the chosen
    experiment would not read (``experiments.flag_scope``): a flag that does nothing
    is a mistake to point out, not to ignore."""
    from async_search.experiments import flag_scope

    if FLAGS.train:
        experiment = f"train {FLAGS.train}"
    elif FLAGS.architecture:
        experiment = flag_scope.ARCHITECTURE
    else:
        experiment = searches_kind()
    choice = flag_scope.Choice(experiment,
                               search="continuous" if FLAGS.continuous else FLAGS.search,
                               untrained=FLAGS.untrained, net=FLAGS.net,
                               value_net=c4_flag("value_net"),
                               backends=tuple(FLAGS.backends), backend=FLAGS.backend)
    unread = flag_scope.out_of_scope(
        [name for name in flag_scope.SCOPES if FLAGS[name].present], choice)
    if unread:
        raise ValueError("; ".join(unread))


def needed_modules() -> dict:
    """The optional modules this run imports, each with why: checked before any work,
    not met as a traceback minutes into it."""
    needs = {"matplotlib": "the plots"}
    if not FLAGS.architecture:
        needs["seaborn"] = "the plots"
    if FLAGS.progress:
        needs["tqdm"] = "the progress bars; --noprogress for none"
    if FLAGS.train:
        needs["tensorflow"] = "training a net"
    elif FLAGS.model == "tf":
        needs["tensorflow"] = "--model tf; --model numpy runs without it"
    if FLAGS.multi_server:
        needs["ray"] = "--multi_server"
    elif FLAGS.train and FLAGS.backend == "ray":
        needs["ray"] = "--backend ray"
    elif not (FLAGS.train or FLAGS.architecture or FLAGS.continuous) and (
            "ray" in FLAGS.backends):  # (--continuous runs a worker process, no Ray)
        needs["ray"] = "--backends with ray; --backends local,process leaves it out"
    return needs


def check_installed() -> None:
    """Raises ValueError (one line) naming the first module the run needs that is not
    installed, why, and the extra that installs it."""
    import importlib.util

    from async_search.extras import EXTRA_OF

    for module, why in needed_modules().items():
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"this run needs {module} ({why}), which is not installed: "
                             f"pip install -e '.[{EXTRA_OF[module]}]' (every extra "
                             f"main.py can use: pip install -e '.[all]')")


def _check_and_run(done: Done) -> int:
    """Checks every parameter and output path (exit 2 before any work), then runs."""
    try:
        check_installed()
    except ValueError as e:
        sys.stderr.write(f"main.py: error: {e}\n")
        sys.exit(2)
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    try:  # every parameter is checked here, before anything runs
        check_flag_scope()
        if FLAGS.train:
            plan = build_training()
        elif FLAGS.architecture:
            plan = build_architectures()
        else:
            plan = build_experiment()
        check_outputs(plan)
    except ValueError as e:  # one the flag validators let through
        sys.stderr.write(f"main.py: error: {' '.join(str(e).split())}\n")
        sys.exit(2)
    done.outputs, done.save_dir = _outputs(plan)
    if FLAGS.train:
        config = plan[0]
        if FLAGS.train == "sliding_puzzle":  # counted by what is committed
            done.expect("rounds", config.rounds)
        else:
            done.expect("iterations", config.iterations)
        return run_training_experiment(plan)
    if FLAGS.architecture:
        return run_architecture_experiment(plan, done)
    return run_searches_experiment(plan, done)


def _exit_now(status: int) -> None:
    """Exits after a stop without the interpreter's teardown: the guard has ended every
    process, and a Ray cut off while it connected can crash in its own teardown (a
    SIGSEGV in its threads). multiprocessing's exit step still runs, so that what its
    queues registered is released and not reported as leaked."""
    import multiprocessing.util

    multiprocessing.util._exit_function()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(argv) -> None:
    del argv
    from async_search.experiments.stops import EXIT_STATUS, SIGNAL_NAMES, RunGuard

    start = time.perf_counter()
    done, stop = Done(), None
    # Ctrl-C and SIGTERM take one path: the run's finally clauses run, then the guard
    # stops Ray and ends whatever process of the run is left; after it, both are
    # ignored while the outcome is printed.
    with RunGuard(ignore_after=True) as guard:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # asyncio's goes over it
        try:
            status = _check_and_run(done)
        except BaseException as e:
            stop = guard.stopped_by(e)
            if stop is None:
                raise
            error = e
    if stop is not None:
        sys.stdout.flush()
        if FLAGS.verbosity >= 1:
            import traceback
            traceback.print_exception(error)
        sys.stderr.write(f"main.py: interrupted by {SIGNAL_NAMES[stop]}: "
                         f"{done.describe()}\n")
        _exit_now(EXIT_STATUS[stop])
    if status == 0:  # an error's one line (or ERROR lines) is the run's last word
        print(f"Finished in {time.perf_counter() - start:.1f} s")
    sys.exit(status)


if __name__ == "__main__":
    # A path that the output's encoding cannot spell (PYTHONIOENCODING=ascii, a
    # non-ASCII --save_path) is printed escaped, not a traceback after the work is saved.
    sys.stdout.reconfigure(errors="backslashreplace")
    app.run(main, flags_parser=parse_flags)
