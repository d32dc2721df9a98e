"""The `cuda_agent` torch.compile backend: Inductor, with our post-grad pass in front of it."""
from __future__ import annotations

import logging

import torch
from torch._inductor.compile_fx import compile_fx, compile_fx_inner

from . import background
from .dispatch import Dispatcher
from .graph_pass import GraphReport, SubgraphPass
from .options import resolve
from .progress import SearchProgress

log = logging.getLogger("cuda_agent")
# Reports of every graph compiled in this process, for `cuda-agent explain` and tests.
reports: list[GraphReport] = []


def cuda_agent_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None,
                       mode: str | None = None):
    """Registered as "cuda_agent" through the torch_dynamo_backends entry point."""
    settings = resolve(options)  # raises OptionError before any work
    config_patches = dict(torch._inductor.list_mode_options(mode)) if mode else {}
    if settings.mode != "off":
        progress = SearchProgress() if settings.mode == "search" else None  # blocking searches only
        dispatcher = Dispatcher(settings, progress=progress)
        # config_patches (not a `with config.patch`) so the lazily compiled backward graph
        # goes through the pass too.
        config_patches["post_grad_custom_pre_pass"] = SubgraphPass(dispatcher.decide, settings.min_ops, reports,
                                                                    dispatcher.cache_identity, progress,
                                                                    confirm=dispatcher.confirm_in_context)
    seen = len(reports)
    try:
        return compile_fx(gm, example_inputs, inner_compile=_held_inner_compile, config_patches=config_patches)
    except Exception as e:
        ours = [d for r in reports[seen:] for d in r.decisions if d.winner_key]
        if not ours:
            raise
        # Inductor failed on a graph holding our kernels (on the H100 a program argument once
        # broke its generated code): the user's compile must not fail for our sake.
        log.warning("cuda_agent: Inductor failed on a graph holding %d kernel(s) of ours (%s: %s); compiling it "
                    "without them", len(ours), type(e).__name__, e, exc_info=True)
        for d in ours:
            d.reason = f"Inductor failed with our kernels in the graph ({type(e).__name__}); not used: {d.reason}"
            d.winner_key = None
        config_patches.pop("post_grad_custom_pre_pass")
        return compile_fx(gm, example_inputs, inner_compile=_held_inner_compile, config_patches=config_patches)


def _held_inner_compile(*args, **kwargs):
    """Inductor's compile of one graph (the forward, or the backward compiled on its first
    call), with background searches held back meanwhile (background.compiling)."""
    with background.compiling():
        return compile_fx_inner(*args, **kwargs)
