"""Backend options: one table of every setting, validated before any work starts.

Each option can also come from a `CUDA_AGENT_<NAME>` environment variable; an option given to
`torch.compile(..., options=...)` wins over the environment.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, fields
from typing import Any, Callable

MODES = ("search", "background", "cached", "off")
POLICIES = ("builtin", "llm")
# llm_engine -> (the package it needs, the extra of this project that installs it)
LLM_ENGINES = {"openai": ("openai", "openai"), "vllm": ("vllm", "vllm"), "transformers": ("transformers", "hf")}


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


def _slack(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError("must be a number of at least 0")
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ValueError("must be a number of at least 0") from None
    if not x >= 0.0:
        raise ValueError("must be a number of at least 0")
    return x


def _fraction(v: Any) -> float:
    x = _positive(float)(v)
    if x > 1.0:
        raise ValueError("must be a fraction, at most 1.0")
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
    Option("mode", "background", _choice(MODES),
           "background: the compile returns at once with Inductor's code for subgraphs the cache does not know "
           "and searches them in a background thread (winners run after agent_backend.refresh(), the next "
           "compile or the next process); search: search them on a GPU before the compile returns (benchmarks, "
           "`cuda-agent warm`); cached: use cached winners only, never search; off: plain Inductor"),
    Option("policy", "builtin", _choice(POLICIES),
           "who writes candidates: builtin = the template library in skills/ (needs no model); "
           "llm = a chat model (see llm_engine and llm_model)"),
    Option("llm_engine", "openai", _choice(tuple(LLM_ENGINES)),
           "policy=llm: how the model is run: openai = a server with an OpenAI-compatible chat API "
           "(`vllm serve`; set llm_url; extra [openai]); vllm = vLLM's offline engine in this process "
           "(extra [vllm]); transformers = a local Hugging Face model in this process (extra [hf])"),
    Option("llm_url", None, _optional_str,
           "llm_engine=openai: base URL of the chat API, e.g. http://localhost:8000/v1 for `vllm serve`"),
    Option("llm_model", None, _optional_str,
           "policy=llm: the model: its name on the server (openai), a name or path (vllm), "
           "a local directory (transformers)"),
    Option("llm_api_key", None, _optional_str, "llm_engine=openai: bearer token for the API, where it needs one"),
    Option("llm_samples", 4, _positive(int),
           "policy=llm: conversations sampled in parallel; each gets one new answer per round"),
    Option("llm_max_new_tokens", 8192, _positive(int), "policy=llm: the longest answer, in tokens"),
    Option("llm_gpu_memory", 0.5, _fraction,
           "llm_engine=vllm: the fraction of the GPU's memory vLLM may take (the rest is for the "
           "kernels under test and your model)"),
    Option("cache_dir", None, _optional_str,
           "local cache directory (default $XDG_CACHE_HOME/cuda_agent or ~/.cache/cuda_agent)"),
    Option("team_cache", (), _path_list,
           "read-only team caches or bundles, looked up after the local cache (list, or os.pathsep-separated)"),
    Option("trust_key", None, _optional_str,
           "HMAC key: team-cache entries signed with it are used without re-verification"),
    Option("record_trajectories", True, _bool,
           "record every evaluated candidate (prompt, answer, verdict, timings) in trajectories.sqlite "
           "beside the cache, for `cuda-agent trajectories export`"),
    Option("search_budget_s", 120.0, _positive(float), "wall-clock seconds the search may spend on one subgraph"),
    Option("max_candidates", 16, _positive(int), "candidates evaluated per subgraph at most"),
    Option("min_speedup", 1.05, _min_speedup,
           "a kernel wins only when Inductor's time over ours exceeds this (1.05 = more than 5% faster)"),
    Option("allow_reduced_precision", False, _bool,
           "let kernels win with TF32/bf16 arithmetic for fp32 subgraphs (off: same precision as the reference)"),
    Option("devices", None, _devices, 'GPUs the search may use: "all" (default) or a list such as ["cuda:0"]'),
    Option("gate", True, _bool,
           "time Inductor's kernel first and skip the search where it runs so close to the subgraph's floor "
           "(the longer of a copy of its bytes, timed beside Inductor's kernel, and its FLOPs over the GPU's "
           "matmul peak) that no kernel could beat it by min_speedup"),
    Option("gate_slack", 0.03, _slack,
           "gate: how far above the floor the best kernels are taken to stay (0.03: 3%; our best pointwise "
           "kernel ran at 1.02x the copy of its bytes on an H100); the search is skipped when Inductor's "
           "time is at most floor * min_speedup * (1 + gate_slack)"),
    Option("background_share", 0.5, _fraction,
           "mode=background: the largest fraction of wall time the search's workers may be busy (they rest "
           "between requests), leaving the GPU and CPU to your program the rest of the time"),
    Option("in_context_check", True, _bool,
           "after a graph's subgraphs are decided, time the whole graph with and without our kernels (both "
           "compiled by Inductor, in a worker) and keep the kernels only where the graph is not slower; the "
           "verdict is cached per graph and winners. Off, or for a graph it cannot check (symbolic sizes, "
           "constants of its own), winners stay, but a kernel whose launch outlasts it runs only with a verdict"),
    Option("min_ops", 2, _positive(int),
           "smallest subgraph (in ops) worth a search; single pointwise ops are already optimal in Inductor "
           "(a reduction is searched however small: Inductor's can be far from the floor)"),
)

_BY_NAME = {o.name: o for o in OPTIONS}
ENV_PREFIX = "CUDA_AGENT_"


@dataclass(frozen=True)
class Settings:
    mode: str
    policy: str
    llm_engine: str
    llm_url: str | None
    llm_model: str | None
    llm_api_key: str | None
    llm_samples: int
    llm_max_new_tokens: int
    llm_gpu_memory: float
    cache_dir: str | None
    team_cache: tuple[str, ...]
    trust_key: str | None
    record_trajectories: bool
    search_budget_s: float
    max_candidates: int
    min_speedup: float
    allow_reduced_precision: bool
    devices: tuple[str, ...] | None
    gate: bool
    gate_slack: float
    background_share: float
    in_context_check: bool
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
    if values["policy"] == "llm":
        _check_llm(values)
    return Settings(**values)


def missing_engine_package(engine: str) -> str | None:
    """Why `engine` cannot run here (its package is not installed, and how to install it), or None."""
    package, extra = LLM_ENGINES[engine]
    if importlib.util.find_spec(package) is not None:
        return None
    return (f"cuda_agent: llm_engine {engine!r} needs the {package} package, which is not installed: "
            f"pip install 'cuda-agent[{extra}]'")


def _check_llm(values: dict) -> None:
    engine, model = values["llm_engine"], values["llm_model"]
    if engine == "openai" and not values["llm_url"]:
        raise OptionError("cuda_agent: policy 'llm' with llm_engine 'openai' needs llm_url (the chat API, "
                          "e.g. http://localhost:8000/v1) and llm_model (the model it serves)")
    if not model:
        raise OptionError(f"cuda_agent: policy 'llm' needs llm_model (llm_engine {engine!r}: "
                          + {"openai": "the model the server serves", "vllm": "a model name or directory",
                             "transformers": "a local model directory"}[engine] + ")")
    if engine == "transformers" and not os.path.isdir(model):
        raise OptionError(f"cuda_agent: llm_engine 'transformers' loads llm_model from a local directory, "
                          f"and {model!r} is not one")
    missing = missing_engine_package(engine)
    if missing:
        raise OptionError(missing)


def options_help() -> str:
    """The options table as Markdown (README.md's table is this text)."""
    rows = ["| option | environment variable | default | meaning |", "|---|---|---|---|"]
    for o in OPTIONS:
        default = "-" if o.default in (None, ()) else f"`{o.default}`"
        rows.append(f"| `{o.name}` | `{ENV_PREFIX}{o.name.upper()}` | {default} | {o.help} |")
    return "\n".join(rows)
