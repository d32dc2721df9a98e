"""The C++ launch op on the CPU: it builds against this torch, and its Meta kernel gives the
outputs' shapes, strides and dtypes under FakeTensorMode (what Inductor traces with); specs are
checked when registered and keys keep their spec; the op refuses inputs outside its spec."""
import subprocess
import sys

import pytest
import torch
from torch._inductor.utils import run_and_get_code
from torch._subclasses.fake_tensor import FakeTensorMode

from agent_backend.env import launch_lowering, launch_op
from agent_backend.env.launch_spec import Arg, KernelLaunch, LaunchSpec
from agent_backend.specs import TensorSpec

pytestmark = pytest.mark.slow  # the first build takes about 30 s on 2 cores

X = TensorSpec((33, 70), (70, 1), "float16", "cuda")
B = TensorSpec((70,), (1,), "float16", "cuda")
OUTPUTS = (TensorSpec((70, 33), (1, 70), "float32", "cuda"), TensorSpec((33, 70), (70, 1), "bool", "cuda"))


def _spec(cubin=b"\x7fELF not loaded on the CPU") -> LaunchSpec:
    args = (Arg.input(0), Arg.input(1), Arg.output(0), Arg.output(1), Arg("f32", 0.5))
    return LaunchSpec((X, B), OUTPUTS, (KernelLaunch(cubin, "sm_90", "k", 4, 256, args),))


@pytest.fixture(scope="module")
def native():
    return launch_op.native()


def test_builds_into_the_cache_root_once(native):
    assert f"/launch_op/{launch_op.build_key()}/" in native.__file__
    assert launch_op.native() is native


def test_build_key_follows_the_driver_header(tmp_path, monkeypatch):
    before = launch_op.build_key()
    header = tmp_path / "cuda_driver.h"
    header.write_text(launch_op.HEADERS[0].read_text() + "\n// changed\n")
    monkeypatch.setattr(launch_op, "HEADERS", (header,))
    assert launch_op.build_key() != before


def test_meta_kernel_gives_the_specs_outputs_under_fake_tensors(native):
    spec = _spec()
    launch_op.register("fake-test", spec, None)  # None: nothing to load until a CUDA launch
    with FakeTensorMode():
        x = torch.empty_strided(X.shape, X.stride, dtype=torch.float16, device="cuda")
        b = torch.empty(70, dtype=torch.float16, device="cuda")
        outs = torch.ops.cuda_agent.launch.default("fake-test", "", [x, b])
        assert [(o.shape, o.stride(), o.dtype, o.device.type) for o in outs] == [
            ((70, 33), (1, 70), torch.float32, "cuda"), ((33, 70), (70, 1), torch.bool, "cuda")]
        with pytest.raises(ValueError, match=r"input 1: this kernel is specialised .* shape \[70\]"):
            torch.ops.cuda_agent.launch.default("fake-test", "", [x, torch.empty(35, dtype=b.dtype, device="cuda")])
        with pytest.raises(ValueError, match="takes 2 inputs, got 1"):
            torch.ops.cuda_agent.launch.default("fake-test", "", [x])
        with pytest.raises(RuntimeError, match="no launch spec is registered under 'nothing here'"):
            torch.ops.cuda_agent.launch.default("nothing here", "", [x, b])


def test_graphs_pass_up_to_eight_inputs_one_by_one_and_more_as_a_list(native):
    """launch.in<N> (cheaper for torch.ops to parse from Python) has the same C++ kernels as the
    list form: the Meta kernel's outputs, and its refusals, come through every overload."""
    launch_op.register("fake-test", _spec(), None)
    with FakeTensorMode():
        x = torch.empty_strided(X.shape, X.stride, dtype=torch.float16, device="cuda")
        b = torch.empty(70, dtype=torch.float16, device="cuda")
        op, args = launch_op.launch_call("fake-test", "", [x, b])
        assert op is torch.ops.cuda_agent.launch.in2 and args == ("fake-test", "", x, b)
        outs = op(*args)
        assert [(o.shape, o.dtype) for o in outs] == [((70, 33), torch.float32), ((33, 70), torch.bool)]
        assert [o.shape for o in launch_op.launcher("fake-test", "", 2)(x, b)] == [(70, 33), (33, 70)]
        with pytest.raises(ValueError, match="takes 2 inputs, got 3"):
            torch.ops.cuda_agent.launch.in3("fake-test", "", x, b, b)
    for count in range(1, 9):
        assert launch_op.launch_overload(count) is getattr(torch.ops.cuda_agent.launch, f"in{count}")
        for key in ("CUDA", "Meta"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"cuda_agent::launch.in{count}", key)
    many = [torch.empty(1)] * 9
    assert launch_op.launch_call("k", "p", many) == (torch.ops.cuda_agent.launch.default, ("k", "p", many))


