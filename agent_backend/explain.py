"""`cuda-agent explain`: which subgraphs the backend would hand to the agent, without searching."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch
from torch._inductor.compile_fx import compile_fx

from skills import rewrites

from .graph_pass import Decision, GraphReport, SubgraphPass
from .options import resolve


def load_factory(spec: str):
    """'path/to/file.py:make' -> the callable `make` from that file."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise SystemExit(f"cuda-agent: expected FILE.py:FACTORY, got {spec!r}")
    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"cuda-agent: no such file: {file}")
    module_spec = importlib.util.spec_from_file_location(f"cuda_agent_user_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, str(file.parent.resolve()))
    module_spec.loader.exec_module(module)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise SystemExit(f"cuda-agent: {file} has no callable {name!r}")
    return factory


def _as_tuple(inputs) -> tuple:
    return tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)


def trace_tasks(model, inputs, *, backward: bool = True, min_ops: int = 2) -> list[GraphReport]:
    """Compile `model` with a pass that records the tasks of every graph and replaces nothing;
    run one backward too (if `backward` and an output needs grad) so backward graphs show."""
    reports: list[GraphReport] = []

    def backend(gm, example_inputs):
        record = SubgraphPass(lambda task: Decision(task, None, "recorded only"), min_ops, reports)
        return compile_fx(gm, example_inputs, config_patches={"post_grad_custom_pre_pass": record})

    run_compiled(model, inputs, backend, backward=backward)
    return reports


def run_compiled(model, inputs, backend, *, backward: bool = True, options: dict | None = None) -> None:
    """Compile `model` from scratch with `backend` and run it once on `inputs`, then one backward
    (if `backward` and an output needs grad) so that backward graphs are compiled too."""
    torch._dynamo.reset()
    out = torch.compile(model, backend=backend, options=options)(*_as_tuple(inputs))
    tensors = [t for t in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(t, torch.Tensor)]
    if backward and any(t.requires_grad for t in tensors):
        sum(t.float().sum() for t in tensors if t.requires_grad).backward()


def tasks_of(reports: list[GraphReport]) -> list:
    return [d.task for r in reports for d in r.decisions if d.task is not None]


def explain(factory, options: dict | None = None) -> list[GraphReport]:
    settings = resolve(options)
    model, inputs = factory()
    return trace_tasks(model, inputs, min_ops=settings.min_ops)


def reports_to_json(reports: list[GraphReport]) -> list[dict]:
    return [
        {"graph": r.graph_index,
         "subgraphs": [{"hash": d.task.hash, "kind": d.task.kind, "ops": list(d.task.ops),
                        "inputs": [s.to_json() for s in d.task.inputs],
                        "outputs": [s.to_json() for s in d.task.outputs],
                        "rewrites": dict(rewrites.explain(d.task))}
                       for d in r.decisions if d.task is not None],
         "not_tasks": [d.reason for d in r.decisions if d.task is None]}
        for r in reports
    ]


def _short_ops(ops) -> str:
    names = [o.split(".")[1] for o in ops]
    return " -> ".join(names) if len(names) <= 8 else " -> ".join(names[:7]) + f" ... ({len(names)} ops)"


def format_reports(reports: list[GraphReport]) -> str:
    lines = []
    for r in reports:
        tasks = [d.task for d in r.decisions if d.task is not None]
        lines.append(f"graph {r.graph_index}: {len(tasks)} subgraph(s)")
        for t in tasks:
            ins = ", ".join(f"{s.dtype}{list(s.shape)}" for s in t.inputs)
            lines.append(f"  {t.hash[:16]}  {t.kind:<9} {_short_ops(t.ops)}")
            lines.append(f"  {'':16}  inputs: {ins} on {t.inputs[0].device if t.inputs else '-'}")
            lines.extend(f"  {'':16}  rewrite {name}: {'applies' if why is None else 'no, ' + why}"
                         for name, why in rewrites.explain(t))
        for d in r.decisions:
            if d.task is None:
                lines.append(f"  (skipped: {d.reason})")
    return "\n".join(lines)


def run_explain(spec: str, as_json: bool) -> int:
    reports = explain(load_factory(spec))
    print(json.dumps(reports_to_json(reports), indent=2) if as_json else format_reports(reports))
    return 0
