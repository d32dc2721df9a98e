"""benchmarks/rows_phases.py, rows_persistent.py and rows_stagger.py on the CPU: their hand-written
kernels build for sm_90 under their launch bounds, without spilling, for both dtypes; rows_ab.py
writes each version's kernels by its own codegen."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

import skills.rows.codegen as codegen
from benchmarks.rows_ab import DEFAULT_LAUNCHES, _compared, ab_launches, load_codegen
from benchmarks.rows_phases import (GEN_GROUPS, gen_groups_source, generated_plan, generated_preamble,
                                     kernel_source, tma_source)
from skills.rows.candidates import launch_arguments, model_source
from test_rows_template import _nvcc, case_task, resized


@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc")
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("online", [0, 1])
def test_the_probe_kernels_compile_without_spilling(tmp_path, dtype, online):
    _compiles_without_spilling(tmp_path / f"phases_{dtype}.cu", kernel_source(dtype, G=2, ONLINE=online))


@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc")
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_bulk_copy_and_row_group_kernels_compile_without_spilling(tmp_path, dtype):
    """The TMA kernels (bulk copies, mbarriers, a cluster's distributed shared memory) under their
    default defines, and the generated kernel's code over the most groups of rows (the most
    registers a thread), after its own preamble."""
    _compiles_without_spilling(tmp_path / f"tma_{dtype}.cu", tma_source(dtype))
    preamble = generated_preamble(*generated_plan(dtype))
    groups = max(GEN_GROUPS)
    _compiles_without_spilling(tmp_path / f"gen{groups}_{dtype}.cu", gen_groups_source(dtype, groups, preamble))


def _compiles_without_spilling(path, source: str) -> None:
    path.write_text(source)
    command = [_nvcc(), "-cubin", "-arch=sm_90", "-Xptxas=--warn-on-spills", "-o", str(path.with_suffix(".cubin")),
               str(path)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0 and not result.stderr.strip(), (path.name, result.stderr)


@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc")
@pytest.mark.parametrize("dtype, defines", [("bf16", dict(T=512)), ("fp32", dict(T=1024)),
                                            ("bf16", dict(T=512, MINB=2, HOLD=0)),
                                            ("fp32", dict(T=512, MINB=2, HOLD=0)),
                                            ("bf16", dict(T=512, STAGE=1, NBUF=2)),
                                            ("fp32", dict(T=1024, STAGE=1, NBUF=1))])
def test_the_persistent_cluster_probes_compile_without_spilling(tmp_path, dtype, defines):
    """benchmarks/rows_persistent.py's shapes that ran fastest (rows held in registers, 48 words a
    thread, the next row loaded as this one is stored; rows read again from L2; rows staged in
    shared memory by bulk copies): no spills."""
    from benchmarks.rows_persistent import source
    _compiles_without_spilling(tmp_path / f"persistent_{dtype}.cu", source(dtype, **defines))


@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc")
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_stagger_layout_probes_build(tmp_path, dtype):
    """benchmarks/rows_stagger.py: every kernel builds for sm_90 (a variant's source holds its own
    kernel: the counter one copying and softmax, the epoch, group and one-exchange kernels; the warp
    kernel with either exchange), and the one-exchange kernel the next GPU run is for
    (stagger-sync) does not spill in bf16."""
    from benchmarks.rows_stagger import STAGGER_VARIANTS, stagger_source, warp_source
    sources = {label: stagger_source(dtype, *STAGGER_VARIANTS[label][:1], **STAGGER_VARIANTS[label][1])
               for label in ("stagger-copy-sync", "stagger-D8", "stagger-E8", "stagger-G4D2", "stagger-sync")}
    sources |= {f"warp-{g}": warp_source(dtype, "W1s", g) for g in (0, 1)}
    for label, source in sources.items():
        path = tmp_path / f"{label}_{dtype}.cu"
        if label == "stagger-sync" and dtype == "bf16":
            _compiles_without_spilling(path, source)
            continue
        path.write_text(source)
        result = subprocess.run([_nvcc(), "-cubin", "-arch=sm_90", "-o", str(path.with_suffix(".cubin")), str(path)],
                                capture_output=True, text=True)
        assert result.returncode == 0, (label, result.stderr[-2000:])


def test_rows_ab_writes_each_version_by_its_own_codegen(tmp_path):
    """benchmarks/rows_ab.py: the base codegen loaded from a file writes the base's kernels into the
    program (this checkout's codegen does not), and the launches compared are those named, or the
    online plan's first two."""
    text = Path(codegen.__file__).read_text()
    marker = 'typedef {"long long"'
    assert marker in text
    base_file = tmp_path / "codegen_base.py"
    base_file.write_text(text.replace(marker, "// the base version\n" + marker, 1))
    base = load_codegen(str(base_file))
    task = resized(case_task("softmax", torch.bfloat16), (16, 393216)).on_device("cuda")
    first = ab_launches(task, [])
    assert len(first) == DEFAULT_LAUNCHES and all(t.endswith("o") for t, _, _ in first)  # online plan's
    (named,) = ab_launches(task, [first[1][0], "no-such-tag"])
    assert named[0] == first[1][0]
    _, plan, launch = named
    assert "// the base version" in model_source(plan, launch, base)
    assert "// the base version" not in model_source(plan, launch)
    # each version sizes its kernels' memory: the base's counters are its own
    base_file.write_text(text.replace(marker, "// the base version\n" + marker, 1).replace(
        "def counter_bytes(plan: RowPlan, launch: Launch) -> int:",
        "def counter_bytes(plan, launch):\n    return 8192\n\n\n"
        "def unused_counter_bytes(plan: RowPlan, launch: Launch) -> int:", 1))
    resized_base = load_codegen(str(base_file))
    ours = launch_arguments(plan, launch)
    assert ours[-1] != 8192 and f"MAIN_LAUNCH = {ours}" in model_source(plan, launch)
    assert f"MAIN_LAUNCH = {ours[:-1] + (8192,)}" in model_source(plan, launch, resized_base)


def test_rows_ab_line_gives_each_base_against_the_new_version_and_leaves_out_failed_ones():
    times = {"main:t1": 20.0, "shuffles:t1": 18.0, "new:t1": 16.0, "main:t2": 10.0}
    line = _compared("t1", ["main", "shuffles", "new"], times)
    assert line == "t1: main 20.0 (1.250x) shuffles 18.0 (1.125x) new 16.0"
    assert _compared("t2", ["main", "shuffles", "new"], times) == "t2: main 10.0"


def test_the_first_value_error_probe_gives_each_element_its_threads_values():
    """benchmarks/rows_first_value_error.py: on 2 blocks of 4 threads, vectors of 2, block 0's
    thread 1 holds vectors 1, 5 and 9 (elements 2-3, 10-11, 18-19); each form's error is measured."""
    from benchmarks.rows_first_value_error import errors, references
    x = torch.arange(48, dtype=torch.float32)
    refs = references(x, threads=4, blocks=2, width=2)
    assert (refs["first value"][10], refs["thread max"][10], refs["row max"][10]) == (2, 19, 47)
    assert (refs["first value"][26], refs["thread max"][26]) == (26, 43)
    found = errors(torch.randn(4096), threads=32, blocks=4, width=4)
    assert set(found) == {"first value", "thread max", "row max"} and all(0 <= a < 1e-4 for a, _ in found.values())