def test_a_size_one_dims_stride_is_not_checked(native):
    one = TensorSpec((1, 8), (8, 1), "float32", "cuda")
    spec = LaunchSpec((one,), (one,), (KernelLaunch(b"\x7fELF", "sm_90", "k", 1, 32, (Arg.input(0), Arg.output(0))),))
    launch_op.register("size-one", spec, None)
    with FakeTensorMode():
        x = torch.empty_strided((1, 8), (1, 1), device="cuda")
        (out,) = torch.ops.cuda_agent.launch.default("size-one", "", [x])
    assert out.stride() == (8, 1)


def test_a_key_keeps_its_first_spec(native):
    launch_op.register("kept", _spec(), None)
    launch_op.register("kept", _spec(), None)  # the same again: nothing happens
    with pytest.raises(ValueError, match="'kept' already names another spec"):
        launch_op.register("kept", _spec(b"\x7fELF another"), None)
    assert launch_op.launch_count("kept") == 0 and launch_op.launch_count("never registered") == 0


ONE = (1, 1, 1)


@pytest.mark.parametrize("change, error", [
    ({"inputs": [([4], [1], "complex64")]}, "unknown dtype 'complex64'"),
    ({"inputs": [([4], [1, 1], "float32")]}, "shape and stride differ"),
    ({"kernels": [(b"x", "k", (0, 1, 1), (1, 1, 1), 0, [], [], ONE, False, False)]}, "at least 1"),
    ({"kernels": [(b"x", "k", (1, 1, 1), (1, 1, 1), 0, [], [], (0, 1, 1), False, False)]}, "at least 1"),
    ({"kernels": [(b"x", "k", (6, 1, 1), (1, 1, 1), 0, [], [], (4, 1, 1), False, False)]}, "whole number of clusters"),
    ({"kernels": [(b"x", "k", ONE, ONE, 0, [("ptr", 0)], [], ONE, False, False)]}, "unknown argument kind 'ptr'"),
    ({"kernels": [(b"x", "k", ONE, ONE, 0, [("output", 3)], [], ONE, False, False)]}, "output 3 does not exist"),
    ({"kernels": [(b"x", "k", ONE, ONE, 0, [("i32", 2**31)], [], ONE, False, False)]}, "i32 out of range"),
    ({"kernels": [(b"x", "k", ONE, ONE, 0, [], [4, 4], ONE, False, False)]}, "alignment must name every input"),
    ({"kernels": [(b"x", "k", ONE, ONE, 0, [("workspace", 0)], [], ONE, True, False)]},
     "a workspace takes at least one byte"),
    ({"kernels": [(b"x", "k", ONE, ONE, 0, [("counters", 0)], [], ONE, True, False)]},
     "counters take at least one byte"),
    ({"kernels": [(b"x", "k", ONE, ONE, 0, [("counters", 8), ("counters", 8)], [], ONE, True, False)]},
     "at most one counters argument"),
    ({"kernels": [(b"x", "k", ONE, ONE, 0, [], [], ONE, False, True)]}, "persistent launch is one of clusters"),
    ({"kernels": [(b"x", "k", (8, 2, 1), ONE, 0, [], [], (4, 1, 1), False, True)]}, "clusters along x"),
])
def test_the_native_table_checks_what_it_is_given(native, change, error):
    good = dict(inputs=[([4], [1], "float32")], outputs=[([4], [1], "float32")],
                kernels=[(b"x", "k", ONE, ONE, 0, [("input", 0), ("output", 0)], [4], ONE, False, False)])
    with pytest.raises(ValueError, match=error):
        native.register_spec(f"bad {error}", "digest", -1, **{**good, **change})


def test_cpu_tensors_are_refused(native):
    launch_op.register("cpu-refused", _spec(), None)
    x, b = torch.zeros(33, 70, dtype=torch.float16), torch.zeros(70, dtype=torch.float16)
    with pytest.raises(ValueError, match="specialised to CUDA tensors; got \\['cpu'\\]"):
        torch.ops.cuda_agent.launch.default("cpu-refused", "", [x, b])


def test_only_models_launch_spec_model_made_are_launch_spec_candidates():
    spec = _spec()
    made = type("ModelNew", (launch_op.LaunchSpecModel,), {"spec": spec, "key": spec.digest})
    assert launch_op.spec_of(made) == spec

    class Overridden(made):
        def forward(self, *inputs):
            return inputs[0] * 2

    relabelled = type("ModelNew", (launch_op.LaunchSpecModel,), {"spec": spec, "key": "some other key"})
    assert launch_op.spec_of(Overridden) is None and launch_op.spec_of(relabelled) is None
    assert launch_op.spec_of(torch.nn.Linear) is None


