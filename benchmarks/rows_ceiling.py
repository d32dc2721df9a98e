"""What a row reduction can reach under the profiler's timing: every candidate the rows template
proposes, Inductor, eager, and plain kernels over the same bytes (a clone: a copy; amax over the
whole tensor: a read; a one-element add: the smallest kernel), timed as the suite times them
(benchmarks/suite/timing.py: the worker's timer, L2 write flush, the host's launch hidden; the
first contender moves on by one each round).

    python benchmarks/rows_ceiling.py [lse] [sum] [softmax] [groupnorm] [softmax_long]
    # default: all, bf16 then fp32

softmax_long (16 x 393216) also times split launch shapes (SHARED_SPLITS): a row split over fewer
blocks of a cooperative grid, each holding its slice in up to 196 KB of shared memory. Probed on
an H200 (2026-11-26, probes-*-sixteenth.log): fp32 at 256 threads x 16 blocks 1.41x Inductor, the
cluster kernel 0.99x; the template has proposed that shape for fp32 since (bf16 keeps 32 blocks).

groupnorm (512 rows of 32768) also times rows held in registers over clusters of 2-8 blocks
(CLUSTER_SHAPES), which the template offers only for few rows. On an H200 (2026-11-26,
rows_ceiling-*-seventeenth-groupnorm-*.txt) they took 30.1-40.7 us in bf16 against the template's
31.5-33.5 us, and 43.9-51.6 us in fp32 against 44.6-45.2 us: not worth proposing. The prefetching
shape (t512r1v8p, 26.9 us) is proposed.

On an H100 (2026-11-25, benchmarks/results/rows_probe-*-thirteenth.txt) a read-only reduction took
about as long as a clone of its input, and the smallest kernel 3.6 us: the bytes over the copy rate
are not a floor such a task can approach.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from agent_backend.explain import tasks_of, trace_tasks  # noqa: E402
from agent_backend.task import load_program  # noqa: E402
from benchmarks.suite.timing import copy_bytes_per_s, time_interleaved  # noqa: E402
from pointwise import Fn  # noqa: E402
from skills.rows import propose  # noqa: E402
from skills.rows.candidates import model_source, tag  # noqa: E402
from skills.rows.codegen import Launch  # noqa: E402
from skills.rows.plan import build_plan  # noqa: E402

ROUNDS = 30
# (threads, split) of shared-memory split rows: 256 blocks of 256 threads (2 an SM, 96 KB each in
# fp32) and 128 of 512 or 1024 (one an SM, 192 KB in fp32), at 16 rows
SHARED_SPLITS = ((256, 16), (512, 8), (1024, 8))
# (threads, cluster) of rows held in registers over a cluster of blocks (GroupNorm: 512 rows of 32768)
CLUSTER_SHAPES = ((128, 2), (256, 2), (128, 4), (256, 4), (512, 2), (128, 8), (256, 8))
PLAIN = ("clone (copy)", "amax all (read)", "tiny kernel")  # the same bytes, not the task: not checked


def shared_split_launches(plan) -> list[Launch]:
    return [Launch(threads, 1, plan.vector_width, "shared", split=split) for threads, split in SHARED_SPLITS]


def cluster_launches(plan) -> list[Launch]:
    """Many rows each held in registers across a cluster (CLUSTER_SHAPES), which the template
    offers only while rows x cluster fit twice the SMs."""
    return [Launch(threads, 1, plan.vector_width, "registers", cluster) for threads, cluster in CLUSTER_SHAPES]


def contenders(fn, xs: list, extra=None) -> dict:
    """Every proposed candidate (and those `extra(plan)` launches), Inductor, eager and the plain
    kernels (over the first input, the one the rows are read from)."""
    (task,) = [t for t in tasks_of(trace_tasks(Fn(fn), xs, backward=False, min_ops=1)) if t.kind == "reduction"]
    x = xs[0]
    named = {c.origin.split(":")[-1]: load_program(c.source, c.origin)["ModelNew"]() for c in propose(task)}
    plan = build_plan(task)
    for launch in extra(plan) if extra else ():
        named.setdefault(tag(plan, launch), load_program(model_source(plan, launch), tag(plan, launch))["ModelNew"]())
    flat, one = x.reshape(-1), torch.zeros(1, device=x.device)
    named.update(dict(zip(PLAIN, (lambda x, *_: x.clone(), lambda *_: torch.amax(flat), lambda *_: one.add_(1)))))
    return named | {"inductor": torch.compile(fn), "eager": fn}


def case(copy_gbs: float, label: str, fn, x: torch.Tensor, extra=None, others: tuple = ()) -> None:
    """Time `fn(x, *others)` every way `contenders` lists; the floor is x read and written once
    (the plain kernels move x's bytes)."""
    xs = [x, *others]
    named = contenders(fn, xs, extra)
    expected = fn(*xs).float()
    atol = 1e-5 if x.dtype == torch.float32 else 4e-2  # a bf16 norm's outputs of about 1 round by 2^-8 of them
    for k, f in list(named.items()):
        try:  # a shape may be refused (a cooperative grid too large) or wrong: say so, time the rest
            if k not in PLAIN and not torch.allclose(f(*xs).float(), expected, rtol=2e-2, atol=atol):
                raise ValueError("its result differs from eager's")
            f(*xs)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            print(f"  {k:24s} left out: {type(e).__name__}: {str(e)[:200]}", flush=True)
            del named[k]
    stats = time_interleaved({k: (lambda f=f: f(*xs)) for k, f in named.items()}, ROUNDS, 1, "cuda")
    nbytes = x.numel() * x.element_size()
    print(f"## {label} {tuple(x.shape)} {x.dtype}: {nbytes / 1e6:.1f} MB, floor {nbytes / copy_gbs / 1e3:.1f} us",
          flush=True)
    inductor = stats["inductor"]["median"]
    for k, s in stats.items():
        m = s["median"]
        print(f"  {k:24s} {m * 1e3:8.2f} us  p10 {s['p10'] * 1e3:8.2f}  vs Inductor {inductor / m:5.2f}x  "
              f"{nbytes / m / 1e6:7.0f} GB/s", flush=True)


def main(which: list[str]) -> None:
    device = torch.device("cuda:0")
    copy_gbs = copy_bytes_per_s("cuda") / 1e9
    for dtype in (torch.bfloat16, torch.float32):
        def r(*shape):
            return torch.randn(*shape, device=device, dtype=dtype)
        if "lse" in which:
            case(copy_gbs, "logsumexp", lambda x: torch.logsumexp(x, -1), r(4096, 8192))
        if "sum" in which:
            case(copy_gbs, "sum long rows", lambda x: x.sum(-1), r(16, 393216))
        if "softmax" in which:
            case(copy_gbs, "softmax", lambda x: torch.softmax(x, -1), r(4096, 8192))
        if "groupnorm" in which:
            w, b = r(256), r(256)
            case(copy_gbs, "groupnorm", lambda x, w, b: torch.nn.functional.group_norm(x, 32, w, b),
                 r(16, 256, 64, 64), cluster_launches, (w, b))
        if "softmax_long" in which:
            case(copy_gbs, "softmax long rows", lambda x: torch.softmax(x, -1), r(16, 393216),
                 shared_split_launches)


if __name__ == "__main__":
    main(sys.argv[1:] or ["lse", "sum", "softmax", "groupnorm", "softmax_long"])
