"""Which head of a Connect Four policy-value net loses games: policy and value swapped
between two nets, against UCT.

Four agents play UCT with --rollouts random rollouts: net A, net B, A's policy with B's
value, and B's policy with A's value. Each agent is the final evaluation's
(``experiments.training.FINAL_AGENT``: MCTS with --simulations, one leaf in flight, no
noise) and plays --games games per seed in --seeds, first player alternating; every
agent meets the same seeds. When an agent's score follows its value head rather than
its policy, the value is what loses.

Measured with it (issue 22): the residual 16x1 net's policy with the shipped MLP's value
scored 0.96 against UCT-1000 over 120 games, its own value 0.79.

Prints one JSON object and writes it to --out.

Usage: python benchmarks/head_swap.py --a DIR [--b DIR] [--games 40] [--seeds 1 2 3]
[--rollouts 1000] [--simulations 100] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from typing import Any, Dict, Sequence, Tuple

import numpy as np

import async_search as asr
from async_search import problems
from async_search.experiments.training import FINAL_AGENT
from async_search.files import write_json
from async_search.problems.checkpoints import load_checkpoint


class SwappedHeads:
    """A policy-value model whose logits come from ``policy`` and value from ``value``
    (two models of the same input).

    Example:
        >>> net = problems.pretrained("connect_four")
        >>> model = SwappedHeads(net, net)
        >>> x = problems.ConnectFour().encode([problems.ConnectFour().initial_state()])
        >>> [a.shape for a in model(x)]
        [(1, 7), (1, 1)]
    """

    def __init__(self, policy: Any, value: Any):
        if tuple(policy.input_spec.shape) != tuple(value.input_spec.shape):
            raise ValueError(f"the nets read different inputs: {policy.input_spec} and "
                             f"{value.input_spec}")
        self.policy, self.value = policy, value
        self.input_spec = policy.input_spec

    def __call__(self, batch: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        return self.policy(batch)[0], self.value(batch)[1]


async def against_uct(model: Any, *, seeds: Sequence[int], games: int, rollouts: int,
                      simulations: int) -> Dict[str, Any]:
    """The agent's wins, draws, losses and score against UCT over every seed."""
    from async_search.training import MCTSPlayer, UCTPlayer, play_match

    game = problems.ConnectFour()
    wins = draws = losses = 0
    async with asr.serve(model, max_batch_size=512) as evaluate:
        agent = MCTSPlayer(evaluate, simulations=simulations, name="agent", **FINAL_AGENT)
        for seed in seeds:
            result = await play_match(game, agent, UCTPlayer(rollouts), num_games=games,
                                      seed=seed)
            wins, draws, losses = (wins + result.wins, draws + result.draws,
                                   losses + result.losses)
    return {"wins": wins, "draws": draws, "losses": losses,
            "score": (wins + draws / 2) / (wins + draws + losses)}


def load(path: str) -> Any:
    return problems.pretrained("connect_four") if path == "shipped" else load_checkpoint(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="a checkpoint folder, or 'shipped'")
    parser.add_argument("--b", default="shipped", help="a checkpoint folder, or 'shipped' "
                        "(the default: the net in problems.pretrained)")
    parser.add_argument("--games", type=int, default=40, help="games per seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--simulations", type=int, default=100)
    parser.add_argument("--out", default=os.path.join("results", "benchmarks",
                                                      "head_swap.json"))
    args = parser.parse_args()
    for name in ("games", "rollouts", "simulations"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    if any(seed < 0 for seed in args.seeds):
        parser.error(f"--seeds must be integers >= 0, got {args.seeds}")
    try:
        a, b = load(args.a), load(args.b)
    except ValueError as e:  # CheckpointError: a damaged or missing checkpoint, named
        parser.error(str(e))
    agents = {"a": a, "b": b, "policy_a_value_b": SwappedHeads(a, b),
              "policy_b_value_a": SwappedHeads(b, a)}
    result: Dict[str, Any] = {"workload": vars(args), "python": platform.python_version(),
                              "machine": platform.machine(), "agents": {}}
    for name, model in agents.items():
        start = time.perf_counter()
        out = asyncio.run(against_uct(model, seeds=args.seeds, games=args.games,
                                      rollouts=args.rollouts, simulations=args.simulations))
        out["seconds"] = round(time.perf_counter() - start, 1)
        result["agents"][name] = out
        print(json.dumps({"agent": name, **out}), file=sys.stderr, flush=True)
    print(json.dumps(result, indent=1))
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()
