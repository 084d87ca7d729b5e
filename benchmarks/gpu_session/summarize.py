"""The GPU run's figures in one table: reads the reports of ``lease_a.sh`` and
``lease_b.sh`` (copied into ``results/benchmarks/gpu_h200/``) and writes
``results/benchmarks/gpu.json``.

Each figure names the report it comes from. Runs cut short by a step's time limit
(``"partial": true``) count with the rounds they finished; a figure over two rounds is
their median (the faster, for two) with both rounds given.

With ``--prefix c_`` it reads instead any reports of a later lease (``next.sh`` writes
``c_mcts``, ``c_big``, ``c_astar``) into one table per report (``report_table``).

Usage: python benchmarks/gpu_session/summarize.py [--dir results/benchmarks/gpu_h200]
[--prefix c_ --out results/benchmarks/gpu_next.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Any, Dict, List

from async_search.files import write_file

SIZES = ("1", "16", "256", "1024", "4096")


def rounds(report: dict, workload: str, section: str) -> Dict[str, List[dict]]:
    """``{key: [record per round]}`` from a finished report or a partial one."""
    if report.get("partial"):
        return report["rounds_so_far"].get(workload, {}).get(section, {})
    found = report["runs"].get(workload, {}).get(section, {})
    out = {}
    for key, record in found.items():
        if "nodes_per_s" not in record:
            continue
        per_round = record.get("nodes_per_s_rounds", [record["nodes_per_s"]])
        out[key] = [{**record, "nodes_per_s": rate} for rate in per_round]
    return out


def run_figures(records: List[dict], source: str) -> dict:
    rates = [r["nodes_per_s"] for r in records]
    best = max(records, key=lambda r: r["nodes_per_s"])
    return {"nodes_per_s": round(statistics.median_high(rates)),
            "nodes_per_s_rounds": [round(r) for r in rates],
            "mean_batch": best.get("mean_batch"),
            "device_busy_fraction": best.get("device_busy_fraction"),
            "fraction_in_model": best.get("fraction_in_model"),
            "vs_ceiling": best.get("vs_ceiling"), "source": source,
            # where the CPU went (reports since the loops' CPU was measured), and the
            # serving process's sampled stacks (gpu.py --sample-stacks)
            # ... and the steady window's figures (every client searching: lease_c.sh)
            **{k: best[k] for k in ("loop_cpu", "process_cpu", "clients_cpu", "clients_busy",
                                     "stacks", "client_waves", "steady_nodes_per_s",
                                     "steady_s", "start_spread_s",
                                     "steady_fraction_in_model")
               if k in best}}


def section(reports: Dict[str, dict], workload: str, name: str, sources: List[str]) -> dict:
    out = {}
    for source in sources:
        for key, records in rounds(reports[source], workload, name).items():
            out.setdefault(key, run_figures(records, source))
    return dict(sorted(out.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0))


def ceiling(report: dict, net: str, source: str) -> dict:
    table = report["ceiling"][net]
    return {"source": source, **{
        size: {"on_device_ms": table[size]["on_device"]["ms_per_batch"],
               "with_copies_ms": table[size]["with_copies"]["ms_per_batch"]}
        for size in SIZES if size in table}}


def summarize(folder: str) -> dict:
    reports = {name[:-5]: json.load(open(os.path.join(folder, name)))
               for name in sorted(os.listdir(folder)) if name.endswith(".json")}
    env = open(os.path.join(folder, "a_env.txt")).read().split("\n")
    mcts, astar = "mcts_connect_four", "astar_15_puzzle"
    out: Dict[str, Any] = {
        "benchmark": "benchmarks/gpu.py on a GPU machine (benchmarks/gpu_session/)",
        "machine": {"gpu": env[0].split(" (")[0], "cpu_cores": int(env[1]),
                    "software": env[2]},
        "nets": {**reports["a_mcts_eager"]["nets"], **reports["a_astar_eager"]["nets"]},
        "ceiling": {
            "policy_value": {
                "torch_eager": ceiling(reports["a_mcts_eager"], "policy_value",
                                       "a_mcts_eager"),
                "torch_cuda_graphs": ceiling(reports["b_mcts_graphs"], "policy_value",
                                             "b_mcts_graphs"),
                "torch_eager_bfloat16": ceiling(reports["b_mcts_eager_bf16"],
                                                "policy_value", "b_mcts_eager_bf16"),
                "jax": ceiling(reports["b_jax"], "policy_value", "b_jax")},
            "cost_to_go": {
                "torch_eager": ceiling(reports["a_astar_eager"], "cost_to_go",
                                       "a_astar_eager"),
                "jax": ceiling(reports["b_jax"], "cost_to_go", "b_jax")}},
        "batch_dependence": {
            f"{net} {framework}": {
                "worst_max_abs": reports[src]["batch_dependence"][net]["worst_max_abs"],
                "worst_of_output_scale": max(
                    v["max_rel"] for v in
                    reports[src]["batch_dependence"][net]["per_batch_size"].values()),
                "adapter_batch_tolerance":
                    reports[src]["batch_dependence"][net]["adapter_batch_tolerance"]}
            for net, framework, src in (
                ("policy_value", "torch", "a_mcts_eager"),
                ("policy_value", "torch bfloat16", "b_mcts_eager_bf16"),
                ("cost_to_go", "torch", "a_astar_eager"),
                ("policy_value", "jax", "b_jax"), ("cost_to_go", "jax", "b_jax"))},
    }
    runs: Dict[str, Any] = {}
    for workload, eager in ((mcts, "a_mcts_eager"), (astar, "a_astar_eager")):
        later = ["b_mcts_eager"] if workload == mcts else []
        runs[workload] = {
            "in_process_torch_eager": section(reports, workload, "in_process",
                                              [eager] + later),
            "handwritten_torch": section(reports, workload, "handwritten_torch", [eager]),
            "max_batch_size_torch_eager": section(reports, workload, "max_batch_size",
                                                  [eager]),
            "process_backend_torch_eager": section(reports, workload, "process_backend",
                                                   [eager] + later),
            "in_process_jax": section(reports, workload, "in_process", ["b_jax"]),
            "process_backend_jax": section(reports, workload, "process_backend", ["b_jax"]),
        }
    variants = {}
    for name in ("b_mcts_eager", "b_mcts_graphs", "b_mcts_eager_switch",
                 "b_mcts_eager_bf16"):
        variants[name] = {
            "in_process": section(reports, mcts, "in_process", [name]),
            "process_backend": section(reports, mcts, "process_backend", [name])}
    runs[mcts]["same_call_variants"] = variants
    mctx = reports["a_mcts_eager"].get("runs", {}).get(mcts, {}).get("mctx")
    runs[mcts]["mctx"] = mctx or {"skipped": "the MCTS step reached its time limit first"}
    out["runs"] = runs
    out["ratios"] = ratios(runs)
    out["tests_on_the_gpu"] = {
        "gpu_only": "6 passed (tests/models -k 'cuda or gpu': TorchModel's CUDA paths, "
                    "CUDA graphs across updates, bf16/fp16, copies between devices, "
                    "JaxModel on the GPU)",
        "adapter_suite": "tests/models stopped at its 35 s limit after 89 of 122: 3 failed, "
                         "each a test's assumption that held on a CPU only (fixed since; "
                         "see docs/benchmarks.md)"}
    return out


def ratios(runs: dict) -> dict:
    """The goals' ratios: serve over the hand-written batcher at the same concurrency,
    the best of each, and the process backend's scaling efficiency."""
    out = {}
    for workload, r in runs.items():
        ours, peer = r["in_process_torch_eager"], r["handwritten_torch"]
        entry = {"vs_handwritten_same_concurrency_eager": {
            n: round(ours[n]["nodes_per_s"] / peer[n]["nodes_per_s"], 2)
            for n in peer if n in ours}}
        graphs = r.get("same_call_variants", {}).get("b_mcts_graphs", {}).get("in_process")
        if graphs:  # a later call on the same machine than the peer's
            entry["vs_handwritten_same_concurrency_cuda_graphs"] = {
                n: round(graphs[n]["nodes_per_s"] / peer[n]["nodes_per_s"], 2)
                for n in peer if n in graphs}
        best_peer = max(v["nodes_per_s"] for v in peer.values())
        candidates = {f"{name} {key}": v["nodes_per_s"] for name, sec in r.items()
                      if isinstance(sec, dict) and name not in ("handwritten_torch", "mctx",
                                                                "same_call_variants")
                      for key, v in sec.items()}
        for name, sec in r.get("same_call_variants", {}).items():
            for kind, found in sec.items():
                for key, v in found.items():
                    candidates[f"{name} {kind} {key}"] = v["nodes_per_s"]
        best = max(candidates, key=candidates.get)
        entry["best_vs_best_handwritten"] = {"ours": best, "nodes_per_s": candidates[best],
                                             "handwritten": best_peer,
                                             "ratio": round(candidates[best] / best_peer, 2)}
        scaling = r["process_backend_torch_eager"]
        one = scaling["1"]["nodes_per_s"]
        entry["scaling_efficiency_torch_eager"] = {
            k: round(v["nodes_per_s"] / (int(k) * one), 2) for k, v in scaling.items()}
        out[workload] = entry
    return out


