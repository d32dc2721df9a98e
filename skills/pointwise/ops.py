"""ATen/prims op -> CUDA C expression, with eager's semantics (NaN propagation, special cases).

Each rule renders one node from its arguments (`OpArgs`): tensor operands arrive as C
expressions already in the op's compute type (fp32 for fp32/fp16/bf16, fp64 for fp64, bool),
Python scalars as values the rule may inspect or turn into literals. The device functions the
expressions call are in DEVICE_FUNCTIONS, written after PyTorch's CUDA kernels.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .dtypes import cast, dtype_info, literal, operand_info
from .errors import Unsupported

aten, prims = torch.ops.aten, torch.ops.prims


@dataclass(frozen=True)
class Value:
    """A tensor inside the kernel: the C variable holding it and its dtype. Not `rounded`: an
    fp16/bf16 value still in fp32, not yet rounded to its dtype (an op's result kept unrounded
    for the next, as Inductor keeps it)."""

    var: str
    dtype: torch.dtype
    rounded: bool = True

    @property
    def exact(self) -> str:
        """C text of the value as its dtype holds it."""
        return self.var if self.rounded else dtype_info(self.dtype).round.format(self.var)


class OpArgs:
    """One node's bound arguments as its rule sees them.

    `args[name]` is C text in the compute type `ctype`; tensors whose dtype differs from the
    op's computation dtype are rounded to it first when `round_operands` is set (eager casts
    operands to the common dtype before computing, e.g. a 0-dim fp32 tensor in an fp16 op).
    An unrounded operand (Value.rounded) is rounded to its own dtype first unless the op is
    `continuous` (CONTINUOUS): a compare, a floor or a narrowing conversion sees what eager sees.
    """

    def __init__(self, bound: dict[str, Any], dtype: torch.dtype, round_operands: bool, fast_fp32: bool = False,
                 continuous: bool = False):
        self.bound = bound
        self.dtype = dtype
        self.ctype = operand_info(dtype).ctype  # an index's compare (cross-entropy's ignore_index) in its own type
        self.round_operands = round_operands
        self.fast_fp32 = fast_fp32
        self.continuous = continuous

    @property
    def fast(self) -> bool:
        """Whether fast fp32 forms may compute this op: its result is fp16/bf16 (rounded to it
        when stored or stepped on), or (`fast_fp32`) every result its value reaches is, which
        hides their few-ulp fp32 errors."""
        return self.dtype in (torch.float16, torch.bfloat16) or (self.fast_fp32 and self.dtype == torch.float32)

    def __getitem__(self, name: str) -> str:
        value = self.bound[name]
        if not isinstance(value, Value):
            return self.lit(value)
        held = value.var if self.continuous else value.exact
        expr = cast(held, operand_info(value.dtype).ctype, self.ctype)
        if self.round_operands and value.dtype != self.dtype:
            expr = operand_info(self.dtype).round.format(expr)
        return expr

    def raw(self, name: str) -> Any:
        return self.bound.get(name)

    def bool(self, name: str) -> str:
        value = self.bound[name]
        if not isinstance(value, Value):
            return literal(value, "bool")
        return cast(value.exact, operand_info(value.dtype).ctype, "bool")

    def lit(self, value: bool | int | float) -> str:
        if not isinstance(value, (bool, int, float)):
            raise Unsupported(f"argument {value!r} is not a number")
        return literal(value, self.ctype)


@dataclass(frozen=True)
class OpRule:
    # "float": result must be floating; operands computed in the result's dtype.
    # "compare": operands computed in their promoted dtype; result is bool.
    # "any": the op only selects or converts values, so rounding its result is enough.
    kind: str
    render: Callable[[OpArgs], str]


def _call(fn: str, *names: str) -> Callable[[OpArgs], str]:
    return lambda a: f"{fn}({', '.join(a[n] for n in names)})"


def _fast_or_precise(fn: str) -> Callable[[OpArgs], str]:
    """`fn`, or its `_fast` form (DEVICE_FUNCTIONS) where the op's result is fp16/bf16."""
    return lambda a: f"{fn}{'_fast' if a.fast else ''}({a['self']})"


