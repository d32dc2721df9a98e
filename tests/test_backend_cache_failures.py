"""A broken cache never breaks torch.compile: the file is set aside and compilation goes on."""
import logging

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

