"""The launch op on a GPU: it computes what the Python launcher computes with the same kernel
(called through torch.ops, or directly as compiled graphs and profiles call it), passes every
argument kind intact, launches on the current stream, takes the kernel the inputs'
alignment allows, raises the shared memory limit, launches a cooperative grid with scratch
memory (eagerly and in a CUDA graph), keeps a kernel's counters (a stream's, a capture's), starts
only the clusters of a persistent grid that fit, is captured in a CUDA graph and replayed,
finds a key it does not know through the kernel cache, and runs a pointwise winner in a
compiled model: through Inductor, under CUDA graphs (mode="reduce-overhead"), and replayed from
Inductor's graph cache in a new process with no candidate code run."""
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

from agent_backend import runtime
from agent_backend.dispatch import Dispatcher
from agent_backend.env import launch_op
from agent_backend.env.fast_kernel import load_kernel
from agent_backend.env.launch_spec import Arg, KernelLaunch, LaunchSpec
from agent_backend.options import resolve
from agent_backend.specs import TensorSpec
from helpers import collect_tasks, put_cached_entry
from test_compile_gpu import FORTY_EIGHT_KB_OF_FLOATS, REVERSE_BESIDE_STATIC_SHARED_SRC, REVERSE_THROUGH_SHARED_SRC
from skills.pointwise import propose

pytestmark = pytest.mark.gpu

SKILL = Path(__file__).parents[1] / "skills" / "SKILL.md"
SCALE_ADD = r"""
extern "C" __global__ void scale_add(const float* x, const float* y, float* out, float a, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
"""
N = 10_000


def _vector(n: int, dtype: str = "float32") -> TensorSpec:
    return TensorSpec((n,), (1,), dtype, "cuda")


