"""`cuda-agent explain FILE.py:FACTORY` prints the subgraphs the backend would hand to the agent."""
import json
import subprocess
import sys
from pathlib import Path

from skills import rewrites

ROOT = Path(__file__).resolve().parent.parent


def _explain(*args):
    return subprocess.run([sys.executable, "-m", "agent_backend.cli", "explain", *args], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)


def test_explain_json_lists_tasks_of_forward_graph():
    out = _explain("examples/quickstart.py:make", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    graphs = json.loads(out.stdout)
    tasks = [t for g in graphs for t in g["subgraphs"]]
    assert tasks, graphs
    for t in tasks:
        assert len(t["hash"]) == 32 and t["ops"] and t["inputs"]
        assert all({"shape", "stride", "dtype", "device"} <= set(i) for i in t["inputs"])
        assert set(t["rewrites"]) == {r.name for r in rewrites.RULES}
    assert any(t["kind"] == "pointwise" for t in tasks)
    assert any("aten.tanh.default" in t["ops"] for t in tasks)


def test_explain_text_and_bad_target(tmp_path):
    factory = tmp_path / "f.py"
    factory.write_text("import torch\n"
                       "def make():\n"
                       "    return (lambda x: torch.relu(x * 2.0 + 1.0)), (torch.randn(4, 4),)\n")
    out = _explain(f"{factory}:make")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "graph 0: 1 subgraph(s)" in out.stdout and "pointwise" in out.stdout
    assert "float32[4, 4]" in out.stdout
    bad = _explain(f"{factory}:nope")
    assert bad.returncode != 0 and "has no callable 'nope'" in bad.stderr


def test_explain_says_which_rewrites_apply_and_why_the_others_do_not(tmp_path):
    factory = tmp_path / "g.py"
    factory.write_text("import torch\n"
                       "def make():\n"
                       "    lin = torch.nn.Linear(32, 64)\n"
                       "    return (lambda x: lin(x).mean(-1)), (torch.randn(8, 32),)\n")
    out = _explain(f"{factory}:make")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "matmul" in out.stdout and "rewrite gemm_reduce: applies" in out.stdout
    assert "rewrite attention: no, no batched matmul" in out.stdout
