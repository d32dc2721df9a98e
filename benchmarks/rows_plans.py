"""Both rows plans of a suite problem's row tasks: every launch shape of its online plan (a sum of
exp(x - max) taken beside the max: skills/rows/README.md) and of its held plan (the row on chip
for a max pass and a sum pass), plus streaming shapes of 128-1024 threads, against Inductor's
kernel for the task and a copy of as many bytes (triton.testing.do_bench, the least of 3 rounds,
contenders interleaved). What set skills/rows.ONLINE_ROW_BYTES (on an H100, 2026-11-26:
benchmarks/results/online_probe-h100-torch2.11-2026-11-26-twentieth.txt).

    python benchmarks/rows_plans.py cross_entropy:bf16 cross_entropy:fp32 logsumexp:fp32 ...
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from agent_backend.explain import tasks_of, trace_tasks  # noqa: E402
from agent_backend.specs import random_inputs  # noqa: E402
from agent_backend.task import load_program  # noqa: E402
from benchmarks.suite.problem import build  # noqa: E402
from benchmarks.suite.registry import select  # noqa: E402
from skills import rows  # noqa: E402
from skills.rows.candidates import launch_configs, model_source, tag  # noqa: E402
from skills.rows import codegen as this_codegen  # noqa: E402
from skills.rows.codegen import Launch  # noqa: E402
from skills.rows.plan import build_plan  # noqa: E402

STREAMING_THREADS = (128, 256, 512, 1024)  # extra shapes of a streamed (nothing held) online plan


def bench(fns: dict, rounds: int = 3) -> dict:
    """Each contender's least do_bench time over `rounds` interleaved rounds, in us."""
    import triton.testing  # on a GPU machine only

    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            times[k].append(triton.testing.do_bench(f, warmup=5, rep=40))
    return {k: min(t) * 1000 for k, t in times.items()}


def bench_beside_inductor_and_copy(fns: dict, reference, ins: list, copied, copy_label: str = "copy",
                                   rounds: int = 3) -> str:
    """`fns` timed (bench) beside Inductor's compile of `reference` on `ins` ("inductor") and a
    copy of the tensor `copied` (`copy_label`): every contender, fastest first, on one line."""
    compiled = torch.compile(reference, backend="inductor")
    compiled(*ins)
    destination = torch.empty_like(copied)
    t = bench({**fns, "inductor": lambda: compiled(*ins), copy_label: lambda: destination.copy_(copied)}, rounds)
    return " | ".join(f"{k} {v:.1f}us" for k, v in sorted(t.items(), key=lambda kv: kv[1]))


def plan_launches(task) -> list[tuple[str, object, Launch]]:
    """(label, plan, launch): "on:<tag>" for each launch of the online plan (and, where it holds
    nothing, STREAMING_THREADS), "2p:<tag>" for each of the held one."""
    launches = []
    for online in (True, False):
        plan = build_plan(task, online)
        shapes = list(launch_configs(plan))
        if online and not plan.stored:
            shapes += [Launch(t, 1, plan.vector_width) for t in STREAMING_THREADS]
        launches += [(("on:" if online else "2p:") + tag(plan, c), plan, c) for c in dict.fromkeys(shapes)]
    return launches


def plan_contenders(launches, ins: list, expected: tuple, atol: float = 2e-2, codegen=this_codegen) -> dict:
    """Those of `launches` ((label, plan, launch), as plan_launches gives them) that run and agree
    with the task's program (`expected`, its outputs on `ins`), each a call; their kernels written
    and sized by `codegen` (another version of the codegen module, where rows_ab.py compares two)."""
    fns = {}
    for label, plan, launch in launches:
        try:
            model = load_program(model_source(plan, launch, codegen), label)["ModelNew"]()
            out = model(*ins)
            torch.cuda.synchronize()  # a kernel's fault shows here, under its own label
        except Exception as e:  # noqa: BLE001 - a shape may be refused: say so, time the rest
            print(label, "failed:", str(e).splitlines()[0][:160])
            continue
        out = out if isinstance(out, tuple) else (out,)
        if not all(torch.allclose(a.float(), b.float(), rtol=2e-2, atol=atol) for a, b in zip(out, expected)):
            print(label, "differs from the task's program: left out")
            continue
        fns[label] = (lambda m=model: m(*ins))
    return fns


def rows_input(ins: list[torch.Tensor]) -> torch.Tensor:
    """A row task's rows: its largest input (not a loss's targets, nor a norm's weight)."""
    return max(ins, key=torch.Tensor.numel)


def row_tasks(name: str, dtype: str, min_row: int = 1024):
    """(task, inputs, reference, expected) for each row task of suite problem `name` in `dtype`
    the rows template takes, of rows of at least `min_row` elements: the task on CUDA, random
    inputs, its program's module and its outputs on them (a tuple)."""
    (problem,) = select(only=[name])
    model, inputs = build(problem, dtype, "cpu", small=False)
    for task in tasks_of(trace_tasks(model, inputs, backward=False, min_ops=1)):
        task = task.on_device("cuda")
        if task.kind != "reduction" or rows.supports(task) is not None or build_plan(task).row_length < min_row:
            continue
        ins = random_inputs(task.inputs, 0, scale=2.0, device="cuda")
        reference = load_program(task.program)["Model"]().cuda()
        with torch.no_grad():
            expected = reference(*ins)
        yield task, ins, reference, expected if isinstance(expected, tuple) else (expected,)


def main(specs: list[str]) -> None:
    for spec in specs:
        name, dtype = spec.split(":")
        for task, ins, reference, expected in row_tasks(name, dtype):
            fns = plan_contenders(plan_launches(task), ins, expected)
            x = rows_input(ins)  # half of it copied: as many bytes moved as reading it
            line = bench_beside_inductor_and_copy(fns, reference, ins, x.view(-1)[: x.numel() // 2], "copy_same_bytes")
            print(spec, task.hash[:8], line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
