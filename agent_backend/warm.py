"""`cuda-agent warm` and `cuda-agent report`: run a model through the backend once, offline.

warm searches every subgraph without a cached result (mode="search") and fills the cache, so
that later compiles, here or wherever the cache is shared, find their kernels; report only
looks up (mode="cached") and says, per subgraph, what the backend would run, with the gate's
numbers where it timed the subgraph (Inductor's time, the floor, the margin).
"""
from __future__ import annotations

import json
import logging

import torch
import torch._functorch.config

from . import backend
from .explain import load_factory, run_compiled
from .graph_pass import Decision
from .options import OptionError, resolve

log = logging.getLogger("cuda_agent")


def parse_options(pairs: list[str]) -> dict:
    """['search_budget_s=60', 'devices=["cuda:0"]'] -> options; values are JSON where they parse."""
    options = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name:
            raise OptionError(f"cuda_agent: expected an option as NAME=VALUE, got {pair!r}")
        try:
            options[name] = json.loads(text)
        except json.JSONDecodeError:
            options[name] = text
    return options


def run_model(spec: str, mode: str, options: dict, backward: bool) -> list[Decision]:
    """Compile and run the factory's model with the backend in `mode`; its decisions, in order."""
    settings_options = {**options, "mode": mode}
    resolve(settings_options)  # bad options fail here, before the model is built
    model, inputs = load_factory(spec)()
    seen = len(backend.reports)
    # Without Inductor's caches of compiled graphs, so that our pass runs and reports every graph.
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        run_compiled(model, inputs, "cuda_agent", backward=backward, options=settings_options)
    return [d for r in backend.reports[seen:] for d in r.decisions if d.task is not None]


def outcome(decision: Decision) -> str:
    return "kernel" if decision.winner_key else "inductor"


def format_gate(record: dict) -> str:
    """The gate's numbers on one line: Inductor's time, the floor and what set it, the margin."""
    verdict = "skipped the search" if record["skipped"] else "searched"
    return (f"gate: Inductor {record['inductor_ms']:.4f} ms, floor {record['floor_ms']:.4f} ms ({record['bound']}), "
            f"margin {record['margin']:.1%}, bar {record['threshold']:.3f}x: {verdict}")


def format_tried(tried: list[dict]) -> str:
    """The candidates a search tried, on one line: each with its speedup over Inductor (counted
    with its launch) or its verdict."""
    return "tried: " + ", ".join(
        f"{t['origin'].removeprefix('builtin:')} " + (f"{t['speedup']:.2f}x" if "speedup" in t else t["status"])
        for t in tried)


def format_decisions(decisions: list[Decision]) -> str:
    lines = []
    for d in decisions:
        lines.append(f"{d.task.hash[:16]}  {d.task.kind:<9} {outcome(d):<8}  {d.reason}")
        for detail in ([format_gate(d.gate)] if d.gate else []) + ([format_tried(d.tried)] if d.tried else []):
            lines.append(f"{'':16}  {'':9} {'':8}  {detail}")
    won = sum(1 for d in decisions if d.winner_key)
    gated = sum(1 for d in decisions if d.gate and d.gate["skipped"])
    lost = sum(1 for d in decisions if d.reason.startswith("lost in context"))
    notes = [f"{gated} where the gate found Inductor at the floor" if gated else "",
             f"{lost} whose kernel won alone and lost in its graph" if lost else ""]
    notes = "; ".join(n for n in notes if n)
    lines.append(f"{len(decisions)} subgraph(s): {won} run by our kernels, {len(decisions) - won} by Inductor"
                 + (f" ({notes})" if notes else ""))
    return "\n".join(lines)


def decisions_to_json(decisions: list[Decision]) -> list[dict]:
    return [{"hash": d.task.hash, "kind": d.task.kind, "ops": list(d.task.ops), "outcome": outcome(d),
             "reason": d.reason, "device": d.task.outputs[0].device, "gate": d.gate, "tried": d.tried}
            for d in decisions]


def run_warm_or_report(command: str, spec: str, option_pairs: list[str], as_json: bool, backward: bool) -> int:
    try:
        options = parse_options(option_pairs)
        if "mode" in options:
            raise OptionError(f"cuda_agent: `{command}` sets the mode itself; leave the mode option out")
        decisions = run_model(spec, "search" if command == "warm" else "cached", options, backward)
    except OptionError as e:
        print(e)
        return 2
    print(json.dumps(decisions_to_json(decisions), indent=2) if as_json else format_decisions(decisions))
    if command == "warm" and not any(d.task.outputs[0].device == "cuda" for d in decisions):
        print(f"cuda-agent warm: nothing was searched: kernels are searched for CUDA subgraphs only, and "
              f"{spec} gave none (are its inputs and model on a GPU?)")
        return 1
    return 0
