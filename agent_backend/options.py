"""Backend options: one table of every setting, validated before any work starts.

Each option can also come from a `CUDA_AGENT_<NAME>` environment variable; an option given to
`torch.compile(..., options=...)` wins over the environment.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Callable

MODES = ("search", "cached", "off")
POLICIES = ("builtin", "llm")


class OptionError(ValueError):
    """A bad backend option or CUDA_AGENT_* variable; raised before any compilation work."""


def _choice(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(v: Any) -> str:
        if v not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return v
    return parse


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return v.lower() in ("1", "true", "yes", "on")
    raise ValueError("must be true or false")


def _positive(kind: type) -> Callable[[Any], Any]:
    def parse(v: Any):
        if isinstance(v, bool):
            raise ValueError(f"must be a positive {kind.__name__}")
        try:
            x = kind(v)
        except (TypeError, ValueError):
            raise ValueError(f"must be a positive {kind.__name__}") from None
        if x <= 0:
            raise ValueError(f"must be a positive {kind.__name__}")
        return x
    return parse


def _min_speedup(v: Any) -> float:
    x = _positive(float)(v)
    if x < 1.0:
        raise ValueError("must be at least 1.0 (a kernel slower than Inductor never wins)")
    return x


def _optional_str(v: Any) -> str | None:
    if v is None or v == "":
        return None
    if not isinstance(v, (str, os.PathLike)):
        raise ValueError("must be a string")
    return os.fspath(v)


def _path_list(v: Any) -> tuple[str, ...]:
    """Team caches: a list of paths, or one string separated by the OS path separator."""
    if v is None or v == "":
        return ()
    if isinstance(v, (str, os.PathLike)):
        return tuple(p for p in os.fspath(v).split(os.pathsep) if p)
    if isinstance(v, (list, tuple)) and all(isinstance(p, (str, os.PathLike)) for p in v):
        return tuple(os.fspath(p) for p in v)
    raise ValueError("must be a path or a list of paths")


def _devices(v: Any) -> tuple[str, ...] | None:
    """GPUs the search may use: "all", or a list like ["cuda:0", "cuda:1"] / "0,1"."""
    if v is None or v == "all":
        return None
    items = v.split(",") if isinstance(v, str) else v
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError('must be "all" or a list of CUDA devices such as ["cuda:0"]')
    out = []
    for d in items:
        d = str(d).strip()
        if d.isdigit():
            d = f"cuda:{d}"
        if not d.startswith("cuda"):
            raise ValueError(f"{d!r} is not a CUDA device")
        out.append(d)
    return tuple(out)


@dataclass(frozen=True)
class Option:
    name: str
    default: Any
    parse: Callable[[Any], Any]
    help: str


OPTIONS: tuple[Option, ...] = (
    Option("mode", "search", _choice(MODES),
           "search: look subgraphs up in the cache and search kernels for misses on a GPU; "
           "cached: use cached winners only, never search; off: plain Inductor"),
    Option("policy", "builtin", _choice(POLICIES),
           "who writes candidates: builtin = the template library in skills/ (needs no model); "
           "llm = a model behind an OpenAI-compatible chat API (set llm_url and llm_model)"),
    Option("llm_url", None, _optional_str,
           "policy=llm: base URL of the chat API, e.g. http://localhost:8000/v1 for `vllm serve`"),
    Option("llm_model", None, _optional_str, "policy=llm: the model name to ask for"),
    Option("llm_api_key", None, _optional_str, "policy=llm: bearer token for the API, where it needs one"),
    Option("llm_samples", 4, _positive(int), "policy=llm: candidates asked for per round"),
    Option("cache_dir", None, _optional_str,
           "local cache directory (default $XDG_CACHE_HOME/cuda_agent or ~/.cache/cuda_agent)"),
    Option("team_cache", (), _path_list,
           "read-only team caches or bundles, looked up after the local cache (list, or os.pathsep-separated)"),
    Option("trust_key", None, _optional_str,
           "HMAC key: team-cache entries signed with it are used without re-verification"),
    Option("search_budget_s", 120.0, _positive(float), "wall-clock seconds the search may spend on one subgraph"),
    Option("max_candidates", 16, _positive(int), "candidates evaluated per subgraph at most"),
    Option("min_speedup", 1.05, _min_speedup,
           "a kernel wins only when Inductor's time over ours exceeds this (1.05 = more than 5% faster)"),
    Option("allow_reduced_precision", False, _bool,
           "let kernels win with TF32/bf16 arithmetic for fp32 subgraphs (off: same precision as the reference)"),
    Option("devices", None, _devices, 'GPUs the search may use: "all" (default) or a list such as ["cuda:0"]'),
    Option("min_ops", 2, _positive(int),
           "smallest subgraph (in ops) worth a search; single pointwise ops are already optimal in Inductor"),
)

_BY_NAME = {o.name: o for o in OPTIONS}
ENV_PREFIX = "CUDA_AGENT_"


@dataclass(frozen=True)
class Settings:
    mode: str
    policy: str
    llm_url: str | None
    llm_model: str | None
    llm_api_key: str | None
    llm_samples: int
    cache_dir: str | None
    team_cache: tuple[str, ...]
    trust_key: str | None
    search_budget_s: float
    max_candidates: int
    min_speedup: float
    allow_reduced_precision: bool
    devices: tuple[str, ...] | None
    min_ops: int

    def public(self) -> dict:
        """The settings without secrets, for logs and reports."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["trust_key"] = "<set>" if self.trust_key else None
        d["llm_api_key"] = "<set>" if self.llm_api_key else None
        return d


def _parse(option: Option, value: Any, where: str) -> Any:
    try:
        return option.parse(value)
    except ValueError as e:
        raise OptionError(f"cuda_agent: {where} = {value!r} is invalid: it {e}") from None


def resolve(options: dict | None = None, environ: dict | None = None) -> Settings:
    """Merge defaults < CUDA_AGENT_* variables < `options`; raise OptionError on anything unknown or bad."""
    options = dict(options or {})
    environ = os.environ if environ is None else environ
    unknown = sorted(set(options) - set(_BY_NAME))
    if unknown:
        raise OptionError(
            f"cuda_agent: unknown option(s) {', '.join(map(repr, unknown))}; "
            f"valid options are: {', '.join(sorted(_BY_NAME))}")
    values = {}
    for opt in OPTIONS:
        env_name = ENV_PREFIX + opt.name.upper()
        if opt.name in options:
            values[opt.name] = _parse(opt, options[opt.name], f"option {opt.name!r}")
        elif env_name in environ:
            values[opt.name] = _parse(opt, environ[env_name], f"environment variable {env_name}")
        else:
            values[opt.name] = opt.default
    if values["policy"] == "llm" and not (values["llm_url"] and values["llm_model"]):
        raise OptionError("cuda_agent: policy 'llm' needs llm_url (the chat API, e.g. http://localhost:8000/v1) "
                          "and llm_model (the model it serves)")
    return Settings(**values)


def options_help() -> str:
    """The options table as Markdown (README.md's table is this text)."""
    rows = ["| option | environment variable | default | meaning |", "|---|---|---|---|"]
    for o in OPTIONS:
        default = "-" if o.default in (None, ()) else f"`{o.default}`"
        rows.append(f"| `{o.name}` | `{ENV_PREFIX}{o.name.upper()}` | {default} | {o.help} |")
    return "\n".join(rows)
