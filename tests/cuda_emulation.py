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
from skills.rows.codegen import CLUSTER_SYNC_FUNCTION, PREFETCH_FUNCTION, SPLIT_BARRIER_FUNCTION, STREAM_LOAD_FUNCTION

EMULATOR = Path(__file__).with_name("cuda_emulator")

# CONVERSIONS without inline PTX: _Float16 rounds to nearest even as cvt.rn does;
# bf16 as the kernels' pre-sm_80 path. ops.NAN_MIN_MAX left out:
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
# ops._FAST as it is, each inline-PTX instruction a function of the same result computed exactly,
# .ftz flushing subnormal inputs and results to zero as sm_90 does: the emulated kernels run the
# fast forms' own arithmetic and constants, not a copy of them.
_PTX_FUNCTIONS = r"""
inline float emu_flush(float x) { return fabsf(x) < 1.17549435e-38f ? copysignf(0.0f, x) : x; }
inline float emu_ex2(float x) { return exp2f(x); }
inline float emu_ex2_ftz(float x) { return emu_flush(exp2f(emu_flush(x))); }
inline float emu_rcp(float x) { return 1.0f / x; }
inline float emu_rcp_ftz(float x) { return emu_flush(1.0f / emu_flush(x)); }
inline float emu_div(float a, float b) { return a / b; }
"""
_PTX_NAMES = {"ex2.approx.f32": "emu_ex2", "ex2.approx.ftz.f32": "emu_ex2_ftz", "rcp.approx.f32": "emu_rcp",
              "rcp.approx.ftz.f32": "emu_rcp_ftz", "div.full.f32": "emu_div"}
_ASM = re.compile(r'asm\("([\w.]+) %0(?:, %\d)+;" : "=f"\((\w+)\) : (.*)\);')


def _ptx_operands(text: str) -> list[str]:
    """The expressions of an asm statement's input operands, `"f"(e1), "f"(e2)` -> [e1, e2]."""
    operands, depth, start = [], 0, 0
    for i, ch in enumerate(text + ","):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            operand = text[start:i].strip()
            assert operand.startswith('"f"(') and operand.endswith(")"), operand
            operands.append(operand[4:-1])
            start = i + 1
    return operands


def emulated_fast() -> str:
    """ops._FAST with each asm statement an assignment of the _PTX_FUNCTIONS call it stands for."""
    body = _ASM.sub(lambda m: f"{m[2]} = {_PTX_NAMES[m[1]]}({', '.join(_ptx_operands(m[3]))});", _FAST)
    assert "asm(" not in body, "an instruction of ops._FAST the emulator has no function for"
    return _PTX_FUNCTIONS + body

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
# codegen.SPLIT_BARRIER_FUNCTION as it is, its acquiring load the emulator's.
_ACQUIRE = 'asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(arrived) : "memory");'
_EMULATED_SPLIT_BARRIER = SPLIT_BARRIER_FUNCTION.replace(_ACQUIRE, "seen = emu::load_acquire(arrived);")
assert _EMULATED_SPLIT_BARRIER != SPLIT_BARRIER_FUNCTION, "the split barrier's acquiring load is not the one emulated"
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
    source = source.replace(CONVERSIONS, _EMULATED_CONVERSIONS).replace(_FAST, emulated_fast()).replace(NAN_MIN_MAX, "")
    source = source.replace(PREFETCH_FUNCTION, _EMULATED_PREFETCH).replace(STREAM_LOAD_FUNCTION, _EMULATED_STREAM_LOAD)
    source = source.replace(CLUSTER_SYNC_FUNCTION, _EMULATED_CLUSTER_SYNC)
    source = source.replace(SPLIT_BARRIER_FUNCTION, _EMULATED_SPLIT_BARRIER)
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


