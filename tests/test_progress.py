"""The progress line of a blocking search: one line on a terminal, rewritten in place with the
subgraph, the stage and the best speedup so far, cleared at the end of the graph; nothing at
all when stderr is not a terminal."""
import io

from agent_backend.progress import SearchProgress
from test_env_cases import add_relu_task

TASK = add_relu_task()


class Terminal(io.StringIO):
    def isatty(self):
        return True


def _walk_through_a_graph(progress: SearchProgress) -> None:
    progress.start_graph(1, 12)
    progress.next_subgraph()
    progress.next_subgraph()
    progress.searching(TASK, "gate: timing Inductor's kernel")
    progress.search_round("evaluating 8 candidate(s), 0 of at most 16 done", None)
    progress.finished(1.07, won=True)
    progress.end_graph()


def test_one_line_rewritten_in_place_on_a_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    terminal = Terminal()
    progress = SearchProgress(terminal)
    _walk_through_a_graph(progress)
    updates = terminal.getvalue().split("\r")[1:]
    assert "\n" not in terminal.getvalue(), "the line is rewritten, never scrolled"
    assert updates[0].startswith("cuda_agent: graph 1, subgraph 2/12 add_relu_cpu (pointwise, 2 ops): "
                                 "gate: timing Inductor's kernel; no verified candidate yet; 0 won")
    assert "evaluating 8 candidate(s)" in updates[1]
    assert "best 1.07x Inductor; 1 won" in updates[2]
    assert updates[-1] == "\x1b[K", "the line is cleared at the end of the graph"


def test_the_line_fits_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    terminal = Terminal()
    _walk_through_a_graph(SearchProgress(terminal))
    assert all(len(update.removesuffix("\x1b[K")) <= 39 for update in terminal.getvalue().split("\r"))


def test_silent_when_stderr_is_not_a_terminal():
    log_file = io.StringIO()
    _walk_through_a_graph(SearchProgress(log_file))
    assert log_file.getvalue() == ""


def test_the_best_speedup_is_the_best_of_the_graph():
    progress = SearchProgress(io.StringIO())
    progress.start_graph(0, 3)
    progress.search_round("round", 1.2)
    progress.finished(0.9, won=False)
    assert "best 1.20x Inductor" in progress.line()
    progress.start_graph(1, 3)
    assert "no verified candidate yet" in progress.line(), "a new graph starts afresh"
