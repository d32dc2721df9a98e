"""The search loop over a real worker pool on CPU tasks: the fastest verified candidate is kept,
broken ones are reported, and the entry says why (on CPU a kernel never wins: host timings
include torch.compile's wrappers, so the environment never calls them wins)."""
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
    # Where the search's time went, summed over both candidates (the wrong one is not profiled).
    assert {"load", "verify", "profile"} <= set(entry.timings["phase_s"])
    assert sum(entry.timings["phase_s"].values()) <= entry.timings["search_s"]
    assert entry.verification["trials"] >= 5
    assert entry.task == TASK.to_json()
    assert (entry.provenance["policy"], entry.provenance["policy_revision"]) == ("test-list", "1")


def test_failed_search_says_why(env):
    entry = search_task(TASK, env, ListPolicy([make_candidate("return a")]), budget_s=600, max_candidates=8)
    assert entry.outcome == "failed" and entry.reason.startswith("no candidate of 1 passed")
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