def _compiled(cpp_source: str, name: str, workdir: Path) -> Path:
    """`cpp_source` built against the emulator's header: the executable's path."""
    cpp, exe = workdir / f"{name}.cpp", workdir / name
    cpp.write_text(cpp_source)
    build = subprocess.run([compiler(), *FLAGS, f"-I{_include_dir()}", str(cpp), "-o", str(exe)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[:4000]
    return exe


def _execute(exe: Path, files: list[Path], timeout: float) -> None:
    """Run `exe` on `files` (its arguments), which must succeed within `timeout` seconds."""
    done = subprocess.run([str(exe), *map(str, files)], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[:4000]


def run(source: str, name: str, launch: tuple, inputs: list[torch.Tensor], outputs: list[TensorSpec],
        workdir: Path) -> list[torch.Tensor]:
    """Launch kernel `name` of `source` with launch = (grid, block, shared bytes, cluster,
    workspace bytes, persistent, counter bytes) on CPU `inputs`; the outputs (filled with NaN
    bytes first, so an unwritten element shows). A workspace (of 0xff bytes) makes the launch
    cooperative, its counters zeroed, and they must be zeroed again when it ends (as the launch op
    keeps them for the next launch). A persistent grid is launched as two clusters (as if only two
    fit), which loop over the rest."""
    grid, block, shared, cluster, workspace, persistent, counters = launch
    if persistent:
        grid = min(grid, 2 * cluster)
    block = tuple(block) + (1,) * (2 - len(block))
    params = [f"reinterpret_cast<const {operand_info(t.dtype).storage}*>(buffers[{k}].data())"
              for k, t in enumerate(inputs)]
    params += [f"reinterpret_cast<{dtype_info(s.torch_dtype).storage}*>(buffers[{len(inputs) + k}].data())"
               for k, s in enumerate(outputs)]
    count = len(inputs) + len(outputs)
    if workspace:
        params += ["workspace.data()", "reinterpret_cast<unsigned*>(counters.data())"]
    main = f"""
#include <cstdio>
#include <fstream>
#include <iterator>
int main(int argc, char** argv) {{
  std::vector<std::vector<unsigned char>> buffers;
  for (int k = 0; k < {count}; ++k) {{
    std::ifstream in(argv[1 + k], std::ios::binary);
    buffers.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }}
  std::vector<unsigned char> workspace({workspace}, 0xff);
  std::vector<unsigned char> counters({counters}, 0);
  emu::launch({grid}, {block[0]}, {block[1]}, {shared}, {cluster}, {"true" if workspace else "false"},
              [&] {{ {name}({", ".join(params)}); }});
  for (unsigned char c : counters) {{
    if (c != 0) {{
      std::fprintf(stderr, "the kernel left its counters non-zero\\n");
      return 3;
    }}
  }}
  for (int k = {len(inputs)}; k < {count}; ++k) {{
    std::ofstream out(argv[1 + k], std::ios::binary);
    out.write(reinterpret_cast<const char*>(buffers[k].data()), buffers[k].size());
  }}
}}
"""
    exe = _compiled(emulated_source(source) + main, name, workdir)
    files = []
    for k, t in enumerate(inputs):
        files.append(workdir / f"{name}.in{k}")
        files[-1].write_bytes(_flat(t))
    for k, s in enumerate(outputs):
        files.append(workdir / f"{name}.out{k}")
        files[-1].write_bytes(b"\xff" * (s.storage_elements() * s.torch_dtype.itemsize))
    _execute(exe, files, timeout=600)
    results = []
    for path, s in zip(files[len(inputs):], outputs):
        data = torch.frombuffer(bytearray(path.read_bytes()), dtype=s.torch_dtype)
        results.append(data.as_strided(s.shape, s.stride))
    return results


def evaluate_fast(expressions: list[str], x: torch.Tensor, workdir: Path) -> list[torch.Tensor]:
    """Each C++ expression of a float `x` (calls of ops._FAST's functions, emulated as the
    kernels have them) evaluated at every element of the fp32 tensor `x`."""
    cases = "".join(f"    case {k}: return {e};\n" for k, e in enumerate(expressions))
    main = f"""
#include <fstream>
#include <iterator>
float evaluate(int k, float x) {{
  switch (k) {{
{cases}  }}
  return 0.0f;
}}
int main(int argc, char** argv) {{
  std::ifstream in(argv[1], std::ios::binary);
  std::vector<char> bytes{{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()}};
  std::vector<float> xs(bytes.size() / 4), ys;
  std::memcpy(xs.data(), bytes.data(), bytes.size());
  for (int k = 0; k < {len(expressions)}; ++k) for (float x : xs) ys.push_back(evaluate(k, x));
  std::ofstream(argv[2], std::ios::binary).write(reinterpret_cast<const char*>(ys.data()), ys.size() * 4);
}}
"""
    exe = _compiled('#include "emulator.h"\n' + emulated_fast() + main, "fast", workdir)
    (workdir / "x").write_bytes(x.to(torch.float32).contiguous().numpy().tobytes())
    _execute(exe, [workdir / "x", workdir / "y"], timeout=120)
    ys = torch.frombuffer(bytearray((workdir / "y").read_bytes()), dtype=torch.float32)
    return list(ys.reshape(len(expressions), x.numel()))