@pytest.mark.parametrize("call", ["default('unknown', '', [x])", "in1('unknown', '', x)"])
def test_a_process_that_has_not_loaded_the_op_loads_it_on_first_call(native, call):
    """A graph replayed from Inductor's cache calls the op before anything loaded its C++
    kernels: the op's default kernel loads them and dispatches again."""
    probe = (
        "import torch\n"
        "from agent_backend.env import launch_op\n"
        "assert launch_op.native.cache_info().currsize == 0\n"
        "x = torch.empty(4, device='meta')\n"
        "try:\n"
        f"    torch.ops.cuda_agent.launch.{call}\n"
        "except RuntimeError as e:\n"
        "    print(launch_op.native.cache_info().currsize, e)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("1 ") and "no launch spec is registered under 'unknown'" in done.stdout


def test_a_candidates_forward_refuses_inputs_outside_its_signature(native):
    """A launch-spec ModelNew is the op and nothing else: the op's checks refuse what the verifier
    may try, a CPU tensor (the op's default kernel) or another layout (its C++ kernels)."""
    spec_in = TensorSpec((4, 8), (8, 1), "float32", "cuda")
    spec = LaunchSpec((spec_in,), (spec_in,), (KernelLaunch(b"\x7fELF k", "sm_90", "k", 1, 32,
                                                            (Arg.input(0), Arg.output(0))),))
    launch_op.register(spec.digest, spec, None)  # launch_spec_model would load it on a GPU
    model = type("ModelNew", (launch_op.LaunchSpecModel,), {"spec": spec, "key": spec.digest})()
    with pytest.raises(ValueError, match=r"specialised to CUDA tensors; got \['cpu'\]"):
        model(torch.empty(4, 8))
    with pytest.raises(ValueError, match=r"input 0: .* stride \[8, 1\], dtype Float; got non-CUDA \[4, 8\] \[1, 4\]"):
        model(torch.empty(8, 4, device="meta").t())
    with pytest.raises(ValueError, match=r"specialised to CUDA tensors; got \[\]"):
        model()


def test_inductors_wrapper_calls_the_ops_kernel_past_torch_ops(native):
    """With launch_lowering installed, Inductor's Python wrapper calls graph_launch.launch (the op's
    C++ kernel, no dispatcher in between) where a graph holds the op: the kernel's own refusal of a
    CPU input comes back, not the op's default kernel's, and torch.ops is not in the code."""
    one = TensorSpec((8,), (1,), "float32", "cuda")
    launch_op.register("lowered", LaunchSpec((one,), (one,), (
        KernelLaunch(b"\x7fELF", "sm_90", "k", 1, 32, (Arg.input(0), Arg.output(0))),)), None)
    assert launch_lowering.install()

    def f(x):
        return torch.ops.cuda_agent.launch.in1("lowered", "", x * 2)[0] + 1

    def run():
        with pytest.raises(ValueError, match="input 0: this kernel is specialised to CUDA tensors .* got cpu"):
            torch.compile(f, backend="inductor")(torch.randn(8))

    torch._dynamo.reset()
    try:
        _, (code, *_) = run_and_get_code(run)
    finally:
        torch._dynamo.reset()
    assert launch_lowering.IMPORT in code and "cuda_agent_launch('lowered', '', " in code
    assert "torch.ops.cuda_agent.launch.in1(" not in code  # its name stays in the wrapper's size asserts


def test_the_direct_call_refuses_what_the_op_refuses_as_python_errors(native):
    """graph_launch.launch parses its arguments itself and raises its refusals as Python errors."""
    from agent_backend.env import graph_launch

    one = TensorSpec((8,), (1,), "float32", "cuda")
    launch_op.register("direct", LaunchSpec((one,), (one,), (
        KernelLaunch(b"\x7fELF", "sm_90", "k", 1, 32, (Arg.input(0), Arg.output(0))),)), None)
    x = torch.randn(8)
    for args, error, match in [
        (("direct", "", x), ValueError, r"input 0: this kernel is specialised to CUDA tensors .* got cpu \[8\]"),
        (("direct", "", [x]), ValueError, "input 0: this kernel is specialised"),
        (("direct", "", x, x), ValueError, "takes 1 inputs, got 2"),
        (("direct", "", [x, 3]), TypeError, "input 1 is not a tensor"),
        (("direct", ""), TypeError, r"takes \(key, program, \*inputs\)"),
        ((b"direct", "", x), TypeError, "the key and the program are strings"),
        (("direct", "", []), ValueError, "no inputs"),
        (("nothing registered", "", x), RuntimeError, "no launch spec is registered under 'nothing registered'"),
    ]:
        with pytest.raises(error, match=match):
            graph_launch.launch(*args)
