"""SkinnyPlan -> Candidates: a few block shapes (warps splitting k, steps a warp loads at once),
each as a launch-spec program."""
from __future__ import annotations

from agent_backend.specs import Candidate
from skills.spec_program import spec_program

from .codegen import Launch, blocks, kernel_source, vector_loads
from .plan import SkinnyPlan

# The shapes that were fastest somewhere on an H200 (benchmarks/results/skinny_clean-h200-...:
# 4-16 rows of x by 14336 x 4096 and 4 by 4096 x 14336, bf16), most often fastest first.
LAUNCHES = (Launch(8, 1), Launch(4, 1), Launch(16, 1), Launch(4, 2), Launch(8, 2), Launch(2, 2))


def tag(launch: Launch) -> str:
    return f"w{launch.warps}u{launch.unroll}"


def launch_arguments(plan: SkinnyPlan, launch: Launch) -> tuple:
    """(grid, block, dynamic shared memory, cluster, workspace bytes, persistent)."""
    return (blocks(plan), (launch.threads,), 0, 1, 0, False)


def model_source(plan: SkinnyPlan, launch: Launch) -> str:
    name = f"skinny_{tag(launch)}"
    whole = vector_loads(plan)
    alignment = [1] * len(plan.inputs)
    alignment[plan.matrix.input] = 16 if whole["matrix"] else 1
    alignment[plan.vector.input] = max(alignment[plan.vector.input], 16 if whole["vector"] else 1)
    vectorised = any(whole.values())
    return spec_program(
        origin=f"builtin:skinny:{tag(launch)}",
        description=(f"a {plan.rows}-row matrix times {plan.vectors} vectors on the tensor cores, specialised "
                     "to these signatures and run by the C++ launch op"),
        name=name, inputs=plan.inputs, outputs=plan.outputs,
        main=(kernel_source(plan, name, launch), launch_arguments(plan, launch), tuple(alignment)),
        fallback=(kernel_source(plan, name, launch, vectors=False), launch_arguments(plan, launch))
        if vectorised else None)


def propose_candidates(plan: SkinnyPlan) -> list[Candidate]:
    return [Candidate(model_source(plan, c), f"builtin:skinny:{tag(c)}", {"warps": c.warps, "unroll": c.unroll})
            for c in LAUNCHES]
