"""Every verification rule on a GPU, each shown by a broken or cheating CUDA candidate that is
refused for the right reason; crash containment (illegal address, device-side assert, a kernel
that never ends); and the profile of a correct candidate.

Candidates use torch ops or the fast path (agent_backend.env.fast_kernel.load_kernel), as
docs/CONTRACTS.md allows. One worker on cuda:0 serves the module.
"""
from __future__ import annotations

import dataclasses
import textwrap

import pytest

from agent_backend.env import Environment, Timeouts
from agent_backend.env.profile import counted_speedup
from agent_backend.env.verify import VERIFICATION_PLAN
from agent_backend.specs import Candidate
from test_env_cases import (CACHES_ONCE_TIMED, STATIC_OUTPUT_ONCE_TIMED, add_relu_task, make_candidate, matmul_task,
                            module_environment)

pytestmark = pytest.mark.gpu

# Large enough that a kernel takes measurable time (16 MB per tensor).
TASK = add_relu_task("cuda", shape=(1024, 4096))
MATMUL = matmul_task("cuda", m=512, k=2048, n=512)

ADD_RELU_SRC = r'''
extern "C" __global__ void add_relu(const float* a, const float* b, float* out, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) {
        float v = a[i] + b[i];
        out[i] = v > 0.f ? v : 0.f;
    }
}
'''


def kernel_candidate(forward: str, header: str = ""):
    """A fast-path candidate: self.kernel is add_relu; `forward` launches it."""
    return make_candidate(forward, init='self.kernel = load_kernel(SRC, "add_relu", ["ptr", "ptr", "ptr", "i64"])',
                          header=f"{header}\nfrom agent_backend.env.fast_kernel import load_kernel\n"
                                 f"SRC = r'''{ADD_RELU_SRC}'''")


LAUNCH = "self.kernel.launch(grid=(n + 255) // 256, block=256, args=[a, b, out, n])"
GOOD_KERNEL = kernel_candidate(f"""
    out = torch.empty_like(a)
    n = a.numel()
    {LAUNCH}
    return out
""")
GOOD_TORCH = make_candidate("return torch.relu(a + b)")


env = module_environment("cuda:0", compile_s=300, verify_s=120, profile_s=300, start_s=300)


def evaluate(env, candidate, task=TASK):
    return env.evaluate(task, candidate, profile=False)


def assert_refused(ev, status: str, reason: str):
    assert (ev.status, reason in ev.reason) == (status, True), f"{ev.status}: {ev.reason}"


# ----------------------------------------------------------------------------- correct candidates

def test_correct_torch_candidate_passes_with_its_stream_order_checked(env):
    ev = evaluate(env, GOOD_TORCH)
    assert ev.status == "passed", ev.reason
    assert ev.verification["torch_ops"] == ["aten.add.Tensor", "aten.relu.default"]
    # forward returned before its inputs arrived on its stream in (nearly) every trial
    assert ev.verification["stream_checked_trials"] >= ev.verification["trials"] - 1


def test_correct_kernel_candidate_passes_and_calls_no_torch_ops(env):
    ev = evaluate(env, GOOD_KERNEL)
    assert ev.status == "passed", ev.reason
    assert ev.verification["torch_ops"] == []
    assert ev.verification["max_abs_err"] == 0.0


def test_correct_fp32_matmul_passes_at_strict_tolerance(env):
    ev = evaluate(env, make_candidate("return torch.mm(a, b)"), MATMUL)
    assert ev.status == "passed", ev.reason
    assert ev.verification["atol"] == 1e-4


# ----------------------------------------------------------------------------- outputs

def test_output_memory_holding_the_right_answer_but_never_written_is_caught(env):
    # The freed block of `answer` holds the right values and is what empty_like hands out next;
    # poisoned allocations make the unwritten output read NaN instead.
    ev = evaluate(env, make_candidate("""
        answer = torch.relu(a + b)
        del answer
        return torch.empty_like(a)
    """))
    assert_refused(ev, "incorrect", "got nan")


