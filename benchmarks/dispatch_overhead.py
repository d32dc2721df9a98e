"""What a winner costs per call besides its kernel: host time per call of one tiny kernel, run
each way a compiled graph (or the verifier) may call it, against a bare launch of it.

    python benchmarks/dispatch_overhead.py [--out results.json]

Ways, all on a (1024,) float32 input, launched back to back (no synchronisation inside the
timed loop; the ways take turns round by round: compile_and_launch.interleaved_overhead_us):
  bare launch             the launcher's Kernel.launch into a preallocated output
  bare launch + empty     the same with the output allocated per call (the least any forward does)
  launch op, direct       graph_launch.launch(key, program, x): the op's C++ kernel with no
                          dispatcher in between, as Inductor's wrapper calls a launch-spec winner
                          (program: a task-sized string; env/launch_lowering.py)
  launch op               torch.ops.cuda_agent.launch.in1(key, program, x), as the wrapper called
                          it until 2026-11-25 (and a C++ wrapper still does)
  launch op, list         torch.ops.cuda_agent.launch.default(key, program, [x]), the inputs as a
                          list (what graphs called until 2026-11-25)
  launch op via ModelNew  the launch-spec ModelNew called as a module (what the verifier calls)
  run_winner (old path)   torch.ops.cuda_agent.run_winner around a Python ModelNew written as
                          the pointwise template wrote them before launch specs
Prints JSON; "overhead_us" is each way less the bare launch (the target for the way graphs call a
winner: 3 us).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from agent_backend import runtime  # noqa: E402
from agent_backend.env import launch_lowering, launch_op  # noqa: E402
from agent_backend.env.fast_kernel import load_kernel  # noqa: E402
from agent_backend.env.launch_spec import Arg, KernelLaunch, LaunchSpec  # noqa: E402
from agent_backend.specs import TensorSpec  # noqa: E402
from compile_and_launch import interleaved_overhead_us  # noqa: E402
from output import emit  # noqa: E402

N = 1024
ADD_ONE = r"""
extern "C" __global__ void add_one(const float* __restrict__ x, float* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + 1.0f;
}
"""
TARGET_US = 3.0
# About the size of a pointwise task's program, which Inductor passes on every call.
PROGRAM = "# the subgraph's program\n" + "x = 0\n" * 400


class PythonModelNew(torch.nn.Module):
    """A forward as the pointwise template wrote them before launch specs: check the inputs,
    allocate, pick the kernel by alignment, launch."""

    INPUTS = [((N,), (1,), torch.float32)]

    def __init__(self, kernel):
        super().__init__()
        self.main = self.fallback = kernel  # one kernel: the choice is what is timed

    def forward(self, x):
        inputs = (x,)
        for t, (shape, stride, dtype) in zip(inputs, self.INPUTS):
            if t.device.type != "cuda" or t.dtype != dtype or tuple(t.shape) != shape or t.stride() != stride:
                raise ValueError("outside the signature")
        out = torch.empty_strided((N,), (1,), dtype=torch.float32, device=x.device)
        kernel = self.main if all(t.data_ptr() % 16 == 0 for t in inputs) else self.fallback
        kernel.launch(((N + 255) // 256, 1, 1), (256, 1, 1), [*inputs, out, N])
        return out


def measure() -> dict:
    torch.cuda.init()
    x = torch.randn(N, device="cuda")
    out = torch.empty_like(x)
    kernel = load_kernel(ADD_ONE, "add_one", ["ptr", "ptr", "i32"])
    vector = TensorSpec((N,), (1,), "float32", "cuda")
    spec = LaunchSpec((vector,), (vector,), (KernelLaunch.compile(
        ADD_ONE, "add_one", grid=(N + 255) // 256, block=256, args=(Arg.input(0), Arg.output(0), Arg("i32", N))),))
    model_class = launch_op.launch_spec_model(spec)
    launch_model = model_class()
    op, list_op = torch.ops.cuda_agent.launch.in1, torch.ops.cuda_agent.launch.default
    python_model = PythonModelNew(kernel)
    device = torch.device("cuda", torch.cuda.current_device())
    runtime.register(runtime.Winner("bench: old path", "", (vector,), "bench", forwards={device: python_model.forward}))
    run_winner = torch.ops.cuda_agent.run_winner.default
    grid = (N + 255) // 256

    assert launch_lowering.install(), "this torch's Inductor calls the op through torch.ops"
    from agent_backend.env.graph_launch import launch as direct

    assert torch.equal(op(spec.digest, PROGRAM, x)[0], x + 1), "the launch op computes something else"
    assert torch.equal(direct(spec.digest, PROGRAM, x)[0], x + 1)
    assert torch.equal(run_winner("bench: old path", PROGRAM, [x])[0], x + 1)
    us = interleaved_overhead_us({
        "bare launch": lambda: kernel.launch(grid, 256, [x, out, N]),
        "bare launch + empty": lambda: kernel.launch(
            grid, 256, [x, torch.empty_strided((N,), (1,), device=x.device), N]),
        "launch op, direct": lambda: direct(spec.digest, PROGRAM, x),
        "launch op": lambda: op(spec.digest, PROGRAM, x),
        "launch op, list": lambda: list_op(spec.digest, PROGRAM, [x]),
        "launch op via ModelNew": lambda: launch_model(x),
        "run_winner (old path)": lambda: run_winner("bench: old path", PROGRAM, [x]),
    })
    bare = us["bare launch"]
    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "host_us_per_call": us,
        "overhead_us": {name: value - bare for name, value in us.items() if name != "bare launch"},
        "target_us": TARGET_US,
        "target_met": us["launch op, direct"] - bare <= TARGET_US,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="also write the results here")
    parser.add_argument("--cache-dir", type=Path,
                        help="cache root (default: a fresh temporary one, where the launch op builds again)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    os.environ["CUDA_AGENT_CACHE_DIR"] = str(args.cache_dir or tempfile.mkdtemp(prefix="cuda_agent_bench_"))
    emit(measure(), args.out)


if __name__ == "__main__":
    main()
