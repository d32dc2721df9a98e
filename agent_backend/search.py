"""The agent loop for one task: propose, evaluate in the workers, keep the fastest verified
candidate, within a budget of candidates and seconds. The result is a cache entry either way:
a winner, "Inductor wins", or why the search failed."""
from __future__ import annotations

import logging
import time

from kernel_cache import Entry, make_provenance

from .env.results import counted_ms
from .specs import Task

log = logging.getLogger("cuda_agent.search")


def _median_ms(ev, who: str) -> float:
    return ev.profile[f"{who}_ms"]["median"]


def _phase_totals(evaluations) -> dict[str, float]:
    """Seconds spent per worker phase over all candidates: where a search's time went."""
    totals: dict[str, float] = {}
    for ev in evaluations:
        for phase, seconds in ev.phase_s.items():
            totals[phase] = round(totals.get(phase, 0.0) + seconds, 3)
    return totals


def search_task(task: Task, env, policy, *, budget_s: float, max_candidates: int) -> Entry:
    """Run the loop and return the entry to cache (never raises for a bad candidate)."""
    start = time.monotonic()
    feedback: list = []
    evaluated = 0
    best = None
    why_not = policy.why_not(task)
    while evaluated < max_candidates and time.monotonic() - start < budget_s:
        candidates = policy.propose(task, feedback)[: max_candidates - evaluated]
        if not candidates:
            break
        log.info("task %s (%s, %d ops): evaluating %d candidate(s)", task.hash[:12], task.kind,
                 len(task.ops), len(candidates))
        results = env.evaluate_many(task, candidates)
        for cand, ev in zip(candidates, results):
            evaluated += 1
            log.info("  %s: %s%s", cand.origin, ev.status,
                     f" {_median_ms(ev, 'ours'):.4f} ms, {ev.profile['speedup_vs_inductor'] or 0:.2f}x Inductor"
                     if ev.status == "passed" and ev.profile else f" ({ev.reason})")
            if ev.status == "passed" and ev.profile and (
                    best is None or counted_ms(ev.profile["ours_ms"]) < counted_ms(best[1].profile["ours_ms"])):
                best = (cand, ev)
        feedback.extend(results)
    provenance = make_provenance(policy.name, policy_revision=policy.revision)
    elapsed = time.monotonic() - start
    if best is None:
        if evaluated == 0:
            reason = why_not or "the policy proposed no candidate"
        else:
            statuses = sorted({f"{ev.status}: {ev.reason}" for ev in feedback})
            reason = f"no candidate of {evaluated} passed ({'; '.join(statuses)[:300]})"
        return Entry(outcome="failed", reason=reason, source=None, origin=policy.name, binaries={},
                     launch={}, timings={"search_s": elapsed, "evaluated": evaluated,
                                                             "phase_s": _phase_totals(feedback)}, verification={},
                     provenance=provenance, task=task.to_json())
    cand, ev = best
    timings = dict(ev.profile, search_s=elapsed, evaluated=evaluated, phase_s=_phase_totals(feedback))
    speedup = ev.profile["speedup_vs_inductor"]
    if ev.profile["wins"]:  # faster than Inductor by more than the environment's min_speedup
        outcome, reason = "kernel", f"{speedup:.2f}x faster than Inductor ({cand.origin})"
    elif speedup is None:
        outcome, reason = "inductor", f"not timed against Inductor: {ev.profile.get('note', 'no Inductor time')}"
    elif ev.profile["launch_bound"] and speedup > ev.profile["min_speedup"]:
        outcome, reason = "inductor", (f"Inductor keeps it: the best candidate is {speedup:.2f}x on the GPU, but its "
                                       f"launch ({ev.profile['ours_ms']['host_median'] * 1e3:.1f} us) takes longer "
                                       f"than it runs")
    else:
        outcome, reason = "inductor", f"Inductor wins: best candidate {speedup:.2f}x of Inductor's speed"
    return Entry(outcome=outcome, reason=reason, source=cand.source if outcome == "kernel" else None,
                 origin=cand.origin, binaries={}, launch=dict(cand.params), timings=timings,
                 verification=ev.verification, provenance=provenance, task=task.to_json())
