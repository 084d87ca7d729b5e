"""One benchmark script, this tree against another checkout, in alternating rounds.

Each round runs the script of each tree (its own copy, from its root, with that tree on
``PYTHONPATH``) in a fresh process, in turn, the order alternating from round to round,
and reads the named figures from the JSON object the script prints. For each figure it
reports the ratio this tree over the other, round by round, with its range and median:
both trees see the same load, so the ratio means something on a busy machine where the
figures themselves do not.

Usage: python benchmarks/compare_trees.py --other TREE --rounds 5
       --figure astar.us_per_expansion --figure mcts.simulations_per_s
       -- benchmarks/search_cost.py --repeats 3

A figure is a dotted path into the printed JSON (``local.requests_per_s``); a path that
one tree's output lacks is reported as missing for that tree.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def figure(report: Any, path: str) -> float | None:
    """The number at ``path`` (dotted) in ``report``, or None."""
    node = report
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return float(node) if isinstance(node, (int, float)) else None


def run(tree: str, script: List[str], timeout: float) -> Dict[str, Any]:
    """The JSON object that ``script`` prints, run in ``tree``."""
    env = {**os.environ, "PYTHONPATH": tree, "TF_CPP_MIN_LOG_LEVEL": "3"}
    child = subprocess.Popen([sys.executable, *script], cwd=tree, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = child.communicate(timeout=timeout)
    except BaseException:
        # Stopped (SIGTERM, Ctrl-C, the timeout): the script is asked to end first, so
        # that it ends what it started (a SIGKILL left its server running for good).
        child.terminate()
        try:
            child.communicate(timeout=30)  # (wait() would deadlock on a full pipe)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
        raise
    done = subprocess.CompletedProcess(child.args, child.returncode, out, err)
    if done.returncode != 0:
        raise RuntimeError(f"{script[0]} failed in {tree} (exit {done.returncode}): "
                           f"{done.stderr[-2000:]}")
    start = done.stdout.index("{")  # scripts may print a line or two before it
    return json.loads(done.stdout[start:])


def commit_of(tree: str) -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree,
                          capture_output=True, text=True)
    return done.stdout.strip() or "?"


def main() -> None:
    # SIGTERM (timeout, kill) ends the run as Ctrl-C does, so that the servers and
    # children it started end with it (they outlived it, re-parented to init).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", required=True, help="the other checkout's root")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--figure", action="append", required=True,
                        help="dotted path of a number in the script's JSON (repeatable)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds one run of the script may take")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument("script", nargs=argparse.REMAINDER,
                        help="-- the script (relative to each tree's root) and its flags")
    args = parser.parse_args()
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not script:
        parser.error("name the script after --")
    if args.rounds < 1:
        parser.error(f"--rounds must be an integer >= 1, got {args.rounds}")
    if not args.timeout > 0:
        parser.error(f"--timeout must be more than 0 seconds, got {args.timeout}")
    if not os.path.isfile(os.path.join(args.other, "async_search", "__init__.py")):
        parser.error(f"--other {args.other}: not a checkout (no async_search package)")
    other = os.path.abspath(args.other)
    trees = {"this": ROOT, "other": other}
    values: Dict[str, Dict[str, List[float | None]]] = {
        f: {"this": [], "other": []} for f in args.figure}
    for r in range(args.rounds):
        order = ["this", "other"] if r % 2 == 0 else ["other", "this"]
        for name in order:
            report = run(trees[name], script, args.timeout)
            for f in args.figure:
                values[f][name].append(figure(report, f))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    summary: Dict[str, Any] = {}
    for f, by_tree in values.items():
        ratios = [a / b for a, b in zip(by_tree["this"], by_tree["other"])
                  if a is not None and b]
        summary[f] = {
            "this": by_tree["this"], "other": by_tree["other"],
            "ratio_this_over_other": ({"min": round(min(ratios), 3),
                                       "median": round(statistics.median(ratios), 3),
                                       "max": round(max(ratios), 3),
                                       "rounds": [round(x, 3) for x in ratios]}
                                      if ratios else "missing")}
    report = {"script": script, "rounds": args.rounds, "this_tree": commit_of(ROOT),
              "other_tree": commit_of(other), "figures": summary}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        from async_search.files import write_file

        write_file(args.out, text + "\n")


if __name__ == "__main__":
    main()
