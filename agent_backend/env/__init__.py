"""The environment of the agent loop: candidates compiled, verified and profiled in worker
processes, one per device, with time limits. See docs/CONTRACTS.md for the formats.

    with Environment() as env:
        ev = env.evaluate(task, candidate)      # -> Evaluation (plain data)
"""
from agent_backend.env.pool import Environment
from agent_backend.env.results import Evaluation, Timeouts

__all__ = ["Environment", "Evaluation", "Timeouts"]
