"""Launch specs as data: what they accept, and that they come back unchanged from JSON and from a
kernel-cache entry stored on disk."""
from dataclasses import replace

import pytest

from agent_backend.env.launch_spec import Arg, KernelLaunch, LaunchSpec, read_from_entry, store_in_entry, strip_from_entry
from agent_backend.specs import TensorSpec
from cache_helpers import make_test_entry, make_test_key
from kernel_cache import Entry, KernelCache

X = TensorSpec((33, 70), (70, 1), "float16", "cuda")
B = TensorSpec((70,), (1,), "float16", "cuda")
OUT = TensorSpec((33, 70), (70, 1), "bool", "cuda")


def _kernel(cubin=b"\x7fELF main", name="k", alignment=(16, 2), **changes) -> KernelLaunch:
    launch = KernelLaunch(cubin, "sm_90", name, 12, (256, 2), (Arg.input(0), Arg.input(1), Arg.output(0),
                                                               Arg("i32", -5), Arg("i64", 2**40), Arg("f32", 0.5),
                                                               Arg("f64", 3)), 1024, alignment)
    return replace(launch, **changes)


def _spec(**changes) -> LaunchSpec:
    spec = LaunchSpec((X, B), (OUT,), (_kernel(), _kernel(b"\x7fELF fallback", alignment=())))
    return replace(spec, **changes)


def test_launch_shapes_are_normalised():
    kernel = _kernel()
    assert kernel.grid == (12, 1, 1) and kernel.block == (256, 2, 1) and kernel.arch == "sm_90"
    assert kernel.args[-1].value == 3.0 and isinstance(kernel.args[-1].value, float)


@pytest.mark.parametrize("make, error", [
    (lambda: Arg("ptr", 0), "not one of"),
    (lambda: Arg("i32", 2**31), "out of range"),
    (lambda: Arg("i64", 1.5), "is an int"),
    (lambda: Arg("f32", True), "is a number"),
    (lambda: Arg.input(-1), "out of range"),
    (lambda: Arg.workspace(0), "out of range"),
    (lambda: Arg.counters(0), "out of range"),
    (lambda: Arg.counters(2**20 + 1), "out of range"),
    (lambda: _kernel(args=(Arg.counters(8), Arg.counters(8))), "at most one counters argument"),
    (lambda: _kernel(cooperative=1), "cooperative must be a bool"),
    (lambda: _kernel(grid=0), "grid must be"),
    (lambda: _kernel(block=(1, 2, 3, 4)), "block must be"),
    (lambda: _kernel(alignment=(0, 1)), "alignment must be"),
    (lambda: _kernel(cubin=b""), "cubin"),
    (lambda: _kernel(cluster=(0,)), "cluster must be"),
    (lambda: _kernel(cluster=8), "whole number of clusters"),  # 12 blocks
    (lambda: _kernel(persistent=1), "persistent must be a bool"),
    (lambda: _kernel(persistent=True), "persistent launch is one of clusters"),
    (lambda: _kernel(grid=(12, 2), cluster=4, persistent=True), "clusters along x"),
    (lambda: _kernel(cluster=4, cooperative=True, persistent=True), "not cooperative"),
    (lambda: _spec(inputs=()), "at least one input"),
    (lambda: _spec(kernels=(_kernel(args=(Arg.input(2),)),)), "input 2 does not exist"),
    (lambda: _spec(kernels=(_kernel(args=(Arg.output(1),)),)), "output 1 does not exist"),
    (lambda: _spec(kernels=(_kernel(alignment=(16,)),)), "alignment names 1 inputs"),
])
def test_bad_specs_are_refused(make, error):
    with pytest.raises((ValueError, TypeError), match=error):
        make()


def test_json_round_trip_and_digest():
    spec = _spec()
    data, binaries = spec.to_json()
    assert len(binaries) == 2 and all(name.startswith("sm_90:") for name in binaries)
    again = LaunchSpec.from_json(data, binaries)
    assert again == spec and again.digest == spec.digest
    changed = _spec(kernels=(_kernel(b"\x7fELF other"),))
    assert changed.digest != spec.digest, "the digest covers the binaries"
    with pytest.raises(ValueError, match="not a launch spec"):
        LaunchSpec.from_json(data, {})


def test_a_cluster_is_kept_and_a_plain_launch_is_written_as_before():
    """The cluster shape goes through JSON; a spec with none is written without it, so the digests
    of specs cached before clusters did not change."""
    spec = _spec(kernels=(_kernel(cluster=4), _kernel(b"\x7fELF fallback", alignment=())))
    assert spec.kernels[0].cluster == (4, 1, 1) and spec.kernels[1].cluster == (1, 1, 1)
    data, binaries = spec.to_json()
    assert data["kernels"][0]["cluster"] == [4, 1, 1] and "cluster" not in data["kernels"][1]
    assert LaunchSpec.from_json(data, binaries) == spec
    assert spec.digest != _spec().digest


def test_a_cooperative_launch_and_its_workspace_go_through_json():
    """A cooperative kernel with scratch memory and counters keeps them through JSON; a spec
    without them is written as before."""
    args = (Arg.input(0), Arg.output(0), Arg.workspace(4096), Arg.counters(128))
    spec = _spec(kernels=(_kernel(cooperative=True, args=args),))
    data, binaries = spec.to_json()
    assert data["kernels"][0]["cooperative"] is True
    assert data["kernels"][0]["args"][-2:] == [["workspace", 4096], ["counters", 128]]
    assert LaunchSpec.from_json(data, binaries) == spec and spec.digest != _spec().digest
    assert "cooperative" not in _spec().to_json()[0]["kernels"][0]


def test_a_persistent_launch_goes_through_json():
    """A persistent cluster launch keeps its flag through JSON; specs without it are written as
    before, so their digests do not change."""
    spec = _spec(kernels=(_kernel(cluster=4, persistent=True),))
    data, binaries = spec.to_json()
    assert data["kernels"][0]["persistent"] is True and "persistent" not in _spec().to_json()[0]["kernels"][0]
    assert LaunchSpec.from_json(data, binaries) == spec
    assert spec.digest != _spec(kernels=(_kernel(cluster=4),)).digest


def test_spec_round_trips_through_a_stored_cache_entry(tmp_path):
    spec = _spec()
    key = make_test_key()
    entry = make_test_entry(key, launch={"block": 256})
    store_in_entry(entry, spec)
    with KernelCache.open(tmp_path) as cache:
        cache.put(key, entry)
    with KernelCache.open(tmp_path) as cache:
        stored = cache.get(key).entry
    assert read_from_entry(stored) == spec and stored.launch["block"] == 256
    assert read_from_entry(Entry.from_json(stored.to_json())) == spec
    strip_from_entry(stored)
    assert read_from_entry(stored) is None and stored.launch == {"block": 256}
    assert set(stored.binaries) == {"sm_90"}, "the spec's binaries go, the entry's others stay"