def _quotient(a: OpArgs, num: str, den: str) -> str:
    """True division, fast where the op's result is fp16/bf16."""
    return f"pw_div_fast({num}, {den})" if a.fast else f"({num} / {den})"


def _infix(op: str) -> Callable[[OpArgs], str]:
    return lambda a: f"({a['self']} {op} {a['other']})"


def _scaled(a: OpArgs, name: str) -> str:
    alpha = a.raw("alpha")
    return a[name] if alpha in (None, 1) else f"({a[name]} * {a.lit(alpha)})"


def _div(a: OpArgs) -> str:
    mode = a.raw("rounding_mode")
    if mode is None:
        return _quotient(a, a["self"], a["other"])
    if mode == "trunc":
        return f"pw_trunc({a['self']} / {a['other']})"
    if mode == "floor":
        return f"pw_div_floor({a['self']}, {a['other']})"
    raise Unsupported(f"div rounding_mode {mode!r} not supported")


def _pow_tensor_scalar(a: OpArgs) -> str:
    # eager's special exponents (pow_out and the CUDA pow kernel), else pow()
    x, e = a["self"], a.raw("exponent")
    special = {0: a.lit(1), 1: x, 2: f"({x} * {x})", 3: f"({x} * {x} * {x})", 0.5: f"pw_sqrt({x})",
               -0.5: f"pw_rsqrt({x})", -1: f"({a.lit(1)} / {x})", -2: f"({a.lit(1)} / ({x} * {x}))"}
    return special.get(e, f"pw_pow({x}, {a.lit(e)})")


def _clamp_scalar(low: str, high: str) -> Callable[[OpArgs], str]:
    def render(a: OpArgs) -> str:
        x = a["self"]
        if a.raw(low) is not None:
            x = f"pw_clamp_min({x}, {a[low]})"
        if a.raw(high) is not None:
            x = f"pw_clamp_max({x}, {a[high]})"
        return x
    return render


def _clamp_tensor(a: OpArgs) -> str:
    x = a["self"]
    if a.raw("min") is not None:
        x = f"pw_maximum({x}, {a['min']})"
    if a.raw("max") is not None:
        x = f"pw_minimum({x}, {a['max']})"
    return x


def _gelu(a: OpArgs) -> str:
    approximate = a.raw("approximate")
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"gelu approximate={approximate!r} not supported")
    return f"pw_gelu{'_tanh' if approximate == 'tanh' else ''}({a['self']})"


def _elu(a: OpArgs) -> str:
    alpha, scale, input_scale = a.raw("alpha"), a.raw("scale"), a.raw("input_scale")
    return f"pw_elu({a['self']}, {a.lit(alpha * scale)}, {a.lit(scale)}, {a.lit(input_scale)})"


def _to_copy(a: OpArgs) -> str:
    device = a.raw("device")
    if device is not None and torch.device(device).type != "cuda":
        raise Unsupported(f"_to_copy to device {device} not supported")
    if a.raw("layout") not in (None, torch.strided):
        raise Unsupported(f"_to_copy to layout {a.raw('layout')} not supported")
    return a["self"]


def _constant(name: str) -> Callable[[OpArgs], str]:
    return lambda a: a.lit(a.raw(name))


# Ops with fast forms for fp16/bf16 results. Inductor's sigmoid is tl.sigmoid, 1 / (1 + tl.exp(-x)):
# ex2.approx of x * log2(e) and div.full; its silu, x / (1 + exp(-x)), divides with div.full too.
# tanh stays precise, as Inductor's libdevice.tanh: tanh.approx's 2^-11 error would show in fp16.
_FAST_UNARY = {aten.sigmoid.default: "pw_sigmoid", aten.exp.default: "pw_exp", aten.silu.default: "pw_silu"}

