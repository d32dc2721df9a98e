"""The backend by name gives exactly Inductor's results where no kernel of ours applies (CPU),
forward and backward, for the whole model set."""
import pytest

from helpers import assert_close_lists, run_fwd_bwd
from models import model_set

MODELS = model_set("cpu")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_matches_eager_and_inductor(name, cache_dir):
    model, inputs = MODELS[name]()
    eager_out, eager_grads = run_fwd_bwd(model, inputs)
    ours_out, ours_grads = run_fwd_bwd(model, inputs, "cuda_agent")
    ind_out, ind_grads = run_fwd_bwd(model, inputs, "inductor")
    assert_close_lists(ours_out, eager_out, 1e-4, 1e-4, f"{name} output vs eager")
    assert_close_lists(ours_grads, eager_grads, 1e-4, 1e-4, f"{name} grad vs eager")
    assert_close_lists(ours_out, ind_out, 1e-6, 1e-6, f"{name} output vs inductor")
    assert_close_lists(ours_grads, ind_grads, 1e-6, 1e-6, f"{name} grad vs inductor")
