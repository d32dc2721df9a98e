"""Decide, for one task, whether a kernel of ours runs it: cache first, then (if the mode allows)
a search on the GPU: now (mode "search") or in the background (mode "background"), after the
gate (search.gate_task) where it is on. Every path that does not end in a verified winner leaves
the subgraph to Inductor with a reason."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from skills import rewrites

from . import background, gate, in_context, inline, runtime
from .env.floors import FILE_NAME as FLOORS_FILE
from .env.launch_spec import read_from_entry, store_in_entry, strip_from_entry
from .env.results import needs_context
from .env.verify import RULES, verified_under_these_rules
from .graph_pass import Decision, rewrite, unchecked
from .options import Settings
from .policies import PolicyError, source_revision
from .progress import SearchProgress
from .specs import Task
from .task import UnsupportedGroup

if TYPE_CHECKING:
    from kernel_cache import Entry

log = logging.getLogger("cuda_agent")

# Verification statuses that the same source fails again under the same rules (see refusal);
# a timeout, a crash or a lack of memory may not recur, and a loss may be noise.
LASTING_FAILURES = ("incorrect", "rejected")
REFUSAL_CHARS = 300  # of the failure's reason kept in the cache


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


def close_shared_environments() -> None:
    """Kill every worker of the shared pools (at exit, with background searches pending); a
    later search starts a new pool."""
    while _environments:
        _environments.popitem()[1].close()


_SEARCHING_LATER = "searching in the background; Inductor runs it until refresh(), the next compile or process"


class Dispatcher:
    def __init__(self, settings: Settings, policy=None, progress: SearchProgress | None = None):
        self.settings = settings
        self.precision = user_precision(settings)
        self.progress = progress
        self._cache = None
        self._policy = policy
        self._trajectories = None
        self._announced_search = False
        # Results of this compile's searches by key digest, for an identical task later in the
        # graph (a transformer's layers) when the cache could not keep them; and why the policy
        # could not be asked (not cached: the next compile asks again); and the cached kernels
        # that failed verification here, by key digest: (their source, why), so an identical task
        # later in the graph is not verified again.
        self._searched: dict[str, Entry] = {}
        self._unanswered: dict[str, str] = {}
        self._refused: dict[str, tuple[str, str]] = {}
        self._graph_token_live = False  # see _in_background

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
        if entry is None or entry.outcome != "kernel" or not entry.task or refused_here(entry):
            return None
        self.cache.touch(digest)
        return runtime.Winner(key=digest, source=entry.source, outputs=Task.from_json(entry.task).outputs,
                              origin=entry.origin, spec=_launch_spec(entry, digest))

    def cache_identity(self) -> str | None:
        """Everything but the graph that decides what the pass does to it: the options, the user's
        precision, this package's code, the policy, the GPUs, and the kernel cache's contents.
        Part of Inductor's FX graph cache key; None: do not cache the graph."""
        token = self.cache.content_token()
        if token is None:
            return None
        parts = {"settings": dataclasses.asdict(self.settings), "precision": self.precision, "code": _code_revision(),
                 "gpus": _gpu_names(), "cache": token}
        if self.settings.mode in ("search", "background"):
            parts["policy"] = [self.policy.name, self.policy.revision]
        self._graph_token_live = True
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
        lookup = self._lookup(key)
        no_search = self._why_no_search(device)
        if lookup is not None and (no_search or not self.search_again(lookup.entry, task)):
            entry = lookup.entry
            if entry.outcome != "kernel":
                return Decision(task, None, f"cached: {entry.reason}", **_recorded(entry))
            if refused_here(entry):
                return Decision(task, None, refusal_reason(entry))
            if lookup.trusted and verified_under_these_rules(entry.verification):
                self.cache.touch(key)
                return self._dispatch(task, key.digest, entry)
            verified = self._verified_here(task, key, entry, lookup)
            if verified is not None:
                return self._dispatch_and_store(task, key, verified)
            if no_search:
                return Decision(task, None, self._refused[key.digest][1])
            # searched anew below: the result replaces the refused kernel in the cache
        if no_search:
            return Decision(task, None, no_search)
        if key.digest in self._unanswered:
            return Decision(task, None, self._unanswered[key.digest])
        if key.digest in self._searched:  # an identical task of this compile, its result not in the cache
            return self._decision(task, key.digest, self._searched[key.digest])
        if key.digest in self._refused or (lookup is not None and refused_here(lookup.entry)):
            log.info("cuda_agent: searching task %s again: its cached kernel failed verification here",
                     task.hash[:12])
        elif lookup is not None:
            written_by = lookup.entry.provenance
            log.info("cuda_agent: searching task %s again: its cached result (%s) came from policy %s revision %s",
                     task.hash[:12], lookup.entry.outcome, written_by.get("policy"), written_by.get("policy_revision"))
        if self.settings.mode == "background":
            return self.leave_to_background(task, key)
        try:
            entry = self._search(task, key)
        except PolicyError as e:  # not a result: nothing cached, the next compile asks again
            log.warning("%s; task %s stays with Inductor", e, task.hash[:12])
            self._unanswered[key.digest] = str(e)
            return Decision(task, None, str(e))
        self._searched[key.digest] = entry
        if entry.outcome == "kernel":
            return self._dispatch_and_store(task, key, entry)
        self.cache.put(key, entry)
        return self._decision(task, key.digest, entry)

    def _lookup(self, key):
        """The cache's entry for `key`; where that is a kernel refused here (refused_here) and a
        shared layer now holds another source for the key (a team entry fixed since), that one."""
        lookup = self.cache.get(key)
        if lookup is None or not refused_here(lookup.entry):
            return lookup
        shared = self.cache.shared(key)
        if shared is None or shared.entry.source == lookup.entry.source:
            return lookup
        if shared.trusted:
            self.cache.adopt(key, shared.entry)  # in place of the refusal, as a lookup copies a trusted entry
        return shared

    def _decision(self, task: Task, digest: str, entry) -> Decision:
        if entry.outcome == "kernel":
            return self._dispatch(task, digest, entry)
        return Decision(task, None, entry.reason, **_recorded(entry))

    def _why_no_search(self, device: str) -> str | None:
        if device != "cuda":
            return f"{device} tensors: our kernels are CUDA only"
        if self.settings.mode not in ("search", "background"):
            return f"no cached winner (mode={self.settings.mode})"
        if not torch.cuda.is_available():
            return "no CUDA device to search on"
        return None

    def search_again(self, entry, task: Task) -> bool:
        """Whether a cached result is worth a new search: a stale loser, a kernel refused here, a
        rewrite winner our rules no longer write, a winner timed after one kind of L2 flush only,
        or a task the gate skipped under a bar that no longer skips it (or with the gate now off)."""
        recorded = entry.timings.get("gate") or {}
        gated_off = recorded.get("skipped") and not (
            self.settings.gate and gate.still_skips(recorded, self.settings.min_speedup, self.settings.gate_slack))
        return (self.is_stale_loser(entry) or refused_here(entry) or self.is_stale_rewrite(entry, task)
                or timed_one_way(entry) or bool(gated_off))

    def written_by_another_policy(self, entry) -> bool:
        """Whether another policy, or another revision of ours, wrote `entry`."""
        written_by = (entry.provenance.get("policy"), entry.provenance.get("policy_revision"))
        return written_by != (self.policy.name, self.policy.revision)

    def is_stale_loser(self, entry) -> bool:
        """A loser written by another policy, or another revision of ours, which might win now."""
        return entry.outcome != "kernel" and self.written_by_another_policy(entry)

    def is_stale_rewrite(self, entry, task: Task) -> bool:
        """A rewrite winner from another revision of ours whose rules, applied to the task now,
        write another source or none: it could no longer go into the graph as its ATen ops
        (inline.aten_graph), only run op by op through its own call, which the in-context check
        never timed; a new search finds what the rules write now."""
        if entry.outcome != "kernel" or not entry.origin.startswith(rewrites.ORIGIN) or task.graph_module is None:
            return False
        return self.written_by_another_policy(entry) and inline.rewritten_as(task, entry.origin, entry.source) is None

    def leave_to_background(self, task: Task, key) -> Decision:
        """Queue the task's search and leave the task to Inductor for now."""
        self._in_background(key, functools.partial(self._search_in_background, task, key))
        return Decision(task, None, _SEARCHING_LATER)

    def _in_background(self, key, work) -> None:
        """Queue `work(stopped)` (an entry for `key`, or None to store nothing; `stopped` is set
        when the queue stops) on the background queue, its entry to be cached under `key`.

        The graph being compiled then holds code that a result still to come may change, and
        Inductor's FX graph cache would store it under a key naming the kernel cache's content
        token, computed (cache_identity) before our pass ran. Were that token still current later
        (work that stores nothing, or a process that exits first), a later compile would replay
        this graph as if it were final, and never queue the work again. So the token is moved on
        now, once per graph: no later lookup computes that key again.
        """
        queue = background.searches(on_stop=close_shared_environments)
        queue.submit(key.digest, functools.partial(work, queue.stopped), functools.partial(self.cache.put, key))
        if self._graph_token_live:
            self.cache.retire_content_token()
            self._graph_token_live = False

    def _search_in_background(self, task: Task, key, stopped):
        """The queued search: its entry, or None when the policy cannot be asked now."""
        from .background import PacedEnvironment
        env = shared_environment(self.settings.devices, self.precision, self.settings.min_speedup)
        try:
            return self._search(task, key, PacedEnvironment(env, self.settings.background_share, stopped))
        except PolicyError as e:
            log.warning("%s; task %s stays with Inductor until a later compile", e, task.hash[:12])
            return None

    def _search(self, task: Task, key, env=None):
        """The gate, then the agent loop, on `env` (default: the shared pool)."""
        from .search import gate_task, search_task
        from .trajectories import FILE, Recorder, TrajectoryLog
        if not self._announced_search and self.settings.mode == "search":
            log.warning("cuda_agent: searching kernels for subgraphs with no cached result, a loser from an "
                        "older policy, a rewrite our rules now write differently, or a cached kernel that "
                        "failed verification here (up to %.0f s each); results are cached, and "
                        "options={'mode': 'cached'} skips the search",
                        self.settings.search_budget_s)
            self._announced_search = True
        env = env or shared_environment(self.settings.devices, self.precision, self.settings.min_speedup)
        progress = self.progress
        gate_record = None
        if self.settings.gate and self.policy.why_not(task) is None:  # else the loop ends at once anyway
            if progress:
                progress.searching(task, "gate: timing Inductor's kernel")
            gated, gate_record = gate_task(task, env, self.policy, precision=self.precision,
                                           min_speedup=self.settings.min_speedup, slack=self.settings.gate_slack,
                                           floors_path=str(self.cache.cache_dir / FLOORS_FILE))
            if gated is not None:
                if progress:
                    progress.finished(None, won=False)
                return gated
        if progress:
            progress.searching(task, "proposing candidates")
        record = None
        if self.settings.record_trajectories:
            self._trajectories = self._trajectories or TrajectoryLog(self.cache.cache_dir / FILE)
            record = Recorder(self._trajectories, task, key, self.policy)
        entry = search_task(task, env, self.policy, budget_s=self.settings.search_budget_s,
                            max_candidates=self.settings.max_candidates, record=record,
                            progress=progress.search_round if progress else None)
        if gate_record is not None:
            entry.timings["gate"] = gate_record
        if progress:
            progress.finished(entry.timings.get("counted_speedup"), won=entry.outcome == "kernel")
        return entry

    def _verified_here(self, task: Task, key, entry, lookup):
        """`entry` (a cached kernel not yet trusted under these rules) once verified here (see
        _reverify), or None: refused, now or earlier in this compile for the same source."""
        refused = self._refused.get(key.digest)
        if refused is not None and refused[0] == entry.source:
            return None
        verified, failed = self._reverify(task, key, entry, lookup.layer, timed=lookup.trusted)
        if verified is None:
            reason = f"{lookup.layer} entry failed verification here"
            if failed is not None:  # wrong under these rules for good: later compiles need not verify it again
                record = refusal(entry, lookup.layer, failed)
                self.cache.put(key, record)
                reason = refusal_reason(record)
            self._refused[key.digest] = (entry.source, reason)
        return verified

    def _reverify(self, task: Task, key, entry, layer: str, timed: bool) -> tuple["Entry | None", str | None]:
        """An untrusted team entry, or one verified under other rules than these (an older
        version's: verify.RULES), runs here only after it passes verification on this device;
        its launch spec, not built here, is dropped (the source gives it again). An untrusted
        entry must also win here; one whose timings are `timed` here (or signed) keeps them: its
        correctness is in question, not its speed, which timing noise would otherwise decide.
        Returns the entry verified, or None; and why it failed where it would fail again
        (LASTING_FAILURES: not a timeout, a lack of memory or a loss by noise), else None."""
        from .specs import Candidate
        if task.inputs[0].device == "cuda" and not torch.cuda.is_available():
            return None, None
        env = shared_environment(self.settings.devices, self.precision, self.settings.min_speedup)
        ev = env.evaluate(task, Candidate(entry.source, entry.origin), profile=not timed)
        wins = timed or bool(ev.profile and (ev.profile["wins"] or needs_context(ev.profile)))
        if ev.status != "passed" or not wins:
            log.info("cuda_agent: %s entry %s rejected here: %s", layer, key.digest[:12], ev.reason or "not faster")
            return None, (f"{ev.status}: {ev.reason}"[:REFUSAL_CHARS] if ev.status in LASTING_FAILURES else None)
        if not timed:
            entry.timings = dict(ev.profile)
        entry.verification = ev.verification_record()
        strip_from_entry(entry)
        return entry, None

    def _dispatch_and_store(self, task: Task, key, entry) -> Decision:
        """Load a winner verified in this run, then cache it, with the launch spec its source
        gave here, where it is one: a graph replayed later registers the spec from the cache."""
        decision = self._dispatch(task, key.digest, entry)
        winner = runtime.registered(key.digest)
        if decision.winner_key and winner.spec is not None:
            store_in_entry(entry, winner.spec)
        self.cache.put(key, entry)
        return decision

    def _dispatch(self, task: Task, key: str, entry) -> Decision:
        winner = runtime.registered(key)
        # a winner this process loaded for the key before is not the entry's where the cache now
        # holds another source (another cache directory, a winner replaced): load the entry's
        if winner is None or winner.source != entry.source:
            try:
                winner = runtime.load_winner(runtime.Winner(key, entry.source, task.outputs, entry.origin,
                                                            spec=_launch_spec(entry, key)),
                                             task.outputs[0].device)
            except Exception as e:  # a cached winner that no longer loads must not break compile
                log.warning("cuda_agent: cached kernel %s failed to load (%s); using Inductor", key[:12], e)
                return Decision(task, None, f"cached kernel failed to load: {type(e).__name__}")
        speedup = entry.timings.get("counted_speedup") or entry.timings.get("speedup_vs_inductor")
        ours, theirs = entry.ms("ours_ms"), entry.ms("inductor_ms")
        saved = None if ours is None or theirs is None else theirs - ours
        if needs_context(entry.timings):
            return Decision(task, key, f"kernel {entry.origin} ({entry.timings['speedup_vs_inductor']:.2f}x Inductor "
                                       f"on the GPU; {speedup:.2f}x counting its launch)",
                            speedup=speedup, needs_context=True, saved_gpu_ms=saved, **_recorded(entry))
        return Decision(task, key, f"kernel {entry.origin}" + (f" ({speedup:.2f}x Inductor)" if speedup else ""),
                        speedup=speedup, saved_gpu_ms=saved, **_recorded(entry))

    def confirm_in_context(self, graph, won: list) -> list:
        """The in-context check (in_context.py) of a graph whose subgraphs `won` (group, decision):
        for each, keep its winner or not, and what the check found. The graph is checked with all
        its winners; where it is slower with them, again without the winner that was least faster
        alone (from every group it won: a transformer's layers repeat their tasks), and so on,
        until a set of winners holds up or none is left."""
        if not self.settings.in_context_check:
            return unchecked(won, "", "in_context_check is off")
        verdicts: list = [None] * len(won)
        # the least faster alone last (an unknown speedup counts as the best)
        remaining = sorted(range(len(won)), key=lambda i: -(won[i][1].speedup or math.inf))
        while remaining:
            keep, found, measured = self._confirm_together(graph, [won[i] for i in remaining])
            if keep:
                kept = [won[i] for i in remaining]
                for i, verdict in zip(remaining, [(True, found)] * len(kept) if measured else unchecked(kept, found)):
                    verdicts[i] = verdict
                break
            dropped = won[remaining[-1]][1].winner_key
            for i in [i for i in remaining if won[i][1].winner_key == dropped]:
                verdicts[i] = (False, f"lost in context: {found}")
                remaining.remove(i)
        return verdicts

    def _confirm_together(self, graph, won: list) -> tuple[bool, str, bool]:
        """Keep the winners `won` together in `graph`, or not; what the check found, or why it
        did not run; and whether it measured the graph. The verdict is cached; in mode "search" a
        missing one is measured now; in mode "background" it is queued and the winners stay
        meanwhile (each won alone: the check can only correct a loss the next compile), as they
        do in mode "cached" (their own verdicts are all we know); but those that need a measured
        verdict (graph_pass.unchecked)."""
        from kernel_cache import make_key
        try:
            check = in_context.build_check(graph, [(g, d.winner_key, d.task) for g, d in won], rewrite)
            why_not = in_context.too_big(check)
        except UnsupportedGroup as e:
            why_not = str(e)
        if why_not:
            log.info("cuda_agent: a graph's kernels are not checked in context: %s", why_not)
            return True, f"not checked ({why_not})", False
        device = (check.before.inputs or check.before.outputs)[0].device
        key = make_key(check.hash, check.before.inputs, device, self.precision)
        lookup = self.cache.get(key)
        if lookup is not None:
            return *in_context.verdict(lookup.entry), True
        saved_ms = in_context.saved_alone([d for _, d in won])
        if self.settings.mode == "search":
            if self.progress:
                self.progress.searching(check.before, f"timing the whole graph with and without {len(won)} kernel(s)")
            entry = self._check_in_context(check, saved_ms)
            self.cache.put(key, entry)
            return *in_context.verdict(entry), True
        if self.settings.mode == "background":
            self._in_background(key, lambda stopped: self._check_in_context(check, saved_ms))
            return True, "being checked in the background; the next compile follows its verdict", False
        return True, "", False

    def _check_in_context(self, check, saved_ms: float | None) -> "Entry":
        """Time the graph with and without its winners (`saved_ms`: what they saved alone); where
        the graph gained more than they could have, or kept them by a GPU gain within noise, once
        more, and the less favourable timing decides; where it dropped them by host time within
        noise while they ran well faster on the GPU, once more, and the more favourable decides."""
        env = shared_environment(self.settings.devices, self.precision, self.settings.min_speedup)
        winners = [runtime.registered(k).to_json() for k in check.winner_keys]
        timing = env.time_in_context(check.before, check.after, winners, compare=check.comparable)
        note, decide = "", in_context.less_favourable
        if in_context.implausible(timing, saved_ms):
            note = in_context.retimed(timing, saved_ms)
        elif in_context.doubtful(timing):
            note = in_context.close_call(timing)
        elif in_context.lost_by_host(timing):
            note, decide = in_context.host_noise(timing), in_context.more_favourable
        if note:
            log.info("cuda_agent: the in-context check of graph %s is timed again: %s", check.before.hash[:12], note)
            again = env.time_in_context(check.before, check.after, winners, compare=check.comparable)
            timing = decide(timing, again)
        if timing.status != "passed":  # each winner passed verification alone: worth a look
            log.warning("cuda_agent: the in-context check of graph %s failed (%s: %s); its kernels are dropped",
                        check.before.hash[:12], timing.status, timing.reason)
        return in_context.entry_of(check, timing, note)


