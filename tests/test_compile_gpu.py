"""Both ways of building a kernel, run on a real GPU against torch."""
import re
import time
from pathlib import Path

import pytest
import torch

from agent_backend.env import extension, nvrtc
from agent_backend.env.extension import keyed_extension_builds
from agent_backend.env.fast_kernel import Kernel, load_kernel

pytestmark = pytest.mark.gpu

SKILL = Path(__file__).parents[1] / "skills" / "SKILL.md"
ADD = r"""
extern "C" __global__ void add(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
"""
ADD_TYPES = ["ptr", "ptr", "ptr", "i32"]


@pytest.fixture(autouse=True)
def fresh_caches(cache_dir, monkeypatch):
    monkeypatch.setattr(nvrtc, "_memory_cache", {})


def skill_example(name: str) -> dict:
    """Run the ```python block under `<!-- example: name -->` in skills/SKILL.md; its globals."""
    text = SKILL.read_text()
    code = re.search(r"```python\n(.*?)```", text[text.index(f"<!-- example: {name} -->"):], re.S).group(1)
    namespace: dict = {}
    exec(compile(code, f"SKILL.md example {name}", "exec"), namespace)
    return namespace


def check_add(kernel: Kernel, n: int = 1000) -> None:
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.full_like(a, float("nan"))
    kernel.launch((n + 255) // 256, 256, [a, b, out, n])
    torch.testing.assert_close(out, a + b, rtol=0, atol=0)


def test_nvrtc_is_the_compiler_here():
    assert nvrtc.get_compiler().version.startswith("nvrtc"), "libnvrtc not found: every compile pays nvcc's 0.5 s"


def test_skill_example_matches_torch_exactly():
    model = skill_example("fast-path")["ModelNew"]()
    for n in (1, 3, 4, 1000, 1 << 20, (1 << 20) + 3):
        a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        torch.testing.assert_close(model(a, b), torch.relu(a + b), rtol=0, atol=0)


def test_every_arg_type_arrives_intact():
    source = r"""
    extern "C" __global__ void store(double* out, int a, long long b, float c, double d, const double* p) {
        out[0] = a; out[1] = (double)b; out[2] = c; out[3] = d; out[4] = p[0];
    }"""
    kernel = load_kernel(source, "store", ["ptr", "i32", "i64", "f32", "f64", "ptr"])
    out = torch.zeros(5, dtype=torch.float64, device="cuda")
    seven = torch.full((1,), 7.0, dtype=torch.float64, device="cuda")
    kernel.launch(1, 1, [out, -7, 2**40 + 3, 1.5, 2.0**-30, seven.data_ptr()])  # a ptr as an int address
    assert out.tolist() == [-7.0, float(2**40 + 3), 1.5, 2.0**-30, 7.0]


def test_launches_on_the_current_non_default_stream():
    source = r"""
    extern "C" __global__ void spin_then_write(float* out, long long cycles) {
        long long start = clock64();
        while (clock64() - start < cycles) { }
        out[0] = 1.0f;
    }"""
    kernel = load_kernel(source, "spin_then_write", ["ptr", "i64"])
    out = torch.zeros(1, device="cuda")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        kernel.launch(1, 1, [out, 500_000_000])  # a quarter of a second or more
    assert not side.query(), "the kernel is not on the current stream"
    assert torch.cuda.default_stream().query(), "the kernel went to the default stream"
    side.synchronize()
    assert out.item() == 1.0


# Reverses n floats through dynamic shared memory: with n * 4 bytes above 48 KB, a launch
# works only where the kernel's shared-memory limit was raised.
REVERSE_THROUGH_SHARED_SRC = r"""
extern "C" __global__ void reverse(const float* x, float* out, int n) {
    extern __shared__ float tile[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) tile[i] = x[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = tile[n - 1 - i];
}"""


def test_large_dynamic_shared_memory():
    kernel = load_kernel(REVERSE_THROUGH_SHARED_SRC, "reverse", ["ptr", "ptr", "i32"])
    n = 100 * 1024 // 4  # 100 KB: above the 48 KB default limit
    x = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    kernel.launch(1, 1024, [x, out, n], shared_mem=n * 4)
    torch.testing.assert_close(out, x.flip(0), rtol=0, atol=0)


# The same through 48 KB of dynamic shared memory beside a static counter: the default limit is
# 48 KB less the static shared memory, so the launch works only where the limit was raised.
REVERSE_BESIDE_STATIC_SHARED_SRC = r"""
extern "C" __global__ void reverse_counted(const float* x, float* out, int n) {
    __shared__ int count;
    extern __shared__ float tile[];
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) { tile[i] = x[i]; atomicAdd(&count, 1); }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = tile[n - 1 - i] + (float)(count - n);
}"""
FORTY_EIGHT_KB_OF_FLOATS = 48 * 1024 // 4


def test_48_kb_of_dynamic_shared_memory_beside_static():
    kernel = load_kernel(REVERSE_BESIDE_STATIC_SHARED_SRC, "reverse_counted", ["ptr", "ptr", "i32"])
    n = FORTY_EIGHT_KB_OF_FLOATS
    x = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    kernel.launch(1, 1024, [x, out, n], shared_mem=n * 4)
    torch.testing.assert_close(out, x.flip(0), rtol=0, atol=0)


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0),
                    reason="thread-block clusters need sm_90")
