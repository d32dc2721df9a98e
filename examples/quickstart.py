"""The main example: compile a small model with backend="cuda_agent" and see what happened.

The first compile returns with Inductor's code while the backend searches kernels for the
model's subgraphs in the background (on a machine with a CUDA GPU; cached afterwards); once they
are done, agent_backend.refresh() makes the next call compile again with the kernels that won.
Without a GPU every subgraph stays with Inductor. Either way the outputs match eager.

    python examples/quickstart.py            # add -v for the search's progress
"""
import logging
import sys
import time

import torch
import torch.nn as nn


class GatedMLP(nn.Module):
    def __init__(self, dim=1024, hidden=4096):
        super().__init__()
        self.up, self.gate, self.down = nn.Linear(dim, hidden), nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        h = torch.nn.functional.silu(self.gate(x)) * self.up(x)
        y = self.down(h)
        return torch.tanh(y * self.scale + x) * 0.5 + x


def make(device=None):
    """(model, inputs) factory, also for `cuda-agent explain examples/quickstart.py:make`."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    rows = 8192 if device == "cuda" else 64
    dim, hidden = (1024, 4096) if device == "cuda" else (64, 128)
    model = GatedMLP(dim, hidden).to(device).eval()
    return model, (torch.randn(rows, dim, device=device),)


def _time_ms(fn, x, reps=20):
    for _ in range(3):
        fn(x)
    if x.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn(x)
    if x.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps * 1e3


def main():
    if "-v" in sys.argv:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    from agent_backend import backend, refresh

    model, (x,) = make()
    with torch.no_grad():
        expected = model(x)
        ours = torch.compile(model, backend="cuda_agent")
        ours(x)  # Inductor's code; the searches run behind it
        still_pending = refresh(wait=True, timeout_s=600)  # wait for them, then compile again on the next call
        if still_pending:
            print(f"cuda_agent: {still_pending} search(es) still running; the kernels they find run from the next "
                  "compile or process on")
        got = ours(x)
        inductor = torch.compile(model, backend="inductor")
        inductor(x)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        print(f"outputs match eager on {x.device.type}")
        for report in backend.reports:
            print(report.summary())
        if not backend.reports:
            print("cuda_agent: graphs replayed from Inductor's graph cache (compiled in an earlier run, against "
                  "the same kernel cache); `cuda-agent report examples/quickstart.py:make` lists their subgraphs")
        print(f"eager {_time_ms(model, x):.3f} ms | inductor {_time_ms(inductor, x):.3f} ms | "
              f"cuda_agent {_time_ms(ours, x):.3f} ms")


if __name__ == "__main__":
    main()