def test_grid_covering_half_the_output_is_caught(env):
    ev = evaluate(env, kernel_candidate("""
        out = torch.empty_like(a)
        n = a.numel()
        self.kernel.launch(grid=(n + 255) // 256 // 2, block=256, args=[a, b, out, n])
        return out
    """))
    assert_refused(ev, "incorrect", "got nan")


def test_constant_output_is_caught(env):
    assert_refused(evaluate(env, make_candidate("return torch.zeros_like(a)")), "incorrect", "elements differ")


def test_output_aliasing_an_input_is_rejected(env):
    assert_refused(evaluate(env, make_candidate("return b")), "rejected", "shares memory with input 1")


def test_lazy_tensor_subclass_is_rejected(env):
    ev = evaluate(env, make_candidate("""
        class Deferred(torch.Tensor):
            pass
        return torch.relu(a + b).as_subclass(Deferred)
    """))
    assert_refused(ev, "rejected", "subclass of torch.Tensor")


# ----------------------------------------------------------------------------- inputs

def test_kernel_zeroing_an_input_is_rejected(env):
    ev = evaluate(env, kernel_candidate(f"""
        out = torch.empty_like(a)
        n = a.numel()
        {LAUNCH}
        a.zero_()
        return out
    """))
    assert_refused(ev, "rejected", "changed input 0")


def test_result_cached_by_input_pointer_is_rejected(env):
    ev = evaluate(env, make_candidate("""
        key = (a.data_ptr(), b.data_ptr())
        if key not in self.cache:
            self.cache[key] = torch.relu(a + b)
        return self.cache[key].clone()
    """, init="self.cache = {}"))
    assert_refused(ev, "rejected", "cached (by input pointer or shape)")


COUNTER_KEEPING = Candidate(textwrap.dedent('''
    from agent_backend.env.launch_op import launch_spec_model
    from agent_backend.env.launch_spec import Arg, KernelLaunch, LaunchSpec
    from agent_backend.specs import TensorSpec

    SRC = r"""
    extern "C" __global__ void add_relu_counted(const float* a, const float* b, float* out, unsigned* calls,
                                                long long n) {
        long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
        if (i < n) out[i] = fmaxf(a[i] + b[i], 0.0f);
        if (i == 0) calls[0] += 1u;  // what the next launch would find
    }
    """
    N = 1024 * 4096
    SPEC = TensorSpec((1024, 4096), (4096, 1), "float32", "cuda")
    ARGS = [Arg.input(0), Arg.input(1), Arg.output(0), Arg.counters(4), Arg("i64", N)]
    ModelNew = launch_spec_model(LaunchSpec(inputs=[SPEC, SPEC], outputs=[SPEC], kernels=[
        KernelLaunch.compile(SRC, "add_relu_counted", grid=N // 256, block=256, args=ARGS)]))
'''), "test")


def test_a_launch_spec_kernel_that_leaves_its_counters_non_zero_is_rejected(env):
    """Its outputs are right, but the counters the launch op keeps for it would carry something
    from one launch to the next."""
    assert_refused(evaluate(env, COUNTER_KEEPING), "rejected", "left its counters non-zero (1 bytes)")


# ----------------------------------------------------------------------------- streams and threads

STREAM_REASON = "wrong when forward runs on another current stream"


def test_work_on_a_side_stream_without_sync_is_rejected(env):
    ev = evaluate(env, make_candidate("""
        with torch.cuda.stream(self.side):
            return torch.relu(a + b)
    """, init="self.side = torch.cuda.Stream()"))
    assert_refused(ev, "rejected", STREAM_REASON)


def test_kernel_on_the_default_stream_while_another_is_current_is_rejected(env):
    ev = evaluate(env, kernel_candidate(f"""
        out = torch.empty_like(a)
        n = a.numel()
        with torch.cuda.stream(torch.cuda.default_stream()):
            {LAUNCH}
        return out
    """))
    assert_refused(ev, "rejected", STREAM_REASON)


