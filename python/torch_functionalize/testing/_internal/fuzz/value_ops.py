"""Value op generators of the fuzzer: factories, seeded random ops and functional ops. Each takes
the Generator (generator.py) and returns one line of code, or None when no live variable fits.
"""
from __future__ import annotations

import math

import torch

from .program import (
    DTYPES, DTYPE_NAMES, FLOAT, ctor, lit_list, pick_destination as _dst, pick_tensor as _t,
    random_shape, scalar_for, shp, weighted,
)


# Factories and random ops -------------------------------------------------------------------

def f_factory(g):
    rng = g.rng
    dt = weighted(rng, DTYPES)
    shape = random_shape(rng)
    s = shp(shape)
    name = DTYPE_NAMES[dt]
    fn = weighted(rng, [("zeros", 3), ("ones", 2), ("full", 2), ("empty", 2), ("arange", 2),
                        ("tensor", 3), ("like", 4), ("new", 3), ("empty_strided", 1),
                        ("eye", 1), ("scalar_tensor", 1)])
    v = g.new()
    if fn == "full":
        return f"{v} = torch.full({s}, {scalar_for(rng, dt)}, dtype={name})"
    if fn == "arange":
        return f"{v} = torch.arange({rng.randint(0, 12)}, dtype={name})"
    if fn == "tensor":
        vals = [eval(scalar_for(rng, dt)) for _ in range(math.prod(shape))]
        return f"{v} = torch.tensor({lit_list(vals, shape)}, dtype={name})"
    if fn == "like":
        x, t = _t(g)
        k = rng.choice(["zeros_like", "ones_like", "empty_like", "full_like", "rand_like",
                        "randn_like"])
        if k == "full_like":
            return f"{v} = torch.full_like({x}, {scalar_for(rng, t.dtype)})"
        return f"{v} = torch.{k}({x})"
    if fn == "new":
        x, t = _t(g)
        k = rng.choice(["new_zeros", "new_ones", "new_empty", "new_full", "new_tensor"])
        if k == "new_full":
            return f"{v} = {x}.new_full({s}, {scalar_for(rng, t.dtype)})"
        if k == "new_tensor":
            return f"{v} = {x}.new_tensor({[eval(scalar_for(rng, t.dtype)) for _ in range(3)]})"
        return f"{v} = {x}.{k}({s})"
    if fn == "empty_strided":
        if len(shape) < 2:
            return f"{v} = torch.empty_strided((2, 3), (1, 2), dtype={name})"
        stride = [1] * len(shape)
        acc = 1
        for i in reversed(range(len(shape))) if rng.random() < 0.5 else range(len(shape)):
            stride[i] = acc
            acc *= max(1, shape[i])
        return f"{v} = torch.empty_strided({s}, {shp(stride)}, dtype={name})"
    if fn == "eye":
        return f"{v} = torch.eye({rng.randint(1, 4)}, dtype={name})"
    if fn == "scalar_tensor":
        return f"{v} = torch.scalar_tensor({scalar_for(rng, dt)}, dtype={name})"
    return f"{v} = torch.{fn}({s}, dtype={name})"


def r_random(g):
    rng = g.rng
    fn = weighted(rng, [("rand", 2), ("randn", 2), ("randint", 1), ("randperm", 1),
                        ("bernoulli_", 2), ("normal_", 2), ("uniform_", 1), ("exponential_", 1),
                        ("random_", 1), ("bernoulli", 1), ("dropout", 2), ("dropout_inplace", 2),
                        ("normal", 1), ("multinomial", 1), ("geometric_", 1)])
    v = g.new()
    s = shp(random_shape(rng))
    if fn in ("rand", "randn"):
        return f"{v} = torch.{fn}({s})"
    if fn == "randint":
        return f"{v} = torch.randint(0, 5, {s})"
    if fn == "randperm":
        return f"{v} = torch.randperm({rng.randint(1, 6)})"
    if fn in ("bernoulli_", "normal_", "uniform_", "exponential_", "random_", "geometric_"):
        x, t = _dst(g)
        arg = {"bernoulli_": rng.choice(["0.5", "0.25"]), "normal_": "0.0, 2.0",
               "uniform_": "-1, 1", "exponential_": "", "random_": "0, 7",
               "geometric_": "0.5"}[fn]
        return f"{x}.{fn}({arg})"
    if fn == "bernoulli":
        x, _ = _t(g, lambda t: t.dtype in FLOAT)
        return f"{v} = torch.bernoulli({x}.sigmoid())" if x else None
    if fn == "dropout":
        x, _ = _t(g, lambda t: t.dtype in FLOAT)
        return f"{v} = F.dropout({x}, 0.5, training=True)" if x else None
    if fn == "dropout_inplace":
        x, _ = _dst(g)
        return f"F.dropout({x}, 0.5, training=True, inplace=True)"
    if fn == "normal":
        x, _ = _t(g, lambda t: t.dtype in FLOAT)
        return f"{v} = torch.normal({x}, 1.0)" if x else None
    x, t = _t(g, lambda t: t.dtype in FLOAT and t.dim() in (1, 2) and t.numel() > 0)
    if x is None:
        return None
    return f"{v} = torch.multinomial({x}.abs() + 0.1, {rng.randint(1, 3)}, replacement=True)"