_UNARY_FLOAT = {
    aten.abs.default: "pw_fabs", aten.tanh.default: "pw_tanh",
    aten.expm1.default: "pw_expm1", aten.log.default: "pw_log",
    aten.log1p.default: "pw_log1p", aten.log2.default: "pw_log2", aten.sqrt.default: "pw_sqrt",
    aten.rsqrt.default: "pw_rsqrt", aten.erf.default: "pw_erf", aten.sin.default: "pw_sin",
    aten.cos.default: "pw_cos", aten.sign.default: "pw_sign",
    aten.mish.default: "pw_mish", aten.hardsigmoid.default: "pw_hardsigmoid",
    aten.hardswish.default: "pw_hardswish", aten.floor.default: "pw_floor", aten.ceil.default: "pw_ceil",
    aten.trunc.default: "pw_trunc", aten.round.default: "pw_rint",
}

_COMPARISONS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _build_rules() -> dict[Any, OpRule]:
    rules = {op: OpRule("float", _call(fn, "self")) for op, fn in _UNARY_FLOAT.items()}
    rules.update({op: OpRule("float", _fast_or_precise(fn)) for op, fn in _FAST_UNARY.items()})
    for overload in ("Tensor", "Scalar"):  # a tensor or a Python scalar `other`
        def get(name: str, suffix: str = "") -> Any:
            return getattr(getattr(aten, name), overload + suffix)
        rules[get("add")] = OpRule("float", lambda a: f"({a['self']} + {_scaled(a, 'other')})")
        rules[get("sub")] = OpRule("float", lambda a: f"({a['self']} - {_scaled(a, 'other')})")
        rules[get("rsub")] = OpRule("float", lambda a: f"({a['other']} - {_scaled(a, 'self')})")
        rules[get("mul")] = OpRule("float", _infix("*"))
        rules[get("div")] = OpRule("float", _div)
        rules[get("div", "_mode")] = OpRule("float", _div)
        for name, op in _COMPARISONS.items():
            rules[get(name)] = OpRule("compare", _infix(op))
    rules.update({
        aten.neg.default: OpRule("float", lambda a: f"(-{a['self']})"),
        aten.relu.default: OpRule("float", lambda a: f"pw_clamp_min({a['self']}, {a.lit(0)})"),
        aten.reciprocal.default: OpRule("float", lambda a: _quotient(a, a.lit(1), a["self"])),
        aten.pow.Tensor_Scalar: OpRule("float", _pow_tensor_scalar),
        aten.pow.Tensor_Tensor: OpRule("float", _call("pw_pow", "self", "exponent")),
        aten.pow.Scalar: OpRule("float", _call("pw_pow", "self", "exponent")),
        aten.maximum.default: OpRule("float", _call("pw_maximum", "self", "other")),
        aten.minimum.default: OpRule("float", _call("pw_minimum", "self", "other")),
        aten.clamp.default: OpRule("float", _clamp_scalar("min", "max")),
        aten.clamp.Tensor: OpRule("float", _clamp_tensor),
        aten.clamp_min.default: OpRule("float", _call("pw_clamp_min", "self", "min")),
        aten.clamp_min.Tensor: OpRule("float", _call("pw_maximum", "self", "min")),
        aten.clamp_max.default: OpRule("float", _call("pw_clamp_max", "self", "max")),
        aten.clamp_max.Tensor: OpRule("float", _call("pw_minimum", "self", "max")),
        aten.hardtanh.default: OpRule("float", _clamp_scalar("min_val", "max_val")),
        aten.gelu.default: OpRule("float", _gelu),
        aten.leaky_relu.default: OpRule("float", _call("pw_leaky_relu", "self", "negative_slope")),
        aten.elu.default: OpRule("float", _elu),
        aten.softplus.default: OpRule("float", _call("pw_softplus", "self", "beta", "threshold")),
        aten.where.self: OpRule("any", lambda a: f"({a.bool('condition')} ? {a['self']} : {a['other']})"),
        aten.logical_not.default: OpRule("any", lambda a: f"(!{a.bool('self')})"),
        aten.logical_and.default: OpRule("any", lambda a: f"({a.bool('self')} && {a.bool('other')})"),
        aten.logical_or.default: OpRule("any", lambda a: f"({a.bool('self')} || {a.bool('other')})"),
        aten.logical_xor.default: OpRule("any", lambda a: f"({a.bool('self')} != {a.bool('other')})"),
        prims.convert_element_type.default: OpRule("any", lambda a: a["a"]),
        aten._to_copy.default: OpRule("any", _to_copy),
        aten.clone.default: OpRule("any", lambda a: a["self"]),
        aten.scalar_tensor.default: OpRule("any", _constant("s")),
        aten.full.default: OpRule("any", _constant("fill_value")),
    })
    return rules


