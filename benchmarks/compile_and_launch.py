"""Compile time and launch overhead of each way cuda-agent builds a kernel, in one run on a GPU.

    python benchmarks/compile_and_launch.py [--out results.json] [--skip-extension]

Compile times are cold: every source is new (a unique comment), and the caches live in a fresh
temporary directory unless --cache-dir is given. Launch overhead is host time per launch of an
empty kernel, launched back to back (no synchronisation inside the timed loop).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from agent_backend.env import nvrtc  # noqa: E402
from agent_backend.env.extension import keyed_extension_builds  # noqa: E402
from agent_backend.env.fast_kernel import load_kernel  # noqa: E402
from agent_backend.env.launcher import launcher_module  # noqa: E402
from cuda_agent_core import toolchain  # noqa: E402

NOOP = r"""
extern "C" __global__ void noop(float* x, int n) {
    if (n < 0) x[0] = 0.0f;  // never true: keeps the arguments alive
}
"""
EXTENSION_CUDA = NOOP + r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

void launch_noop(torch::Tensor x, int64_t n) {
    noop<<<1, 32, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), static_cast<int>(n));
}
"""
EXTENSION_CPP = "void launch_noop(torch::Tensor x, int64_t n);"


def unique(source: str) -> str:
    return f"// {uuid.uuid4().hex}\n{source}"


def seconds(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def compile_times(compiler: str, runs: int) -> dict:
    """The first compile (loads the compiler), then the median of `runs` more, each a new source."""
    first = seconds(lambda: nvrtc.compile_cubin(unique(NOOP), compiler=compiler))
    rest = [seconds(lambda: nvrtc.compile_cubin(unique(NOOP), compiler=compiler)) for _ in range(runs)]
    return {"first_s": first, "median_s": statistics.median(rest), "runs": runs}


def launch_overhead_us(launch, *, per_round: int = 200, rounds: int = 30) -> float:
    """Median host time per launch, in microseconds, over rounds of back-to-back launches."""
    return interleaved_overhead_us({"": launch}, per_round=per_round, rounds=rounds)[""]


def interleaved_overhead_us(ways: dict, *, per_round: int = 200, rounds: int = 30) -> dict[str, float]:
    """launch_overhead_us of each way, the ways taking turns round by round (A, B, A, B), so that
    a drift of the machine's speed falls on all of them alike."""
    for launch in ways.values():
        for _ in range(per_round):
            launch()
    torch.cuda.synchronize()
    per_launch = {name: [] for name in ways}
    for _ in range(rounds):
        for name, launch in ways.items():
            started = time.perf_counter()
            for _ in range(per_round):
                launch()
            per_launch[name].append((time.perf_counter() - started) / per_round)
            torch.cuda.synchronize()
    return {name: statistics.median(times) * 1e6 for name, times in per_launch.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    parser.add_argument("--cache-dir", type=Path, help="cache root to use (default: a fresh temporary one)")
    parser.add_argument("--skip-extension", action="store_true", help="skip the load_inline build (about a minute)")
    parser.add_argument("--runs", type=int, default=5, help="compiles timed per compiler after the first")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    os.environ["CUDA_AGENT_CACHE_DIR"] = str(args.cache_dir or tempfile.mkdtemp(prefix="cuda_agent_bench_"))
    results = measure(runs=args.runs, skip_extension=args.skip_extension)
    print_table(results)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")


def measure(runs: int = 5, skip_extension: bool = False) -> dict:
    """Compile time per path and launch overhead per path, on the current GPU."""
    torch.cuda.init()
    x = torch.zeros(1, device="cuda")

    results: dict = {
        "device": torch.cuda.get_device_name(),
        "arch": nvrtc.current_arch(),
        "torch": torch.__version__,
        "compilers": {name: getattr(find(), "version", None)
                      for name, find in (("nvrtc", toolchain.find_nvrtc), ("nvcc", toolchain.find_nvcc))},
        "compile_s": {},
        "launch_overhead_us": {},
    }
    compile_s = results["compile_s"]
    compile_s["launcher build (once per machine)"] = seconds(launcher_module)
    if toolchain.find_nvrtc():
        compile_s["nvrtc"] = compile_times("nvrtc", runs)
    if toolchain.find_nvcc():
        compile_s["nvcc -cubin"] = compile_times("nvcc", runs)
    compile_s["load_kernel (compile + load), cold"] = seconds(
        lambda: load_kernel(unique(NOOP), "noop", ["ptr", "i32"]))

    overhead = results["launch_overhead_us"]
    fast = load_kernel(NOOP, "noop", ["ptr", "i32"])
    overhead["fast path: Kernel.launch"] = launch_overhead_us(lambda: fast.launch(1, 32, [x, 1]))
    if hasattr(torch.cuda, "_compile_kernel"):
        compiled = torch.cuda._compile_kernel(NOOP, "noop")
        overhead["torch.cuda._compile_kernel (ctypes)"] = launch_overhead_us(
            lambda: compiled(grid=(1, 1, 1), block=(32, 1, 1), args=[x, 1]))
    if not skip_extension:
        with keyed_extension_builds(Path(os.environ["CUDA_AGENT_CACHE_DIR"]) / "extensions"):
            from torch.utils.cpp_extension import load_inline

            started = time.perf_counter()
            ext = load_inline(name="bench_noop", cpp_sources=EXTENSION_CPP, cuda_sources=unique(EXTENSION_CUDA),
                              functions=["launch_noop"], extra_cuda_cflags=["-O3"])
            compile_s["load_inline (torch/extension.h), cold"] = time.perf_counter() - started
        overhead["load_inline extension"] = launch_overhead_us(lambda: ext.launch_noop(x, 1))
    overhead["torch op x.zero_() (1 element), reference"] = launch_overhead_us(x.zero_)

    return results


def print_table(results: dict) -> None:
    print(f"{results['device']} ({results['arch']}), torch {results['torch']}, "
          f"compilers: {', '.join(f'{k}={v}' for k, v in results['compilers'].items())}")
    print("\ncompile time")
    for name, value in results["compile_s"].items():
        if isinstance(value, dict):
            print(f"  {name:45s} {value['median_s']:8.3f} s   (median of {value['runs']}; first {value['first_s']:.3f} s)")
        else:
            print(f"  {name:45s} {value:8.3f} s")
    print("\nlaunch overhead (host time per launch)")
    for name, value in results["launch_overhead_us"].items():
        print(f"  {name:45s} {value:8.2f} us")


if __name__ == "__main__":
    main()