def test_side_stream_that_waits_for_its_inputs_but_is_not_waited_for_is_rejected(env):
    # The copy of the output is queued on the current stream as soon as forward returns, while
    # the side stream still has 50 kernels to go.
    ev = evaluate(env, make_candidate("""
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            out = torch.relu(a + b)
            for _ in range(50):
                out = out * 1.0
        return out
    """, init="self.side = torch.cuda.Stream()"))
    assert ev.status in ("rejected", "incorrect") and "output 0" in ev.reason, ev.reason


def test_side_stream_with_proper_sync_passes(env):
    ev = evaluate(env, make_candidate("""
        current = torch.cuda.current_stream()
        self.side.wait_stream(current)
        with torch.cuda.stream(self.side):
            out = torch.relu(a + b)
        current.wait_stream(self.side)
        out.record_stream(current)
        return out
    """, init="self.side = torch.cuda.Stream()"))
    assert ev.status == "passed", ev.reason


def test_kernel_launched_from_a_thread_left_running_is_rejected(env):
    ev = evaluate(env, kernel_candidate(f"""
        out = torch.empty_like(a)
        n = a.numel()
        def later():
            time.sleep(0.05)
            {LAUNCH}
        threading.Thread(target=later, name="late-launch").start()
        return out
    """, header="import threading, time"))
    assert_refused(ev, "rejected", "left a thread running (late-launch)")
    assert ev.worker_restarted


# ----------------------------------------------------------------------------- precision

def test_silent_tf32_inside_forward_is_caught_by_tolerance(env):
    ev = evaluate(env, make_candidate("""
        torch.backends.cuda.matmul.allow_tf32 = True
        out = torch.mm(a, b)
        torch.backends.cuda.matmul.allow_tf32 = False
        return out
    """), MATMUL)
    assert ev.status == "incorrect" and ("rtol = 0.0001" in ev.reason or "less accurate" in ev.reason), ev.reason


def test_silent_bf16_is_caught_by_tolerance(env):
    ev = evaluate(env, make_candidate("return torch.mm(a.bfloat16(), b.bfloat16()).float()"), MATMUL)
    assert_refused(ev, "incorrect", "elements differ")


@pytest.mark.parametrize("flip, seen", [
    ("torch.backends.cuda.matmul.allow_tf32 = True", "torch.backends.cuda.matmul.allow_tf32: False -> True"),
    ("torch.set_float32_matmul_precision('high')", "torch.get_float32_matmul_precision(): highest -> high"),
    ("torch.backends.cuda.matmul.fp32_precision = 'tf32'", "fp32_precision(cuda, matmul)"),
])
def test_global_tf32_switch_left_flipped_is_rejected_and_undone(env, flip, seen):
    ev = evaluate(env, make_candidate(f"""
        {flip}
        return torch.mm(a, b)
    """), MATMUL)
    assert_refused(ev, "rejected", seen)
    assert evaluate(env, make_candidate("return torch.mm(a, b)"), MATMUL).status == "passed"


def test_current_stream_changed_for_good_is_rejected(env):
    ev = evaluate(env, make_candidate("return torch.relu(a + b)", init="torch.cuda.set_stream(torch.cuda.Stream())"))
    assert_refused(ev, "rejected", "torch.cuda.current_stream()")
    assert evaluate(env, GOOD_TORCH).status == "passed"


def test_tf32_allowed_by_the_user_is_accepted():
    with Environment(["cuda:0"], Timeouts(compile_s=300, start_s=300), precision={"allow_tf32": True}) as env:
        ev = evaluate(env, make_candidate("return torch.mm(a, b)"), MATMUL)
    assert ev.status == "passed" and ev.verification["atol"] == 1e-2, ev.reason


# ----------------------------------------------------------------------------- patched timers

