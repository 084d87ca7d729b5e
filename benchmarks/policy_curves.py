"""Training runs side by side against their wall time: Gumbel against PUCT, or any runs.

Reads the JSON that ``python main.py --train connect_four`` writes beside its plot, for
two or more runs (``--run NAME=PATH``), and draws, against each run's cumulative
training time (self-play, training and evaluation; the final evaluation left out):

- Elo against UCT-300, a fixed opponent, from each iteration's games against it
  (``elo_difference`` of the score, clipped by half a game), and its rolling mean over
  ``--window`` iterations: the rating that runs of different searches share;
- the chain Elo each run prints (the best net's plus what the arena implies; untrained
  net = 0): comparable only within a run, since each run's nets rate each other;
- move accuracy on the solver-labelled sets, the net alone and the run's search agent;
- the score against UCT-1000, where the runs played it;
- each run's final evaluation (the same PUCT agent for every run, 40 games a match).

The lines are rolling means over ``--window`` iterations (20 games an iteration against
UCT-300 put about 80 Elo of noise on each point).

It also reports each run's figures at equal wall time (the end of the shortest run) and
at the end, and the final evaluation (the same PUCT agent for every run). One JSON
object, printed and written to ``--out``; the figure to ``--png``.

Usage: python benchmarks/policy_curves.py --run puct=runs/puct.json
       --run gumbel=runs/gumbel.json [--window 4] [--out PATH] [--png PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from typing import Any, Dict, List

import numpy as np

from async_search.files import write_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def curves(run: Dict[str, Any], window: int) -> Dict[str, List[float]]:
    """Per iteration: minutes since the start, Elo against UCT-300 (and its rolling
    mean), chain Elo, move accuracies and the UCT-1000 score."""
    from async_search.training import elo_difference

    games = run["config"]["eval_games"]
    rows = run["iterations"]
    minutes = list(np.cumsum([r["iteration_s"] for r in rows]) / 60.0)
    vs_uct = [elo_difference(r["scores"]["uct300"], games) for r in rows]
    out = {"minutes": [round(m, 3) for m in minutes],
           "elo_vs_uct300": [round(e, 1) for e in vs_uct],
           "elo_vs_uct300_rolling": [round(e, 1) for e in rolling(vs_uct, window)],
           "chain_elo": [round(r["elo"], 1) for r in rows]}
    for key in ("net_end", "net_middle", "mcts_end", "mcts_middle"):
        out[key] = [r.get("accuracy", {}).get(key) for r in rows]
    strong = [k for k in rows[0]["scores"] if k.startswith("uct") and k != "uct300"]
    if strong:
        out[f"{strong[0]}_score"] = [r["scores"].get(strong[0]) for r in rows]
    return out


def net_of(config: Dict[str, Any]) -> str:
    """The run's net in short (``mlp 256x256``, ``residual 16x2``); runs saved before
    the architectures existed trained MLPs."""
    architecture = config.get("architecture", "mlp")
    if architecture == "mlp":
        return "mlp " + "x".join(str(h) for h in config.get("hidden_sizes", []))
    return f"{architecture} {config.get('channels')}x{config.get('blocks')}"


def run_label(name: str, run: Dict[str, Any]) -> str:
    """``name (net, N simulations)``; the net left out when the name is the net."""
    net = net_of(run["config"])
    simulations = run["config"]["selfplay"]["simulations"]
    return f"{name} ({'' if net == name else net + ', '}{simulations} simulations)"


def at_minutes(curve: Dict[str, List[float]], minutes: float) -> Dict[str, Any]:
    """Each figure at the last iteration that ended by ``minutes``."""
    done = [i for i, m in enumerate(curve["minutes"]) if m <= minutes + 1e-9]
    i = done[-1] if done else 0
    return {"iteration": i + 1, **{k: v[i] for k, v in curve.items()}}


def rolling(values: List[float | None], window: int) -> List[float]:
    """The mean of each value and the ``window - 1`` before it (None left out)."""
    out = []
    for i in range(len(values)):
        seen = [v for v in values[max(0, i + 1 - window):i + 1] if v is not None]
        out.append(float(np.mean(seen)) if seen else float("nan"))
    return out


def plot(named: Dict[str, Dict[str, List[float]]], finals: Dict[str, Any], path: str,
         title: str, window: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(18, 9))
    (elo, chain, strong), (net, agent, final) = axes
    colors = [c["color"] for c in plt.rcParams["axes.prop_cycle"]]
    for (name, c), color in zip(named.items(), colors):
        m = c["minutes"]
        elo.plot(m, c["elo_vs_uct300"], "o", color=color, alpha=0.3, ms=4)
        elo.plot(m, c["elo_vs_uct300_rolling"], "-", color=color, lw=2, label=name)
        chain.plot(m, c["chain_elo"], "o-", color=color, ms=3, label=name)
        key = next((k for k in c if k.endswith("_score")), None)
        if key is not None:
            strong.plot(m, rolling(c[key], window), "-", color=color, lw=2, label=name)
        for ax, who in ((net, "net"), (agent, "mcts")):
            for stage, style in (("end", "-"), ("middle", "--")):
                values = c[f"{who}_{stage}"]
                if any(v is not None for v in values):
                    ax.plot(m, rolling(values, window), style, color=color,
                            label=f"{name}, {stage} game")
    elo.axhline(0, color="grey", lw=0.8)
    elo.set(title="Elo against UCT-300 (dots: one iteration's 20 games)",
            ylabel="Elo")
    chain.set(title="chain Elo: each run's nets against each other (own scale)",
              ylabel="Elo")
    strong.set(title="score against UCT-1000", ylabel="score", ylim=(-0.02, 1.02))
    net.set(title="move accuracy of the net alone (solver-labelled)",
            ylabel="fraction optimal")
    agent.set(title="move accuracy of the run's search agent", ylabel="fraction optimal")
    for ax in (elo, chain, strong, net, agent):
        ax.set_xlabel(f"training time (min); lines: rolling mean of {window} iterations"
                      if ax is not chain else "training time (min)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    matches = list(dict.fromkeys(k for f in finals.values() if f for k in f))
    width = 0.8 / max(1, len(finals))
    for k, ((name, f), color) in enumerate(zip(finals.items(), colors)):
        if f:
            final.bar([i + (k - (len(finals) - 1) / 2) * width for i in range(len(matches))],
                      [f[m]["score"] for m in matches], width, color=color, label=name)
    final.set_xticks(range(len(matches)),
                     [m.replace("mcts_vs_", "vs ").replace("_", " ") for m in matches])
    final.set(title="final evaluation: one PUCT agent for all, 40 games",
              ylabel="score", ylim=(0, 1.05))
    final.legend(fontsize=7)
    final.grid(alpha=0.3, axis="y")
    # Many runs make a long title: wrap it to the figure's width rather than clip it.
    fig.suptitle("\n".join(textwrap.wrap(title, width=180)))
    fig.tight_layout()
    write_file(path, lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)


def main() -> None:
    # Before any work: the plot came last, after the JSON was written, as a traceback.
    from async_search.extras import import_extra

    try:
        import_extra("matplotlib", "benchmarks/policy_curves.py")
    except ModuleNotFoundError as e:
        sys.exit(f"policy_curves.py: {e}")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, metavar="NAME=PATH",
                        help="a training run's JSON (main.py --train connect_four)")
    parser.add_argument("--window", type=int, default=4,
                        help="iterations of the rolling mean of the Elo against UCT-300")
    parser.add_argument("--out", default=os.path.join(ROOT, "results", "benchmarks",
                                                      "policy_curves.json"))
    parser.add_argument("--png", default=None,
                        help="the figure (default: --out with .png)")
    args = parser.parse_args()
    if args.window < 1:
        parser.error(f"--window must be at least 1, got {args.window}")
    runs: Dict[str, Dict[str, Any]] = {}
    for item in args.run:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            parser.error(f"--run takes NAME=PATH, got {item!r}")
        try:
            with open(path) as f:
                runs[name] = json.load(f)
        except (OSError, ValueError) as e:
            parser.error(f"cannot read {path}: {e}")
        if not isinstance(runs[name], dict) or not runs[name].get("iterations"):
            parser.error(f"{path} holds no iterations (not the JSON of main.py --train "
                         f"connect_four?)")
    named = {}
    for name, run in runs.items():
        try:
            named[name] = curves(run, args.window)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            parser.error(f"run {name!r} is not the JSON of main.py --train connect_four: "
                         f"{type(e).__name__}: {e}")
    equal = min(c["minutes"][-1] for c in named.values())
    report = {
        "runs": {name: {"command": run.get("command"),
                        "policy": run["config"]["selfplay"].get("policy", "puct"),
                        "simulations": run["config"]["selfplay"]["simulations"],
                        "net": net_of(run["config"]),
                        "iterations": len(run["iterations"]),
                        "training_min": round(named[name]["minutes"][-1], 2),
                        "final_evaluation": run.get("final_evaluation", {}).get("trained"),
                        "at_equal_time": at_minutes(named[name], equal),
                        "at_end": at_minutes(named[name], named[name]["minutes"][-1]),
                        "curves": named[name]}
                 for name, run in runs.items()},
        "equal_time_min": round(equal, 2), "window": args.window}
    png = args.png or os.path.splitext(args.out)[0] + ".png"
    write_file(args.out, json.dumps(report, indent=1))
    finals = {name: run.get("final_evaluation", {}).get("trained")
              for name, run in runs.items()}
    plot(named, finals, png, "Connect Four AlphaZero runs against wall time (2 cores): "
         + ", ".join(run_label(n, r) for n, r in runs.items()), args.window)
    report["png"] = png
    json.dump({k: v for k, v in report.items()}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