# Functional ops ----------------------------------------------------------------------------

def fn_pointwise(g):
    x, t = _t(g)
    rng = g.rng
    v = g.new()
    form = weighted(rng, [("binop", 5), ("unary", 3), ("where", 1), ("clone", 2), ("cast", 1),
                          ("masked_fill", 1)])
    if form == "binop":
        op = rng.choice(["+", "-", "*", "/", "@"])
        if op == "@":
            y = g.pick(lambda u: u.dim() >= 1 and t.dim() >= 1 and u.size(0) == t.size(-1)
                       and u.dtype == t.dtype)
            if y is None:
                return None
            return f"{v} = {x} @ {y}"
        return f"{v} = {x} {op} {g.operand(tuple(t.shape), t.dtype)}"
    if form == "unary":
        fn = rng.choice(["exp", "sin", "abs", "neg", "sigmoid", "sqrt", "relu", "square",
                         "flip(0)" if t.dim() else "abs", "roll(1)", "cumsum(0)" if t.dim() else "abs",
                         "tril()" if t.dim() >= 2 else "abs"])
        if "(" not in fn:
            fn += "()"
        return f"{v} = {x}.{fn}"
    if form == "where":
        y = g.operand(tuple(t.shape), t.dtype, allow_scalar=False) or x
        return f"{v} = torch.where({g.mask_expr(tuple(t.shape))}, {x}, {y})"
    if form == "clone":
        return f"{v} = {x}.clone()"
    if form == "cast":
        return f"{v} = {x}.to({DTYPE_NAMES[weighted(rng, DTYPES)]})"
    return f"{v} = {x}.masked_fill({g.mask_expr(tuple(t.shape))}, {scalar_for(rng, t.dtype)})"


def fn_reduce(g):
    x, t = _t(g, lambda t: t.dtype != torch.bool)
    if x is None:
        return None
    rng = g.rng
    v = g.new()
    fn = rng.choice(["sum", "mean", "amax", "prod", "std", "norm"])
    if t.dim() == 0 or rng.random() < 0.3:
        return f"{v} = {x}.{fn}()"
    return f"{v} = {x}.{fn}({g.dim(t)})"


def fn_structural(g):
    x, t = _t(g)
    rng = g.rng
    v = g.new()
    form = rng.choice(["cat", "stack", "index", "mask_index", "repeat", "scatter_fn",
                       "diag_scatter", "slice_scatter", "select_scatter", "index_put"])
    if form in ("cat", "stack"):
        y = g.pick(lambda u: u.dtype == t.dtype and u.shape == t.shape)
        d = rng.randint(0, t.dim()) if form == "stack" else (g.dim(t) if t.dim() else 0)
        return f"{v} = torch.{form}([{x}, {y}], {d})"
    if form == "index" and t.dim() and t.size(0):
        idx, _ = g.index_lit(t.size(0))
        return f"{v} = {x}[{idx}]"
    if form == "mask_index":
        return f"{v} = {x}[{g.mask_expr(tuple(t.shape))}]"
    if form == "repeat":
        return f"{v} = {x}.repeat({shp([rng.randint(1, 2) for _ in range(max(1, t.dim()))])})"
    if form == "diag_scatter" and t.dim() >= 2:
        n = t.diagonal().numel()
        src = g.pick(lambda u: u.shape == (n,) and u.dtype == t.dtype) or ctor(rng, t.dtype, [n])
        return f"{v} = {x}.diagonal_scatter({src})"
    if form == "slice_scatter" and t.dim() >= 1:
        d = rng.randrange(t.dim())
        a = rng.randint(0, t.size(d))
        shape = list(t.shape)
        shape[d] = t.size(d) - a
        src = g.pick(lambda u: list(u.shape) == shape and u.dtype == t.dtype) or \
            ctor(rng, t.dtype, shape)
        return f"{v} = {x}.slice_scatter({src}, {d}, {a})"
    if form == "select_scatter" and t.dim() >= 1 and t.numel():
        d = rng.randrange(t.dim())
        shape = list(t.shape[:d] + t.shape[d + 1:])
        src = g.pick(lambda u: list(u.shape) == shape and u.dtype == t.dtype) or \
            ctor(rng, t.dtype, shape)
        return f"{v} = {x}.select_scatter({src}, {d}, {rng.randrange(t.size(d))})"
    if form == "index_put" and t.dim() and t.size(0):
        idx, n = g.index_lit(t.size(0))
        return f"{v} = {x}.index_put(({idx},), torch.tensor({scalar_for(rng, t.dtype)}, dtype={DTYPE_NAMES.get(t.dtype, 'torch.float32')}))"
    if form == "scatter_fn" and t.dim() and t.numel():
        d = rng.randrange(t.dim())
        ishape = [rng.randint(1, s) for s in t.shape]
        vals = [rng.randrange(t.size(d)) for _ in range(math.prod(ishape))]
        idx = f"torch.tensor({lit_list(vals, ishape)}, dtype=torch.long)"
        return f"{v} = {x}.scatter({d}, {idx}, {scalar_for(rng, t.dtype)})"
    return f"{v} = {x}.clone()"


