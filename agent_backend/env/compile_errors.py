"""Compiler failures as short, exact text that a model or a person can act on.

Compilers bury the few lines that matter (file, line, message, the offending source line) under
banners, warnings, build commands and absolute temp paths. `trim_compiler_log` keeps the first
errors with their context lines, drops the rest, and caps the length.
"""
from __future__ import annotations

import re

MAX_ERRORS = 5
MAX_CONTEXT_LINES = 4
MAX_CHARS = 2000
FALLBACK_LINES = 10  # kept from the end of a log in which no error line is recognised

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# An absolute path up to its last component: "/tmp/tmpab12/kernel.cu" -> "kernel.cu".
_ABSOLUTE_DIRS = re.compile(r"(?<![\w.])(?:/[\w.+-]+)+/(?=[\w.+-])")
_ERROR_START = re.compile(
    r"""^(?:
        \S+\(\d+\):\s+(?:catastrophic\s+)?error\b          # nvcc, NVRTC:  kernel.cu(3): error: ...
      | \S+:\d+(?::\d+)?:\s+(?:fatal\s+)?error\b            # gcc, clang:   main.cpp:2:33: error: ...
      | (?:ptxas|nvlink|nvcc|nvrtc)\b.*?\b(?:error|fatal)\b # CUDA tools:   ptxas error   : ...
      | .*\bundefined\s+(?:reference|symbol)\b              # linker, or importing the built module
      | (?:fatal\s+)?error\b                                # a bare "error: ..."
    )""",
    re.IGNORECASE | re.VERBOSE,
)
# Lines that never help: build steps and commands, banners, summaries.
_NOISE = re.compile(
    r"""^(?:
        \[\d+/\d+\]\s                    # ninja progress with the full command
      | FAILED:                          # ninja
      | ninja:                           # ninja
      | (?:c\+\+|g\+\+|gcc|clang\S*|\S*nvcc)\s+-  # a compiler command line
      | \d+\s+errors?\s+detected\b       # nvcc's summary
      | Remark:                          # nvcc's note on suppressing warnings
      | compilation\s+terminated         # gcc
      | Error\s+building\s+extension     # torch.utils.cpp_extension's banner
    )""",
    re.IGNORECASE | re.VERBOSE,
)


class CompileError(RuntimeError):
    """A source did not compile. `str(error)` is the trimmed compiler text; `log` is all of it."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log or message

    @classmethod
    def from_log(cls, log: str) -> "CompileError":
        return cls(trim_compiler_log(log), log)


def trim_compiler_log(log: str, *, max_errors: int = MAX_ERRORS, max_chars: int = MAX_CHARS) -> str:
    """The first `max_errors` errors of a compiler's output, each with its context lines
    (source line, caret, instantiation notes), paths cut to file names, at most `max_chars`."""
    lines = [_clean(line) for line in log.splitlines()]
    blocks = _error_blocks(lines)
    if blocks:
        shown = blocks[:max_errors]
        text = "\n".join(shown)
        if len(blocks) > max_errors:
            text += f"\n({len(blocks) - max_errors} more errors not shown)"
    else:
        useful = [line for line in lines if line.strip() and not _NOISE.match(line)]
        text = "\n".join(useful[-FALLBACK_LINES:]) or "compilation failed with no compiler output"
    return _cap(text, max_chars)


def _clean(line: str) -> str:
    return _ABSOLUTE_DIRS.sub("", _ANSI_ESCAPE.sub("", line)).rstrip()


def _error_blocks(lines: list[str]) -> list[str]:
    """Each error line with the indented lines right after it; repeats dropped, order kept."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in lines:
        if _ERROR_START.match(line) and not _NOISE.match(line):
            current = [line]
            blocks.append(current)
        elif current is not None and line[:1].isspace() and line.strip() and len(current) <= MAX_CONTEXT_LINES:
            current.append(line)
        else:
            current = None
    unique: list[str] = []
    for block in blocks:
        text = "\n".join(block)
        if text not in unique:
            unique.append(text)
    return unique


def _cap(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    marker = "\n... (truncated)"
    cut = text.rfind("\n", 0, max_chars - len(marker))
    return text[: cut if cut > 0 else max_chars - len(marker)] + marker
