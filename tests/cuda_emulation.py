"""Run a generated row kernel on the CPU (tests/cuda_emulator/emulator.h): its CUDA source,
rewritten where the emulator needs it, built with the host C++ compiler and launched on inputs
passed through files. For checking kernel logic (indexing, passes, combining across threads,
warps, cluster blocks and the blocks of a cooperative grid) where there is no GPU; it says
nothing about speed."""
from __future__ import annotations

import functools
import itertools
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from agent_backend.specs import TensorSpec
from skills.pointwise.codegen import CONVERSIONS
from skills.pointwise.dtypes import dtype_info, operand_info
from skills.pointwise.ops import _FAST, NAN_MIN_MAX
from skills.rows.codegen import CLUSTER_SYNC_FUNCTION, PREFETCH_FUNCTION, STREAM_LOAD_FUNCTION

EMULATOR = Path(__file__).with_name("cuda_emulator")

# CONVERSIONS and ops._FAST without inline PTX: _Float16 rounds to nearest even as cvt.rn does;
# bf16 as the kernels' pre-sm_80 path; the fast forms computed exactly. ops.NAN_MIN_MAX left out:
# max and min by the templates (the pre-sm_80 path).
_EMULATED_CONVERSIONS = r"""
struct f16 { unsigned short bits; };
struct bf16 { unsigned short bits; };
template <typename T, int N> struct alignas(sizeof(T) * N) Vec { T v[N]; };
inline float f16_to_float(f16 h) { _Float16 x; std::memcpy(&x, &h.bits, 2); return (float)x; }
inline f16 float_to_f16(float f) { _Float16 x = (_Float16)f; f16 h; std::memcpy(&h.bits, &x, 2); return h; }
inline float bf16_to_float(bf16 h) { return __uint_as_float(((unsigned int)h.bits) << 16); }
inline bf16 float_to_bf16(float f) {
  bf16 h;
  const unsigned int u = __float_as_uint(f);
  h.bits = (f != f) ? (unsigned short)0x7fc0u : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  return h;
}
inline float round_f16(float x) { return f16_to_float(float_to_f16(x)); }
inline float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }
"""
_EMULATED_FAST = r"""
inline float pw_exp_fast(float x) { return exp2f(x * 1.44269504088896341f); }
inline float pw_div_fast(float a, float b) { return a / b; }
inline float pw_exp_fast_ftz(float x) { const float y = pw_exp_fast(x); return y < 1.17549435e-38f ? 0.0f : y; }
inline float pw_exp_fast_nonpositive(float x) {
  const float y = exp2f(fmaf(x, 1.44269504088896341f, 64.0f));
  return (y < 1.17549435e-38f ? 0.0f : y) * 5.42101086242752217e-20f;
}
inline float pw_exp_fast_bounded(float x) {
  const float y = exp2f(fmaf(x, 1.44269504088896341f, 32.0f));
  return (y < 1.17549435e-38f ? 0.0f : y) * 2.32830643653869629e-10f;
}
inline float pw_sigmoid_fast(float x) { return pw_div_fast(1.0f, 1.0f + pw_exp_fast_ftz(-x)); }
inline float pw_silu_fast(float x) { return pw_div_fast(x, 1.0f + pw_exp_fast_ftz(-x)); }
inline float pw_one_plus_tanh_fast(float z) { return 2.0f / (1.0f + pw_exp_fast_ftz(-2.0f * z)); }
inline float pw_gelu_tanh_fast(float x, float a, float b) {
  const float y = exp2f(x * fmaf(b, x * x, a));
  const float r = 1.0f / (1.0f + (y < 1.17549435e-38f ? 0.0f : y));
  return x * (r < 1.17549435e-38f ? 0.0f : r);
}
"""

# codegen.PREFETCH_FUNCTION: each thread's copy done at once (it reads only its own slots after the wait).
_EMULATED_PREFETCH = r"""
inline void rows_prefetch16(void* to, const void* from) { std::memcpy(to, from, 16); }
inline void rows_prefetch_commit() {}
inline void rows_prefetch_wait() {}
"""
# codegen.CLUSTER_SYNC_FUNCTION: the emulator's cluster barrier (its threads' memory is one, ordered
# by the barrier).
_EMULATED_CLUSTER_SYNC = r"""
inline void rows_cluster_sync() { cooperative_groups::this_cluster().sync(); }
"""
# codegen.STREAM_LOAD_FUNCTION: a plain load (where the line goes is the GPU's business).
_EMULATED_STREAM_LOAD = r"""
template <typename T> inline T rows_ld_stream(const T* p) { return *p; }
"""


FLAGS = ("-std=c++20", "-O1", "-pthread", "-w")


def compiler() -> str | None:
    return shutil.which("g++") or shutil.which("c++")


