"""Instructions of each template kernel a suite problem gets, counted on the CPU: where ncu cannot
run (it did not on the H200 machines), the SASS of a kernel says what an element costs. Each
candidate's main kernel is compiled as the environment compiles it for the GPU named (nvcc
-cubin) and disassembled (nvdisasm: the `nvidia-cuda-nvdisasm` wheel of the test extra has it);
its instructions are counted by opcode.

    python -m benchmarks.sass_mix cross_entropy --dtype bf16
    python -m benchmarks.sass_mix layernorm_gelu softmax --dtype bf16 fp32 --arch sm_90

The count is of the code, not of its execution: a kernel whose loop over a thread's vectors is
fully unrolled (rows held in registers) runs each instruction once, so "per element" (the count
over the elements a thread takes) is what an element costs; a streaming loop's body runs once a
vector, so there the count is a lower bound. On 2026-11-26 a bf16 cross-entropy's kernel counted
17 instructions an element, 11 after its max and exps were fixed (1.90x -> 2.35x Inductor on an
H200).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

from agent_backend.explain import tasks_of, trace_tasks
from agent_backend.specs import Task
from benchmarks.suite.problem import build
from benchmarks.suite.registry import select
from skills import pointwise, rows
from skills.rows.plan import build_plan

TEMPLATES = {"reduction": rows, "scan": rows, "pointwise": pointwise}
_OPCODE = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P[0-9T] )?([A-Z][A-Z0-9]*)", re.M)


def nvdisasm() -> str | None:
    """nvdisasm on PATH, else the one the nvidia-cuda-nvdisasm wheel installs."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for candidate in Path(root).glob("cu*/bin/nvdisasm"):
            return str(candidate)
    return None


@dataclasses.dataclass(frozen=True)
class Mix:
    origin: str
    registers: int
    opcodes: Counter
    elements_a_thread: float

    @property
    def count(self) -> int:
        return sum(self.opcodes.values())


def kernel_mix(candidate, task: Task, arch: str, workdir: Path) -> Mix:
    """The opcode counts of a candidate program's main kernel (MAIN_SOURCE) built for `arch`."""
    registers, sass = kernel_sass(candidate, arch, workdir)
    return Mix(candidate.origin, registers, Counter(_OPCODE.findall(sass)), _elements_a_thread(candidate, task))


def kernel_sass(candidate, arch: str, workdir: Path) -> tuple[int, str]:
    """A candidate program's main kernel (MAIN_SOURCE) built for `arch`: its registers and SASS."""
    path = workdir / "kernel.cu"
    path.write_text(re.search(r"MAIN_SOURCE = r\'\'\'(.*?)\'\'\'", candidate.source, re.S).group(1))
    built = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-Xptxas", "-v", "-o", str(path.with_suffix(".cubin")),
                            str(path)], capture_output=True, text=True, check=True)
    registers = int(re.search(r"Used (\d+) registers", built.stderr).group(1))
    sass = subprocess.run([nvdisasm(), str(path.with_suffix(".cubin"))], capture_output=True, text=True,
                          check=True).stdout
    return registers, sass


def _elements_a_thread(candidate, task: Task) -> float:
    """Elements of a row a thread takes in a rows kernel (its row's length over the threads a row
    has), or of one step of a pointwise kernel's loop (unroll x vector width)."""
    params = candidate.params
    if "unroll" in params:
        return params["unroll"] * params["vector_width"]
    return build_plan(task).row_length / (params["threads"] * params["cluster"] * params["split"])


def problem_tasks(name: str, dtype: str) -> list[Task]:
    """The tasks of suite problem `name` as the suite runs it, traced on the CPU at its full size
    (for the GPU): an inference problem under no_grad, as problem.make_call runs it (with grad on,
    a norm's graph also returns its mean and rstd in fp32, so a kernel counted so took no fast
    fp16/bf16 forms where the suite's did)."""
    (problem,) = select(only=[name])
    model, inputs = build(problem, dtype, "cpu", small=False)
    with torch.enable_grad() if problem.train else torch.no_grad():
        reports = trace_tasks(model, inputs, backward=problem.train, min_ops=1)
    return [task.on_device("cuda") for task in tasks_of(reports)]


def problem_mixes(name: str, dtype: str, arch: str) -> list[tuple[Task, list[Mix]]]:
    """Each template task of suite problem `name` (problem_tasks) and the mixes of its candidates."""
    found = []
    with tempfile.TemporaryDirectory() as workdir:
        for task in problem_tasks(name, dtype):
            template = TEMPLATES.get(task.kind)
            if template is None or template.supports(task) is not None:
                continue
            found.append((task, [kernel_mix(c, task, arch, Path(workdir)) for c in template.propose(task)]))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="+", help="suite problem names (python -m benchmarks.suite --list)")
    parser.add_argument("--dtype", nargs="+", default=["bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args(argv)
    if shutil.which("nvcc") is None or nvdisasm() is None:
        print("sass_mix needs nvcc and nvdisasm (pip install nvidia-cuda-nvdisasm)", file=sys.stderr)
        return 2
    for name in args.problems:
        for dtype in args.dtype:
            for task, mixes in problem_mixes(name, dtype, args.arch):
                print(f"## {name} {dtype}: {task.kind} {' '.join(task.ops)}")
                for m in mixes:
                    top = ", ".join(f"{op} {n}" for op, n in m.opcodes.most_common(8))
                    print(f"  {m.origin:32s} {m.registers:4d} registers  {m.count:6d} instructions  "
                          f"{m.count / m.elements_a_thread:6.1f} an element ({m.elements_a_thread:g} a thread)  {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
