"""Every candidate of the skinny template (skills/skinny) computes its product on a GPU: run
directly against the task's program in eager (the verifier's rules) and judged by the real
environment (a worker, Inductor's reference, the verifier); over 1 to 16 vectors, odd counts of
rows and of k, a bias, epilogues (GELU and a residual, a SiLU gate, the product returned beside
its ReLU), columns strided along k, and unaligned inputs (the fallback)."""
from __future__ import annotations

import pytest
import torch

from agent_backend.specs import random_inputs
from skills import skinny
from helpers import run_candidate
from test_env_cases import module_environment
from test_rows_template import assert_computes_the_task
from test_skinny_template import SKINNY_CASES, skinny_task

pytestmark = pytest.mark.gpu
env = module_environment("cuda:0", compile_s=300, verify_s=300, profile_s=600, start_s=300)

f16, bf16 = torch.float16, torch.bfloat16


def _assert_every_candidate_computes(env, task, inputs):
    candidates = skinny.propose(task)
    assert candidates, skinny.supports(task)
    for candidate in candidates:
        assert_computes_the_task(task, inputs, run_candidate(candidate, inputs), candidate.origin)
    for candidate, ev in zip(candidates, env.evaluate_many(task, candidates, profile=False)):
        assert ev.status == "passed", f"{candidate.origin}: {ev.status}: {ev.reason}"


BIG = [("linear_bias_batch5", bf16, [(4, 4096), (4097, 4096), (4097,)]),
       ("linear_batch16", f16, [(16, 4096), (1024, 4096)]),
       ("linear_batch1", bf16, [(1, 8192), (2048, 8192)])]


@pytest.mark.parametrize("name, dtype, shapes", [(n, dt, None) for n in SKINNY_CASES for dt in (bf16, f16)] + BIG,
                         ids=str)
def test_every_candidate_computes_the_product(env, name, dtype, shapes):
    task = skinny_task(name, dtype, "cuda", tuple(map(tuple, shapes)) if shapes else None)
    _assert_every_candidate_computes(env, task, random_inputs(task.inputs, 0, scale=2.0, device="cuda"))


def test_unaligned_inputs_take_the_fallback(env):
    """x shifted by one element: the main kernel's 16-byte loads would be misaligned, so the
    launch op runs the fallback, which reads an element at a time."""
    task = skinny_task("linear_bias_batch5", bf16, "cuda")
    inputs = random_inputs(task.inputs, 0, device="cuda")
    x = next(k for k, s in enumerate(task.inputs) if s.shape == (5, 1000))
    shifted = torch.randn(5 * 1000 + 1, dtype=bf16, device="cuda")[1:].view(5, 1000)
    shifted.copy_(inputs[x])
    assert shifted.data_ptr() % 16
    inputs[x] = shifted
    for candidate in skinny.propose(task):
        assert_computes_the_task(task, inputs, run_candidate(candidate, inputs), candidate.origin)
