"""A GPU's floors (gate.Floors): measured once per machine, in a worker, and kept in a small JSON
file under the kernel cache root, one record per GPU (name and SM count: MIG slices share a
name), driver and torch version.

Each figure is the best of its trials (the highest FLOP rate, the shortest host time of a
launch), so floors err low: a floor too low only lets a search run that could have been skipped.
A task's memory floor is no machine figure: the gate times a copy of its bytes (`copy_call`)
beside Inductor's kernel.
Timing is the profiler's (env/profile.py CudaTimer: L2 flushed, host launch hidden, events).
"""
from __future__ import annotations

import ctypes
import json
import logging
from pathlib import Path
from typing import Callable

import filelock
from cuda_agent_core.identity import device_identity
from cuda_agent_core.paths import atomic_write_bytes

from agent_backend.gate import PRECISIONS, Floors

log = logging.getLogger("cuda_agent")

FILE_NAME = "gpu_floors.json"
FORMAT_VERSION = 3  # 3: no copy rate, launch time or L2 size (a copy is timed beside each task)
_LOCK_TIMEOUT_S = 10.0
_MATMUL_SIZES = (4096, 8192)
_TRIALS = 10


# -- the file -------------------------------------------------------------------------------------

def _records(path: Path) -> dict[str, dict]:
    """GPU key -> floors JSON; empty for a missing, damaged or older file (rewritten on the next write)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        return {}
    gpus = data.get("gpus")
    return gpus if isinstance(gpus, dict) else {}


def read_floors(path: Path, key: str) -> Floors | None:
    record = _records(path).get(key)
    try:
        return Floors.from_json(record) if record else None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def load_or_measure(path: Path, key: str, measure: Callable[[], Floors]) -> Floors:
    """The floors recorded under `key`, else `measure()`'s, recorded. Written once: a process
    that measured while another wrote keeps the record already there. A file that cannot be
    written costs a measurement per process, never an error."""
    path = Path(path)
    found = read_floors(path, key)
    if found is not None:
        return found
    floors = measure()
    try:
        with filelock.FileLock(str(path) + ".lock", timeout=_LOCK_TIMEOUT_S):
            written = read_floors(path, key)  # by another process while we measured
            if written is not None:
                return written
            records = _records(path)
            records[key] = floors.to_json()
            text = json.dumps({"format_version": FORMAT_VERSION, "gpus": records}, indent=1, sort_keys=True)
            atomic_write_bytes(path, text.encode())
    except (OSError, filelock.Timeout) as exc:
        log.warning("cuda_agent: could not record the GPU's floors in %s (%s); measuring again next time", path, exc)
    return floors


# -- which GPU ------------------------------------------------------------------------------------

def driver_version() -> str:
    """The NVIDIA kernel module's version ("570.124.06"), else the CUDA driver API's, else "unknown"."""
    try:
        return Path("/sys/module/nvidia/version").read_text().strip()
    except OSError:
        pass
    try:
        version = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            return f"cuda {version.value}"
    except OSError:
        pass
    return "unknown"


def machine_key(gpu_name: str, driver: str, torch_version: str) -> str:
    return f"{gpu_name} | driver {driver} | torch {torch_version}"


def gpu_key(index: int | None) -> str:
    """The record of CUDA device `index` (None: the current one). The SM count tells MIG
    slices of one GPU model apart."""
    import torch
    gpu = device_identity("cuda", index)
    return machine_key(f"{gpu.name} ({gpu.sm_count} SMs)", driver_version(), torch.__version__)


# -- measuring (in a worker, on its GPU) -----------------------------------------------------------

def _best(timer, call: Callable[[], object], trials: int = _TRIALS) -> tuple[float, float]:
    """(shortest GPU time, shortest host time) of `call` in ms, after a warm-up."""
    warm = [timer.time_call(call) for _ in range(3)]
    timer.fit_cover(max(t.host_ms for t in warm))
    timings = [timer.time_call(call) for _ in range(trials)]
    return min(t.ms for t in timings), min(t.host_ms for t in timings)


def copy_call(moved: int, device) -> Callable[..., object]:
    """A device-to-device copy (a memcpy) that moves `moved` bytes, read plus written: the gate
    times one beside Inductor's kernel as the fastest a task moving as many bytes runs there.
    Takes and ignores a task's inputs, as a contender in the profiler's timing does."""
    import torch
    src = torch.empty(max(1, moved // 2), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return lambda *_: dst.copy_(src)


def _peak_tflops(timer, device, free_bytes: int, precision_context) -> dict[str, float]:
    import torch
    settings = {"fp32": ("float32", {}), "tf32": ("float32", {"allow_tf32": True}),
                "bf16": ("bfloat16", {}), "fp16": ("float16", {})}
    peaks = {}
    for name in PRECISIONS:
        dtype_name, precision = settings[name]
        dtype = getattr(torch, dtype_name)
        best = 0.0
        with precision_context(precision):
            for n in _MATMUL_SIZES:
                if 3 * n * n * dtype.itemsize > free_bytes // 2:
                    continue
                a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
                out = torch.empty(n, n, device=device, dtype=dtype)
                ms, _ = _best(timer, lambda: torch.mm(a, b, out=out), trials=5)
                best = max(best, 2 * n**3 / (ms * 1e-3) / 1e12)
                del a, b, out
        if best:
            peaks[name] = best
    return peaks


def _fast_launch_host_ms(timer) -> float | None:
    """Host time of a launch through the candidates' fast path (env/fast_kernel.py), where it
    builds here: the cheapest launch a candidate can make."""
    try:
        from agent_backend.env.fast_kernel import load_kernel
        kernel = load_kernel('extern "C" __global__ void cuda_agent_noop() {}', "cuda_agent_noop", [])
    except Exception as exc:  # no compiler, no launcher: torch's own launch is the cheapest known
        log.info("cuda_agent: no fast-path launch to time for the floors (%s)", exc)
        return None
    return _best(timer, lambda: kernel.launch(1, 1, []))[1]


def measure_floors(device, timer, precision_context) -> Floors:
    """Measure this worker's GPU: a large matmul per precision and the host time of the cheapest
    launch. `timer` is the profiler's (env/profile.py CudaTimer); `precision_context(settings)`
    runs a block under precision settings (env/guards.py)."""
    import torch
    free_bytes, _ = torch.cuda.mem_get_info(device)
    with torch.no_grad():
        peaks = _peak_tflops(timer, device, free_bytes, precision_context)
        one = torch.zeros(1, device=device)
        _, host_ms = _best(timer, lambda: one.add_(1))
        fast_host_ms = _fast_launch_host_ms(timer)
    torch.cuda.empty_cache()
    return Floors(host_ms=min(host_ms, fast_host_ms) if fast_host_ms is not None else host_ms, peak_tflops=peaks)
