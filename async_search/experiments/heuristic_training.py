"""The ``--train sliding_puzzle`` experiment: DAVI, then Korf's 100 against Manhattan.

It trains a ``LearnedHeuristic`` with ``training.Davi`` (a bar over rounds, a row every
few rounds; each round committed in the save folder, so ``--resume`` continues a killed
run), saves it as a checkpoint, then runs batch-weighted A* on Korf's 100 random
15-puzzle instances with the learned heuristic and with ``ManhattanHeuristic`` at the
same weight, budget and buffer, and reports solved counts, mean path length (with the
optimal lengths of the solved instances), mean expansions and evaluations.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from typing import Any, Callable, Dict, List, Sequence

import numpy as np

from async_search.checks import check_float, check_int
from async_search.extras import import_extra
from async_search.files import write_json


@dataclasses.dataclass(frozen=True)
class HeldOutConfig:
    """How heuristics are compared on Korf's 100: batch-weighted A* with these.

    Attributes:
        weight: the weight of the path cost g in A*'s priority ``weight * g + h``.
        budget: model evaluations each search may spend.
        buffer_size: nodes each A* step expands (one request).
        max_batch_size: the most elements the server puts in one batch.
    """

    weight: float = 0.3
    budget: int = 20_000
    buffer_size: int = 16
    max_batch_size: int = 1024

    def __post_init__(self) -> None:
        check_float("HeldOutConfig.weight", self.weight, minimum=0.0)
        for name in ("budget", "buffer_size", "max_batch_size"):
            check_int(f"HeldOutConfig.{name}", getattr(self, name), minimum=1)


async def _solve_all(model: Any, starts: List[bytes], params: HeldOutConfig,
                     on_done: Callable[[], None] | None) -> list:
    import async_search as asr
    from async_search import problems, search

    puzzle = problems.SlidingPuzzle(4)

    async def one(start):
        r = await search.batched_astar(puzzle, start, evaluate, budget=params.budget,
                                       buffer_size=params.buffer_size,
                                       weight=params.weight)
        if on_done is not None:
            on_done()
        return r

    async with asr.serve(model, max_batch_size=params.max_batch_size) as evaluate:
        return await asyncio.gather(*(one(s) for s in starts))


def evaluate_heuristic(model: Any, params: HeldOutConfig, *,
                       on_done: Callable[[], None] | None = None,
                       limit: int | None = None,
                       ids: Sequence[int] | None = None) -> Dict[str, Any]:
    """Batch-weighted A* on Korf's 100 with ``model``: counts and means. ``ids`` keeps
    the instances of those numbers (1-100), and ``limit`` the first ``limit`` of what is
    kept, for a quick look.

    Raises:
        ValueError: an id that is not one of Korf's 100, or a ``limit`` below 1.
    """
    from async_search import problems

    instances = problems.korf100()
    if ids is not None:
        wanted = {check_int("ids[]", i) for i in ids}
        unknown = sorted(wanted - {i.id for i in instances})
        if unknown:
            raise ValueError(f"no Korf instance numbered {unknown}: they are 1-100")
        instances = [i for i in instances if i.id in wanted]
    if limit is not None:
        instances = instances[:check_int("limit", limit, minimum=1)]
    start = time.perf_counter()
    results = asyncio.run(_solve_all(model, [i.state for i in instances], params, on_done))
    seconds = time.perf_counter() - start
    solved = [(i, r) for i, r in zip(instances, results) if r.status.value == "goal_found"]
    return {
        "instances": len(instances), "solved": len(solved),
        "mean_length": float(np.mean([r.cost for _, r in solved])) if solved else None,
        "mean_optimal_of_solved": (float(np.mean([i.optimal for i, _ in solved]))
                                   if solved else None),
        "optimal_found": sum(1 for i, r in solved if r.cost == i.optimal),
        "mean_expansions": float(np.mean([r.nodes_expanded for r in results])),
        "mean_evaluations": float(np.mean([r.evaluations for r in results])),
        "mean_expansions_solved": (float(np.mean([r.nodes_expanded for _, r in solved]))
                                   if solved else None),
        "seconds": seconds,
        "per_instance": [{"id": i.id, "optimal": i.optimal, "status": r.status.value,
                          "cost": r.cost, "expansions": r.nodes_expanded}
                         for i, r in zip(instances, results)],
    }


def compare_heuristics(learned: Any, params: HeldOutConfig, *,
                       show_progress: bool = True) -> Dict[str, Dict[str, Any]]:
    """The learned heuristic and Manhattan on Korf's 100, same weight, budget, buffer."""
    from async_search import problems
    from async_search.experiments.progress import progress_bar

    out = {}
    for name, model in (("manhattan", problems.ManhattanHeuristic(problems.SlidingPuzzle(4))),
                        ("learned", learned)):
        with progress_bar(f"Korf's 100, {name}", 100, enabled=show_progress,
                          unit="puzzle") as update:
            out[name] = evaluate_heuristic(model, params,
                                           on_done=(lambda: update(1)) if update else None)
    return out


