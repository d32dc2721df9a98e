"""Nothing of ours breaks torch.compile: a broken cache file is set aside and compilation goes
on, and a failure while deciding a subgraph leaves it to Inductor with the reason reported."""
import logging

from agent_backend import backend
from agent_backend.dispatch import Dispatcher
from helpers import assert_close_lists, run_fwd_bwd
from models import model_set


def test_garbage_cache_file_does_not_break_compile(cache_dir, caplog):
    cache_dir.mkdir(parents=True)
    (cache_dir / "cache.sqlite").write_bytes(b"this is not a database" * 100)
    model, inputs = model_set("cpu")["swish_bias_scale"]()
    with caplog.at_level(logging.WARNING, logger="cuda_agent"):
        got, _ = run_fwd_bwd(model, inputs, "cuda_agent")
    expected, _ = run_fwd_bwd(model, inputs)
    assert_close_lists(got, expected, 1e-4, 1e-4, "output")
    assert any("corrupt" in r.getMessage().lower() or "set aside" in r.getMessage().lower()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert list(cache_dir.glob("cache.sqlite.corrupt*")), list(cache_dir.iterdir())



def test_a_failure_while_deciding_leaves_the_subgraph_to_inductor(cache_dir, caplog, monkeypatch):
    def broken_decide(self, task):
        raise RuntimeError("a bug in the dispatcher")
    monkeypatch.setattr(Dispatcher, "decide", broken_decide)
    model, inputs = model_set("cpu")["swish_bias_scale"]()
    seen = len(backend.reports)
    with caplog.at_level(logging.WARNING, logger="cuda_agent"):
        got, got_grads = run_fwd_bwd(model, inputs, "cuda_agent")
    expected, expected_grads = run_fwd_bwd(model, inputs)
    assert_close_lists(got, expected, 1e-4, 1e-4, "output")
    assert_close_lists(got_grads, expected_grads, 1e-4, 1e-4, "grad")
    reasons = [d.reason for r in backend.reports[seen:] for d in r.decisions]
    assert reasons and all(r == "internal error: RuntimeError: a bug in the dispatcher" for r in reasons), reasons
    assert any("Inductor keeps it" in r.getMessage() for r in caplog.records)


def test_a_failure_while_partitioning_leaves_the_graph_to_inductor(cache_dir, caplog, monkeypatch):
    from agent_backend import graph_pass

    def broken_partition(graph):
        raise RuntimeError("a bug in the partitioner")
    monkeypatch.setattr(graph_pass, "partition", broken_partition)
    model, inputs = model_set("cpu")["swish_bias_scale"]()
    with caplog.at_level(logging.WARNING, logger="cuda_agent"):
        got, _ = run_fwd_bwd(model, inputs, "cuda_agent")
    expected, _ = run_fwd_bwd(model, inputs)
    assert_close_lists(got, expected, 1e-4, 1e-4, "output")
    assert any("could not partition" in r.getMessage() for r in caplog.records)
