"""The suite's results: a JSON file and a Markdown table, both rewritten after every problem (so
an interrupted run keeps what it measured), a summary per level and group, and one console line
per problem."""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import torch


def gpu_short_name(device_name: str) -> str:
    """"h100" for "NVIDIA H100 80GB HBM3", "a100" for "NVIDIA A100-SXM4-80GB"."""
    name = device_name.lower()
    model = re.search(r"\b([a-z]{1,3}\d{2,4}[a-z]*)\b", name)
    return model.group(1) if model else re.sub(r"[^a-z0-9]+", "-", name.replace("nvidia", "")).strip("-")


def torch_short_version() -> str:
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def output_paths(out_dir: Path, gpu: str, date: str, dry_run: bool) -> tuple[Path, Path]:
    """suite-<gpu>-torch<ver>-<date>.json and .md in `out_dir`, with -2, -3... where a run of the
    same day already wrote there."""
    stem = f"suite-{gpu}{'-dry-run' if dry_run else ''}-torch{torch_short_version()}-{date}"
    name, n = stem, 1
    while (out_dir / f"{name}.json").exists() or (out_dir / f"{name}.md").exists():
        n += 1
        name = f"{stem}-{n}"
    return out_dir / f"{name}.json", out_dir / f"{name}.md"


def _counts_as_timed(row: dict) -> bool:
    """Rows whose speed means something: measured, and our result matches eager."""
    return row["status"] == "ok" and row["correct"]["ours"]["verdict"] != "MISMATCH"


def summarize(rows: list[dict], scope: str) -> dict:
    timed = [r for r in rows if _counts_as_timed(r)]
    with_kernels = [r for r in rows if r["status"] == "ok" and r["kernels"]]
    ratios = [r["vs_inductor"] for r in timed]
    return {"scope": scope, "cases": len(rows), "timed": len(timed),
            "geomean_vs_inductor": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
            "cases_with_our_kernels": len(with_kernels),
            "problems_with_our_kernels": len({r["problem"] for r in with_kernels}),
            "mismatches": sum(1 for r in rows if r["status"] == "ok" and r["correct"]["ours"]["verdict"] == "MISMATCH"),
            "errors": sum(1 for r in rows if r["status"] == "error"),
            "skipped": sum(1 for r in rows if r["status"] == "skipped")}


def summaries(rows: list[dict]) -> list[dict]:
    """One summary per level, then per group, then for everything."""
    levels = sorted({r["level"] for r in rows})
    groups = sorted({r["group"] for r in rows})
    return ([summarize([r for r in rows if r["level"] == lv], f"level {lv}") for lv in levels]
            + [summarize([r for r in rows if r["group"] == g], f"group {g}") for g in groups]
            + [summarize(rows, "all")])


def _ms(x: float) -> str:
    return f"{x:.4g}"


def _err(check: dict) -> str:
    return "n/a" if check["max_err"] is None else f"{check['max_err']:.2g}"


def _kernels_cell(row: dict) -> str:
    sub = row["subgraphs"]
    ran = ", ".join(f"{k['origin']}" + (f" ({k['kind']})" if k["kind"] else "") for k in row["kernels"])
    return f"{sub['ours']}/{sub['tasks']}" + (f": {ran}" if ran else "")


def _floor_cell(row: dict) -> str:
    if not row["floor"]:
        return "-"
    pct, of_copy = row["floor"]["pct"], row["floor"].get("pct_of_copy")
    copy = f" (of a copy: {of_copy['ours']:.0f}% / {of_copy['inductor']:.0f}%)" if of_copy else ""
    return f"{pct['ours']:.0f}% / {pct['inductor']:.0f}%{copy}"


def _cells(row: dict) -> list[str]:
    head = [row["problem"], row["dtype"], row["mode"]]
    if row["status"] != "ok":
        what = row.get("reason") or row.get("error", "")
        return head + [f"**{row['status']}**: {what[:160]}"] + [""] * 7
    ms, ours, ind = row["ms"], row["correct"]["ours"], row["correct"]["inductor"]
    return head + [_ms(ms["ours"]["median"]), _ms(ms["inductor"]["median"]), _ms(ms["eager"]["median"]),
                   _vs_inductor_cell(row), f"{ours['verdict']} ({_err(ours)} / {_err(ind)})",
                   _floor_cell(row), _kernels_cell(row),
                   _compile_cell(row["compile_s"])]


def _paced_ms(stats: dict) -> float:
    """A call's cost when called in a loop: the GPU waits for the host where the host is slower."""
    return max(stats["median"], stats.get("host_median", 0.0))


