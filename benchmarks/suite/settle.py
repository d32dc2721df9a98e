"""What a user of mode="background" meets on later compiles, for the suite's runner and for
benchmarks/compile_time.py's priming process alike."""
from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")


def compile_until_settled(compile_once: Callable[[], T], wait_s: float, times: int = 3) -> list[T]:
    """Wait (up to `wait_s`) for the background work the last compile queued, compile again
    (`compile_once`), and repeat while that compile queued more (an in-context check follows the
    searches), at most `times` times; each compile's result, in order."""
    from agent_backend import background  # here: compile_time.py's trials count our imports

    results = []
    for _ in range(times):
        background.refresh(wait=True, timeout_s=wait_s)
        results.append(compile_once())
        if not background.pending():
            break
    return results
