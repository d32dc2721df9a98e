"""The `cuda_agent` torch.compile backend: Inductor, with our post-grad pass in front of it."""
from __future__ import annotations

import torch
from torch._inductor.compile_fx import compile_fx

from .dispatch import Dispatcher
from .graph_pass import GraphReport, SubgraphPass
from .options import resolve
from .progress import SearchProgress

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
    return compile_fx(gm, example_inputs, config_patches=config_patches)