def _vs_inductor_cell(row: dict) -> str:
    """The ratio of GPU times, marked where our host time per call exceeds our GPU time: calls in a
    loop would then wait on the host, which GPU times hide; "paced" is the ratio of max(GPU, host)."""
    ours, inductor = row["ms"]["ours"], row["ms"]["inductor"]
    cell = f"{row['vs_inductor']:.2f}x"
    if row.get("vs_inductor_by_flush"):  # timed after both flushes: the cell's is the less favourable
        cell += " (" + ", ".join(f"{f} {r:.2f}x" for f, r in row["vs_inductor_by_flush"].items()) + ")"
    if ours.get("host_median", 0.0) <= ours["median"]:
        return cell
    hosts = f"{_ms(ours['host_median'])} / {_ms(inductor['host_median'])}"
    return f"{cell} (host-bound: host {hosts} ms, paced {_paced_ms(inductor) / _paced_ms(ours):.2f}x)"


def _compile_cell(seconds: dict) -> str:
    """'ours / Inductor' for the first compile, and with --settle the later ones: 'then 4.1, 3.9 / 3.8'."""
    cell = f"{seconds['ours']:.1f} / {seconds['inductor']:.1f}"
    if "ours_later" in seconds:
        cell += f"; then {', '.join(f'{s:.1f}' for s in seconds['ours_later'])} / {seconds['inductor_again']:.1f}"
    return cell


COLUMNS = ["problem", "dtype", "mode", "ours ms", "Inductor ms", "eager ms", "vs Inductor",
           "correct (max err ours / Inductor)", "% of floor (ours / Inductor)", "our kernels (subgraphs)",
           "compile s (ours / Inductor; with --settle, later compiles)"]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows])


def markdown(run: dict, rows: list[dict]) -> str:
    lines = [f"# cuda-agent benchmark suite: {run['gpu']}, torch {run['torch']}, {run['date']}", "",
             f"`{run['command']}`", "",
             f"Device-to-device copy (floors): {run['copy_gb_s']:.0f} GB/s; a problem's floor is its bytes at that "
             "rate, and a copy of as many bytes is timed beside it (\"of a copy\"). Timing: "
             f"{run['rounds']} rounds x "
             f"{run['calls']} calls per contender, interleaved; {run['timer']}; medians of GPU time. "
             f"Backend options: `{json.dumps(run['options'], sort_keys=True)}`. Precision: "
             f"`{json.dumps(run['precision'], sort_keys=True)}`.", ""]
    if run.get("warmup_compile_s"):
        warm = run["warmup_compile_s"]
        lines += [f"The process's first compile (a one-op model, charged to no problem): ours {warm['ours']:.1f} s, "
                  f"Inductor {warm['inductor']:.1f} s.", ""]
    lines += ["## Summary", ""]
    summary_rows = [[s["scope"], str(s["cases"]), str(s["timed"]),
                     "-" if s["geomean_vs_inductor"] is None else f"{s['geomean_vs_inductor']:.3f}x",
                     f"{s['cases_with_our_kernels']} ({s['problems_with_our_kernels']} problems)",
                     str(s["mismatches"]), str(s["errors"]), str(s["skipped"])] for s in summaries(rows)]
    lines += _table(["scope", "cases", "timed", "geomean vs Inductor", "cases with our kernels", "mismatches",
                     "errors", "skipped"], summary_rows)
    for level in sorted({r["level"] for r in rows}):
        lines += ["", f"## Level {level}", ""]
        lines += _table(COLUMNS, [_cells(r) for r in rows if r["level"] == level])
    return "\n".join(lines) + "\n"


def console_line(row: dict) -> str:
    name = f"[L{row['level']} {row['problem']} {row['dtype']}{' train' if row['mode'] == 'train' else ''}]"
    if row["status"] != "ok":
        return f"{name} {row['status'].upper()}: {row.get('reason') or row.get('error')}"
    c = _cells(row)
    return (f"{name} ours {c[3]} ms | Inductor {c[4]} | eager {c[5]} | {c[6]} vs Inductor | {c[7]} | "
            f"floor {c[8]} | kernels {c[9]} | compile {c[10]} s")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class ReportWriter:
    """Holds the run's header and rows; every `add` rewrites both files."""

    def __init__(self, run: dict, json_path: Path, md_path: Path):
        self.run, self.rows = run, []
        self.json_path, self.md_path = json_path, md_path

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.write()

    def write(self) -> None:
        self.json_path.parent.mkdir(parents=True, exist_ok=True)
        data = {**self.run, "summary": summaries(self.rows), "results": self.rows}
        _write_atomic(self.json_path, json.dumps(data, indent=1) + "\n")
        _write_atomic(self.md_path, markdown(self.run, self.rows))
