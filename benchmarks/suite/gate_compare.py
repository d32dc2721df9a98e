"""The gate side by side with a full search (issue 11): two suite runs of the same problems, one
with the gate (the default) and one with `-o gate=false`, each from an empty kernel cache.

    python -m benchmarks.suite.gate_compare GATED.json FULL.json [--out FILE.md]

Per problem: the pointwise tasks, how many the gate skipped, and any task the gate skipped whose
full search found a kernel that runs (a win the gate lost). Tasks are matched by their hash.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _rows(path: Path) -> dict[tuple[str, str], dict]:
    data = json.loads(path.read_text())
    return {(r["problem"], r["dtype"]): r for r in data["results"] if r.get("status") == "ok"}


def _tasks(row: dict) -> dict[str, dict]:
    return {t["hash"]: t for t in row["subgraphs"].get("each", [])}


def compare(gated: dict[tuple[str, str], dict], full: dict[tuple[str, str], dict], kind: str = "pointwise") -> dict:
    """Per problem (in both runs): tasks of `kind`, those the gate skipped, and those it skipped
    where the full search's kernel runs; and the totals."""
    problems, total, skipped, lost = [], 0, 0, []
    for key in sorted(gated.keys() & full.keys()):
        with_gate, without = _tasks(gated[key]), _tasks(full[key])
        of_kind = [h for h, t in with_gate.items() if t["kind"] == kind]
        gated_here = [h for h in of_kind if with_gate[h]["gated"]]
        lost_here = [h for h in gated_here if without.get(h, {}).get("ours")]
        problems.append({"problem": key[0], "dtype": key[1], "tasks": len(of_kind), "gated": len(gated_here),
                         "lost": lost_here, "ours_gated": sum(t["ours"] for t in with_gate.values()),
                         "ours_full": sum(t["ours"] for t in without.values())})
        total, skipped = total + len(of_kind), skipped + len(gated_here)
        lost += [f"{key[0]} {key[1]} {h}" for h in lost_here]
    return {"kind": kind, "problems": problems, "tasks": total, "gated": skipped,
            "share_gated": skipped / total if total else None, "wins_lost": lost}


def markdown(result: dict, gated_path: Path, full_path: Path) -> str:
    share = "-" if result["share_gated"] is None else f"{100 * result['share_gated']:.0f}%"
    lines = [f"# The gate side by side with a full search ({result['kind']} tasks)", "",
             f"With the gate: `{gated_path.name}`; without (`gate=false`): `{full_path.name}`.", "",
             f"The gate skipped {result['gated']} of {result['tasks']} {result['kind']} tasks ({share}); "
             f"wins it lost: {len(result['wins_lost'])}" + (f" ({', '.join(result['wins_lost'])})"
                                                              if result["wins_lost"] else "") + ".", "",
             "| problem | dtype | tasks | gated | wins lost | kernels run (gate / full) |", "|---|---|---|---|---|---|"]
    lines += [f"| {p['problem']} | {p['dtype']} | {p['tasks']} | {p['gated']} | {len(p['lost'])} | "
              f"{p['ours_gated']} / {p['ours_full']} |" for p in result["problems"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suite.gate_compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gated", type=Path, help="the suite's JSON from a run with the gate")
    parser.add_argument("full", type=Path, help="the suite's JSON from a run with -o gate=false")
    parser.add_argument("--kind", default="pointwise", help="task kind to count (default pointwise)")
    parser.add_argument("--out", type=Path, help="also write the Markdown here")
    args = parser.parse_args(argv)
    for path in (args.gated, args.full):
        if not path.is_file():
            print(f"no such file: {path}", file=sys.stderr)
            return 2
    text = markdown(compare(_rows(args.gated), _rows(args.full), args.kind), args.gated, args.full)
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