def format_comparison(results: Dict[str, Dict[str, Any]], params: HeldOutConfig) -> str:
    lines = [f"Korf's 100 random 15-puzzle instances (optimal lengths known, mean 53.05): "
             f"batch-weighted A*, weight {params.weight}, budget {params.budget} "
             f"evaluations, {params.buffer_size} nodes per step",
             f"{'heuristic':<11}{'solved':>7}{'mean len':>10}{'optimal*':>10}"
             f"{'optimal found':>15}{'mean expansions':>17}{'mean evals':>12}{'s':>7}"]
    for name, r in results.items():
        mean_len = f"{r['mean_length']:.1f}" if r["mean_length"] is not None else "-"
        mean_opt = (f"{r['mean_optimal_of_solved']:.1f}"
                    if r["mean_optimal_of_solved"] is not None else "-")
        lines.append(f"{name:<11}{r['solved']:>7}{mean_len:>10}{mean_opt:>10}"
                     f"{r['optimal_found']:>15}{r['mean_expansions']:>17.0f}"
                     f"{r['mean_evaluations']:>12.0f}{r['seconds']:>7.1f}")
    lines.append("* optimal: the mean optimal length of the instances that heuristic solved")
    m, l_ = results.get("manhattan"), results.get("learned")
    if m and l_ and m["mean_expansions"]:
        lines.append(f"learned / Manhattan expansions: "
                     f"{l_['mean_expansions'] / m['mean_expansions']:.2f}")
    return "\n".join(lines)


def plot_heuristic_training(records: List[Any], results: Dict[str, Dict[str, Any]],
                            path: str, *, title: str = "") -> Any:
    """DAVI's loss and mean target per round; expansions per Korf instance."""
    plt = import_extra("matplotlib.pyplot", "plot_heuristic_training")
    pd = import_extra("pandas", "plot_heuristic_training")
    sns = import_extra("seaborn", "plot_heuristic_training")

    from async_search.experiments.plots import finish_figure

    sns.set_theme(style="whitegrid", context="notebook")
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    df = pd.DataFrame([dataclasses.asdict(r) for r in records])
    sns.lineplot(data=df, x="round", y="value_loss", marker="o", ax=axes[0])
    axes[0].set_yscale("log")
    axes[0].set_title("DAVI loss (moves squared)")
    sns.lineplot(data=df, x="round", y="mean_target", marker="o", ax=axes[1],
                 label="mean target (moves)", legend=False)
    ax2 = axes[1].twinx()
    sns.lineplot(data=df, x="round", y="target_updates", color="grey", ax=ax2,
                 label="target refreshes", legend=False)
    ax2.grid(False)
    handles = axes[1].get_lines()[:1] + ax2.get_lines()[:1]
    axes[1].legend(handles, [h.get_label() for h in handles], fontsize=8, loc="upper left")
    axes[1].set_title("targets and target-net refreshes")
    rows = [{"heuristic": name, "optimal length": p["optimal"],
             "expansions": p["expansions"], "solved": p["status"] == "goal_found"}
            for name, r in results.items() for p in r["per_instance"]]
    sns.scatterplot(data=pd.DataFrame(rows), x="optimal length", y="expansions",
                    hue="heuristic", style="solved", ax=axes[2])
    axes[2].set_yscale("log")
    axes[2].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    axes[2].set_title("Korf's 100: expansions per instance")
    finish_figure(fig, path, title=title, close=True)
    return fig


