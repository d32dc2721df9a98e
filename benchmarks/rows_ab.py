"""Versions of the rows template's code generation, A/B on a GPU: launches of suite problems'
row tasks written by one or more base copies of skills/rows/codegen.py (comma-separated) and by
this checkout's, each checked against the task's program, then timed interleaved in one process
(rows_plans.bench: the least do_bench time of 5 rounds). Only codegen.py is swapped (each
version writes its kernels and sizes their grid, shared memory, workspace and counters), so a
base must agree with this checkout's plan.py and candidates.py. Per launch: each base's us and
base / new, then new's us; per line, a copy of the task's rows (as many bytes as a softmax moves).

    git show main:skills/rows/codegen.py > /tmp/codegen_main.py
    python benchmarks/rows_ab.py /tmp/codegen_main.py softmax_long_rows:bf16:t256r1v8g16o,t128r1v8g32o logsumexp:fp32

A spec is problem:dtype[:tags]: the launches of the task's online plan (the held one where it
has no online sums) with those tags, or its first two.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from benchmarks.rows_plans import bench, plan_contenders, row_tasks, rows_input  # noqa: E402
from skills.rows import codegen as this_codegen  # noqa: E402
from skills.rows.candidates import launch_configs, tag  # noqa: E402
from skills.rows.plan import build_plan  # noqa: E402

DEFAULT_LAUNCHES = 2


def load_codegen(path: str):
    """The codegen module at `path`, imported as a sibling of skills.rows.codegen (its relative
    imports resolve to this checkout's plan.py and the rest)."""
    spec = importlib.util.spec_from_file_location("skills.rows.codegen_base", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def ab_launches(task, tags: list[str]) -> list[tuple[str, object, object]]:
    """(tag, plan, launch) for the launches named by `tags` (or the first DEFAULT_LAUNCHES) of the
    task's online plan, or of its held plan where the online one has no online sums."""
    plan = build_plan(task, True)
    if not plan.online:
        plan = build_plan(task, False)
    configs = [(tag(plan, c), plan, c) for c in launch_configs(plan)]
    return [c for c in configs if c[0] in tags] or configs[:DEFAULT_LAUNCHES]


def main(base_paths: list[str], specs: list[str]) -> None:
    codegens = {Path(p).stem: load_codegen(p) for p in base_paths}
    if "new" in codegens or len(codegens) < len(base_paths):
        sys.exit(f"bases need distinct file names, none of them new.py: {base_paths}")
    codegens["new"] = this_codegen
    for spec in specs:
        name, dtype, *tags = spec.split(":")
        for task, ins, _, expected in row_tasks(name, dtype):
            launches = ab_launches(task, tags[0].split(",") if tags else [])
            fns = {}
            for version, codegen in codegens.items():
                fns.update(plan_contenders([(f"{version}:{t}", plan, c) for t, plan, c in launches], ins, expected,
                                           codegen=codegen))
            rows, destination = _copied(ins)
            times = bench({**fns, "copy": lambda: destination.copy_(rows)}, rounds=5)
            print(spec, task.hash[:8], " | ".join(_compared(t, list(codegens), times) for t, _, _ in launches),
                  f"| copy {times['copy']:.1f}", flush=True)


def _copied(ins: list):
    """The task's rows and a destination: a copy of as many bytes as a row task that reads its
    rows once and writes as many (a softmax) must move, timed beside it."""
    rows = rows_input(ins)
    return rows, torch.empty_like(rows)


def _compared(launch_tag: str, versions: list[str], times: dict) -> str:
    """One launch's times: each base's us and base / new, then new's (a version that failed or
    differed is missing from `times`, and from the line)."""
    new = times.get(f"new:{launch_tag}")
    parts = [f"{v} {times[f'{v}:{launch_tag}']:.1f}" + (f" ({times[f'{v}:{launch_tag}'] / new:.3f}x)" if new else "")
             for v in versions[:-1] if f"{v}:{launch_tag}" in times]
    return f"{launch_tag}: " + " ".join(parts + ([f"new {new:.1f}"] if new else []))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1].split(","), sys.argv[2:])