def report_table(report: dict, source: str) -> dict:
    """Any one report of gpu.py (finished, or cut short at a step's limit), as the
    figures its README and docs tables take: the ceiling in ms at the bucket sizes, and
    every run's figures with where the CPU went, per workload and section; ``goals``
    as gpu.py read them (a finished report only)."""
    out: Dict[str, Any] = {"source": source, "partial": bool(report.get("partial")),
                           "device": report.get("device", {}),
                           "settings": {k: report.get("settings", {}).get(k) for k in (
                               "channels", "blocks", "width", "dense_blocks", "servers",
                               "process_searches", "loop", "eager", "framework",
                               "client_waves")},
                           "ceiling": {net: ceiling(report, net, source)
                                       for net in report.get("ceiling", {})},
                           "runs": {}}
    for workload in ("mcts_connect_four", "astar_15_puzzle"):
        found = {}
        for name in ("in_process", "handwritten_torch", "max_batch_size",
                     "process_backend", "clients_alone", "multi_device"):
            table = {key: run_figures(records, source)
                     for key, records in rounds(report, workload, name).items()}
            if table:
                found[name] = table
        mctx = report.get("runs", {}).get(workload, {}).get("mctx")
        if mctx:
            found["mctx"] = mctx
        if found:
            out["runs"][workload] = found
    if "goals" in report:
        out["goals"] = report["goals"]
    return out


