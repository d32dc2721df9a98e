"""Keys differ when anything that decides validity differs, and match across processes and
machines when nothing relevant does."""
import platform
from types import SimpleNamespace

import pytest
import torch
from cache_helpers import PRECISION, finish, make_test_entry, make_test_key, run_helper

from agent_backend.specs import TensorSpec
from cuda_agent_core import identity
from kernel_cache import CacheKey, KernelCache, make_key
from kernel_cache.keys import canonical_json

INPUTS = [TensorSpec((8, 16), (16, 1), "float16", "cpu"), TensorSpec((16,), (1,), "float16", "cpu")]
# The digest of make_test_key("pinned"), computed before machine identity moved out of
# agent_backend.env into cuda_agent_core; it must never change.
KNOWN_DIGEST = "cd21103ef840fd4bee682ada462e4fe015b794ae1f73afb5a33ebe641a4d2eee"
KNOWN_INPUTS = [TensorSpec((64, 64), (64, 1), "float32", "cuda"), TensorSpec((64,), (1,), "float32", "cuda")]


def test_digest_of_fixed_parts_is_pinned():
    # The digest is a pure function of the parts (no host, path, time or hash seed in it), so
    # any machine computes this value. If this test fails, the key format changed: bump
    # KEY_FORMAT_VERSION, since old entries would otherwise be unreachable or, worse, misread.
    key = make_test_key("pinned")
    assert canonical_json(key.to_json()) == (
        '{"format_version":1,"gpu":{"capability":"9.0","name":"NVIDIA H100 80GB HBM3","sm_count":132},'
        '"inputs":["float32[64,64]/[64,1]@cuda","float32[64]/[1]@cuda"],"precision":{"allow_reduced_precision":'
        'false,"allow_tf32":false,"matmul_precision":"highest"},"software":{"compiler":"nvrtc 12.8","cuda":"12.8",'
        '"torch":"2.11.0+cu128"},"task_hash":"task-pinned"}')
    assert key.digest == KNOWN_DIGEST


@pytest.fixture
def known_machine(monkeypatch):
    """This process seen as an H100 with torch 2.11.0+cu128 and NVRTC 12.8."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu128")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(identity, "compiler_version", lambda: "nvrtc 12.8")
    identity._cuda_identity.cache_clear()
    yield
    identity._cuda_identity.cache_clear()


def test_make_key_on_a_known_machine_is_pinned(known_machine):
    # The identity parts make_key fills in from this process, end to end: where they are looked
    # up may move, the key they give must not.
    key = make_key("task-pinned", KNOWN_INPUTS, "cuda", PRECISION)
    assert key == make_test_key("pinned")
    assert key.digest == KNOWN_DIGEST


def test_a_known_entry_is_stored_under_its_pinned_digest(known_machine, cache_dir):
    key = make_key("task-pinned", KNOWN_INPUTS, torch.device("cuda", 0), PRECISION)
    with KernelCache.open() as cache:
        assert cache.put(key, make_test_entry(key))
        assert cache.local.store.digests() == [KNOWN_DIGEST]
        assert cache.get(make_test_key("pinned")).entry.key == key.to_json()


def test_same_key_in_another_process_with_another_environment(tmp_path):
    here = make_key("task-x", INPUTS, "cpu", PRECISION).digest
    elsewhere = finish(run_helper("print-key", "task-x", cwd=tmp_path,
                                  env={"HOME": str(tmp_path), "PYTHONHASHSEED": "123", "HOSTNAME": "elsewhere"}))
    assert elsewhere["digest"] == here


def test_precision_settings_are_canonical():
    reordered = dict(reversed(list(PRECISION.items())))
    assert make_key("t", INPUTS, "cpu", reordered) == make_key("t", INPUTS, "cpu", PRECISION)


@pytest.mark.parametrize("change", [
    "task", "shape", "stride", "dtype", "input_device", "tf32", "matmul_precision", "reduced_precision",
    "gpu_name", "capability", "sm_count", "torch_version", "cuda_version", "compiler",
])
def test_every_part_changes_the_digest(change, monkeypatch):
    base = make_key("t", INPUTS, "cpu", PRECISION)
    task, inputs, precision = "t", list(INPUTS), dict(PRECISION)
    if change == "task":
        task = "t2"
    elif change == "shape":
        inputs[0] = TensorSpec((16, 8), (8, 1), "float16", "cpu")
    elif change == "stride":
        inputs[0] = TensorSpec((8, 16), (1, 8), "float16", "cpu")
    elif change == "dtype":
        inputs[0] = TensorSpec((8, 16), (16, 1), "bfloat16", "cpu")
    elif change == "input_device":
        inputs[1] = TensorSpec((16,), (1,), "float16", "cuda")
    elif change == "tf32":
        precision["allow_tf32"] = True
    elif change == "matmul_precision":
        precision["matmul_precision"] = "high"
    elif change == "reduced_precision":
        precision["allow_reduced_precision"] = True
    elif change in ("gpu_name", "capability", "sm_count"):
        here = identity.device_identity("cpu", None)
        changed = {"gpu_name": here._replace(name="other"), "capability": here._replace(capability="9.0"),
                   "sm_count": here._replace(sm_count=7)}[change]
        monkeypatch.setattr(identity, "device_identity", lambda *_: changed)
    elif change == "torch_version":
        monkeypatch.setattr(torch, "__version__", "2.99.0")
    elif change == "cuda_version":
        monkeypatch.setattr(torch.version, "cuda", "13.0")
    elif change == "compiler":
        monkeypatch.setattr(identity, "compiler_version", lambda: "nvrtc 99.0")
    assert make_key(task, inputs, "cpu", precision).digest != base.digest


def test_cuda_device_identity_comes_from_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"NVIDIA H200 #{i}")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"multi_processor_count": 132}))
    identity._cuda_identity.cache_clear()
    try:
        on_1 = make_key("t", INPUTS, torch.device("cuda", 1), PRECISION)
        on_default = make_key("t", INPUTS, "cuda", PRECISION)
    finally:
        identity._cuda_identity.cache_clear()
    assert (on_1.gpu, on_1.capability, on_1.sm_count) == ("NVIDIA H200 #1", "9.0", 132)
    assert on_default.gpu == "NVIDIA H200 #0"


def test_cpu_identity_and_software_are_filled_in():
    key = make_key("t", INPUTS, "cpu", PRECISION)
    assert (key.gpu, key.capability, key.sm_count) == (f"cpu:{platform.machine()}", "", 0)
    assert key.torch == torch.__version__
    assert key.cuda == (torch.version.cuda or "none")
    assert key.compiler == identity.compiler_version() and key.compiler


def test_key_json_round_trip_keeps_the_digest():
    key = make_key("t", INPUTS, "cpu", PRECISION)
    again = CacheKey.from_json(key.to_json())
    assert again == key and again.digest == key.digest
    with pytest.raises(ValueError):
        CacheKey.from_json({"task_hash": "t"})
