"""benchmarks/rows_phases.py on the CPU: its hand-written kernels build for sm_90 under the
launch bounds of the generated kernel's grid, without spilling, for both dtypes."""
from __future__ import annotations

import subprocess

import pytest

from benchmarks.rows_phases import kernel_source
from test_rows_template import _nvcc


@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc")
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("online", [0, 1])
def test_the_probe_kernels_compile_without_spilling(tmp_path, dtype, online):
    path = tmp_path / f"phases_{dtype}.cu"
    path.write_text(kernel_source(dtype, G=2, ONLINE=online))
    command = [_nvcc(), "-cubin", "-arch=sm_90", "-Xptxas=--warn-on-spills", "-o", str(path.with_suffix(".cubin")),
               str(path)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