def _scale_add_spec(n: int = N) -> LaunchSpec:
    args = (Arg.input(0), Arg.input(1), Arg.output(0), Arg("f32", 2.0), Arg("i64", n))
    kernel = KernelLaunch.compile(SCALE_ADD, "scale_add", grid=(n + 255) // 256, block=256, args=args)
    return LaunchSpec((_vector(n), _vector(n)), (_vector(n),), (kernel,))


def _registered(key: str, spec: LaunchSpec) -> str:
    launch_op.register(key, spec, torch.cuda.current_device())
    return key


def _launcher_result(x, y) -> torch.Tensor:
    kernel = load_kernel(SCALE_ADD, "scale_add", ["ptr", "ptr", "ptr", "f32", "i64"])
    out = torch.empty_like(x)
    kernel.launch((x.numel() + 255) // 256, 256, [x, y, out, 2.0, x.numel()])
    return out


def test_same_result_as_the_python_launcher_and_counted():
    key = _registered("gpu scale_add", _scale_add_spec())
    x, y = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    before = launch_op.launch_count(key)
    (ours,) = torch.ops.cuda_agent.launch.default(key, "", [x, y])
    assert torch.equal(ours, _launcher_result(x, y))
    (positional,) = torch.ops.cuda_agent.launch.in2(key, "", x, y)  # what a compiled graph calls
    assert torch.equal(positional, ours)
    assert launch_op.launch_count(key) == before + 2


REFUSE = textwrap.dedent('''
    import torch
    from agent_backend.env import graph_launch
    from test_launch_op_gpu import _registered, _scale_add_spec
    key = _registered("gpu scale_add", _scale_add_spec())
    x = torch.randn(10_000, device="cuda")
    try:
        graph_launch.launch(key, "", x, x[:-1])
    except ValueError as e:
        print("refused:", e)
''')


def test_the_kernel_called_directly_as_graphs_and_profiles_call_it():
    """graph_launch.launch (what Inductor's wrapper and a candidate's profile call, past torch.ops)
    runs the same kernel as the op and counts; a wrong input is a ValueError, not a crash (on an
    H100 machine, 2026-11-25, formatting the refusal with c10::str ended the process: checked in
    one of its own)."""
    key = _registered("gpu scale_add", _scale_add_spec())
    x, y = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    before = launch_op.launch_count(key)
    from agent_backend.env import graph_launch

    (direct,) = graph_launch.launch(key, "", x, y)
    (listed,) = graph_launch.launch(key, "", [x, y])
    assert torch.equal(direct, _launcher_result(x, y)) and torch.equal(listed, direct)
    model = launch_op.launch_spec_model(_scale_add_spec())()
    profiled, name = runtime.as_called_by_a_graph(model, (_vector(N),), "", torch.device("cuda"))
    assert name == "cuda_agent::launch.in2, direct" and torch.equal(profiled(x, y)[0], direct)
    assert launch_op.launch_count(key) == before + 2
    here = Path(__file__).parent
    path = os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", REFUSE], capture_output=True, text=True, timeout=300, cwd=here,
                          env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 0 and "refused: input 1: this kernel is specialised" in done.stdout, done.stderr[-2000:]


def test_every_argument_kind_arrives_intact():
    source = r"""
    extern "C" __global__ void store(double* out, int a, long long b, float c, double d, const double* p) {
        out[0] = a; out[1] = (double)b; out[2] = c; out[3] = d; out[4] = p[0];
    }"""
    args = (Arg.output(0), Arg("i32", -7), Arg("i64", 2**40 + 3), Arg("f32", 1.5), Arg("f64", 2.0**-30), Arg.input(0))
    spec = LaunchSpec((_vector(1, "float64"),), (_vector(5, "float64"),),
                      (KernelLaunch.compile(source, "store", grid=1, block=1, args=args),))
    key = _registered("gpu store", spec)
    (out,) = torch.ops.cuda_agent.launch.default(key, "", [torch.full((1,), 7.0, dtype=torch.float64, device="cuda")])
    assert out.tolist() == [-7.0, float(2**40 + 3), 1.5, 2.0**-30, 7.0]


def test_launches_on_the_current_non_default_stream():
    source = r"""
    extern "C" __global__ void spin_then_write(const float* x, float* out, long long cycles) {
        long long start = clock64();
        while (clock64() - start < cycles) { }
        out[0] = x[0] + 1.0f;
    }"""
    args = (Arg.input(0), Arg.output(0), Arg("i64", 500_000_000))  # a quarter of a second or more
    spec = LaunchSpec((_vector(1),), (_vector(1),), (KernelLaunch.compile(source, "spin_then_write", grid=1, block=1,
                                                                         args=args),))
    key = _registered("gpu spin", spec)
    x = torch.ones(1, device="cuda")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        (out,) = torch.ops.cuda_agent.launch.default(key, "", [x])
    assert not side.query(), "the kernel is not on the current stream"
    assert torch.cuda.default_stream().query(), "the kernel went to the default stream"
    side.synchronize()
    assert out.item() == 2.0


def test_the_first_kernel_the_alignment_allows_runs():
    source = r"""extern "C" __global__ void mark(const float* x, float* out, float v) { out[0] = v; }"""

    def marking(value: float, alignment: tuple[int, ...]) -> KernelLaunch:
        args = (Arg.input(0), Arg.output(0), Arg("f32", value))
        return KernelLaunch.compile(source, "mark", grid=1, block=1, args=args, alignment=alignment)

    spec = LaunchSpec((_vector(8),), (_vector(1),), (marking(1.0, (16,)), marking(2.0, ())))
    key = _registered("gpu alignment", spec)
    base = torch.zeros(9, device="cuda")
    assert torch.ops.cuda_agent.launch.default(key, "", [base[:8]])[0].item() == 1.0
    assert torch.ops.cuda_agent.launch.default(key, "", [base[1:]])[0].item() == 2.0  # 4 bytes off


def test_large_dynamic_shared_memory():
    n = 100 * 1024 // 4  # 100 KB: above the 48 KB default limit
    args = (Arg.input(0), Arg.output(0), Arg("i32", n))
    spec = LaunchSpec((_vector(n),), (_vector(n),), (KernelLaunch.compile(REVERSE_THROUGH_SHARED_SRC, "reverse", grid=1, block=1024,
                                                                         args=args, shared_mem=n * 4),))
    key = _registered("gpu reverse", spec)
    x = torch.randn(n, device="cuda")
    assert torch.equal(torch.ops.cuda_agent.launch.default(key, "", [x])[0], x.flip(0))


@pytest.mark.parametrize("cooperative", [False, True])
def test_48_kb_of_dynamic_shared_memory_beside_static(cooperative):
    # cooperative, the launch refused this as "too many blocks in cooperative launch"
    n = FORTY_EIGHT_KB_OF_FLOATS
    args = (Arg.input(0), Arg.output(0), Arg("i32", n))
    kernel = KernelLaunch.compile(REVERSE_BESIDE_STATIC_SHARED_SRC, "reverse_counted", grid=1, block=1024, args=args,
                                  shared_mem=n * 4, cooperative=cooperative)
    key = _registered(f"gpu reverse beside static {cooperative}", LaunchSpec((_vector(n),), (_vector(n),), (kernel,)))
    x = torch.randn(n, device="cuda")
    assert torch.equal(torch.ops.cuda_agent.launch.default(key, "", [x])[0], x.flip(0))


def test_captured_in_a_cuda_graph_and_replayed():
    key = _registered("gpu graph", _scale_add_spec())
    x, y = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the default stream, as torch.cuda.graph asks
        torch.ops.cuda_agent.launch.default(key, "", [x, y])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (out,) = torch.ops.cuda_agent.launch.default(key, "", [x, y])
    launches = launch_op.launch_count(key)
    for seed in range(3):
        torch.manual_seed(seed)
        x.copy_(torch.randn(N, device="cuda"))
        y.copy_(torch.randn(N, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, _launcher_result(x, y)), f"replay {seed}"
    assert launch_op.launch_count(key) == launches, "a replay runs the captured kernel, not the op"


GRID_SUM = r"""
#include <cooperative_groups.h>
extern "C" __global__ void grid_sum(const float* x, float* out, float* partial, int n) {
    // each block's sum to the workspace, the whole grid waits, then every block adds them up
    __shared__ float block_sum;
    if (threadIdx.x == 0) block_sum = 0.0f;
    __syncthreads();
    float mine = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) mine += x[i];
    atomicAdd(&block_sum, mine);
    __syncthreads();
    if (threadIdx.x == 0) partial[blockIdx.x] = block_sum;
    cooperative_groups::this_grid().sync();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int b = 0; b < gridDim.x; ++b) total += __ldcg(&partial[b]);
        out[blockIdx.x] = total;
    }
}
"""


def test_a_cooperative_grid_with_its_workspace_eagerly_and_in_a_cuda_graph():
    """528 blocks (four an SM on an H100) exchange partial sums through the op's workspace: every
    block ends with the whole sum, which only a grid that synchronised can give; the same under
    a CUDA graph's replays, on new data."""
    n, blocks = 1 << 20, 528
    args = (Arg.input(0), Arg.output(0), Arg.workspace(4 * blocks), Arg("i32", n))
    kernel = KernelLaunch.compile(GRID_SUM, "grid_sum", grid=blocks, block=256, args=args, cooperative=True)
    key = _registered("gpu grid sum", LaunchSpec((_vector(n),), (_vector(blocks),), (kernel,)))
    x = torch.rand(n, device="cuda")
    (out,) = torch.ops.cuda_agent.launch.default(key, "", [x])
    torch.testing.assert_close(out, x.sum().expand(blocks), rtol=1e-4, atol=1e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (captured,) = torch.ops.cuda_agent.launch.in1(key, "", x)
    for seed in range(2):
        torch.manual_seed(seed)
        x.copy_(torch.rand(n, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(captured, x.sum().expand(blocks), rtol=1e-4, atol=1e-2)


COUNTED = r"""
extern "C" __global__ void counted(const float* x, float* out, unsigned* counters) {
    // what the counters held when the launch began, then one more: counters never reset
    if (threadIdx.x == 0) out[blockIdx.x] = (float)atomicAdd(&counters[blockIdx.x], 1u) + x[blockIdx.x];
}
"""


def test_counters_are_zeroed_once_a_stream_kept_between_launches_and_a_captures_own():
    """A kernel's counters start at zero on each stream and keep what a launch left for the next
    launch there (this kernel never resets them: counters_left sees it); a launch captured in a
    CUDA graph has counters of its own, zeroed on every replay, which the op does not keep."""
    blocks = 3
    kernel = KernelLaunch.compile(COUNTED, "counted", grid=blocks, block=32,
                                  args=(Arg.input(0), Arg.output(0), Arg.counters(4 * blocks)))
    key = _registered("gpu counted", LaunchSpec((_vector(blocks),), (_vector(blocks),), (kernel,)))
    x = torch.zeros(blocks, device="cuda")
    seen = [launch_op.launcher(key, "", 1)(x)[0].tolist() for _ in range(2)]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        seen.append(launch_op.launcher(key, "", 1)(x)[0].tolist())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (captured,) = launch_op.launcher(key, "", 1)(x)
    for _ in range(2):
        graph.replay()
        seen.append(captured.tolist())
    seen.append(launch_op.launcher(key, "", 1)(x)[0].tolist())
    assert seen == [[0.0] * blocks, [1.0] * blocks, [0.0] * blocks, [0.0] * blocks, [0.0] * blocks, [2.0] * blocks]
    # a counter a block in each stream's buffer (the current stream's at 3, the side stream's at
    # 1), each a 4-byte count of which one byte is not zero
    assert launch_op.counters_left(key) == 2 * blocks


PERSISTENT_ROWS = r"""
#include <cooperative_groups.h>
extern "C" __global__ void __launch_bounds__(1024)
persistent_rows(const float* x, float* out, int* clusters, int rows) {
    // each cluster takes rows blockIdx.x / 8, + the clusters launched, ...; each block a slice of 1024
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    const int launched = gridDim.x / 8;
    for (int row = blockIdx.x / 8; row < rows; row += launched) {
        const int i = row * 8192 + cluster.block_rank() * 1024 + threadIdx.x;
        out[i] = x[i] + 1.0f;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) clusters[0] = launched;
}
"""


def test_a_persistent_cluster_launch_starts_only_the_clusters_that_fit():
    """A grid of 4096 clusters of 8 blocks of 1024 threads is launched as only as many clusters as
    the GPU holds at once (at most two blocks of 1024 an SM: on an H200, 30), which loop over the
    rows between them: every row done, eagerly and in a CUDA graph."""
    rows = 4096
    args = (Arg.input(0), Arg.output(0), Arg.output(1), Arg("i32", rows))
    kernel = KernelLaunch.compile(PERSISTENT_ROWS, "persistent_rows", grid=rows * 8, block=1024, args=args, cluster=8,
                                  persistent=True)
    spec = LaunchSpec((_vector(rows * 8192),), (_vector(rows * 8192), _vector(1, "int32")), (kernel,))
    key = _registered("gpu persistent rows", spec)
    x = torch.randn(rows * 8192, device="cuda")
    out, launched = torch.ops.cuda_agent.launch.default(key, "", [x])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert 1 <= int(launched) * 8 <= 2 * sms, int(launched)
    assert torch.equal(out, x + 1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured, _ = torch.ops.cuda_agent.launch.in1(key, "", x)
    x.copy_(torch.randn(rows * 8192, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, x + 1)


class Gate(nn.Module):
    def forward(self, x, y):
        return torch.tanh(x * 0.5 + y) * torch.sigmoid(y)


def _gate_inputs(rows: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(rows, 1024, device="cuda", generator=g) for _ in range(2)]


def _gate_winner(rows: int):
    """The Gate task on (rows, 1024) inputs and the pointwise template's first candidate for it,
    with its spec. Each test takes its own `rows`, so its winner's key is new to this process."""
    (task,) = collect_tasks(Gate(), _gate_inputs(rows), backward=False, min_ops=2)
    candidate = propose(task)[0]
    namespace: dict = {}
    exec(compile(candidate.source, candidate.origin, "exec"), namespace)
    spec = launch_op.spec_of(namespace["ModelNew"])
    assert spec is not None, "the pointwise template writes launch specs"
    return task, candidate, spec


def test_an_unknown_key_is_found_in_the_kernel_cache(cache_dir):
    """What a graph replayed by Inductor's cache does on its first call: the launch op hands the
    key to run_winner, which registers the cached spec (no source runs: this one raises), so the
    next call stays in C++; a key no cache has runs the task's program."""
    task, _, spec = _gate_winner(1024)
    key = put_cached_entry(task, source="raise RuntimeError('the source must not run')\n", device="cuda",
                           launch_spec=spec)
    Dispatcher(resolve({})).cache  # opening the cache makes it a source of winners
    x, y = _gate_inputs(1024)
    expected = Gate()(x, y)
    program = runtime.program_arg(task.program)  # as a compiled graph passes it: on one line
    for _ in range(2):
        (out,) = torch.ops.cuda_agent.launch.default(key, program, [x, y])
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert runtime.registered(key).spec == spec and launch_op.launch_count(key) == 2
    (out,) = torch.ops.cuda_agent.launch.default("in no cache", program, [x, y])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_compiled_model_runs_the_winner_through_the_launch_op(cache_dir):
    task, candidate, _ = _gate_winner(2048)
    key = put_cached_entry(task, source=candidate.source, device="cuda")
    x, y = _gate_inputs(2048)
    torch._dynamo.reset()
    with torch.no_grad():
        out, code = run_and_get_code(torch.compile(Gate(), backend="cuda_agent", options={"mode": "cached"}), x, y)
    text = "\n".join(code)
    assert "cuda_agent_launch(" in text and "run_winner" not in text  # the op's kernel, past torch.ops
    torch.testing.assert_close(out, Gate()(x, y), atol=1e-5, rtol=1e-5)
    winner = runtime.registered(key)
    assert winner.spec is not None and winner.calls == 1


def test_reduce_overhead_captures_the_winner_in_a_cuda_graph(cache_dir, monkeypatch):
    task, candidate, _ = _gate_winner(3072)
    key = put_cached_entry(task, source=candidate.source, device="cuda")
    monkeypatch.setenv("CUDA_AGENT_MODE", "cached")  # torch.compile takes a mode or options, not both
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(Gate(), backend="cuda_agent", mode="reduce-overhead")
    calls = 6
    with torch.no_grad():
        for seed in range(calls):
            x, y = _gate_inputs(3072, seed)
            torch.testing.assert_close(compiled(x, y), Gate()(x, y), atol=1e-5, rtol=1e-5, msg=f"call {seed}")
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert 1 <= runtime.registered(key).calls < calls, "every call ran the op: no CUDA graph was replayed"


# One process: compile Gate on the GPU with the backend (mode "cached"), run it, report.
RUN = textwrap.dedent('''
    import json
    import torch
    from torch._dynamo.utils import counters
    from agent_backend import backend, runtime

    class Gate(torch.nn.Module):
        def forward(self, x, y):
            return torch.tanh(x * 0.5 + y) * torch.sigmoid(y)

    g = torch.Generator(device="cuda").manual_seed(0)
    x, y = (torch.randn(4096, 1024, device="cuda", generator=g) for _ in range(2))
    with torch.no_grad():
        out = torch.compile(Gate(), backend="cuda_agent", options={"mode": "cached"})(x, y)
        error = (out - Gate()(x, y)).abs().max().item()
    print(json.dumps({
        "hits": counters["inductor"]["fxgraph_cache_hit"], "decisions": [d.reason for r in backend.reports for d in r.decisions],
        "calls": sum(w.calls for w in runtime._registry.values()), "error": error}))
''')


def test_a_replayed_graph_registers_the_spec_from_the_kernel_cache(cache_dir, tmp_path):
    """Inductor's graph cache replays the graph in a new process: its launch op finds the spec
    in the kernel cache; the entry's source raises, so no candidate code ran in either process."""
    task, _, spec = _gate_winner(4096)  # the shape RUN compiles
    put_cached_entry(task, source="raise RuntimeError('the source must not run')\n", device="cuda", launch_spec=spec)
    env = {**os.environ, "CUDA_AGENT_CACHE_DIR": str(cache_dir), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["decisions"] == ["kernel test"] and first["calls"] == 1 and first["error"] < 1e-5
    assert second["hits"] == 1 and second["decisions"] == [], "the graph was compiled again"
    assert second["calls"] == 1 and second["error"] < 1e-5, "the replayed graph did not run the cached spec"


def test_skill_example_of_a_launch_spec():
    text = SKILL.read_text()
    code = re.search(r"```python\n(.*?)```", text[text.index("<!-- example: launch-spec -->"):], re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "SKILL.md example launch-spec", "exec"), namespace)
    model = namespace["ModelNew"]()
    assert launch_op.spec_of(namespace["ModelNew"]) is not None
    a, b = (torch.randn(4096, 1024, device="cuda") for _ in range(2))
    torch.testing.assert_close(model(a, b), torch.relu(a + b), rtol=0, atol=0)
    shifted = torch.empty(a.numel() + 1, device="cuda")[1:].view(a.shape).copy_(a)  # 4 bytes off: the scalar kernel
    torch.testing.assert_close(model(shifted, b), torch.relu(a + b), rtol=0, atol=0)