@pytest.mark.parametrize("patch, name", [
    ("torch.cuda.synchronize = lambda *args, **kwargs: None", "torch.cuda.synchronize"),
    ("torch.cuda.Event.elapsed_time = lambda self, end: 0.001", "Event.elapsed_time"),
    ("torch.cuda.Event.record = lambda self, stream=None: None", "Event.record"),
    ("torch.cuda.Stream.synchronize = lambda self: None", "Stream.synchronize"),
])
def test_patched_timer_event_or_synchronize_is_rejected(env, patch, name):
    ev = evaluate(env, make_candidate("return torch.relu(a + b)", init=patch))
    assert_refused(ev, "rejected", name)
    assert ev.worker_restarted


# ----------------------------------------------------------------------------- crashes

def test_illegal_address_is_a_crash_and_the_worker_is_replaced(env):
    ev = evaluate(env, kernel_candidate("""
        out = torch.empty_like(a)
        n = a.numel()
        self.kernel.launch(grid=(n + 255) // 256, block=256, args=[a, b, 8, n])
        return out
    """))
    assert_refused(ev, "crash", "illegal memory access")
    assert ev.worker_restarted
    assert evaluate(env, GOOD_KERNEL).status == "passed"


def test_device_side_assert_is_a_crash(env):
    ev = evaluate(env, make_candidate("return a[torch.full((4,), 10**6, device=a.device)]"))
    assert ev.status == "crash" and ev.worker_restarted, ev.reason
    assert evaluate(env, GOOD_TORCH).status == "passed"


def test_kernel_that_never_ends_times_out(env):
    saved = env.timeouts
    env.timeouts = dataclasses.replace(saved, verify_s=20)
    try:
        ev = evaluate(env, make_candidate("""
            torch.cuda._sleep(1 << 42)
            return torch.relu(a + b)
        """))
    finally:
        env.timeouts = saved
    assert_refused(ev, "timeout", "verify ran past its limit of 20 s")
    assert ev.worker_restarted
    assert evaluate(env, GOOD_TORCH).status == "passed"


# ----------------------------------------------------------------------------- profile

def test_profile_of_a_correct_candidate(env):
    ev = env.evaluate(TASK, GOOD_KERNEL, profile=True)
    assert ev.status == "passed", ev.reason
    profile = ev.profile
    assert "note" not in profile, profile.get("note")
    for name in ("ours_ms", "inductor_ms", "eager_ms"):
        stats = profile[name]
        assert stats["trials"] >= 20 and 0 < stats["p10"] <= stats["median"] <= stats["p90"], (name, stats)
    # One fused pass over 48 MB: neither far faster nor far slower than Inductor's fused kernel.
    assert 0.5 < profile["speedup_vs_inductor"] < 2.0, profile
    assert profile["speedup_vs_eager"] > 1.05, profile  # eager runs add and relu as two kernels
    assert profile["wins"] == (profile["speedup_vs_inductor"] > 1.05)
    assert profile["ours_ms"]["host_median"] > 0
    # timed after both L2 flushes, alternate rounds, and judged under the one less favourable to ours
    by_flush = profile["ours_ms"]["by_flush"]
    assert set(by_flush) == {"write", "read"} and abs(by_flush["write"]["trials"] - by_flush["read"]["trials"]) <= 3
    inductor = profile["inductor_ms"]["by_flush"]
    counted = {f: counted_speedup(by_flush[f], inductor[f]) for f in by_flush}
    judged = profile["judged_flush"]
    assert judged == min(counted, key=counted.get) and profile["counted_speedup"] == pytest.approx(counted[judged])
    assert profile["speedup_vs_inductor"] == pytest.approx(inductor[judged]["median"] / by_flush[judged]["median"])