def _inductor_rules() -> dict[Any, OpRule]:
    """Ops Inductor defines (torch._inductor.inductor_prims) that its decompositions write into
    the graphs we see: fma in softmax's backward."""
    import torch._inductor.inductor_prims  # noqa: F401  (registers prims.fma)
    fma = getattr(prims, "fma", None)
    return {fma.default: OpRule("float", _call("pw_fma", "a", "b", "c"))} if fma is not None else {}


OP_RULES: dict[Any, OpRule] = {**_build_rules(), **_inductor_rules()}

CONVERSIONS = frozenset({prims.convert_element_type.default, aten._to_copy.default})

# Ops whose fp16/bf16 operands and result may stay unrounded in fp32 (Value.rounded), as
# Inductor keeps them (its emulate_precision_casts is off): arithmetic and math functions, a
# select and a copy (and a widening conversion: plan._render). Not the steps where a rounding
# could move the input across a jump (floor, sign, a division's rounding modes, compares), nor
# narrowing conversions and constants: there, as where a value is stored, it is rounded first.
# Rounding every op's result cost a bf16 chain a conversion and a shift an op an element (on
# sm_90, a bf16 scale, shift and tanh: 39 SASS instructions an element, 30 without).
_STEPS = {aten.floor.default, aten.ceil.default, aten.trunc.default, aten.round.default, aten.sign.default,
          aten.div.Tensor_mode, aten.div.Scalar_mode}
CONTINUOUS = frozenset({op for op, rule in OP_RULES.items() if rule.kind == "float" and op not in _STEPS}
                       | {aten.where.self, aten.clone.default})


# pw_<name>(float) and pw_<name>(double) overloads of CUDA's math library, so templates below
# and rendered expressions work for both compute types. Precise versions: no fast-math.
_MATH_UNARY = ("exp", "expm1", "log", "log1p", "log2", "sqrt", "rsqrt", "tanh", "erf", "sin", "cos",
               "fabs", "floor", "ceil", "trunc", "rint")
_MATH_BINARY = ("pow", "fmod", "copysign")


def _math_overloads() -> str:
    lines = []
    for name in _MATH_UNARY:
        for ctype, fn in (("float", f"{name}f"), ("double", name)):
            lines.append(f"__device__ __forceinline__ {ctype} pw_{name}({ctype} x) {{ return {fn}(x); }}")
    for name in _MATH_BINARY:
        for ctype, fn in (("float", f"{name}f"), ("double", name)):
            lines.append(f"__device__ __forceinline__ {ctype} pw_{name}({ctype} a, {ctype} b) {{ return {fn}(a, b); }}")
    for ctype, fn in (("float", "fmaf"), ("double", "fma")):  # one rounding, as prims.fma promises
        lines.append(f"__device__ __forceinline__ {ctype} pw_fma({ctype} a, {ctype} b, {ctype} c) {{ return {fn}(a, b, c); }}")
    return "\n".join(lines)


