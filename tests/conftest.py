"""Shared test set-up: `gpu` tests skip cleanly where CUDA is missing, and no test touches the
user's own cache (~/.cache/cuda_agent)."""
import os
import tempfile

import pytest
import torch


def pytest_configure(config):
    os.environ["CUDA_AGENT_CACHE_DIR"] = tempfile.mkdtemp(prefix="cuda_agent_tests_")


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
