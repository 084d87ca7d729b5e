"""The ``--train connect_four`` experiment: AlphaZero iterations, a table, a figure.

It runs a ``training.Commander`` with tqdm bars per phase, prints one table row per
iteration (losses, scores against the baselines, move accuracy on the solver-labelled
positions), then evaluates the final best net and the untrained net on the goal's terms
(MCTS with ``final_simulations`` and no noise against the one-ply, UCT-300 and UCT-1000
baselines, the net alone against random), and saves the JSON of every figure, then a
seaborn figure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional

from async_search.extras import import_extra
from async_search.files import write_json


class PhaseBars:
    """tqdm bars for ``Commander``'s ``progress(phase, done, total)`` hook: one bar per
    phase, replaced when the phase changes (shown on a terminal only)."""

    _UNITS = {"selfplay": "eval", "train": "step", "evaluate": "game",
              "accuracy": "pos"}

    def __init__(self, enabled: bool = True, prefix: str = ""):
        self.enabled = enabled
        self.prefix = prefix
        self._phase: Optional[str] = None
        self._bar = None

    def __call__(self, phase: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if phase != self._phase:
            self.close()
            tqdm = import_extra("tqdm", "a progress bar (show_progress=False for "
                                "none)").tqdm
            self._bar = tqdm(total=total or None, desc=f"{self.prefix}{phase}",
                             unit=self._UNITS.get(phase, "it"), unit_scale=True,
                             leave=False, dynamic_ncols=True, file=sys.stderr,
                             mininterval=0.2, disable=None)
            self._phase = phase
        self._bar.update(done)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar, self._phase = None, None


_COLUMNS = [("it", 3), ("samples", 8), ("smp/s", 7), ("s/1k", 6), ("policy", 7),
            ("value", 6), ("l2", 6), ("arena", 6), ("promo", 5), ("one-ply", 7),
            ("uct", 6), ("uct1k", 6), ("net/rnd", 7), ("net end", 7), ("net mid", 7),
            ("mcts end", 8), ("mcts mid", 8), ("elo", 6), ("play s", 7), ("train s", 7),
            ("eval s", 7), ("acc s", 6)]

#: The accuracy columns: ``IterationRecord.accuracy``'s keys, in the table's order.
ACCURACY_KEYS = ("net_end", "net_middle", "mcts_end", "mcts_middle")


def iteration_header() -> str:
    return "  ".join(f"{name:>{width}}" for name, width in _COLUMNS)


def format_iteration(r: Any, uct_rollouts: int | None = None,
                     strong_uct_rollouts: int | None = None) -> str:
    """One table row for an ``IterationRecord`` (``nan`` where a figure was not
    measured): ``uct`` is the UCT baseline of ``uct_rollouts``, ``uct1k`` the stronger
    one of ``strong_uct_rollouts`` (the run's config's). Without them: the baseline of
    fewer rollouts, and the one of more when there are two."""
    nan = float("nan")
    if uct_rollouts is not None and strong_uct_rollouts is not None and (
            uct_rollouts != strong_uct_rollouts):
        # By name: either may be missing (the strong one played, the other not), and
        # the "strong" one may have fewer rollouts.
        uct = r.scores.get(f"uct{uct_rollouts}", nan)
        strong = r.scores.get(f"uct{strong_uct_rollouts}", nan)
    else:
        ucts = sorted((int(k[3:]), v) for k, v in r.scores.items()
                      if k.startswith("uct") and k[3:].isdigit())
        uct = ucts[0][1] if ucts else nan
        strong = ucts[-1][1] if len(ucts) > 1 else nan
    accuracy = [f"{r.accuracy.get(k, nan):.2f}" for k in ACCURACY_KEYS]
    cells = [r.iteration, r.samples, f"{r.samples_per_s:.0f}", f"{r.s_per_1000_samples:.2f}",
             f"{r.policy_loss:.3f}", f"{r.value_loss:.3f}", f"{r.l2_loss:.3f}",
             f"{r.arena_score:.2f}", "yes" if r.promoted else "no",
             f"{r.scores.get('one_ply', nan):.2f}", f"{uct:.2f}", f"{strong:.2f}",
             f"{r.scores.get('policy_vs_random', nan):.2f}", *accuracy, f"{r.elo:+.0f}",
             f"{r.selfplay_s:.1f}", f"{r.train_s:.1f}", f"{r.eval_s:.1f}",
             f"{r.accuracy_s:.1f}"]
    return "  ".join(f"{c:>{w}}" for c, (_, w) in zip(cells, _COLUMNS))


#: The agent of the final evaluation: MCTS, one leaf per round (the best search per
#: simulation), c_puct as in self-play. Chosen on seeds 1-2 against UCT(300) (0.80 and
#: 0.78, against 0.75 and 0.70 with 2 leaves at c_puct 2), reported on other seeds.
FINAL_AGENT = {"c_puct": 1.5, "num_parallel": 1}


async def evaluate_agent(model: Any, *, games: int, simulations: int, uct_rollouts: int,
                         c_puct: float = FINAL_AGENT["c_puct"],
                         num_parallel: int = FINAL_AGENT["num_parallel"], seed: int = 12345,
                         on_game: Callable[[], None] | None = None,
                         max_batch_size: int = 512, strong_uct_rollouts: int = 1000,
                         strong_uct_games: int = 0, solve: bool = False) -> Dict[str, Any]:
    """The goal's evaluation of a policy-value net on Connect Four: MCTS with
    ``simulations`` and no noise against one-ply and UCT(``uct_rollouts``), and the net
    alone (greedy on its policy) against random; ``games`` each, first player
    alternating; with ``strong_uct_games``, that many games of the MCTS agent against
    UCT(``strong_uct_rollouts``) too (about 1 s a game on one core); ``solve``: the
    MCTS agent proves values (``search.mcts``'s ``solve``). Returns each match's wins,
    draws, losses and score."""
    import async_search as asr
    from async_search.problems import ConnectFour
    from async_search.training import (MCTSPlayer, OnePlyPlayer, PolicyPlayer,
                                       RandomPlayer, UCTPlayer, play_match)

    game = ConnectFour()
    out: Dict[str, Any] = {}
    async with asr.serve(model, max_batch_size=max_batch_size) as evaluate:
        agent = MCTSPlayer(evaluate, simulations=simulations, c_puct=c_puct,
                           num_parallel=num_parallel, name="agent", solve=solve)
        matches = {"mcts_vs_one_ply": (agent, OnePlyPlayer(), games),
                   f"mcts_vs_uct{uct_rollouts}": (agent, UCTPlayer(uct_rollouts), games)}
        if strong_uct_games:
            matches[f"mcts_vs_uct{strong_uct_rollouts}"] = (
                agent, UCTPlayer(strong_uct_rollouts), strong_uct_games)
        matches["net_vs_random"] = (PolicyPlayer(evaluate), RandomPlayer(), games)
        for name, (player, opponent, count) in matches.items():
            result = await play_match(game, player, opponent, num_games=count, seed=seed,
                                      on_game=on_game)
            out[name] = {"wins": result.wins, "draws": result.draws,
                         "losses": result.losses, "score": result.score}
    return out


#: The goals of issue 22 (README's "What training reaches"): the agent's score against
#: UCT-1000 and against one-ply, drawn on the scores' panel when that match was played
#: (its key in the iterations' scores).
SCORE_GOALS = (("uct1000", 0.90, "goal vs UCT-1000"), ("one_ply", 0.99, "goal vs one-ply"))


def plot_training(records: List[Any], path: str, *, title: str = "",
                  gate_threshold: float = 0.0) -> Any:
    """Losses, scores against the baselines, move accuracy on the solver-labelled
    positions, seconds per phase and the rating over iterations; the scores' panel marks
    the goals and the arena's gate (``gate_threshold``; none at 0, where every
    candidate is promoted)."""
    plt = import_extra("matplotlib.pyplot", "plot_training")
    pd = import_extra("pandas", "plot_training")
    sns = import_extra("seaborn", "plot_training")

    from async_search.experiments.plots import finish_figure

    sns.set_theme(style="whitegrid", context="notebook")
    rows = [dataclasses.asdict(r) for r in records]
    df = pd.DataFrame(rows)
    fig, axes = plt.subplots(1, 5, figsize=(25, 4.6))
    losses = df.melt(id_vars="iteration", value_vars=["policy_loss", "value_loss", "l2_loss"],
                     var_name="term", value_name="loss")
    sns.lineplot(data=losses, x="iteration", y="loss", hue="term", marker="o", ax=axes[0])
    axes[0].set_title("training loss (mean over each iteration's steps)")
    score_rows = []
    for r in records:
        score_rows.append({"iteration": r.iteration, "opponent": "best (arena)",
                           "score": r.arena_score})
        for name, score in r.scores.items():
            label = "net alone vs random" if name == "policy_vs_random" else (
                f"agent vs {name.replace('_', '-')}")
            score_rows.append({"iteration": r.iteration, "opponent": label, "score": score})
    sns.lineplot(data=pd.DataFrame(score_rows), x="iteration", y="score", hue="opponent",
                 marker="o", ax=axes[1])
    gate = ((gate_threshold, "gate (arena)"),) if gate_threshold > 0 else ()
    played = {name for r in records for name in r.scores}
    goals = tuple((level, label) for name, level, label in SCORE_GOALS if name in played)
    for level, label in gate + goals:
        axes[1].axhline(level, color="grey", ls=":", lw=1)
        axes[1].annotate(label, (df["iteration"].max(), level), fontsize=7, color="grey",
                         va="bottom", ha="right")
    axes[1].set_ylim(-0.02, 1.02)
    axes[1].set_title("candidate's score (1 = all won)")
    # Grouped bars on a numeric axis (seaborn's barplot makes the iterations categories,
    # labels every one of them, and has matplotlib log a line about it).
    width = 0.27
    for k, (column, phase) in enumerate((("selfplay_s", "self-play"), ("train_s", "training"),
                                          ("eval_s", "evaluation"))):
        axes[2].bar(df["iteration"] + (k - 1) * width, df[column], width, label=phase)
    axes[2].set(title="seconds per phase", xlabel="iteration", ylabel="seconds")
    _plot_accuracy(records, axes[3])
    sns.lineplot(data=df, x="iteration", y="elo", marker="o", ax=axes[4], label="candidate")
    best = df.assign(best=df["elo"].where(df["promoted"]).ffill().fillna(0.0))
    sns.lineplot(data=best, x="iteration", y="best", ax=axes[4], label="best (promoted)",
                 drawstyle="steps-post")
    axes[4].set(title="Elo-style rating (untrained net = 0)", ylabel="Elo")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    finish_figure(fig, path, title=title, close=True)
    return fig


_ACCURACY_LABELS = {"net_end": "net alone, end game", "net_middle": "net alone, middle game",
                    "mcts_end": "agent, end game", "mcts_middle": "agent, middle game"}


def _plot_accuracy(records: List[Any], ax: Any) -> None:
    """Move accuracy per iteration: the net alone and the evaluation agent, on each
    solver-labelled set (an empty panel that says so when none was measured)."""
    import pandas as pd
    import seaborn as sns

    rows = [{"iteration": r.iteration, "chooser": _ACCURACY_LABELS.get(k, k),
             "accuracy": v} for r in records for k, v in r.accuracy.items()]
    ax.set_title("move accuracy on solved positions")
    ax.set_ylim(-0.02, 1.02)
    if not rows:
        ax.text(0.5, 0.5, "not measured (accuracy_positions=0)", ha="center",
                va="center", transform=ax.transAxes, color="grey")
        return
    sns.lineplot(data=pd.DataFrame(rows), x="iteration", y="accuracy", hue="chooser",
                 style="chooser", marker="o", ax=ax)


def run_connect_four_training(config: Any, *, save_dir: str, resume: bool,
                              png_path: str, final_games: int, final_simulations: int,
                              show_progress: bool = True, command: str = "",
                              print_fn: Callable[[str], None] = print,
                              final_strong_uct_games: int = 0) -> Dict[str, Any]:
    """Runs the training experiment; prints as it goes; returns the JSON it saved.

    The final evaluation plays ``final_games`` per match, and ``final_strong_uct_games``
    against UCT(``config.strong_uct_rollouts``). Every file is written atomically
    (``files.write_file``), the JSON before the plot.
    With ``resume``, a run that is already complete says so and is evaluated again.

    Raises:
        CheckpointError: a damaged saved file of the run (``resume``), named.
        FileWriteError: a file that could not be written, named.
    """
    from async_search.experiments.progress import progress_bar
    from async_search.training import Commander

    bars = PhaseBars(show_progress)
    commander = Commander(config, save_dir, resume=resume, progress=bars)
    untrained = _untrained(config)
    if resume and commander.iteration >= config.iterations:
        print_fn(f"The run in {save_dir} is already complete ({commander.iteration} of "
                 f"{config.iterations} iterations): nothing to train; its best net is "
                 f"evaluated again.")
    print_fn(iteration_header())
    def row(record: Any) -> str:
        return format_iteration(record, config.uct_rollouts, config.strong_uct_rollouts)

    for r in commander.history:  # a resumed run shows what was done before
        print_fn(row(r))
    start = time.perf_counter()

    def on_iteration(record):
        bars.close()
        print_fn(row(record))

    records = asyncio.run(commander.run(on_iteration=on_iteration))
    bars.close()
    train_s = time.perf_counter() - start
    final: Dict[str, Any] = {}
    t = time.perf_counter()
    for name, model in (("untrained", untrained), ("trained", commander.best)):
        with progress_bar(f"final evaluation ({name})",
                          3 * final_games + final_strong_uct_games,
                          enabled=show_progress, unit="game") as update:
            final[name] = asyncio.run(evaluate_agent(
                model, games=final_games, simulations=final_simulations,
                uct_rollouts=config.uct_rollouts,
                strong_uct_rollouts=config.strong_uct_rollouts,
                strong_uct_games=final_strong_uct_games, solve=config.eval_solve,
                on_game=(lambda: update(1)) if update else None))
    eval_s = time.perf_counter() - t
    if save_dir is not None:  # the best checkpoint says how it was made and what it scores
        from async_search.training import read_checkpoint, save_checkpoint

        best = os.path.join(save_dir, "best")
        saved = read_checkpoint(best)
        save_checkpoint(best, saved.weights, saved.config, {
            **saved.metadata, "command": command, "config": config.to_json(),
            "final_evaluation": final, "final_games": final_games,
            "final_simulations": final_simulations})
    result = {"command": command, "config": config.to_json(),
              "iterations": [dataclasses.asdict(r) for r in records],
              "final_evaluation": final, "final_games": final_games,
              "final_strong_uct_games": final_strong_uct_games,
              "final_simulations": final_simulations, "best_version": commander.best_version,
              "training_s": train_s, "final_evaluation_s": eval_s}
    # The figures first, "plot" null until the PNG is this run's: a plot that fails
    # loses none of them, and a stop while it is drawn leaves no earlier run's named.
    json_path = write_json(os.path.splitext(png_path)[0] + ".json",
                           {**result, "plot": None})
    search = {"puct": "", "gumbel": " (Gumbel)"}[config.selfplay.policy]
    plot_training(records, png_path, title=f"AlphaZero{search} on Connect Four: "
                  f"{config.iterations} iterations of {config.games_per_iteration} games",
                  gate_threshold=config.gate_threshold)
    write_json(json_path, {**result, "plot": png_path})
    result["png_path"], result["json_path"] = png_path, json_path
    return result


def format_final(final: Dict[str, Any], games: int, simulations: int,
                 c_puct: float = FINAL_AGENT["c_puct"],
                 num_parallel: int = FINAL_AGENT["num_parallel"], solve: bool = False
                 ) -> str:
    """The final evaluation table: untrained against trained, per match; ``solve``: the
    agent proved values (``search.mcts``'s ``solve``)."""
    names = list(final["trained"])
    lines = [f"Final evaluation, {games} games each (see W-D-L), first player "
             f"alternating; agent = "
             f"MCTS with {simulations} simulations, no noise (c_puct {c_puct}, "
             f"{num_parallel} leaves per round{', proving values' if solve else ''}); "
             f"net = greedy on its policy",
             f"{'match':<22}{'untrained':>12}{'trained':>12}   trained W-D-L"]
    for name in names:
        u, t = final["untrained"][name], final["trained"][name]
        lines.append(f"{name:<22}{u['score']:>12.3f}{t['score']:>12.3f}   "
                     f"{t['wins']}-{t['draws']}-{t['losses']}")
    return "\n".join(lines)


def _untrained(config: Any) -> Any:
    from async_search.problems.nets import initial_weights, to_model
    return to_model(config.net, initial_weights(config.net, config.seed))