_TEMPLATES = r"""
#define PW_T template <typename T> __device__ __forceinline__ T
// NaN in either operand wins, as in eager maximum/minimum/clamp.
PW_T pw_maximum(T a, T b) { return a != a ? a : (b != b ? b : (a > b ? a : b)); }
PW_T pw_minimum(T a, T b) { return a != a ? a : (b != b ? b : (a < b ? a : b)); }
PW_T pw_clamp_min(T x, T lo) { return x != x ? x : (x < lo ? lo : x); }
PW_T pw_clamp_max(T x, T hi) { return x != x ? x : (x > hi ? hi : x); }
PW_T pw_sign(T x) { return T((T(0) < x) - (x < T(0))); }
PW_T pw_sigmoid(T x) { return T(1) / (T(1) + pw_exp(-x)); }
PW_T pw_silu(T x) { return x / (T(1) + pw_exp(-x)); }
PW_T pw_mish(T x) { return x * pw_tanh(pw_log1p(pw_exp(x))); }
PW_T pw_gelu(T x) { return T(0.5) * x * (T(1) + pw_erf(x * T(0.70710678118654752440))); }
PW_T pw_gelu_tanh(T x) {
  const T inner = T(0.79788456080286535588) * (x + T(0.044715) * (x * x * x));
  return T(0.5) * x * (T(1) + pw_tanh(inner));
}
PW_T pw_leaky_relu(T x, T slope) { return x > T(0) ? x : x * slope; }
PW_T pw_elu(T x, T neg_coef, T pos_coef, T input_scale) {
  return x <= T(0) ? pw_expm1(x * input_scale) * neg_coef : x * pos_coef;
}
PW_T pw_softplus(T x, T beta, T threshold) {
  return x * beta > threshold ? x : pw_log1p(pw_exp(x * beta)) / beta;
}
// std::min(std::max(x, 0), 6) as eager writes it, so NaN propagates.
PW_T pw_relu6(T x) { const T lo = x < T(0) ? T(0) : x; return T(6) < lo ? T(6) : lo; }
PW_T pw_hardsigmoid(T x) { return pw_relu6(x + T(3)) * T(1.0 / 6.0); }
PW_T pw_hardswish(T x) { return x * pw_relu6(x + T(3)) * T(1.0 / 6.0); }
// c10's div_floor_floating: floor division that agrees with Python's // near integers.
PW_T pw_div_floor(T a, T b) {
  if (b == T(0)) return a / b;
  const T mod = pw_fmod(a, b);
  T div = (a - mod) / b;
  if (mod != T(0) && (b < T(0)) != (mod < T(0))) div -= T(1);
  if (div == T(0)) return pw_copysign(T(0), a / b);
  T floordiv = pw_floor(div);
  if (div - floordiv > T(0.5)) floordiv += T(1);
  return floordiv;
}
#undef PW_T
"""