def refused_here(entry) -> bool:
    """A kernel that failed verification under these rules, on this machine (see refusal)."""
    return entry.outcome == "kernel" and verified_under_these_rules(entry.verification) and not entry.verified


def refusal(entry, layer: str, why: str) -> "Entry":
    """`entry` (from `layer`) as a kernel refused here under these rules, for the local cache:
    mode "cached" leaves its task to Inductor without verifying it again, mode "search" searches
    the task anew, and `cache verify --drop-failed` deletes it. A rules change verifies it again."""
    verification = {"passed": False, "rules": RULES, "refused": f"{layer} entry: {why}"}
    return dataclasses.replace(entry, verification=verification, signature=None)


def refusal_reason(entry) -> str:
    return f"cached kernel failed verification here: {entry.verification.get('refused', 'no reason recorded')}"


def _recorded(entry) -> dict:
    """What a cache entry keeps of how its task was decided, for the Decision: the gate's numbers
    and each candidate tried."""
    return {"gate": entry.timings.get("gate"), "tried": entry.timings.get("candidates", [])}


def _launch_spec(entry, key: str):
    """The launch spec a trusted entry holds (None: none, or a damaged one; the source then
    gives it)."""
    try:
        return read_from_entry(entry)
    except ValueError as e:
        log.warning("cuda_agent: the launch spec of cached kernel %s is damaged (%s); its source is run instead",
                    key[:12], e)
        return None


def timed_one_way(entry) -> bool:
    """A winner whose profile timed it after one kind of L2 flush only (the worker's timer before
    it alternated a write and a read): its win may have been that flush's favour, as a skinny
    product kernel's 1.10x after a write flush was 0.97x after a read (env/profile.py)."""
    return entry.outcome == "kernel" and "by_flush" not in (entry.timings.get("ours_ms") or {})


@functools.cache
def _code_revision() -> str:
    return source_revision(Path(__file__).parent)


def _gpu_names() -> list[str]:
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
