"""The agent loop for one task: propose, evaluate in the workers, keep the verified candidate
fastest against Inductor (`rank`), within a budget of candidates and seconds. The result is a cache entry either way:
a winner, "Inductor wins", or why the search failed. Before it, the gate (`gate_task`): where
Inductor already runs at the task's floor, the loop is skipped. Each round's candidates and
verdicts go to `record` (the trajectories), and back to the policy as feedback for its next round."""
from __future__ import annotations

import logging
import time
from typing import Callable

from kernel_cache import Entry, make_provenance

from . import gate
from .env.profile import gpu_speedups_by_flush
from .env.results import Evaluation, counted_ms, needs_context
from .specs import Candidate, Task

log = logging.getLogger("cuda_agent.search")


def _median_ms(ev, who: str) -> float:
    return ev.profile[f"{who}_ms"]["median"]


def tried(cand: Candidate, ev: Evaluation) -> dict:
    """One candidate's result as the cache keeps it (timings["candidates"]): what it was, its
    verdict, and the speedup the choice is made on (counted, with its launch), or why it failed."""
    speedup = ev.profile.get("counted_speedup") if ev.profile else None
    return {"origin": cand.origin, "status": ev.status,
            **({"speedup": round(speedup, 3)} if speedup is not None else {}),
            **({"reason": ev.reason[:160]} if ev.status != "passed" else {})}


def _phase_totals(evaluations) -> dict[str, float]:
    """Seconds spent per worker phase over all candidates: where a search's time went."""
    totals: dict[str, float] = {}
    for ev in evaluations:
        for phase, seconds in ev.phase_s.items():
            totals[phase] = round(totals.get(phase, 0.0) + seconds, 3)
    return totals


def evaluate_round(task: Task, env, candidates: list[Candidate]) -> list[Evaluation]:
    """The verdict on each candidate, in order: from the workers, or "rejected" without running
    it where the policy found nothing to run in an answer."""
    runnable = [c for c in candidates if c.rejection is None]
    verdicts = iter(env.evaluate_many(task, runnable) if runnable else [])
    return [Evaluation("rejected", c.rejection) if c.rejection is not None else next(verdicts) for c in candidates]


def gate_task(task: Task, env, policy, *, precision: dict, min_speedup: float, slack: float,
              floors_path: str | None) -> tuple[Entry | None, dict | None]:
    """Time Inductor's kernel for `task` and set it against the task's floor on that GPU
    (gate.py). Returns the entry to cache where no kernel could beat Inductor by `min_speedup`
    (outcome "inductor", reason "Inductor at floor: ..."), else None; and the gate's numbers
    (None where Inductor could not be timed, the GPU has no floors or no copy of the task's bytes
    was timed beside it, as where it would not fit in memory: the search decides)."""
    from skills import rewrites

    start = time.monotonic()
    moved = gate.task_bytes(task)
    timing = env.time_reference(task, floors_path, copy_bytes=moved)
    if timing.status != "passed" or timing.floors is None or timing.copy_ms is None:
        log.info("task %s: no gate (%s)", task.hash[:12], timing.reason or timing.floors_note or "no copy timed")
        return None, None
    try:
        floor = gate.task_floor(timing.copy_ms["median"], gate.task_work(task, precision),
                                gate.Floors.from_json(timing.floors), rewritable=rewrites.supports(task) is None)
    except Exception as e:  # a floor we cannot compute must not cost the task its search
        log.warning("cuda_agent: no gate for task %s (%s: %s)", task.hash[:12], type(e).__name__, e, exc_info=True)
        return None, None
    verdict = gate.judge(timing.inductor_ms["median"], floor, min_speedup, slack)
    log.info("task %s: %s", task.hash[:12], verdict.reason())
    record = verdict.to_json()
    if not verdict.skip:
        return None, record
    timings = {"inductor_ms": timing.inductor_ms, "gate": record, "search_s": time.monotonic() - start,
               "evaluated": 0, "phase_s": timing.phase_s}
    return Entry(outcome="inductor", reason=verdict.reason(), source=None, origin="gate", binaries={}, launch={},
                 timings=timings, verification={},
                 provenance=make_provenance(policy.name, policy_revision=policy.revision),
                 task=task.to_json()), record


