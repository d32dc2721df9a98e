"""Built-in template: row reductions and normalisations (softmax, log_softmax, layer/RMS norm,
logsumexp, sum/mean/amax/amin/var over dims) and scans along rows (cumsum), with their pointwise
prologue and epilogue, as one CUDA kernel that reads each row from global memory once. See
README.md beside this file."""
from __future__ import annotations

from agent_backend.specs import Candidate, Task
from skills.pointwise.errors import Unsupported

from .candidates import launch_configs, propose_candidates
from .plan import RowPlan, build_plan

# A sum of exp(y - max) taken online streams its rows once (plan.Partial); holding each row on
# chip for a max pass and a sum pass measured faster where a row is at most this long (on an
# H100, 2026-11-26: cross-entropy over 32000 classes in bf16, logsumexp and log-softmax over
# 8192 in both dtypes, by 2-10%), and slower where it is 128 KB (fp32 cross-entropy: 189 us
# streamed, 197 us held over a pair of cluster blocks). Above it, both are tried.
ONLINE_ROW_BYTES = 64 * 1024


def plans(task: Task) -> list[RowPlan]:
    """The plans worth trying for `task`, each with launch shapes; Unsupported where none is."""
    online = build_plan(task, online=True)
    if not online.online:  # no sum of exp to take online: the same plan as the held one
        launch_configs(online)  # raises Unsupported where no launch shape fits
        return [online]
    held = build_plan(task)
    fitting = [p for p in (online, held) if _fits(p)]
    if not fitting:
        launch_configs(held)  # raises Unsupported: why no launch shape fits
    if len(fitting) == 2 and _row_bytes(online) <= ONLINE_ROW_BYTES:
        return [held]
    return fitting


def _fits(plan: RowPlan) -> bool:
    try:
        launch_configs(plan)
    except Unsupported:
        return False
    return True


def _row_bytes(plan: RowPlan) -> int:
    return plan.row_length * max(plan.inputs[a.input].torch_dtype.itemsize for a in plan.accesses if not a.per_row)


def supports(task: Task) -> str | None:
    """None if the template can handle `task`, else a short reason why not."""
    try:
        plans(task)
    except Unsupported as e:
        return str(e)
    return None


def propose(task: Task) -> list[Candidate]:
    """One candidate per plan and launch shape worth trying; [] when unsupported."""
    try:
        return [c for plan in plans(task) for c in propose_candidates(plan)]
    except Unsupported:
        return []


__all__ = ["supports", "propose", "plans"]
