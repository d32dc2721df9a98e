"""How each dtype the pointwise template handles is stored, computed in and rounded in CUDA C.

fp16/bf16 are stored as raw 16-bit structs and converted by hand (codegen's conversion helpers),
so generated kernels need no cuda_fp16.h / cuda_bf16.h, which NVRTC may not find.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .errors import Unsupported


@dataclass(frozen=True)
class DtypeInfo:
    storage: str  # C type of one element in memory
    ctype: str    # C type values are computed in
    load: str     # storage -> ctype; "{}" stands for the stored element
    store: str    # ctype -> storage
    round: str    # ctype -> ctype rounded to this dtype, as eager rounds an op's result


DTYPES: dict[torch.dtype, DtypeInfo] = {
    torch.float32: DtypeInfo("float", "float", "{}", "{}", "{}"),
    torch.float16: DtypeInfo("f16", "float", "f16_to_float({})", "float_to_f16({})", "round_f16({})"),
    torch.bfloat16: DtypeInfo("bf16", "float", "bf16_to_float({})", "float_to_bf16({})", "round_bf16({})"),
    torch.float64: DtypeInfo("double", "double", "{}", "{}", "{}"),
    torch.bool: DtypeInfo("bool", "bool", "{}", "{}", "{}"),
}
# Indices (the rows template's gather reads them, compares them, never computes with them), so
# apart from DTYPES, which says what the pointwise template computes in.
INDEX_DTYPES: dict[torch.dtype, DtypeInfo] = {
    torch.int64: DtypeInfo("long long", "long long", "{}", "{}", "{}"),
    torch.int32: DtypeInfo("int", "int", "{}", "{}", "{}"),
}

# Bit patterns, so no header's INFINITY/NAN macros are needed.
_SPECIALS = {
    "float": ("__uint_as_float(0x7f800000u)", "__uint_as_float(0x7fc00000u)"),
    "double": ("__longlong_as_double(0x7ff0000000000000LL)", "__longlong_as_double(0x7ff8000000000000LL)"),
}


def dtype_info(dtype: torch.dtype) -> DtypeInfo:
    info = DTYPES.get(dtype)
    if info is None:
        raise Unsupported(f"dtype {dtype} not supported")
    return info


def operand_info(dtype: torch.dtype) -> DtypeInfo:
    """dtype_info, indices included (for kernels that read index inputs)."""
    return INDEX_DTYPES.get(dtype) or dtype_info(dtype)


def cast(expr: str, from_ctype: str, to_ctype: str) -> str:
    """C conversion between compute types (a cast to bool tests != 0, so NaN is true, as in torch)."""
    return expr if from_ctype == to_ctype else f"(({to_ctype})({expr}))"


def literal(value: bool | int | float, ctype: str) -> str:
    """`value` as a C literal of `ctype`, rounded as torch rounds a Python scalar to that type."""
    if ctype == "bool":
        return "true" if value else "false"
    if ctype in ("long long", "int"):  # an index, or a value compared with one (an ignore_index)
        if not isinstance(value, int) or isinstance(value, bool):
            raise Unsupported(f"{value!r} is not an integer")
        return f"{value}LL" if ctype == "long long" else str(value)
    v = float(value)
    if ctype == "float":
        v = torch.tensor(v, dtype=torch.float32).item()
    inf, nan = _SPECIALS[ctype]
    if math.isnan(v):
        return nan
    if math.isinf(v):
        return inf if v > 0 else f"(-{inf})"
    return f"{v!r}f" if ctype == "float" else repr(v)
