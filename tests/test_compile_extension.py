"""The torch-extension path: builds keyed by their sources, renamed, reused, errors trimmed."""
import time
from pathlib import Path

import pytest
import torch.utils.cpp_extension as cpp_extension

from agent_backend.env import extension
from agent_backend.env.compile_errors import CompileError
from agent_backend.env.extension import keyed_extension_builds

BUILD_FAILURE = """\
Error building extension 'ext': [1/2] c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=ext -fPIC -c /b/ext/main.cpp -o main.o
FAILED: main.o
/b/ext/main.cpp:5:12: error: 'oops' was not declared in this scope
    5 |     return oops;
      |            ^~~~
ninja: build stopped: subcommand failed.
"""


class FakeBuilds:
    """Stands in for load_inline/load (same parameters), recording each call instead of building."""

    def __init__(self):
        self.calls = []
        self.raise_error = None

    def load_inline(self, name, cpp_sources, cuda_sources=None, functions=None, extra_cuda_cflags=None,
                    build_directory=None, verbose=False):
        return self._record(name, build_directory)

    def load(self, name, sources, extra_cflags=None, build_directory=None, verbose=False):
        return self._record(name, build_directory)

    def _record(self, name, build_directory):
        self.calls.append({"name": name, "build_directory": build_directory,
                           "stale_torch_lock": (Path(build_directory) / "lock").exists()})
        if self.raise_error:
            raise self.raise_error
        return f"module {name}"


@pytest.fixture
def fake(monkeypatch):
    builds = FakeBuilds()
    monkeypatch.setattr(cpp_extension, "load_inline", builds.load_inline)
    monkeypatch.setattr(cpp_extension, "load", builds.load)
    monkeypatch.setattr(extension, "_loaded", {})
    return builds


def inline_build(name="ext", cuda="__global__ void k() {}", **kwargs):
    return cpp_extension.load_inline(name=name, cpp_sources="void f();", cuda_sources=cuda, functions=["f"],
                                     **kwargs)


def test_builds_are_renamed_and_placed_by_key(fake, tmp_path):
    with keyed_extension_builds(tmp_path) as root:
        module = inline_build()
    [call] = fake.calls
    assert root == tmp_path
    assert call["name"].startswith("ext_") and len(call["name"]) == len("ext_") + 16
    assert call["build_directory"] == str(tmp_path / call["name"])
    assert module == f"module {call['name']}"


def test_identical_sources_reuse_the_build(fake, tmp_path):
    with keyed_extension_builds(tmp_path):
        first = inline_build(verbose=False)
        again = inline_build(verbose=True)  # how loudly it builds is not what it builds
    assert again == first
    assert len(fake.calls) == 1  # the second came from this process's loaded modules


def test_different_sources_flags_or_names_build_apart(fake, tmp_path):
    with keyed_extension_builds(tmp_path):
        inline_build()
        inline_build(cuda="__global__ void k() { }")
        inline_build(extra_cuda_cflags=["-O3"])
        inline_build(name="other")
    names = [call["name"] for call in fake.calls]
    assert len(set(names)) == 4
    assert names[3] == "other_" + names[0].removeprefix("ext_")  # same sources, same key


def test_load_is_keyed_by_file_contents_not_location(fake, tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "ext.cpp").write_text("int f() { return 1; }")
    with keyed_extension_builds(tmp_path / "builds"):
        cpp_extension.load(name="ext", sources=[str(tmp_path / "a" / "ext.cpp")])
        cpp_extension.load(name="ext", sources=str(tmp_path / "b" / "ext.cpp"))
    assert len(fake.calls) == 1
    (tmp_path / "b" / "ext.cpp").write_text("int f() { return 2; }")
    with keyed_extension_builds(tmp_path / "builds"):
        cpp_extension.load(name="ext", sources=[str(tmp_path / "b" / "ext.cpp")])
    assert fake.calls[1]["name"] != fake.calls[0]["name"]


def test_originals_come_back_after_the_block(fake, tmp_path):
    with keyed_extension_builds(tmp_path):
        assert cpp_extension.load_inline != fake.load_inline
    assert cpp_extension.load_inline == fake.load_inline
    assert cpp_extension.load == fake.load


def test_a_lock_left_by_a_killed_build_is_cleared(fake, tmp_path):
    with keyed_extension_builds(tmp_path):
        inline_build()
        build_dir = Path(fake.calls[0]["build_directory"])
        (build_dir / "lock").touch()
        extension._loaded.clear()
        inline_build()
    assert fake.calls[1]["stale_torch_lock"] is False


def test_build_failures_become_short_compile_errors(fake, tmp_path):
    fake.raise_error = RuntimeError(BUILD_FAILURE)
    with keyed_extension_builds(tmp_path), pytest.raises(CompileError) as caught:
        inline_build()
    assert str(caught.value) == (
        "main.cpp:5:12: error: 'oops' was not declared in this scope\n"
        "    5 |     return oops;\n"
        "      |            ^~~~"
    )
    assert caught.value.log == BUILD_FAILURE


def test_load_failures_become_compile_errors(fake, tmp_path):
    fake.raise_error = ImportError("/b/ext_1234/ext_1234.so: undefined symbol: _Z6launchv")
    with keyed_extension_builds(tmp_path), pytest.raises(CompileError, match="undefined symbol: _Z6launchv"):
        inline_build()


def test_other_errors_pass_through(fake, tmp_path):
    fake.raise_error = RuntimeError("Ninja is required to load C++ extensions")
    with keyed_extension_builds(tmp_path), pytest.raises(RuntimeError, match="Ninja is required") as caught:
        inline_build()
    assert not isinstance(caught.value, CompileError)


# A real build, kept small: no torch headers (no_implicit_headers, no pybind11 error wrapping).
ADD_ONE = "#include <pybind11/pybind11.h>\nint add_one(int x) { return x + 1; }\n"
BROKEN = "#include <pybind11/pybind11.h>\nint add_one(int x) { return x + oops; }\n"


def real_build(source):
    return cpp_extension.load_inline(name="ext", cpp_sources=source, functions=["add_one"],
                                     no_implicit_headers=True, with_pytorch_error_handling=False)


@pytest.mark.slow
def test_real_build_is_reused_without_rebuilding(tmp_path, monkeypatch):
    monkeypatch.setattr(extension, "_loaded", {})
    with keyed_extension_builds(tmp_path):
        module = real_build(ADD_ONE)
        assert module.add_one(41) == 42
        [build_dir] = [p for p in tmp_path.iterdir() if p.is_dir()]
        [library] = build_dir.glob("ext_*.so")
        built_at = library.stat().st_mtime_ns
        extension._loaded.clear()  # as a new process would start: ninja finds it up to date
        started = time.perf_counter()
        assert real_build(ADD_ONE).add_one(1) == 2
        assert time.perf_counter() - started < 5
    assert library.stat().st_mtime_ns == built_at


@pytest.mark.slow
def test_real_compiler_error_names_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setattr(extension, "_loaded", {})
    with keyed_extension_builds(tmp_path), pytest.raises(CompileError) as caught:
        real_build(BROKEN)
    text = str(caught.value)
    assert text.startswith("main.cpp:2:")
    assert "oops" in text and "/" not in text.splitlines()[0]