# Fast fp32 forms, as Triton lowers tl.exp and fp32 `/`: for ops whose result is rounded to
# fp16/bf16 (OpArgs.fast). Not .ftz: subnormals stay; inf, NaN and overflow behave as the
# precise forms (ex2(-inf) = 0, x / inf = 0, 0 / 0 = NaN). .ftz only where a flushed term
# changes nothing: inside 1 + exp(-x), the rows template's exps of a row's sum beside its max
# (pw_exp_fast_ftz, rows plan._Program._summed_exp), and an exp of x <= 0 scaled so that nothing
# representable is flushed (pw_exp_fast_nonpositive).
_FAST = r"""
__device__ __forceinline__ float pw_exp_fast(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x * 1.44269504088896341f));
  return y;
}
__device__ __forceinline__ float pw_div_fast(float a, float b) {
  float q;
  asm("div.full.f32 %0, %1, %2;" : "=f"(q) : "f"(a), "f"(b));
  return q;
}
// exp(x - max) where its result only joins a sum of such terms (log-softmax's, logsumexp's): .ftz
// flushes a term below 2^-126 to 0 beside the max's own exp(0) = 1, and spares ex2's subnormal
// handling (a compare and two multiplies: on sm_90, 3 of the 17 instructions an element of a
// bf16 cross-entropy's two passes). In 1 + exp(-x) (sigmoid, SiLU, 1 + tanh) a term below 2^-126
// vanishes in the sum anyway, so there .ftz changes no bit of the result.
__device__ __forceinline__ float pw_exp_fast_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.44269504088896341f));
  return y;
}
// exp(x) for x <= 0 (a row's y - max(y): rows plan._Program._exp_below_max) where every result
// is rounded to fp16/bf16: ex2's .ftz form of x log2(e) + 64, scaled by 2^-64 after. A result
// below 2^-126 then comes out of the multiply as the subnormal it is, and only those below 2^-190,
// which are 0 in every dtype, are flushed; the form without .ftz spent a compare and two
// multiplies an element on subnormals (on sm_90, 3 of the 9 instructions of a bf16 softmax's
// output element). The + 64 keeps the exponent to 2^-18, a relative 2.6e-6: far below fp16/bf16.
__device__ __forceinline__ float pw_exp_fast_nonpositive(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(fmaf(x, 1.44269504088896341f, 64.0f)));
  return y * 5.42101086242752217e-20f;  // 2^-64
}
// exp(x) for x <= 66, as pw_exp_fast_nonpositive (every result rounded to fp16/bf16) but of
// x log2(e) + 32, scaled by 2^-32: a rows kernel's kept term against a thread's first value,
// up to e^64 (rows codegen FIRST_VALUE_RANGE). Results down to 2^-158 (bf16's least subnormal is
// 2^-133) come out of the multiply; the exponent stays within 2^-18 as there.
__device__ __forceinline__ float pw_exp_fast_bounded(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(fmaf(x, 1.44269504088896341f, 32.0f)));
  return y * 2.32830643653869629e-10f;  // 2^-32
}
__device__ __forceinline__ float pw_sigmoid_fast(float x) { return pw_div_fast(1.0f, 1.0f + pw_exp_fast_ftz(-x)); }
__device__ __forceinline__ float pw_silu_fast(float x) { return pw_div_fast(x, 1.0f + pw_exp_fast_ftz(-x)); }
// 1 + tanh(z) = 2 sigmoid(2 z): two special-function instructions where tanhf takes a dozen, and
// no cancellation where tanh nears -1 (a decomposed tanh GELU, 0.5 x (1 + tanh(z))).
__device__ __forceinline__ float pw_one_plus_tanh_fast(float z) {
  float r;
  asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(1.0f + pw_exp_fast_ftz(-2.0f * z)));
  return 2.0f * r;
}
// A tanh GELU, 0.5 x (1 + tanh(c (x + k x^3))) = x / (1 + exp(-2 c (x + k x^3))), with the exp's
// argument in log2 units as x (a + b x^2), a = -2 c log2(e), b = a k (rows plan._gelu_tanh): an
// ex2, a rcp and five more instructions. The rcp flushes results below 2^-126 (x under about -10),
// which sm_90 otherwise guards with a compare, a select and two multiplies an element; there
// 0.5 x (1 + tanh) is 0 too, tanh having rounded to -1 from x = -6 on (where this form is nearer).
__device__ __forceinline__ float pw_gelu_tanh_fast(float x, float a, float b) {
  float y, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * fmaf(b, x * x, a)));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + y));
  return x * r;
}
"""

# Exact, so not a fast form: every kernel has them (the emulator, none: it takes the templates).
NAN_MIN_MAX = r"""#if __CUDA_ARCH__ >= 800
// fp32 max/min propagating NaN in one instruction (the templates above take three compares and
// a select: a third of a bf16 cross-entropy's instructions an element on sm_90). NaN as eager's.
__device__ __forceinline__ float pw_maximum(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float pw_minimum(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
#endif
"""

DEVICE_FUNCTIONS = _math_overloads() + "\n" + _TEMPLATES + _FAST + NAN_MIN_MAX
