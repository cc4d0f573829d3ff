"""Write op generators of the fuzzer: in-place ops, copy_ / in-place ops between two views of
one storage, out= ops and metadata mutations. Each takes the Generator (generator.py) and
returns one line of code, or None when no live variable fits.
"""
from __future__ import annotations

import math

import torch

from .program import (
    DTYPE_NAMES, ctor, factorize, lit_list, pick_destination as _dst, pick_tensor as _t,
    random_shape, scalar_for, shp, weighted,
)


# In-place ops -------------------------------------------------------------------------------

UNARY_INPLACE = ["abs_", "neg_", "sin_", "cos_", "exp_", "sqrt_", "floor_", "ceil_", "round_",
                 "trunc_", "sigmoid_", "tanh_", "relu_", "reciprocal_", "sign_", "zero_", "frac_",
                 "log1p_", "square_", "nan_to_num_", "logical_not_", "bitwise_not_", "detach_"]
BINARY_INPLACE = [("add_", 6), ("sub_", 4), ("mul_", 5), ("div_", 3), ("pow_", 1), ("lerp_", 1),
                  ("atan2_", 1), ("fmod_", 1), ("remainder_", 1), ("copysign_", 1),
                  ("bitwise_and_", 1), ("bitwise_or_", 1), ("logical_and_", 1), ("maximum", 0),
                  ("hypot_", 1), ("clamp_min_", 1), ("clamp_max_", 1), ("floor_divide_", 1),
                  ("eq_", 1), ("lt_", 1)]


def i_unary(g):
    x, t = _dst(g)
    return f"{x}.{g.rng.choice(UNARY_INPLACE)}()"


def i_fill(g):
    x, t = _dst(g)
    if g.rng.random() < 0.25:
        y = g.pick(lambda u: u.dim() == 0)
        if y:
            return f"{x}.fill_({y})"
    return f"{x}.fill_({scalar_for(g.rng, t.dtype)})"


def i_clamp(g):
    x, t = _dst(g)
    form = g.rng.random()
    if form < 0.6:
        return f"{x}.clamp_(min={g.rng.choice(['-0.5', '0', '-1'])}, max={g.rng.choice(['0.5', '1', '2'])})"
    y = g.operand(tuple(t.shape), t.dtype, allow_scalar=False)
    return f"{x}.clamp_(min={y})" if y else None


def i_binary(g):
    x, t = _dst(g)
    op = weighted(g.rng, BINARY_INPLACE)
    if op == "maximum":
        return None
    y = g.operand(tuple(t.shape), t.dtype)
    if op == "lerp_":
        return f"{x}.lerp_({y}, {g.rng.choice(['0.5', '0.25'])})"
    if op in ("add_", "sub_") and g.rng.random() < 0.3:
        return f"{x}.{op}({y}, alpha={g.rng.choice(['2', '-1', '0.5'])})"
    return f"{x}.{op}({y})"


def i_operator(g):
    x, t = _dst(g)
    op = g.rng.choice(["+=", "-=", "*=", "/=", "|=", "&="])
    return f"{x} {op} {g.operand(tuple(t.shape), t.dtype)}"


def i_addcmul(g):
    x, t = _dst(g)
    a = g.operand(tuple(t.shape), t.dtype, allow_scalar=False)
    b = g.operand(tuple(t.shape), t.dtype, allow_scalar=False)
    if a is None or b is None:
        return None
    fn = g.rng.choice(["addcmul_", "addcdiv_"])
    return f"{x}.{fn}({a}, {b}, value={g.rng.choice(['0.5', '2', '-1'])})"


def i_copy(g):
    x, t = _dst(g)
    y = g.operand(tuple(t.shape), allow_scalar=False,
                  dtype=t.dtype if g.rng.random() < 0.7 else None)
    if y is None:
        return None
    if g.rng.random() < 0.15:
        return f"torch.ops.aten.copy_({x}, {y})"
    return f"{x}.copy_({y})"


def i_masked_fill(g):
    x, t = _dst(g)
    m = g.mask_expr(tuple(t.shape))
    v = scalar_for(g.rng, t.dtype)
    fn = g.rng.choice(["masked_fill_", "masked_fill_", "masked_scatter_"])
    if fn == "masked_scatter_":
        src = g.pick(lambda u: u.dtype == t.dtype and u.numel() >= t.numel())
        if src is None:
            return None
        return f"{x}.masked_scatter_({m}, {src})"
    return f"{x}.masked_fill_({m}, {v})"


