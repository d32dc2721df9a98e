"""PointwisePlan -> Candidates: one ModelNew program per launch configuration worth trying."""
from __future__ import annotations

import inspect
import string
from dataclasses import dataclass

from agent_backend.specs import Candidate

from .codegen import TILE, is_vector_access, kernel_source, tile_count, tiled_kernel_source, wants_tiles
from .plan import PointwisePlan

TYPICAL_SM_COUNT = 132  # H100/H200; used only to drop configs that would launch like another


@dataclass(frozen=True)
class LaunchConfig:
    block: int                # threads per block
    unroll: int               # element groups (vectors) each thread takes per loop step
    waves: int | None = None  # None: a grid covering every group once; else at most this many full waves

    def tag(self, width: int) -> str:
        return f"b{self.block}u{self.unroll}v{width}" + (f"w{self.waves}" if self.waves else "")

    # What model_source needs of a config (TiledConfig has the same): the kernel and its launch.
    @property
    def threads(self) -> tuple[int, int, int]:
        return (self.block, 1, 1)

    @property
    def groups_per_block(self) -> int:
        return self.block * self.unroll

    def vector_width(self, plan: PointwisePlan) -> int:
        return plan.vector_width

    def kernel(self, plan: PointwisePlan, name: str, width: int) -> str:
        return kernel_source(plan, name, self.block, self.unroll, width)

    def groups(self, plan: PointwisePlan, width: int) -> int:
        return plan.numel // width

    def params(self, width: int) -> dict:
        return {"block": self.block, "unroll": self.unroll, "waves": self.waves, "vector_width": width}


@dataclass(frozen=True)
class TiledConfig:
    """The tiled kernel (codegen.tiled_kernel_source): one TILE x TILE tile per block of TILE x
    `rows` threads, a grid of one block per tile, element by element (no vectors)."""
    rows: int
    waves = None
    groups_per_block = 1  # a group is a tile

    def tag(self, width: int) -> str:
        return f"t{TILE}r{self.rows}"

    @property
    def threads(self) -> tuple[int, int, int]:
        return (TILE, self.rows, 1)

    def vector_width(self, plan: PointwisePlan) -> int:
        return 1

    def kernel(self, plan: PointwisePlan, name: str, width: int) -> str:
        return tiled_kernel_source(plan, name, self.rows)

    def groups(self, plan: PointwisePlan, width: int) -> int:
        return tile_count(plan)

    def params(self, width: int) -> dict:
        return {"tile": TILE, "rows": self.rows}


SEARCH_SPACE = (
    LaunchConfig(128, 1), LaunchConfig(256, 1), LaunchConfig(512, 1),
    LaunchConfig(128, 4), LaunchConfig(256, 2), LaunchConfig(256, 4),
    LaunchConfig(256, 1, waves=8), LaunchConfig(512, 2, waves=4),
)
# Added where an operand is transposed (codegen.wants_tiles): coalesced through shared memory.
TILED_SEARCH_SPACE = (TiledConfig(8), TiledConfig(4))