@pytest.mark.parametrize("name, task, candidate", [
    ("the same cuBLAS GEMM Inductor calls", MATMUL, make_candidate("return torch.mm(a, b)")),
    ("eager's two kernels against Inductor's one", TASK, GOOD_TORCH),
])
def test_torch_compile_overhead_is_no_false_speedup(env, name, task, candidate):
    # torch.compile's per-call guards and wrappers cost tens of microseconds on the host; timed
    # with them, a candidate that is eager itself beat Inductor by 1.3x to 7x.
    ev = env.evaluate(task, candidate, profile=True)
    assert ev.status == "passed", ev.reason
    assert not ev.profile["wins"] and ev.profile["speedup_vs_inductor"] < 1.05, ev.profile


def test_candidate_that_caches_only_once_timing_starts_is_caught_after_timing(env):
    ev = env.evaluate(TASK, CACHES_ONCE_TIMED, profile=True)
    assert ev.status in ("rejected", "incorrect") and ev.reason.startswith("after timing: "), ev.reason


def test_candidate_that_reuses_one_output_buffer_once_timed_is_caught_after_timing(env):
    ev = env.evaluate(TASK, STATIC_OUTPUT_ONCE_TIMED, profile=True)
    assert ev.status == "rejected" and ev.reason.startswith("after timing: "), ev.reason
    assert "output returned by an earlier call" in ev.reason, ev.reason


# ----------------------------------------------------------------------------- memory

def test_an_idle_worker_gives_back_what_a_big_task_left_cached(env):
    """After a task of 1 GiB tensors (its trials take several GiB), the idle worker holds little
    more of the device than before: one that kept its allocator's cache (105-120 GB of an H200
    after softmax over 4096 x 393216 fp32) ran the user's process out of memory."""
    import torch

    from agent_backend.env.worker import CACHE_KEPT_BYTES

    free_before, _ = torch.cuda.mem_get_info()
    ev = evaluate(env, GOOD_TORCH, add_relu_task("cuda", shape=(16384, 16384)))
    assert ev.status == "passed", ev.reason
    free_after, _ = torch.cuda.mem_get_info()
    assert free_before - free_after < CACHE_KEPT_BYTES + (256 << 20), (free_before - free_after) / 2**30


def test_a_task_whose_trials_do_not_fit_is_refused_for_memory_and_the_worker_stays(env):
    """Each tensor a quarter of the free memory: a trial's two inputs and the verifier's copies
    of them cannot all be held. The candidate is refused as out of GPU memory (it was "the verifier
    failed" with a traceback, and the worker replaced: softmax over 4096 x 393216 fp32 on an
    H200), and the same worker goes on to pass the next task."""
    import torch

    free, _ = torch.cuda.mem_get_info()
    ev = evaluate(env, GOOD_TORCH, add_relu_task("cuda", shape=(free // 4 // (4096 * 4), 4096)))
    assert (ev.status, "out of memory" in ev.reason, "the verifier failed" in ev.reason) == ("runtime_error", True, False)
    assert not ev.worker_restarted, ev.reason
    ev = evaluate(env, GOOD_TORCH)
    assert ev.status == "passed" and not ev.worker_restarted, ev.reason


def test_a_task_whose_input_and_output_take_a_twelfth_of_the_memory_each_is_verified(env):
    """One input and one output of a twelfth of the free memory each (KernelBench's softmax over
    4096 x 393216 fp32 takes 6.4 GB each on an H100's 80). Keeping every call's output alive and
    every earlier trial's inputs' range out of reach, the trials ran out of memory; within the
    retention budget (retained.py) only the previous call's are kept, and they fit."""
    import torch

    from test_env_cases import contiguous, make_task

    free, _ = torch.cuda.mem_get_info()
    spec = contiguous((free // 12 // (4096 * 4), 4096), "float32", "cuda")
    task = make_task("double_large", "return aten.mul.Tensor(in0, 2.0)", [spec], [spec], "pointwise",
                     ("aten.mul.Tensor",))
    ev = evaluate(env, make_candidate("return a * 2.0", args="a"), task)
    assert ev.status == "passed", ev.reason
    assert ev.verification["trials"] == len(VERIFICATION_PLAN)

