"""benchmarks/rows_plans.py on the CPU: the launches it times for a row task, under both plans."""
from __future__ import annotations

from benchmarks.rows_plans import plan_launches
from test_rows_template import _cross_entropy_tasks, resized


def test_both_plans_of_a_loss_are_timed_each_under_its_own_label():
    """fp32 cross-entropy over 32000 classes: the online plan's shapes (the first two also loading
    past L1, "n"; and the streaming ones it adds, 128 threads among them), then the held plan's
    (the pair cluster among them)."""
    losses = resized(_cross_entropy_tasks()[0], (4096,), (4096, 32000))
    labels = [label for label, _, _ in plan_launches(losses)]
    assert labels[:6] == ["on:t1024r1v4o", "on:t1024r1v4no", "on:t512r1v4o", "on:t512r1v4no", "on:t256r1v4o",
                          "on:t128r1v4o"]
    assert "2p:t256r1v4c2" in labels and all(label.startswith(("on:", "2p:")) for label in labels)
    assert len(labels) == len(set(labels))
    assert {plan.online for _, plan, _ in plan_launches(losses)} == {True, False}


def test_the_one_hot_benchmark_times_the_closed_form_against_a_pass():
    """benchmarks/ce_backward_one_hot.py: cross-entropy's backward with its one-hot's sum taken once
    a row, and the same task's plan with a pass over the row for it; the plan builder is left as
    it was."""
    from benchmarks.ce_backward_one_hot import plans
    from skills.rows.plan import build_plan
    from test_rows_template import cross_entropy_backward_task

    task = cross_entropy_backward_task()
    closed, with_pass = plans(task)
    assert closed.passes == () and [[p.combine for p in ps.partials] for ps in with_pass.passes] == [["sum"]]
    assert build_plan(task).passes == ()
