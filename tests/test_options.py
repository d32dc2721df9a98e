"""Options are validated before any work, come from CUDA_AGENT_* variables too, and options win."""
import pytest
import torch

from agent_backend.options import OPTIONS, OptionError, options_help, resolve


def test_defaults():
    s = resolve({}, environ={})
    assert s.mode == "background" and s.min_speedup == 1.05 and s.allow_reduced_precision is False
    assert (s.gate, s.gate_slack, s.background_share) == (True, 0.03, 0.5)


def test_unknown_key_names_valid_keys():
    with pytest.raises(OptionError) as e:
        resolve({"mdoe": "cached"}, environ={})
    msg = str(e.value)
    assert "unknown option(s) 'mdoe'" in msg
    for o in OPTIONS:
        assert o.name in msg


@pytest.mark.parametrize("key,value,expect", [
    ("mode", "fast", "must be one of search, background, cached, off"),
    ("gate", "sometimes", "true or false"),
    ("gate_slack", -0.1, "at least 0"),
    ("background_share", 1.5, "at most 1.0"),
    ("background_share", 0, "positive float"),
    ("min_speedup", 0.9, "at least 1.0"),
    ("search_budget_s", -1, "positive float"),
    ("max_candidates", "many", "positive int"),
    ("allow_reduced_precision", "maybe", "true or false"),
    ("devices", ["cpu"], "not a CUDA device"),
])
def test_bad_values(key, value, expect):
    with pytest.raises(OptionError) as e:
        resolve({key: value}, environ={})
    assert f"option {key!r}" in str(e.value) and expect in str(e.value)


def test_environment_and_precedence():
    env = {"CUDA_AGENT_MODE": "cached", "CUDA_AGENT_MAX_CANDIDATES": "3",
           "CUDA_AGENT_TEAM_CACHE": "/a:/b", "CUDA_AGENT_DEVICES": "0,1"}
    s = resolve({}, environ=env)
    assert (s.mode, s.max_candidates, s.team_cache, s.devices) == ("cached", 3, ("/a", "/b"), ("cuda:0", "cuda:1"))
    assert resolve({"mode": "off"}, environ=env).mode == "off"


def test_bad_environment_variable_named():
    with pytest.raises(OptionError, match="environment variable CUDA_AGENT_MODE"):
        resolve({}, environ={"CUDA_AGENT_MODE": "sometimes"})


def test_trust_key_hidden_in_public_view():
    assert resolve({"trust_key": "s3cret"}, environ={}).public()["trust_key"] == "<set>"


def test_torch_compile_rejects_bad_option_before_work(cache_dir):
    fn = torch.compile(lambda x: x + 1, backend="cuda_agent", options={"colour": "blue"})
    with pytest.raises(Exception, match="unknown option"):
        fn(torch.ones(2))


def test_readme_documents_every_option():
    from pathlib import Path
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    assert options_help() in readme, "README.md's option table is out of date: paste options_help()"
