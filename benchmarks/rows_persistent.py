"""Softmax over many long rows (KernelBench level 1's 4096 x 393216), hand-written kernels of
benchmarks/rows_persistent.cu and the backend's own ("gen-t<threads>") against Inductor and
torch's copy of the tensor (triton.testing.do_bench, the least of 3 interleaved rounds): a row
over a cluster of C blocks, NCL clusters launched (persistent: they loop over the rows; n4096:
one cluster a row; fit: as many as fit at once), held in registers with the next row loaded as
this one is stored ("hold"), staged in shared memory by bulk copies a row or two ahead
("staged"), or read twice, the second time from L2 ("l2"), and a copy on
the same grid ("pcopy"). What set skills/rows/candidates' persistent clusters (on an H200,
2026-11-27: benchmarks/results/persistent_probe-h200-torch2.11-2026-11-27-twentyseventh.txt).

    python benchmarks/rows_persistent.py bf16,fp32 [LABEL-SUBSTRINGS,...] [--rows N]

--rows 1024 matches the suite's softmax_many_long_rows, all of whose generated kernels
benchmarks/rows_plans.py times (benchmarks/gpu_session.sh many-long-rows runs both).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from agent_backend.env.launch_op import launch_spec_model  # noqa: E402
from agent_backend.env.launch_spec import Arg, KernelLaunch, LaunchSpec  # noqa: E402
from agent_backend.explain import tasks_of, trace_tasks  # noqa: E402
from agent_backend.specs import TensorSpec  # noqa: E402
from agent_backend.task import load_program  # noqa: E402
from benchmarks.rows_phases import COMMON  # noqa: E402
from benchmarks.rows_plans import bench  # noqa: E402
from skills.rows.candidates import MAX_CLUSTER, model_source  # noqa: E402
from skills.rows.codegen import Launch  # noqa: E402
from skills.rows.plan import build_plan  # noqa: E402

ROWS, ROWLEN = 4096, 393216
SRC = (Path(__file__).parent / "rows_persistent.cu").read_text()


def source(dtype: str, C=8, T=512, MINB=1, HOLD=1, PREFETCH=1, U=4, NOL1=0, STCS=0, STAGE=0, NBUF=2, NCH=4,
           rows=ROWS) -> str:
    """rows_persistent.cu under its defines: C blocks a row, T threads, MINB blocks an SM, ..."""
    vw = 8 if dtype == "bf16" else 4
    nvs = ROWLEN // C // vw
    nv = nvs // T
    assert nvs % (T * U) == 0 and nv * T == nvs
    d = dict(E="bf16" if dtype == "bf16" else "float", VW=vw, C=C, THREADS=T, MINB=MINB, ROWS=rows, ROWLEN=ROWLEN,
             HOLD=HOLD, PREFETCH=PREFETCH, NV=nv, U=U, NOL1=NOL1, STCS=STCS, STAGE=STAGE, NBUF=NBUF, NCH=NCH)
    return "".join(f"#define {k} {v}\n" for k, v in d.items()) + COMMON + SRC


def variant(dtype, C: int, T: int, kernel="persist", NCL=16, rows=ROWS, **defines):
    """The kernel on NCL clusters of C blocks of T threads (its grid; NCL 0: as many as fit at
    once, the launch op's persistent launch), as a launch-op model of x -> softmax(x) over `rows`
    rows."""
    src = source(dtype, C=C, T=T, rows=rows, **defines)
    x = TensorSpec((rows, ROWLEN), (ROWLEN, 1), "bfloat16" if dtype == "bf16" else "float32", "cuda")
    # a staged kernel's buffers (its variants name NBUF): NBUF slices of the row
    staged = defines["NBUF"] * ROWLEN // C * (2 if dtype == "bf16" else 4) if kernel == "persist_staged" else 0
    launch = KernelLaunch.compile(src, kernel, grid=(NCL or rows) * C, block=T, args=(Arg.input(0), Arg.output(0)),
                                  shared_mem=staged, cluster=C if kernel.startswith("persist") else 1,
                                  persistent=NCL == 0)
    return launch_spec_model(LaunchSpec(inputs=(x,), outputs=(x,), kernels=(launch,)))()


# rows read twice, the second time from L2 (and a copy on the same grid), in either dtype
STREAMED = {
    "l2-c8t512-m2-n32": dict(C=8, T=512, MINB=2, NCL=32, HOLD=0),
    "l2-c8t512-m2-n16": dict(C=8, T=512, MINB=2, NCL=16, HOLD=0),
    "l2-c8t512-m3-n48": dict(C=8, T=512, MINB=3, NCL=48, HOLD=0),
    "l2-c8t512-m2-n4096": dict(C=8, T=512, MINB=2, NCL=4096, HOLD=0),
    "l2-c4t512-m2-n64": dict(C=4, T=512, MINB=2, NCL=64, HOLD=0),
    "l2-c8t512-m2-n32-stcs": dict(C=8, T=512, MINB=2, NCL=32, HOLD=0, STCS=1),
    "pcopy-c8t512-m2-n32": dict(kernel="pcopy", C=8, T=512, MINB=2, NCL=32),
}
VARIANTS = {
    "bf16": {
        "hold-c8t512-n16": dict(C=8, T=512, NCL=16),
        "hold-c8t512-n15": dict(C=8, T=512, NCL=15),
        "hold-c8t512-n14": dict(C=8, T=512, NCL=14),
        "hold-c8t512-n4096": dict(C=8, T=512, NCL=4096),
        "hold-c8t512-fit": dict(C=8, T=512, NCL=0),
        # rows staged in shared memory by bulk copies, two buffers: loads run on through a row's reduction
        "staged-c8t512-b2": dict(kernel="persist_staged", C=8, T=512, STAGE=1, NBUF=2, NCL=0),
        "staged-c8t512-b2-ch1": dict(kernel="persist_staged", C=8, T=512, STAGE=1, NBUF=2, NCH=1, NCL=0),
        "staged-c8t512-b1": dict(kernel="persist_staged", C=8, T=512, STAGE=1, NBUF=1, NCL=0),
        "hold-c8t512-n16-nopf": dict(C=8, T=512, NCL=16, PREFETCH=0),
        "hold-c8t512-n16-nol1": dict(C=8, T=512, NCL=16, NOL1=1),
        "hold-c8t512-n16-stcs": dict(C=8, T=512, NCL=16, STCS=1),
        **STREAMED,
    },
    "fp32": {
        "hold-c8t1024-n16": dict(C=8, T=1024, NCL=16),
        "hold-c8t1024-n15": dict(C=8, T=1024, NCL=15),
        "hold-c8t1024-n16-nopf": dict(C=8, T=1024, NCL=16, PREFETCH=0),
        "staged-c8t1024-b1": dict(kernel="persist_staged", C=8, T=1024, STAGE=1, NBUF=1, NCL=0),
        **STREAMED,
    },
}


GENERATED_THREADS = (256, 512, 1024)  # "gen-t<threads>": skills/rows' persistent kernels of the same softmax


class Softmax(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1)


def generated(x: torch.Tensor, threads: int):
    """The backend's own candidate for softmax(x) (traced as the backend traces it): the online
    plan at `threads` a block, a persistent cluster of MAX_CLUSTER blocks a row, as a program's
    ModelNew (launch spec, fallback kernel and all)."""
    (task,) = tasks_of(trace_tasks(Softmax(), [x], backward=False, min_ops=1))
    plan = build_plan(task, online=True)
    launch = Launch(threads, 1, plan.vector_width, "registers", MAX_CLUSTER, persistent=True)
    return load_program(model_source(plan, launch), f"gen-t{threads}")["ModelNew"]()


def contenders(dtype: str, x: torch.Tensor, only: str) -> dict:
    """Each variant (whose label holds one of `only`'s comma-separated parts) that runs and gives
    softmax(x) (a copy: x), a call."""
    expected = torch.softmax(x.float(), -1).to(x.dtype)
    makers = {label: (lambda p=params: variant(dtype, rows=x.shape[0], **p))
              for label, params in VARIANTS[dtype].items()}
    makers |= {f"gen-t{t}": (lambda t=t: generated(x, t)) for t in GENERATED_THREADS}
    fns = {}
    for label, make in makers.items():
        if not any(part in label for part in only.split(",")):
            continue
        try:
            model = make()
            out = model(x)
            torch.cuda.synchronize()  # a kernel's fault shows here, under its own label
            ok = torch.equal(out, x) if label.startswith("pcopy") else torch.allclose(
                out.float(), expected.float(), rtol=2e-2, atol=1e-7)
        except Exception as e:  # noqa: BLE001 - a variant may fail: say so, time the rest
            print(dtype, label, "failed:", str(e).splitlines()[0][:200], flush=True)
            continue
        if ok:
            fns[label] = (lambda m=model: m(x))
        else:
            print(dtype, label, "differs from softmax: left out", flush=True)
    return fns


def main(dtype: str, only: str = "", rows: int = ROWS) -> None:
    torch.manual_seed(0)
    x = (torch.randn(rows, ROWLEN, device="cuda") * 2).to(torch.bfloat16 if dtype == "bf16" else torch.float32)
    fns = contenders(dtype, x, only)
    compiled = torch.compile(lambda a: torch.softmax(a, -1))
    compiled(x)
    destination = torch.empty_like(x)
    t = bench({**fns, "inductor": lambda: compiled(x), "torch-copy": lambda: destination.copy_(x)}, rounds=3)
    copy = t["torch-copy"]
    print(dtype, torch.cuda.get_device_name(), " | ".join(
        f"{k} {v:.0f}us ({copy / v:.0%})" for k, v in sorted(t.items(), key=lambda kv: kv[1])), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dtypes", help="bf16, fp32 or bf16,fp32")
    parser.add_argument("only", nargs="?", default="", help="time the variants whose label holds one of these")
    parser.add_argument("--rows", type=int, default=ROWS)
    args = parser.parse_args()
    for d in args.dtypes.split(","):
        main(d, args.only, args.rows)
        torch.cuda.empty_cache()  # the next dtype's tensors are as large
