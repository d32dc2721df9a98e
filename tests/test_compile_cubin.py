"""CUDA source -> CUBIN: both compilers (where found; no GPU needed), errors, and the cache."""
import re

import pytest

from agent_backend.env import nvrtc
from agent_backend.env.compile_errors import CompileError
from cuda_agent_core import identity, toolchain

ADD = r"""
extern "C" __global__ void add(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
"""
BROKEN = r"""
extern "C" __global__ void add(const float* a, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + undefined_thing;
}
"""


@pytest.fixture(autouse=True)
def fresh_memory_cache(monkeypatch):
    """Each test starts as a new process would: nothing compiled in memory."""
    monkeypatch.setattr(nvrtc, "_memory_cache", {})


available = [name for name, find in (("nvrtc", toolchain.find_nvrtc), ("nvcc", toolchain.find_nvcc)) if find()]
compilers = pytest.mark.parametrize(
    "compiler", [pytest.param(name, marks=pytest.mark.skipif(name not in available, reason=f"no {name} here"))
                 for name in toolchain.COMPILERS])


@compilers
def test_compiles_a_cubin_for_sm_90(compiler, cache_dir):
    cubin = nvrtc.compile_cubin(ADD, arch="sm_90", compiler=compiler)
    assert cubin[:4] == b"\x7fELF"
    assert b"add" in cubin
    assert list((cache_dir / "cubin").glob("*.cubin")) and list((cache_dir / "cubin").glob("*.cu"))


@compilers
def test_a_broken_kernel_gives_a_short_error_naming_the_line(compiler, cache_dir):
    with pytest.raises(CompileError) as caught:
        nvrtc.compile_cubin(BROKEN, arch="sm_90", compiler=compiler)
    text = str(caught.value)
    assert text.startswith('kernel.cu(4): error: identifier "undefined_thing" is undefined')
    assert "if (i < n) out[i] = a[i] + undefined_thing;" in text
    assert len(text) < 400 and "/tmp" not in text and "detected in the compilation" not in text


@compilers
def test_wgmma_target_compiles(compiler, cache_dir):
    cubin = nvrtc.compile_cubin(ADD, arch="sm_90a", options=["--use_fast_math"], compiler=compiler)
    assert cubin[:4] == b"\x7fELF"


def test_unknown_option_is_a_compile_error(cache_dir):
    if not available:
        pytest.skip("no CUDA compiler here")
    with pytest.raises(CompileError, match="bogus"):
        nvrtc.compile_cubin(ADD, arch="sm_90", options=["--bogus"])


class CountingCompiler:
    version = "fake 1.0"

    def __init__(self):
        self.calls = 0

    def compile(self, source, arch, options):
        self.calls += 1
        return b"\x7fELF" + f"{arch} {options} {source}".encode()


@pytest.fixture
def fake_compiler(monkeypatch):
    compiler = CountingCompiler()
    monkeypatch.setattr(nvrtc, "get_compiler", lambda name="auto": compiler)
    return compiler


def test_compiles_once_then_serves_from_memory_then_from_disk(fake_compiler, cache_dir, monkeypatch):
    first = nvrtc.compile_cubin(ADD, arch="sm_90")
    assert nvrtc.compile_cubin(ADD, arch="sm_90") == first
    monkeypatch.setattr(nvrtc, "_memory_cache", {})  # as a new process would start
    assert nvrtc.compile_cubin(ADD, arch="sm_90") == first
    assert fake_compiler.calls == 1
    [stored] = (cache_dir / "cubin").glob("*.cubin")
    assert stored.read_bytes() == first
    assert stored.with_suffix(".cu").read_text() == ADD
    assert not list((cache_dir / "cubin").glob(".*"))  # no temporary files left behind


def test_explicit_cache_dir(fake_compiler, cache_dir, tmp_path):
    nvrtc.compile_cubin(ADD, arch="sm_90", cache_dir=tmp_path / "elsewhere")
    assert list((tmp_path / "elsewhere").glob("*.cubin"))
    assert not (cache_dir / "cubin").exists()


def test_cache_key_changes_with_source_options_arch_and_compiler():
    base = nvrtc.cubin_cache_key(ADD, "sm_90", ("-O3",), "nvrtc 13.0")
    assert base == nvrtc.cubin_cache_key(ADD, "sm_90", ["-O3"], "nvrtc 13.0")
    variants = [
        nvrtc.cubin_cache_key(ADD + " ", "sm_90", ("-O3",), "nvrtc 13.0"),
        nvrtc.cubin_cache_key(ADD, "sm_90", (), "nvrtc 13.0"),
        nvrtc.cubin_cache_key(ADD, "sm_90a", ("-O3",), "nvrtc 13.0"),
        nvrtc.cubin_cache_key(ADD, "sm_90", ("-O3",), "nvcc 13.0.88"),
    ]
    assert len({base, *variants}) == 5


@pytest.mark.parametrize("given, expected", [(90, "sm_90"), ("90", "sm_90"), ("sm_90", "sm_90"),
                                             ("sm_90a", "sm_90a"), ("sm_100a", "sm_100a"), ("sm_120f", "sm_120f")])
def test_arch_names(given, expected):
    assert nvrtc.normalize_arch(given) == expected


@pytest.mark.parametrize("bad", ["compute_90", "sm90", "hopper", ""])
def test_bad_arch_names_are_refused(bad):
    with pytest.raises(ValueError, match="sm_90"):
        nvrtc.normalize_arch(bad)


def test_cache_keys_name_the_compiler_that_compiles():
    expected = nvrtc.get_compiler().version if available else "unknown"
    assert identity.compiler_version() == expected


@pytest.mark.skipif("nvcc" not in available, reason="no nvcc here")
def test_nvcc_version_is_its_release():
    assert re.fullmatch(r"nvcc \d+\.\d+\.\d+", toolchain.find_nvcc().version)


def test_unknown_compiler_name_is_refused():
    with pytest.raises(ValueError, match="unknown compiler"):
        nvrtc.get_compiler("clang")


def test_nvrtc_candidates_include_pip_wheel_layouts(tmp_path, monkeypatch):
    wheel_lib = tmp_path / "nvidia" / "cu13" / "lib"
    wheel_lib.mkdir(parents=True)
    (wheel_lib / "libnvrtc.so.13").touch()
    (wheel_lib / "libnvrtc-builtins.so.13.0").touch()
    monkeypatch.syspath_prepend(str(tmp_path))
    candidates = toolchain.nvrtc_library_candidates()
    assert str(wheel_lib / "libnvrtc.so.13") in candidates
    assert not any("builtins" in c for c in candidates)
