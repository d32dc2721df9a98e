"""The backend is found by name in a fresh interpreter, with no import of ours first."""
import subprocess
import sys


def test_backend_listed_in_fresh_interpreter():
    code = "import torch._dynamo as d; print('cuda_agent' in d.list_backends())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("True")


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "agent_backend.cli", "--help"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "explain" in out.stdout and "cache" in out.stdout