def test_cluster_launch_shares_shared_memory():
    """Each block of a 4-block cluster reads its neighbour's shared memory (DSMEM)."""
    source = r"""
    #include <cooperative_groups.h>
    namespace cg = cooperative_groups;
    extern "C" __global__ void neighbour(float* out) {
        __shared__ float mine;
        cg::cluster_group cluster = cg::this_cluster();
        if (threadIdx.x == 0) mine = (float)blockIdx.x;
        cluster.sync();
        const unsigned next = (cluster.block_rank() + 1) % cluster.num_blocks();
        if (threadIdx.x == 0) out[blockIdx.x] = *cluster.map_shared_rank(&mine, next);
        cluster.sync();
    }"""
    kernel = load_kernel(source, "neighbour", ["ptr"])
    out = torch.full((8,), float("nan"), device="cuda")
    kernel.launch(8, 32, [out], cluster=4)
    expected = torch.tensor([1, 2, 3, 0, 5, 6, 7, 4], dtype=torch.float32, device="cuda")
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_nvcc_cubin_runs():
    cubin = nvrtc.compile_cubin(ADD, compiler="nvcc")
    check_add(Kernel(cubin, "add", ADD_TYPES, arch=nvrtc.current_arch()))


def test_kernel_from_cached_cubin_without_compiling(monkeypatch):
    first = load_kernel(ADD, "add", ADD_TYPES)
    assert first.arch == nvrtc.current_arch() and first.cubin[:4] == b"\x7fELF"

    def no_compiling(*args):
        raise AssertionError("compiled again")

    monkeypatch.setattr(nvrtc, "_memory_cache", {})  # as a new process: only the disk cache is left
    monkeypatch.setattr(nvrtc.NvrtcCompiler, "compile", no_compiling)
    monkeypatch.setattr(nvrtc.NvccCompiler, "compile", no_compiling)
    from_disk = load_kernel(ADD, "add", ADD_TYPES)
    assert from_disk.cubin == first.cubin
    check_add(from_disk)
    check_add(Kernel(first.cubin, "add", ADD_TYPES, arch=first.arch))


def test_missing_kernel_name_says_extern_c():
    with pytest.raises(ValueError, match=r"no kernel named 'add_v2'.*extern \"C\" __global__"):
        load_kernel(ADD, "add_v2", ADD_TYPES)


def test_cubin_for_another_architecture_is_refused_clearly():
    cubin = nvrtc.compile_cubin(ADD, arch="sm_80")
    with pytest.raises(RuntimeError, match="cuModuleLoadData failed"):
        Kernel(cubin, "add", ADD_TYPES, arch="sm_80")


@pytest.mark.slow
def test_extension_example_builds_once_and_matches_torch(tmp_path, monkeypatch):
    monkeypatch.setattr(extension, "_loaded", {})
    with keyed_extension_builds(tmp_path):
        model = skill_example("extension")["ModelNew"]()
        a, b = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
        torch.testing.assert_close(model(a, b), torch.relu(a + b), rtol=0, atol=0)
        started = time.perf_counter()
        skill_example("extension")  # the same candidate again: its build is reused
        assert time.perf_counter() - started < 1
    [build_dir] = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert re.fullmatch(r"add_relu_[0-9a-f]{16}", build_dir.name)