@functools.cache
def _include_dir() -> Path:
    """A directory holding emulator.h and, where the compiler makes one, its precompiled header
    (the header's standard library takes most of a build's time)."""
    where = Path(tempfile.mkdtemp(prefix="cuda_emulator_"))
    shutil.copy(EMULATOR / "emulator.h", where / "emulator.h")
    subprocess.run([compiler(), *FLAGS, str(where / "emulator.h"), "-o", str(where / "emulator.h.gch")],
                   capture_output=True)
    return where


def emulated_source(source: str) -> str:
    """`source` as C++ for the emulator."""
    assert CONVERSIONS in source and _FAST in source
    source = source.replace(CONVERSIONS, _EMULATED_CONVERSIONS).replace(_FAST, _EMULATED_FAST).replace(NAN_MIN_MAX, "")
    source = source.replace(PREFETCH_FUNCTION, _EMULATED_PREFETCH).replace(STREAM_LOAD_FUNCTION, _EMULATED_STREAM_LOAD)
    source = source.replace(CLUSTER_SYNC_FUNCTION, _EMULATED_CLUSTER_SYNC)
    source = source.replace("#include <cooperative_groups.h>\n", "")
    source = re.sub(r"extern __shared__ __align__\(16\) unsigned char (\w+)\[\];",
                    r"unsigned char* \1 = emu::dynamic_shared();", source)
    ids = itertools.count()
    source = re.sub(r"__shared__ (\w+) (\w+)((?:\[\d+\])*);",
                    lambda m: f"auto& {m[2]} = *emu::shared<{m[1]}{m[3]}>({next(ids)});", source)
    assert "__shared__" not in source and "asm(" not in source and "asm volatile(" not in source
    return '#include "emulator.h"\n' + source


def _flat(t: torch.Tensor) -> bytes:
    """The bytes of the storage a strided tensor views, from its first element."""
    spec = TensorSpec.of(t)
    flat = torch.as_strided(t, (spec.storage_elements(),), (1,)) if t.numel() else t.reshape(-1)
    return flat.contiguous().view(torch.uint8).numpy().tobytes()


def run(source: str, name: str, launch: tuple, inputs: list[torch.Tensor], outputs: list[TensorSpec],
        workdir: Path) -> list[torch.Tensor]:
    """Launch kernel `name` of `source` with launch = (grid, block, shared bytes, cluster,
    workspace bytes, persistent) on CPU `inputs`; the outputs (filled with NaN bytes first, so an
    unwritten element shows). A workspace (of 0xff bytes) makes the launch cooperative. A
    persistent grid is launched as two clusters (as if only two fit), which loop over the rest."""
    grid, block, shared, cluster, workspace, persistent = launch
    if persistent:
        grid = min(grid, 2 * cluster)
    block = tuple(block) + (1,) * (2 - len(block))
    params = [f"reinterpret_cast<const {operand_info(t.dtype).storage}*>(buffers[{k}].data())"
              for k, t in enumerate(inputs)]
    params += [f"reinterpret_cast<{dtype_info(s.torch_dtype).storage}*>(buffers[{len(inputs) + k}].data())"
               for k, s in enumerate(outputs)]
    count = len(inputs) + len(outputs)
    if workspace:
        params.append("workspace.data()")
    main = f"""
#include <fstream>
#include <iterator>
int main(int argc, char** argv) {{
  std::vector<std::vector<unsigned char>> buffers;
  for (int k = 0; k < {count}; ++k) {{
    std::ifstream in(argv[1 + k], std::ios::binary);
    buffers.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }}
  std::vector<unsigned char> workspace({workspace}, 0xff);
  emu::launch({grid}, {block[0]}, {block[1]}, {shared}, {cluster}, {"true" if workspace else "false"},
              [&] {{ {name}({", ".join(params)}); }});
  for (int k = {len(inputs)}; k < {count}; ++k) {{
    std::ofstream out(argv[1 + k], std::ios::binary);
    out.write(reinterpret_cast<const char*>(buffers[k].data()), buffers[k].size());
  }}
}}
"""
    cpp = workdir / f"{name}.cpp"
    cpp.write_text(emulated_source(source) + main)
    exe = workdir / name
    build = subprocess.run([compiler(), *FLAGS, f"-I{_include_dir()}", str(cpp), "-o", str(exe)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[:4000]
    files = []
    for k, t in enumerate(inputs):
        files.append(workdir / f"{name}.in{k}")
        files[-1].write_bytes(_flat(t))
    for k, s in enumerate(outputs):
        files.append(workdir / f"{name}.out{k}")
        files[-1].write_bytes(b"\xff" * (s.storage_elements() * s.torch_dtype.itemsize))
    done = subprocess.run([str(exe), *map(str, files)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[:4000]
    results = []
    for path, s in zip(files[len(inputs):], outputs):
        data = torch.frombuffer(bytearray(path.read_bytes()), dtype=s.torch_dtype)
        results.append(data.as_strided(s.shape, s.stride))
    return results