def grid_blocks(groups: int, per_block: int, threads: int, waves: int | None, sm_count: int) -> int:
    """Blocks of `threads` threads to launch, each taking `per_block` groups a step: enough for
    every group once, capped at `waves` full waves of resident blocks (2048 threads an SM) when
    `waves` is set; at least one, for a scalar tail."""
    blocks = max(1, -(-groups // per_block))
    if waves is not None:
        blocks = min(blocks, waves * sm_count * (2048 // threads))
    return blocks


def launch_configs(groups: int) -> list[LaunchConfig]:
    """SEARCH_SPACE less configs that would launch exactly like an earlier one on a typical GPU,
    or that would leave over half of a single block idle (the first config always stays)."""
    chosen, launches = [], set()
    for c in SEARCH_SPACE:
        launch = (c.block, c.unroll, grid_blocks(groups, c.groups_per_block, c.block, c.waves, TYPICAL_SM_COUNT))
        if launch in launches or (chosen and c.block * c.unroll > 2 * groups):
            continue
        chosen.append(c)
        launches.add(launch)
    return chosen


def propose_candidates(plan: PointwisePlan) -> list[Candidate]:
    configs = launch_configs(plan.numel // plan.vector_width) + list(TILED_SEARCH_SPACE if wants_tiles(plan) else ())
    return [Candidate(model_source(plan, c), f"builtin:pointwise:{c.tag(c.vector_width(plan))}",
                      c.params(c.vector_width(plan)))
            for c in configs]


_MODEL = string.Template('''\
import torch

from agent_backend.env.launch_op import launch_spec_model
from agent_backend.env.launch_spec import Arg, KernelLaunch, LaunchSpec
from agent_backend.specs import TensorSpec

# builtin:pointwise:$tag - one fused pointwise kernel, specialised to these signatures and run
# by the C++ launch op (a launch spec: no Python runs per call).
INPUTS = $inputs  # (shape, stride, dtype) of each input
OUTPUTS = $outputs
THREADS, GROUPS_PER_BLOCK, WAVES = $threads, $per_block, $waves
KERNEL_NAME = "$name"
ARGS = [Arg.input(k) for k in range(len(INPUTS))] + [Arg.output(k) for k in range(len(OUTPUTS))]

MAIN_SOURCE = r\'\'\'$main_source\'\'\'
MAIN_GROUPS = $main_groups
# Bytes each input's data pointer must be a multiple of for MAIN's vector loads; where one is
# not, FALLBACK (the same computation, one element per access) runs instead.
MAIN_ALIGNMENT = $alignment
FALLBACK_SOURCE = $fallback_source
FALLBACK_GROUPS = $fallback_groups


$grid_blocks

def _launch(source, groups, alignment=()):
    sm_count = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    blocks = grid_blocks(groups, GROUPS_PER_BLOCK, THREADS[0] * THREADS[1], WAVES, sm_count)
    return KernelLaunch.compile(source, KERNEL_NAME, grid=blocks, block=THREADS, args=ARGS, alignment=alignment)


KERNELS = [_launch(MAIN_SOURCE, MAIN_GROUPS, MAIN_ALIGNMENT)]
if FALLBACK_SOURCE:
    KERNELS.append(_launch(FALLBACK_SOURCE, FALLBACK_GROUPS))
ModelNew = launch_spec_model(LaunchSpec(inputs=[TensorSpec(*s, "cuda") for s in INPUTS],
                                        outputs=[TensorSpec(*s, "cuda") for s in OUTPUTS], kernels=KERNELS))
''')


def model_source(plan: PointwisePlan, config: LaunchConfig | TiledConfig) -> str:
    """KernelBench-style program whose ModelNew runs `plan` with `config` as a launch spec,
    compiled for the current GPU at import."""
    width = config.vector_width(plan)
    name = f"pointwise_{config.tag(width)}"
    fallback = config.kernel(plan, name, 1) if width > 1 else None
    alignment = tuple(width * op.spec.torch_dtype.itemsize if k in plan.reads and is_vector_access(op, width) else 1
                      for k, op in enumerate(plan.inputs))
    return _MODEL.substitute(
        tag=config.tag(width), name=name, threads=config.threads, per_block=config.groups_per_block,
        waves=config.waves,
        inputs=_signatures(op.spec for op in plan.inputs), outputs=_signatures(op.spec for op in plan.outputs),
        main_source=config.kernel(plan, name, width), main_groups=config.groups(plan, width), alignment=alignment,
        fallback_source=f"r'''{fallback}'''" if fallback else None, fallback_groups=config.groups(plan, 1),
        # the program carries grid_blocks' own source, so its grid is the one pruning assumed
        grid_blocks=inspect.getsource(grid_blocks))


def _signatures(specs) -> str:
    return "[" + ", ".join(f"({s.shape}, {s.stride}, {s.dtype!r})" for s in specs) + "]"