def _values_for(g, t, shape):
    """A value for an indexed write: scalar, 0-dim literal, or a broadcastable variable."""
    r = g.rng.random()
    if r < 0.4:
        return scalar_for(g.rng, t.dtype)
    y = g.operand(shape, t.dtype, allow_scalar=True)
    return y


def i_index_put(g):
    x, t = _dst(g, )
    if t.dim() == 0 or t.size(0) == 0:
        return None
    idx, n = g.index_lit(t.size(0))
    shape = (n,) + tuple(t.shape[1:])
    v = _values_for(g, t, shape)
    if v is None or not v.isidentifier():
        v = f"torch.tensor({v}, dtype={DTYPE_NAMES.get(t.dtype, 'torch.float32')})" \
            if v is not None else None
    acc = g.rng.choice(["True", "False"])
    return f"{x}.index_put_(({idx},), {v}, accumulate={acc})"


def i_setitem(g):
    x, t = _dst(g)
    rng = g.rng
    if t.dim() == 0:
        return f"{x}[...] = {scalar_for(rng, t.dtype)}"
    form = weighted(rng, [("slice", 4), ("int", 3), ("tensor", 2), ("mask", 2), ("iadd", 3)])
    d = rng.randrange(t.dim())
    n = t.size(d)
    if form == "int" and n:
        key = ", ".join([":"] * d + [str(rng.randrange(n))])
        shape = tuple(t.shape[:d] + t.shape[d + 1:])
    elif form == "tensor" and n:
        idx, k = g.index_lit(n)
        key = ", ".join([":"] * d + [idx])
        shape = tuple(t.shape[:d]) + (k,) + tuple(t.shape[d + 1:])
    elif form == "mask":
        key = g.mask_expr(tuple(t.shape))
        return f"{x}[{key}] = {scalar_for(rng, t.dtype)}"
    else:
        a = rng.randint(0, n)
        s = rng.choice([1, 1, 2])
        key = ", ".join([":"] * d + [f"{a}::{s}" if s != 1 else f"{a}:"])
        shape = tuple(t.shape[:d]) + (len(range(a, n, s)),) + tuple(t.shape[d + 1:])
    if form == "iadd":
        return f"{x}[{key}] += {g.operand(shape, t.dtype)}"
    return f"{x}[{key}] = {_values_for(g, t, shape)}"


def _index_args(g, t, d):
    """index tensor along d (of the source's length) for index_add_/copy_/fill_."""
    n = t.size(d)
    if n == 0:
        return None
    return g.index_lit(n)


def i_index_family(g):
    x, t = _dst(g)
    if t.dim() == 0:
        return None
    d = g.rng.randrange(t.dim())
    r = _index_args(g, t, d)
    if r is None:
        return None
    fn = weighted(g.rng, [("index_fill_", 2), ("index_copy_", 2), ("index_add_", 3),
                          ("index_reduce_", 1)])
    if fn == "index_fill_":
        return f"{x}.index_fill_({d}, {r[0]}, {scalar_for(g.rng, t.dtype)})"
    idx, k = g.index_lit(t.size(d), unique=(fn == "index_copy_"))
    shape = list(t.shape)
    shape[d] = k
    src = g.source(x, lambda u: tuple(u.shape) == tuple(shape) and u.dtype == t.dtype)
    if src is None:
        src = ctor(g.rng, t.dtype, shape)
    if fn == "index_add_" and g.rng.random() < 0.3:
        return f"{x}.index_add_({d}, {idx}, {src}, alpha=2)"
    if fn == "index_reduce_":
        red = g.rng.choice(["prod", "mean", "amax", "amin"])
        return f"{x}.index_reduce_({d}, {idx}, {src}, '{red}', include_self={g.rng.choice(['True', 'False'])})"
    return f"{x}.{fn}({d}, {idx}, {src})"