def summarize_reports(folder: str, prefix: str) -> dict:
    """``report_table`` of every ``{prefix}*.json`` in ``folder`` (a later lease's
    reports, named by the script that ran them: ``c_mcts``, ``c_big``, ``c_astar`` for
    next.sh), with the folder's ``env.txt`` when there is one."""
    out: Dict[str, Any] = {"benchmark": "benchmarks/gpu.py on a GPU machine "
                                        "(benchmarks/gpu_session/)", "reports": {}}
    env = os.path.join(folder, "env.txt")
    if os.path.exists(env):
        out["machine"] = open(env).read().strip().split("\n")
    for name in sorted(os.listdir(folder)):
        if name.startswith(prefix) and name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                out["reports"][name[:-5]] = report_table(json.load(f), name[:-5])
    if not out["reports"]:
        raise SystemExit(f"no {prefix}*.json in {folder}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="results/benchmarks/gpu_h200")
    parser.add_argument("--out", default="results/benchmarks/gpu.json")
    parser.add_argument("--prefix", default=None,
                        help="a later lease's reports (next.sh: c_): a table per report")
    args = parser.parse_args()
    if not os.path.isdir(args.dir):
        raise SystemExit(f"summarize.py: error: --dir {args.dir}: no such folder")
    try:
        summary = (summarize(args.dir) if args.prefix is None
                   else summarize_reports(args.dir, args.prefix))
    except FileNotFoundError as e:  # not a whole lease of lease_a.sh and lease_b.sh
        raise SystemExit(f"summarize.py: error: --dir {args.dir} is not a lease of "
                         f"lease_a.sh and lease_b.sh ({e.filename} is missing); give "
                         f"--prefix for a later lease's reports") from None
    text = json.dumps(summary, indent=1)
    print(text)
    write_file(args.out, text + "\n")


if __name__ == "__main__":
    main()
