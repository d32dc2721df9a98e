"""Decide, for one task, whether a kernel of ours runs it: cache first, then (if the mode allows)
a search on the GPU. Every path that does not end in a verified winner leaves the subgraph to
Inductor with a reason."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
from pathlib import Path

import torch

from . import runtime
from .graph_pass import Decision
from .options import Settings
from .policies import PolicyError, source_revision
from .specs import Task

log = logging.getLogger("cuda_agent")


def user_precision(settings: Settings) -> dict:
    """The precision the user's program runs at: part of the cache key, and what the verifier
    runs the reference, Inductor and the candidate under (env/results.py DEFAULT_PRECISION)."""
    return {
        "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        # torch's default is True: convolutions in the user's program (and Inductor's) use TF32.
        "allow_cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "allow_reduced_precision": settings.allow_reduced_precision,
    }


_environments: dict = {}


def shared_environment(devices, precision: dict, min_speedup: float = 1.05):
    """One worker pool per (devices, precision, bar to win) for the whole process: workers are slow to start."""
    from .env import Environment
    key = (devices, tuple(sorted(precision.items())), min_speedup)
    if key not in _environments:
        _environments[key] = Environment(devices=list(devices) if devices else None, precision=precision,
                                         min_speedup=min_speedup)
    return _environments[key]


class Dispatcher:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.precision = user_precision(settings)
        self._cache = None
        self._policy = None
        self._announced_search = False

    @property
    def cache(self):
        if self._cache is None:
            from kernel_cache import KernelCache
            self._cache = KernelCache.open(cache_dir=self.settings.cache_dir,
                                           team=list(self.settings.team_cache) or None,
                                           trust_key=self.settings.trust_key)
            runtime.add_winner_source(str(self._cache.cache_dir), self.cached_winner)
        return self._cache

    def cached_winner(self, digest: str) -> runtime.Winner | None:
        """The local cache's winner under `digest` (local entries are verified or trusted), for a
        graph that Inductor's FX graph cache replays without running our pass."""
        entry = self.cache.local.read(digest)
        if entry is None or entry.outcome != "kernel" or not entry.task:
            return None
        self.cache.touch(digest)
        return runtime.Winner(key=digest, source=entry.source, outputs=Task.from_json(entry.task).outputs,
                              origin=entry.origin)

    def cache_identity(self) -> str | None:
        """Everything but the graph that decides what the pass does to it: the options, the user's
        precision, this package's code, the policy, the GPUs, and the kernel cache's contents. Part of Inductor's FX graph cache key; None: do not cache the graph."""
        token = self.cache.content_token()
        if token is None:
            return None
        parts = {"settings": dataclasses.asdict(self.settings), "precision": self.precision, "code": _code_revision(),
                 "gpus": _gpu_names(), "cache": token}
        if self.settings.mode == "search":
            parts["policy"] = [self.policy.name, self.policy.revision]
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()

    @property
    def policy(self):
        if self._policy is None:
            from .policies import make_policy
            self._policy = make_policy(self.settings)
        return self._policy

    def decide(self, task: Task) -> Decision:
        from kernel_cache import make_key
        device = task.inputs[0].device if task.inputs else task.outputs[0].device
        key = make_key(task.hash, task.inputs, device, self.precision)
        lookup = self.cache.get(key)
        no_search = self._why_no_search(device)
        if lookup is not None and (no_search or not self.is_stale_loser(lookup.entry)):
            entry = lookup.entry
            if entry.outcome != "kernel":
                return Decision(task, None, f"cached: {entry.reason}")
            if not lookup.trusted:
                entry = self._reverify(task, key, entry, lookup.layer)
                if entry is None:
                    return Decision(task, None, f"{lookup.layer} entry failed verification here")
            self.cache.touch(key)
            return self._dispatch(task, key.digest, entry)
        if no_search:
            return Decision(task, None, no_search)
        if lookup is not None:
            written_by = lookup.entry.provenance
            log.info("cuda_agent: searching task %s again: its cached result (%s) came from policy %s revision %s",
                     task.hash[:12], lookup.entry.outcome, written_by.get("policy"), written_by.get("policy_revision"))
        try:
            entry = self._search(task)
        except PolicyError as e:  # not a result: nothing cached, the next compile asks again
            log.warning("%s; task %s stays with Inductor", e, task.hash[:12])
            return Decision(task, None, str(e))
        self.cache.put(key, entry)
        if entry.outcome == "kernel":
            return self._dispatch(task, key.digest, entry)
        return Decision(task, None, entry.reason)

    def _why_no_search(self, device: str) -> str | None:
        if device != "cuda":
            return f"{device} tensors: our kernels are CUDA only"
        if self.settings.mode != "search":
            return f"no cached winner (mode={self.settings.mode})"
        if not torch.cuda.is_available():
            return "no CUDA device to search on"
        return None

    def is_stale_loser(self, entry) -> bool:
        """A loser written by another policy, or another revision of ours, which might win now."""
        current = (self.policy.name, self.policy.revision)
        return entry.outcome != "kernel" and (entry.provenance.get("policy"),
                                              entry.provenance.get("policy_revision")) != current

    def _search(self, task: Task):
        from .search import search_task
        if not self._announced_search:
            log.warning("cuda_agent: searching kernels for subgraphs with no cached result, or a loser from "
                        "an older policy (up to %.0f s "
                        "each); results are cached, and options={'mode': 'cached'} skips the search",
                        self.settings.search_budget_s)
            self._announced_search = True
        env = shared_environment(self.settings.devices, self.precision, self.settings.min_speedup)
        return search_task(task, env, self.policy, budget_s=self.settings.search_budget_s,
                           max_candidates=self.settings.max_candidates)

    def _reverify(self, task: Task, key, entry, layer: str):
        """An untrusted team entry runs here only after it passes verification on this GPU."""
        from .specs import Candidate
        if task.inputs[0].device != "cuda" or not torch.cuda.is_available():
            return None
        env = shared_environment(self.settings.devices, self.precision, self.settings.min_speedup)
        ev = env.evaluate(task, Candidate(entry.source, entry.origin))
        if ev.status != "passed" or not ev.profile or not ev.profile["wins"]:
            log.info("cuda_agent: %s entry %s rejected here: %s", layer, key.digest[:12], ev.reason or "not faster")
            return None
        entry.timings = dict(ev.profile)
        entry.verification = ev.verification
        self.cache.put(key, entry)
        return entry

    def _dispatch(self, task: Task, key: str, entry) -> Decision:
        winner = runtime.registered(key)
        if winner is None:
            try:
                winner = runtime.load_winner(runtime.Winner(key, entry.source, task.outputs, entry.origin),
                                             task.outputs[0].device)
            except Exception as e:  # a cached winner that no longer loads must not break compile
                log.warning("cuda_agent: cached kernel %s failed to load (%s); using Inductor", key[:12], e)
                return Decision(task, None, f"cached kernel failed to load: {type(e).__name__}")
        speedup = entry.timings.get("counted_speedup") or entry.timings.get("speedup_vs_inductor")
        return Decision(task, key, f"kernel {entry.origin}" + (f" ({speedup:.2f}x Inductor)" if speedup else ""))


@functools.cache
def _code_revision() -> str:
    return source_revision(Path(__file__).parent)


def _gpu_names() -> list[str]:
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
