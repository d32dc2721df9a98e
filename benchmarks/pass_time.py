"""What our graph pass costs a compile by itself, in mode "background", on the transformers
suite's training graphs (forward and backward, at the suite's full size), on this machine's CPU.

The graphs are traced as Inductor would receive them (AOTAutograd with Inductor's
decompositions); each is then handed to the pass the backend installs, as if its tensors were
on a GPU (the rule that searches CUDA tasks only is lifted) and with the background queue's
submit left out, so what is timed is the pass alone: partition, tasks, cache lookups.

    python benchmarks/pass_time.py gpt2 llama bert
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def graphs_of(family: str) -> list:
    """The forward and backward graphs of the suite's `<family>_train` problem, at full size, bf16."""
    import torch
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._inductor.decomposition import select_decomp_table

    from benchmarks.suite.problem import build
    from benchmarks.suite.registry import select

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=capture, bw_compiler=capture,
                                     decompositions=select_decomp_table())

    torch._dynamo.reset()
    model, inputs = build(select(only=[f"{family}_train"])[0], "bf16", "cpu", small=False)
    out = torch.compile(model, backend=backend)(*inputs)
    out.float().sum().backward()
    return graphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", default=["gpt2", "llama", "bert"])
    args = parser.parse_args()
    os.environ.setdefault("CUDA_AGENT_CACHE_DIR", tempfile.mkdtemp(prefix="cuda_agent_pass_time_"))
    from agent_backend import background
    from agent_backend.dispatch import Dispatcher
    from agent_backend.graph_pass import SubgraphPass
    from agent_backend.options import resolve

    Dispatcher._why_no_search = lambda self, device: None
    background.SearchQueue.submit = lambda self, name, search, store: True
    for family in args.families:
        dispatcher = Dispatcher(resolve({"mode": "background"}))
        for name, gm in zip(("forward", "backward"), graphs_of(family)):
            reports: list = []
            graph_pass = SubgraphPass(dispatcher.decide, 2, reports, dispatcher.cache_identity,
                                      confirm=dispatcher.confirm_in_context)
            start = time.perf_counter()
            graph_pass(gm.graph)
            print(f"{family} {name}: {len(gm.graph.nodes)} nodes, {len(reports[0].decisions)} subgraphs, "
                  f"pass {time.perf_counter() - start:.3f} s")


if __name__ == "__main__":
    main()
