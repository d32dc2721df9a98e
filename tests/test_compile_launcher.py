"""The fast-path launcher, built for real with the C++ compiler: it imports without a CUDA driver,
checks every argument before it reaches the driver, and says plainly when no driver is there."""
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from agent_backend.env import launcher as launcher_build
from agent_backend.env.fast_kernel import ARG_TYPE_CODES, arg_type_codes

# Tests that use the built launcher: its first build takes about 10 s on 2 cores.
needs_build = pytest.mark.slow


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CUDA_AGENT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        launcher_build.launcher_module.cache_clear()
        yield launcher_build.launcher_module()
    launcher_build.launcher_module.cache_clear()


@pytest.fixture
def scale(launcher):
    """A Function with a null handle: enough to exercise everything before the driver call."""
    return launcher.Function(0, "scale", arg_type_codes(["ptr", "ptr", "f32", "i64"]))


@needs_build
def test_builds_into_the_cache_root_once(launcher):
    library = launcher.__file__
    assert f"/launcher/{launcher_build.build_key()}/" in library
    assert launcher_build.launcher_module() is launcher


def test_build_key_follows_the_source(tmp_path, monkeypatch):
    before = launcher_build.build_key()
    changed = tmp_path / "launcher.cpp"
    changed.write_text(launcher_build.SOURCE.read_text() + "\n// changed\n")
    monkeypatch.setattr(launcher_build, "SOURCE", changed)
    assert launcher_build.build_key() != before


@needs_build
@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA driver is present")
def test_without_a_driver_loading_and_launching_say_so(launcher, scale):
    with pytest.raises(RuntimeError, match=r"cannot load the CUDA driver \(libcuda\.so\.1\)"):
        launcher.load_module(b"\x7fELF", 0)
    with pytest.raises(RuntimeError, match="libcuda.so.1"):
        scale.launch((4,), 256, [0, 0, 2.0, 1024], 0, 0)


@needs_build
def test_function_keeps_name_and_codes(scale):
    assert scale.name == "scale"
    assert scale.arg_codes == "ppfl"


@needs_build
@pytest.mark.parametrize("args, message", [
    ([0, 0, 2.0], r"kernel 'scale' takes 4 arguments, got 3"),
    ([object(), 0, 2.0, 1], r"argument 0 \(ptr\) must be a torch.Tensor or an int address"),
    ([torch.zeros(4), 0, 2.0, 1], r"argument 0 \(ptr\) must be a CUDA tensor"),
    ([0, 0, "2.0", 1], r"argument 2 \(f32\) must be a float"),
    ([0, 0, 2.0, 1.5], r"argument 3 \(i64\) must be an int"),
    ([0, 0, 2.0, 2**70], r"argument 3 \(i64\) must be an int that fits in 64 bits"),
])
def test_bad_arguments_are_refused_before_launch(scale, args, message):
    with pytest.raises(TypeError, match=message):
        scale.launch(1, 1, args, 0, 0)


@needs_build
def test_i32_range_is_checked(launcher):
    function = launcher.Function(0, "k", "i")
    with pytest.raises(TypeError, match=r"argument 0 \(i32\) must be an int that fits in 32 bits"):
        function.launch(1, 1, [2**31], 0, 0)


@needs_build
@pytest.mark.parametrize("grid", [0, -1, (), (1, 2, 3, 4), (1.5,), "ab", (2, 0)])
def test_bad_grid_is_refused(scale, grid):
    with pytest.raises(ValueError, match="grid must be a positive int or a tuple of 1 to 3 positive ints"):
        scale.launch(grid, 1, [0, 0, 2.0, 1], 0, 0)


@needs_build
@pytest.mark.parametrize("cluster, message", [
    ((3,), "the grid must be a whole number of clusters"),
    ((2, 0), "cluster must be a positive int or a tuple of 1 to 3 positive ints"),
])
def test_bad_cluster_is_refused_before_launch(scale, cluster, message):
    with pytest.raises(ValueError, match=message):
        scale.launch(4, 1, [0, 0, 2.0, 1], 0, 0, cluster)


def _cuda_header() -> Path | None:
    found = [Path(p).parent.parent / "include" / "cuda.h" for p in filter(None, [shutil.which("nvcc")])]
    found += sorted(Path("/usr/local").glob("cuda*/include/cuda.h"))
    return next((p for p in found if p.is_file()), None)


@pytest.mark.skipif(_cuda_header() is None or shutil.which("c++") is None, reason="needs cuda.h and a C++ compiler")
def test_cluster_launch_structs_match_cuda_h(tmp_path):
    """cuda_driver.h declares cuLaunchKernelEx's structs by hand (the launcher builds without CUDA
    headers) and static_asserts these sizes and offsets for them; here they are checked against
    cuda.h."""
    check = tmp_path / "abi.cpp"
    check.write_text("""#include <cuda.h>
#include <cstddef>
static_assert(sizeof(CUlaunchAttribute) == 72 && offsetof(CUlaunchAttribute, value) == 8, "attribute");
static_assert(sizeof(CUlaunchConfig) == 56 && offsetof(CUlaunchConfig, sharedMemBytes) == 24 &&
              offsetof(CUlaunchConfig, hStream) == 32 && offsetof(CUlaunchConfig, attrs) == 40 &&
              offsetof(CUlaunchConfig, numAttrs) == 48, "config");
static_assert(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION == 4, "attribute id");
""")
    done = subprocess.run(["c++", "-fsyntax-only", f"-I{_cuda_header().parent}", str(check)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    header = launcher_build.HEADERS[0].read_text()  # cuda_driver.h
    assert "sizeof(LaunchAttribute) == 72 && offsetof(LaunchAttribute, value) == 8" in header
    assert "sizeof(LaunchConfig) == 56 && offsetof(LaunchConfig, shared_mem) == 24" in header
    assert "CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4;" in header


@needs_build
def test_unknown_type_code_is_refused(launcher):
    with pytest.raises(ValueError, match="unknown argument type code 'q'"):
        launcher.Function(0, "k", "pq")


def test_arg_type_names():
    assert arg_type_codes(["ptr", "i32", "i64", "f32", "f64"]) == "pilfd"
    assert set(ARG_TYPE_CODES) == {"ptr", "i32", "i64", "f32", "f64"}
    with pytest.raises(ValueError, match=r"unknown arg types \['float'\]"):
        arg_type_codes(["ptr", "float"])
    with pytest.raises(TypeError, match="not the string"):
        arg_type_codes("ptr")