def i_scatter(g):
    x, t = _dst(g)
    rng = g.rng
    if t.dim() == 0 or t.numel() == 0:
        return None
    d = rng.randrange(t.dim())
    ishape = [rng.randint(1, s) for s in t.shape]
    vals = [rng.randrange(t.size(d)) for _ in range(math.prod(ishape))]
    idx = f"torch.tensor({lit_list(vals, ishape)}, dtype=torch.long)"
    fn = weighted(rng, [("scatter_", 3), ("scatter_add_", 2), ("scatter_reduce_", 2),
                        ("scatter_value", 1)])
    if fn == "scatter_value":
        return f"{x}.scatter_({d}, {idx}, {scalar_for(rng, t.dtype)})"
    src = g.source(x, lambda u: u.dtype == t.dtype and u.dim() == t.dim() and all(
        a >= b for a, b in zip(u.shape, ishape)))
    if src is None:
        src = ctor(rng, t.dtype, ishape)
    if fn == "scatter_reduce_":
        red = rng.choice(["sum", "prod", "mean", "amax", "amin"])
        return f"{x}.scatter_reduce_({d}, {idx}, {src}, '{red}', include_self={rng.choice(['True', 'False'])})"
    return f"{x}.{fn}({d}, {idx}, {src})"


def i_put(g):
    x, t = _dst(g)
    if t.numel() == 0:
        return None
    idx, k = g.index_lit(t.numel(), unique=g.rng.random() < 0.5)
    src = g.source(x, lambda u: u.dtype == t.dtype and u.numel() == k)
    if src is None:
        src = ctor(g.rng, t.dtype, [k])
    return f"{x}.put_({idx}, {src}, accumulate={g.rng.choice(['True', 'False'])})"


def i_tri(g):
    x, _ = _t(g, lambda t: t.dim() >= 2, prefer=g.input_alias)
    if x is None:
        return None
    return f"{x}.{g.rng.choice(['tril_', 'triu_'])}({g.rng.randint(-1, 1)})"


def i_cumsum(g):
    x, t = _dst(g)
    d = g.dim(t) if t.dim() else 0
    return f"{x}.{g.rng.choice(['cumsum_', 'cumprod_'])}({d})"


def i_addmm(g):
    x, t = _dst(g)
    if t.dim() != 2:
        return None
    k = g.rng.randint(1, 3)
    a = g.pick(lambda u: tuple(u.shape) == (t.size(0), k) and u.dtype == t.dtype) or \
        ctor(g.rng, t.dtype, [t.size(0), k])
    b = g.pick(lambda u: tuple(u.shape) == (k, t.size(1)) and u.dtype == t.dtype) or \
        ctor(g.rng, t.dtype, [k, t.size(1)])
    return f"{x}.addmm_({a}, {b})"


def i_foreach(g):
    a, _ = _dst(g)
    b, _ = _t(g)
    op = g.rng.choice(["_foreach_add_", "_foreach_mul_", "_foreach_zero_"])
    if op == "_foreach_zero_":
        return f"torch.{op}([{a}, {b}])"
    if g.rng.random() < 0.5:
        return f"torch.{op}([{a}, {b}], 2)"
    return f"torch.{op}([{a}, {b}], [{b}, {a}])"


def i_set(g):
    # set_ is a documented limit (NotImplementedError naming the op); kept rare.
    x, t = _dst(g)
    y = g.pick(lambda u: u.dtype == t.dtype)
    return f"{x}.set_({y})"


# Cross-alias writes: copy_ / in-place op between two views of one storage.

def a_cross(g):
    x, t = _dst(g)
    ptr = t.untyped_storage().data_ptr()
    same = g.tensors(lambda u: u.untyped_storage().data_ptr() == ptr and u.dtype == t.dtype)
    if not same:
        return None
    y = g.rng.choice(same)
    u = g.ns[y]
    rng = g.rng
    # Make y's shape fit x by a view, when it does not broadcast already.
    ok = u.dim() <= t.dim() and all(a == b or a == 1 for a, b in zip(reversed(u.shape),
                                                                     reversed(t.shape)))
    src = y
    if not ok:
        if u.numel() == t.numel():
            src = f"{y}.reshape({shp(t.shape)})"
        elif u.numel() >= t.numel() and t.numel() > 0:
            src = f"{y}.flatten()[:{t.numel()}].view({shp(t.shape)})"
        else:
            return None
    fn = rng.choice(["copy_", "add_", "mul_", "sub_"])
    return f"{x}.{fn}({src})"