def run_heuristic_training(config: Any, params: HeldOutConfig, *, save_dir: str,
                           png_path: str, resume: bool = False, show_progress: bool = True,
                           command: str = "",
                           print_fn: Callable[[str], None] = print) -> Dict[str, Any]:
    """Trains by DAVI, saves the checkpoint, compares with Manhattan; returns the JSON.

    Each round is committed in ``save_dir`` (``training.RunFolder``, as the AlphaZero
    loop does); ``resume`` continues the run saved there, and a run that is already
    complete says so and is evaluated again. Every file is written atomically, the JSON
    before the plot.

    Raises:
        ValueError: ``resume`` with no run in ``save_dir``, or with other parameters.
        CheckpointError: a damaged saved file of the run (``resume``), named.
        FileWriteError: a file that could not be written, named.
    """
    from async_search.experiments.progress import progress_bar
    from async_search.training import Davi, save_checkpoint

    davi = Davi(config, save_dir=save_dir, resume=resume)
    done = davi.rounds_done
    if resume and done >= config.rounds:
        print_fn(f"The run in {save_dir} is already complete ({done} of {config.rounds} "
                 f"rounds): nothing to train; its heuristic is evaluated again.")
    start = time.perf_counter()
    every = max(1, config.rounds // 10)
    print_fn(f"{'round':>5}  {'loss':>8}  {'mean target':>11}  {'refreshes':>9}  {'s':>5}")

    def show(r):
        print_fn(f"{r.round:>5}  {r.value_loss:>8.3f}  {r.mean_target:>11.2f}  "
                 f"{r.target_updates:>9}  {r.seconds:>5.1f}")

    for r in davi.history:  # a resumed run shows what was done before
        if r.round % every == 0 or r.round == config.rounds:
            show(r)
    with progress_bar("DAVI rounds", config.rounds - min(done, config.rounds),
                      enabled=show_progress, unit="round") as update:
        def on_round(r):
            if update:
                update(1)
            if r.round % every == 0 or r.round == config.rounds:
                show(r)
        records = davi.run(on_round)
    train_s = time.perf_counter() - start
    model = davi.model()
    checkpoint = save_checkpoint(os.path.join(save_dir, "heuristic"), model, config.net,
                                 {"trainer": "davi", "config": dataclasses.asdict(config),
                                  "rounds": len(records),
                                  "target_updates": davi.target_updates,
                                  "training_s": train_s})
    results = compare_heuristics(model, params, show_progress=show_progress)
    summary = {name: {k: v for k, v in r.items() if k != "per_instance"}
               for name, r in results.items()}
    save_checkpoint(checkpoint, model, config.net,  # how it was made and what it scores
                    {"trainer": "davi", "command": command,
                     "config": dataclasses.asdict(config),
                     "target_updates": davi.target_updates, "training_s": train_s,
                     "korf100": summary, "held_out": dataclasses.asdict(params)})
    result = {"command": command, "config": dataclasses.asdict(config),
              "held_out": dataclasses.asdict(params),
              "rounds": [dataclasses.asdict(r) for r in records], "training_s": train_s,
              "checkpoint": checkpoint, "korf100": results}
    # The figures first, "plot" null until the PNG is this run's: a plot that fails
    # loses none of them, and a stop while it is drawn leaves no earlier run's named.
    json_path = write_json(os.path.splitext(png_path)[0] + ".json",
                           {**result, "plot": None})
    plot_heuristic_training(records, results, png_path,
                            title=f"DAVI on the 15-puzzle: {config.rounds} rounds of "
                                  f"{config.states_per_round} states")
    write_json(json_path, {**result, "plot": png_path})
    result["png_path"], result["json_path"] = png_path, json_path
    return result
