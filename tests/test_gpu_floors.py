"""A GPU's floors: measured once per machine and kept in a JSON file under the kernel cache root,
one record per GPU (name and SM count, driver, torch); a damaged or unwritable file costs a measurement, never
an error. On a GPU: the measurement itself, through the worker's reference request."""
import json

import pytest
import torch

from agent_backend.env import Environment, Timeouts
from agent_backend.env.floors import FILE_NAME, driver_version, gpu_key, load_or_measure, machine_key, read_floors
from agent_backend.gate import Floors
from test_env_cases import add_relu_task

H200 = machine_key("NVIDIA H200", "570.124.06", "2.11.0+cu130")
H100 = machine_key("NVIDIA H100 80GB HBM3", "570.124.06", "2.11.0+cu130")


def floors(fp32_tflops: float) -> Floors:
    return Floors(host_ms=0.004, peak_tflops={"fp32": fp32_tflops, "bf16": 700.0})


class Measure:
    """Counts measurements: the file must make a second one unnecessary."""

    def __init__(self, result: Floors):
        self.result, self.calls = result, 0

    def __call__(self) -> Floors:
        self.calls += 1
        return self.result


def test_measured_once_then_read_back(tmp_path):
    path = tmp_path / FILE_NAME
    first = Measure(floors(4000.0))
    assert load_or_measure(path, H200, first) == floors(4000.0) and first.calls == 1
    again = Measure(floors(1.0))
    assert load_or_measure(path, H200, again) == floors(4000.0) and again.calls == 0
    assert json.loads(path.read_text())["gpus"][H200]["peak_tflops"]["fp32"] == 4000.0


def test_each_gpu_driver_and_torch_has_its_own_record(tmp_path):
    path = tmp_path / FILE_NAME
    load_or_measure(path, H200, Measure(floors(4000.0)))
    other = Measure(floors(3000.0))
    assert load_or_measure(path, H100, other) == floors(3000.0) and other.calls == 1
    newer_torch = machine_key("NVIDIA H200", "570.124.06", "2.13.0+cu130")
    assert load_or_measure(path, newer_torch, Measure(floors(4100.0))).peak_tflops["fp32"] == 4100.0
    assert {read_floors(path, k).peak_tflops["fp32"] for k in (H200, H100, newer_torch)} == {4000.0, 3000.0, 4100.0}


def test_a_record_written_by_another_process_while_we_measured_is_kept(tmp_path):
    path = tmp_path / FILE_NAME

    def measure_while_another_writes() -> Floors:
        load_or_measure(path, H200, Measure(floors(4000.0)))  # the other process finishes first
        return floors(3900.0)
    assert load_or_measure(path, H200, measure_while_another_writes).peak_tflops["fp32"] == 4000.0
    assert read_floors(path, H200).peak_tflops["fp32"] == 4000.0


def test_a_damaged_file_is_measured_over(tmp_path):
    path = tmp_path / FILE_NAME
    for text in ("{not json", json.dumps({"format_version": 0, "gpus": {H200: floors(1.0).to_json()}}),
                 json.dumps({"format_version": 2, "gpus": {H200: {"copy_gbps": 1.0, "launch_ms": 0.002, "host_ms": 0.004,
                                                                 "peak_tflops": {}, "l2_bytes": 0}}})):
        path.write_text(text)
        measure = Measure(floors(4000.0))
        assert load_or_measure(path, H200, measure).peak_tflops["fp32"] == 4000.0 and measure.calls == 1
        assert read_floors(path, H200).peak_tflops["fp32"] == 4000.0


def test_an_unwritable_place_costs_a_measurement_not_an_error(tmp_path, caplog):
    not_a_directory = tmp_path / "a-file"
    not_a_directory.write_text("")
    measure = Measure(floors(4000.0))
    assert load_or_measure(not_a_directory / FILE_NAME, H200, measure).peak_tflops["fp32"] == 4000.0
    assert "could not record the GPU's floors" in caplog.text


def test_the_key_names_gpu_driver_and_torch():
    assert H200 == "NVIDIA H200 | driver 570.124.06 | torch 2.11.0+cu130"
    assert isinstance(driver_version(), str) and driver_version()


@pytest.mark.gpu
def test_floors_are_measured_in_the_worker_and_recorded(tmp_path):
    path = tmp_path / FILE_NAME
    task = add_relu_task("cuda", shape=(4096, 4096))
    moved = 3 * 4096 * 4096 * 4
    with Environment(["cuda:0"], Timeouts(compile_s=300, profile_s=300)) as env:
        timing = env.time_reference(task, floors_path=str(path), copy_bytes=moved)
    assert timing.status == "passed", timing.reason
    # the copy of as many bytes, timed beside Inductor's add+relu: no faster than the copy rate
    # allows, and Inductor no faster than it by more than noise
    copy = timing.copy_ms
    assert copy["trials"] == timing.inductor_ms["trials"] and copy["median"] >= moved / 20000e9 * 1e3
    assert timing.inductor_ms["median"] > 0.9 * copy["median"], (timing.inductor_ms, copy)
    measured = Floors.from_json(timing.floors)
    assert set(measured.peak_tflops) == {"fp32", "tf32", "bf16", "fp16"}
    assert measured.peak_tflops["bf16"] > measured.peak_tflops["fp32"]
    assert 0 < measured.host_ms < 1.0
    key = gpu_key(0)
    assert key.startswith(torch.cuda.get_device_name(0)) and key.endswith(f"torch {torch.__version__}")
    assert read_floors(path, key) == measured
    # A new worker (a new process, say) reads the record instead of measuring again.
    before = path.stat().st_mtime_ns
    with Environment(["cuda:0"], Timeouts(compile_s=300, profile_s=300)) as env:
        again = env.time_reference(task, floors_path=str(path))
    assert again.floors == timing.floors and path.stat().st_mtime_ns == before