# Out= ops -----------------------------------------------------------------------------------

def o_pointwise(g):
    x, t = _t(g)
    rng = g.rng
    fn = weighted(rng, [("add", 4), ("mul", 3), ("sub", 2), ("div", 2), ("maximum", 1),
                        ("minimum", 1), ("abs", 2), ("neg", 1), ("exp", 1), ("sin", 1),
                        ("sigmoid", 1), ("clamp", 1), ("where", 1), ("floor", 1)])
    if fn in ("abs", "neg", "exp", "sin", "sigmoid", "floor"):
        call = f"torch.{fn}({x}"
    elif fn == "clamp":
        call = f"torch.clamp({x}, -0.5, 0.5"
    elif fn == "where":
        y = g.operand(tuple(t.shape), t.dtype, allow_scalar=False) or x
        call = f"torch.where({g.mask_expr(tuple(t.shape))}, {x}, {y}"
    else:
        call = f"torch.{fn}({x}, {g.operand(tuple(t.shape), t.dtype)}"
    o = g.out_target(t.dtype, t.shape, avoid=(x,))
    return f"{call}, out={o})"


def o_reduction(g):
    x, t = _t(g, lambda t: t.dtype != torch.bool)
    if x is None:
        return None
    rng = g.rng
    fn = rng.choice(["sum", "mean", "amax", "prod", "cumsum", "max", "sort", "logsumexp"])
    d = g.dim(t) if t.dim() else 0
    keep = rng.choice(["True", "False"])
    if fn in ("max", "sort"):
        o1 = g.out_target(t.dtype, avoid=(x,))
        o2 = g.out_target(torch.int64, avoid=(x,))
        if o1 == o2:
            return None
        extra = f", keepdim={keep}" if fn == "max" else ""
        return f"torch.{fn}({x}, {d}{extra}, out=({o1}, {o2}))"
    o = g.out_target(t.dtype, avoid=(x,))
    if fn == "cumsum":
        return f"torch.cumsum({x}, {d}, out={o})"
    return f"torch.{fn}({x}, {d}, keepdim={keep}, out={o})"


def o_matmul(g):
    x, t = _t(g, lambda t: t.dim() in (1, 2) and (t.dtype.is_floating_point or t.is_complex()))
    if x is None:
        return None
    rng = g.rng
    k = t.size(-1)
    y = g.pick(lambda u: u.dim() in (1, 2) and u.dtype == t.dtype and u.size(0) == k)
    if y is None:
        n = rng.randint(1, 3)
        y = ctor(rng, t.dtype, [k, n])
    fn = rng.choice(["mm", "matmul", "matmul"]) if t.dim() == 2 and g.ns.get(y) is not None \
        and g.ns[y].dim() == 2 else "matmul"
    return f"torch.{fn}({x}, {y}, out={g.out_target(t.dtype, avoid=(x, y))})"


def o_cat(g):
    x, t = _t(g)
    rng = g.rng
    y = g.pick(lambda u: u.dtype == t.dtype and u.dim() == t.dim())
    if rng.random() < 0.5 and tuple(g.ns[y].shape) == tuple(t.shape):
        return f"torch.stack([{x}, {y}], {rng.randint(0, t.dim())}, out={g.out_target(t.dtype, avoid=(x, y))})"
    d = g.dim(t) if t.dim() else 0
    return f"torch.cat([{x}, {y}], {d}, out={g.out_target(t.dtype, avoid=(x, y))})"


def o_index(g):
    x, t = _t(g, lambda t: t.dim() >= 1 and t.numel() > 0)
    if x is None:
        return None
    rng = g.rng
    d = rng.randrange(t.dim())
    fn = rng.choice(["index_select", "gather", "masked_select", "nonzero"])
    if fn == "index_select":
        idx, _ = g.index_lit(t.size(d))
        return f"torch.index_select({x}, {d}, {idx}, out={g.out_target(t.dtype, avoid=(x,))})"
    if fn == "gather":
        ishape = [rng.randint(1, s) for s in t.shape]
        vals = [rng.randrange(t.size(d)) for _ in range(math.prod(ishape))]
        idx = f"torch.tensor({lit_list(vals, ishape)}, dtype=torch.long)"
        return f"torch.gather({x}, {d}, {idx}, out={g.out_target(t.dtype, avoid=(x,))})"
    if fn == "masked_select":
        return f"torch.masked_select({x}, {g.mask_expr(tuple(t.shape))}, out={g.out_target(t.dtype, avoid=(x,))})"
    return f"torch.nonzero({x}, out={g.out_target(torch.int64, avoid=(x,))})"


