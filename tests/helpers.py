"""Running a model eagerly and compiled, forward and backward, comparing the results, and putting
entries in the kernel cache by hand."""
from __future__ import annotations

import time

import torch


def _outputs(out) -> list[torch.Tensor]:
    """The tensors in a nested output (tuples, lists, transformers ModelOutputs, caches)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):  # transformers ModelOutput
        out = out.to_tuple()
    if not isinstance(out, (list, tuple)):
        return []
    return [t for o in out for t in _outputs(o)]


def run_fwd_bwd(model, inputs, compile_backend=None, options=None):
    """Outputs and parameter/input gradients of one forward + backward."""
    model.zero_grad(set_to_none=True)
    inputs = [i.detach().clone().requires_grad_(i.is_floating_point()) for i in inputs]
    fn = model
    if compile_backend is not None:
        torch._dynamo.reset()
        fn = torch.compile(model, backend=compile_backend, options=options)
    outs = [o for o in _outputs(fn(*inputs)) if o.is_floating_point()]
    sum((o.float() * (i + 1)).sum() for i, o in enumerate(outs)).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    grads += [i.grad for i in inputs if i.grad is not None]
    return [o.detach() for o in outs], [g.detach() for g in grads]


def assert_close_lists(got, expected, atol, rtol, what):
    assert len(got) == len(expected), f"{what}: {len(got)} tensors, expected {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        torch.testing.assert_close(g, e, atol=atol, rtol=rtol, msg=lambda m: f"{what} {i}: {m}")


def collect_tasks(model, inputs, backward: bool = True, min_ops: int = 1):
    """Tasks the backend's pass extracts from `model`, compiled with nothing replaced."""
    from agent_backend.explain import tasks_of, trace_tasks
    return tasks_of(trace_tasks(model, inputs, backward=backward, min_ops=min_ops))


# a winner's profile stats as the search stores them: timed after both L2 flushes (env/profile.py
# summarize); a winner without them was timed one way and is searched again (dispatch.timed_one_way)
TIMED_BOTH_WAYS = {"ours_ms": {"median": 0.01, "host_median": 0.005,
                               "by_flush": {f: {"median": 0.01, "host_median": 0.005} for f in ("write", "read")}}}


def put_cached_entry(task, outcome: str = "kernel", source: str | None = None, *, device: str = "cpu",
                     cache_dir=None, trust_key=None, reason: str = "supplied by a test", provenance=None,
                     timings=None, launch_spec=None, origin: str = "test", rules: str | None = None) -> str:
    """Store an entry for `task` under the key the backend looks up with default options; its
    digest. `launch_spec`: a LaunchSpec stored with it, as the search stores a winner's; a winner's
    `timings` default to TIMED_BOTH_WAYS, its verification passed under `rules` (default: these,
    verify.RULES)."""
    from agent_backend.dispatch import user_precision
    from agent_backend.env.launch_spec import store_in_entry
    from agent_backend.env.verify import RULES
    from agent_backend.options import resolve
    from kernel_cache import Entry, KernelCache, make_key
    key = make_key(task.hash, task.inputs, device, user_precision(resolve({})))
    verification = {"passed": True, "rules": rules or RULES} if outcome == "kernel" else {}
    entry = Entry(outcome=outcome, reason=reason, source=source, origin=origin,
                  provenance=provenance or {"policy": "test"},
                  timings=timings or (TIMED_BOTH_WAYS if outcome == "kernel" else {}), task=task.to_json(),
                  verification=verification, key=key.to_json(), last_used=time.time(),
                  created=time.time())
    if launch_spec is not None:
        store_in_entry(entry, launch_spec)
    cache = KernelCache.open(cache_dir=cache_dir, trust_key=trust_key)
    cache.put(key, entry)
    cache.close()
    return key.digest


def launch_spec_of(source: str, monkeypatch):
    """Execute a candidate's program on the CPU as a worker on an H100 would (132 SMs, sm_90),
    with each CUBIN standing for its source; the LaunchSpec its ModelNew runs."""
    import types

    from agent_backend.env import launch_op, launch_spec
    monkeypatch.setattr(launch_spec, "compile_cubin", lambda source, arch, options: f"cubin of {source}".encode())
    monkeypatch.setattr(launch_spec, "current_arch", lambda: "sm_90")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(launch_op, "register", lambda key, spec, device: None)
    namespace = {}
    exec(compile(source, "<candidate>", "exec"), namespace)
    spec = launch_op.spec_of(namespace["ModelNew"])
    assert spec is not None, "ModelNew is not a launch-spec model"
    return spec
