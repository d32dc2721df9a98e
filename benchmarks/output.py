"""How a benchmark script hands back its results: JSON on stdout, and in a file where asked."""
from __future__ import annotations

import json
from pathlib import Path


def emit(results: dict, out: Path | str | None) -> None:
    text = json.dumps(results, indent=1)
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
