"""The search loop over a real worker pool on CPU tasks: the fastest verified candidate is kept,
broken ones are reported, and the entry says why (on CPU a kernel never wins: host timings
include torch.compile's wrappers, so the environment never calls them wins)."""
from agent_backend.env.verify import RULES
from agent_backend.search import search_task
from test_env_cases import add_relu_task, make_candidate, module_environment

TASK = add_relu_task()


class ListPolicy:
    """A policy that proposes a fixed list once: the smallest real policy."""

    name = "test-list"
    revision = "1"

    def __init__(self, candidates, why_not=None):
        self.candidates, self._why_not = candidates, why_not

    def why_not(self, task):
        return self._why_not

    def propose(self, task, feedback):
        return [] if feedback else list(self.candidates)


env = module_environment("cpu", compile_s=120, verify_s=60, profile_s=180, start_s=120)


def test_keeps_a_verified_candidate_and_records_evidence(env):
    wrong = make_candidate("return torch.relu(a - b)")
    good = make_candidate("return torch.clamp_min(a + b, 0.0)")
    entry = search_task(TASK, env, ListPolicy([wrong, good]), budget_s=600, max_candidates=8)
    assert entry.outcome == "inductor" and entry.reason.startswith(("Inductor wins", "not timed"))
    assert entry.source is None, "a loser's source is not kept"
    assert entry.timings["evaluated"] == 2 and entry.timings["ours_ms"]["trials"] > 0
    # each candidate, in order: the wrong one with why, the good one with its speedup
    first, second = entry.timings["candidates"]
    assert (first["origin"], second["origin"]) == (wrong.origin, good.origin)
    assert first["status"] == "incorrect" and first["reason"] and "speedup" not in first
    assert second["status"] == "passed" and second["speedup"] > 0 and "reason" not in second
    # Where the search's time went, summed over both candidates (the wrong one is not profiled).
    assert {"load", "verify", "profile"} <= set(entry.timings["phase_s"])
    assert sum(entry.timings["phase_s"].values()) <= entry.timings["search_s"]
    assert entry.verification["trials"] >= 5
    # the verdict and the rules it was reached under (kernel_cache.Entry.verified, dispatch.decide)
    assert entry.verified and entry.verification["rules"] == RULES
    assert entry.task == TASK.to_json()
    assert (entry.provenance["policy"], entry.provenance["policy_revision"]) == ("test-list", "1")


def test_failed_search_says_why(env):
    entry = search_task(TASK, env, ListPolicy([make_candidate("return a")]), budget_s=600, max_candidates=8)
    assert entry.outcome == "failed" and entry.reason.startswith("no candidate of 1 passed")
    tried = entry.timings["candidates"]
    assert [t["status"] for t in tried] == ["rejected"] and tried[0]["reason"] in entry.reason
    nothing = search_task(TASK, env, ListPolicy([], why_not="no template for this"), budget_s=600,
                          max_candidates=8)
    assert nothing.outcome == "failed" and nothing.reason == "no template for this"


def test_max_candidates_is_respected(env):
    cands = [make_candidate("return torch.relu(a + b)") for _ in range(3)]
    entry = search_task(TASK, env, ListPolicy(cands), budget_s=600, max_candidates=1)
    assert entry.timings["evaluated"] == 1


def test_progress_hears_of_each_round_and_the_best_speedup(env):
    class TwoRounds(ListPolicy):
        def propose(self, task, feedback):
            return list(self.candidates) if len(feedback) < 2 else []

    heard = []
    search_task(TASK, env, TwoRounds([make_candidate("return torch.relu(a + b)")]), budget_s=600, max_candidates=8,
                progress=lambda stage, best: heard.append((stage, best)))
    assert [stage for stage, _ in heard] == ["evaluating 1 candidate(s), 0 of at most 8 done",
                                             "evaluating 1 candidate(s), 1 of at most 8 done"]
    assert heard[0][1] is None and heard[1][1] > 0, "the second round knows the first one's speedup"


def _profile(gpu_speedup, host_us, wins, gpu_wins=None):
    ours_ms = {"median": 0.040, "host_median": host_us / 1e3}
    return {"speedup_vs_inductor": gpu_speedup, "ours_ms": ours_ms, "min_speedup": 1.05, "wins": wins,
            "launch_bound": ours_ms["host_median"] > ours_ms["median"],
            "gpu_wins": gpu_speedup > 1.05 if gpu_wins is None else gpu_wins}


def test_the_outcome_of_a_search_follows_its_best_profile():
    from agent_backend.search import outcome_of
    assert outcome_of(_profile(1.4, 10.0, wins=True), "x") == ("kernel", "1.40x faster than Inductor (x)")
    outcome, reason = outcome_of(_profile(1.41, 103.7, wins=False), "x")
    assert outcome == "kernel" and reason == ("1.41x faster than Inductor on the GPU (x), but its launch (103.7 us) "
                                              "takes longer than it runs: it runs only where its graph is faster "
                                              "with it")
    assert outcome_of(_profile(1.02, 103.7, wins=False), "x") == ("inductor",
                                                                   "Inductor wins: best candidate 1.02x of "
                                                                   "Inductor's speed")
    # a timer that may not declare wins (host times on the CPU) never makes one of either kind
    assert outcome_of(_profile(1.5, 103.7, wins=False, gpu_wins=False), "x")[0] == "inductor"
    assert outcome_of(dict(_profile(1.0, 1.0, wins=False), speedup_vs_inductor=None, note="n"), "x") == \
        ("inductor", "not timed against Inductor: n")
    # timed after both kinds of L2 flush: the reason says which one the speedup is judged after
    both = dict(_profile(1.06, 10.0, wins=True), judged_flush="read",
                ours_ms={"by_flush": {"write": {"median": 0.030}, "read": {"median": 0.034}}},
                inductor_ms={"by_flush": {"write": {"median": 0.0351}, "read": {"median": 0.036}}})
    assert outcome_of(both, "x") == ("kernel", "1.06x faster than Inductor (x), after a read flush of the L2 "
                                               "(the less favourable; 1.17x after a write flush)")
    assert outcome_of(dict(both, wins=False, gpu_wins=False), "x")[1].endswith("(the less favourable; 1.17x after a "
                                                                               "write flush)")


def test_the_best_candidate_is_the_fastest_against_inductor_timed_beside_it():
    """Two candidates' profiles, the second taken while the GPU ran slower (Inductor too): the
    second is slower in its own time but faster against Inductor, and ranks first."""
    from agent_backend.search import rank
    first = dict(_profile(1.04, 10.0, wins=False), counted_speedup=1.04)
    second = dict(_profile(1.11, 10.0, wins=True), counted_speedup=1.11)
    second["ours_ms"] = dict(second["ours_ms"], median=0.046)
    assert rank(second) > rank(first)
    # without Inductor's time, the faster call ranks first (host time counted where longer)
    untimed = [dict(_profile(1.0, host_us, wins=False), counted_speedup=None) for host_us in (30.0, 60.0)]
    assert rank(untimed[0]) > rank(untimed[1])