def outcome_of(profile: dict, origin: str) -> tuple[str, str]:
    """The cache outcome ("kernel" or "inductor") of the best candidate's profile, and why."""
    speedup = profile["speedup_vs_inductor"]
    if profile["wins"]:  # faster than Inductor by more than the environment's min_speedup
        return "kernel", f"{speedup:.2f}x faster than Inductor ({origin}){_judged_after(profile)}"
    if speedup is None:
        return "inductor", f"not timed against Inductor: {profile.get('note', 'no Inductor time')}"
    if needs_context(profile):
        return "kernel", (f"{speedup:.2f}x faster than Inductor on the GPU ({origin}), but its launch "
                          f"({profile['ours_ms']['host_median'] * 1e3:.1f} us) takes longer than it runs: it runs "
                          f"only where its graph is faster with it")
    return "inductor", f"Inductor wins: best candidate {speedup:.2f}x of Inductor's speed{_judged_after(profile)}"


def _judged_after(profile: dict) -> str:
    """Where the profile timed both kinds of L2 flush: the one its speedup is judged after (the
    less favourable to ours) and the other's GPU speedup."""
    judged = profile.get("judged_flush")
    if not judged:
        return ""
    speedups = gpu_speedups_by_flush(profile["ours_ms"], profile["inductor_ms"])
    others = ", ".join(f"{r:.2f}x after a {f} flush" for f, r in speedups.items() if f != judged)
    return f", after a {judged} flush of the L2 (the less favourable; {others})"


def rank(profile: dict) -> float:
    """How good a profiled candidate is, to pick a search's best: its counted speedup over the
    Inductor time interleaved with it in its own profile, else (no Inductor time) the inverse of
    its counted time. Candidates are profiled one after another, and a GPU's times drift between
    profiles (an H100 timed the same Inductor kernel at 40-51 us in three profiles of one search),
    so two candidates' own times compare worse than their ratios."""
    speedup = profile.get("counted_speedup")
    return speedup if speedup is not None else 1.0 / max(counted_ms(profile["ours_ms"]), 1e-9)


def search_task(task: Task, env, policy, *, budget_s: float, max_candidates: int,
                record: Callable[[list[Candidate], list[Evaluation]], None] | None = None,
                progress: Callable[[str, float | None], None] | None = None) -> Entry:
    """Run the loop and return the entry to cache (never raises for a bad candidate);
    `record(candidates, evaluations)` is called after each round, and `progress(what the loop is
    doing, best speedup so far)` told of each round."""
    start = time.monotonic()
    feedback: list = []
    evaluated = 0
    best = None
    candidates_tried: list[dict] = []  # tried() of each candidate, in order
    why_not = policy.why_not(task)
    while evaluated < max_candidates and time.monotonic() - start < budget_s:
        candidates = policy.propose(task, feedback)[: max_candidates - evaluated]
        if not candidates:
            break
        log.info("task %s (%s, %d ops): evaluating %d candidate(s)", task.hash[:12], task.kind,
                 len(task.ops), len(candidates))
        if progress:
            progress(f"evaluating {len(candidates)} candidate(s), {evaluated} of at most {max_candidates} done",
                     best[1].profile["counted_speedup"] if best else None)
        results = evaluate_round(task, env, candidates)
        if record is not None:
            record(candidates, results)
        for cand, ev in zip(candidates, results):
            evaluated += 1
            candidates_tried.append(tried(cand, ev))
            log.info("  %s: %s%s", cand.origin, ev.status,
                     f" {_median_ms(ev, 'ours'):.4f} ms, {ev.profile['speedup_vs_inductor'] or 0:.2f}x Inductor"
                     if ev.status == "passed" and ev.profile else f" ({ev.reason})")
            if ev.status == "passed" and ev.profile and (best is None or rank(ev.profile) > rank(best[1].profile)):
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
                     launch={}, timings={"search_s": elapsed, "evaluated": evaluated, "candidates": candidates_tried,
                                         "phase_s": _phase_totals(feedback)}, verification={},
                     provenance=provenance, task=task.to_json())
    cand, ev = best
    timings = dict(ev.profile, search_s=elapsed, evaluated=evaluated, candidates=candidates_tried,
                   phase_s=_phase_totals(feedback))
    outcome, reason = outcome_of(ev.profile, cand.origin)
    return Entry(outcome=outcome, reason=reason, source=cand.source if outcome == "kernel" else None,
                 origin=cand.origin, binaries={}, launch=dict(cand.params), timings=timings,
                 verification=ev.verification_record(), provenance=provenance, task=task.to_json())