def o_factory(g):
    rng = g.rng
    o = g.out_target()
    t = g.ns[o]
    shape = t.shape if rng.random() < 0.6 else random_shape(rng)
    fn = rng.choice(["zeros", "ones", "full", "arange", "randn", "rand", "eye", "linspace"])
    s = shp(shape)
    if fn == "full":
        return f"torch.full({s}, {scalar_for(rng, t.dtype)}, out={o})"
    if fn == "arange":
        return f"torch.arange({max(1, t.numel())}, out={o})"
    if fn == "eye":
        return f"torch.eye({rng.randint(1, 4)}, out={o})"
    if fn == "linspace":
        return f"torch.linspace(0, 1, {rng.randint(1, 6)}, out={o})"
    return f"torch.{fn}({s}, out={o})"


def o_into_view(g):
    # out= into a view: of an input, or a fresh slice/transpose of a variable.
    x, t = _t(g)
    rng = g.rng
    tgt, tt = _t(g, prefer=g.input_alias)
    if tt.dim() >= 2 and rng.random() < 0.5:
        view = f"{tgt}.t()" if tt.dim() == 2 else f"{tgt}.transpose(0, 1)"
    elif tt.dim() >= 1 and tt.size(0) > 1:
        view = f"{tgt}[1:]"
    else:
        view = f"{tgt}.view(-1)"
    fn = rng.choice(["add", "mul", "abs", "neg"])
    if fn in ("abs", "neg"):
        return f"torch.{fn}({x}, out={view})"
    return f"torch.{fn}({x}, {g.operand(tuple(t.shape), t.dtype)}, out={view})"


# Metadata mutations -----------------------------------------------------------------------

def m_t(g):
    x, t = _t(g, lambda t: t.dim() <= 2, prefer=g.input_alias)
    if x is None:
        return None
    return f"{x}.t_()"


def m_transpose(g):
    x, t = _t(g, lambda t: t.dim() >= 1, prefer=g.input_alias)
    if x is None:
        return None
    fn = g.rng.choice(["transpose_", "swapdims_", "swapaxes_"])
    return f"{x}.{fn}({g.dim(t)}, {g.dim(t)})"


def m_squeeze(g):
    x, t = _t(g, prefer=lambda t: 1 in t.shape)
    if g.rng.random() < 0.5 or 1 not in t.shape:
        return f"{x}.unsqueeze_({g.rng.randint(-t.dim() - 1, t.dim())})"
    ones = [i for i, s in enumerate(t.shape) if s == 1]
    return f"{x}.squeeze_({g.rng.choice(ones)})" if g.rng.random() < 0.7 else f"{x}.squeeze_()"


def m_resize(g):
    x, t = _t(g, prefer=g.input_alias)
    rng = g.rng
    form = weighted(rng, [("shrink", 3), ("grow", 2), ("reshape", 2), ("as", 1)])
    n = t.numel()
    if form == "as":
        y = g.pick()
        return f"{x}.resize_as_({y})"
    if form == "shrink":
        m = rng.randint(0, max(0, n - 1))
    elif form == "grow":
        m = n + rng.randint(1, 8)
    else:
        m = n
    return f"{x}.resize_({shp(factorize(rng, m, 3))})"


def m_as_strided(g):
    x, t = _t(g, prefer=g.input_alias)
    rng = g.rng
    n = t.untyped_storage().nbytes() // max(1, t.element_size())
    if n == 0:
        return None
    size = [rng.randint(1, 4) for _ in range(rng.randint(1, 2))]
    stride = [rng.choice([1, 2, 3]) for _ in size]
    extent = sum((s - 1) * st for s, st in zip(size, stride))
    if extent >= n:
        return None
    return f"{x}.as_strided_({shp(size)}, {shp(stride)}, {rng.randint(0, n - 1 - extent)})"


