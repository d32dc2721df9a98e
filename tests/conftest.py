"""Shared test set-up: `gpu` tests skip cleanly where CUDA is missing, no test touches the
user's own cache (~/.cache/cuda_agent), and Inductor's caches of compiled graphs are off in the
test process, so that every compile runs our pass and reports its decisions whatever ran before
(tests/test_fx_graph_cache.py turns them on in the processes it starts)."""
import os
import tempfile

import pytest
import torch
import torch._functorch.config


def pytest_configure(config):
    os.environ["CUDA_AGENT_CACHE_DIR"] = tempfile.mkdtemp(prefix="cuda_agent_tests_")
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private cache directory, so no test reads or writes the user's cache."""
    d = tmp_path / "cache"
    monkeypatch.setenv("CUDA_AGENT_CACHE_DIR", str(d))
    monkeypatch.delenv("CUDA_AGENT_TEAM_CACHE", raising=False)
    monkeypatch.delenv("CUDA_AGENT_TRUST_KEY", raising=False)
    return d
