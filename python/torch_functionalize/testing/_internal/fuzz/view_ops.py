"""View op generators of the fuzzer: each takes the Generator (generator.py) and returns one
line of code making a view of a live variable, or None when none fits.
"""
from __future__ import annotations

import torch

from .program import (
    DTYPES, DTYPE_NAMES, FLOAT, SAME_SIZE, factorize, pick_tensor as _t, shp, weighted,
)


# Views --------------------------------------------------------------------------------------

def v_view(g):
    x, t = _t(g)
    shape = factorize(g.rng, t.numel())
    if shape and g.rng.random() < 0.3:
        shape[g.rng.randrange(len(shape))] = -1
    return f"{g.new()} = {x}.view({shp(shape)})"


def v_view_flat(g):
    x, _ = _t(g)
    return f"{g.new()} = {x}.view(-1)"


def v_reshape(g):
    x, t = _t(g)
    return f"{g.new()} = {x}.reshape({shp(factorize(g.rng, t.numel()))})"


def v_select(g):
    x, t = _t(g, lambda t: t.dim() > 0 and t.numel() > 0)
    if x is None:
        return None
    d = g.dim(t)
    i = g.rng.randrange(-t.size(d), t.size(d))
    return f"{g.new()} = {x}.select({d}, {i})"


def v_index_int(g):
    x, t = _t(g, lambda t: t.dim() > 0 and t.numel() > 0)
    if x is None:
        return None
    d = g.rng.randrange(t.dim())
    i = g.rng.randrange(t.size(d))
    return f"{g.new()} = {x}[{', '.join([':'] * d + [str(i)])}]"


def v_slice(g):
    x, t = _t(g, lambda t: t.dim() > 0)
    if x is None:
        return None
    rng = g.rng
    d = rng.randrange(t.dim())
    n = t.size(d)
    a = rng.randint(0, max(0, n - 1))
    b = rng.choice([None, rng.randint(a, n)])
    s = weighted(rng, [(1, 4), (2, 3), (3, 1)])
    sl = f"{a}:{'' if b is None else b}" + (f":{s}" if s != 1 else "")
    return f"{g.new()} = {x}[{', '.join([':'] * d + [sl])}]"


def v_narrow(g):
    x, t = _t(g, lambda t: t.dim() > 0)
    if x is None:
        return None
    d = g.dim(t)
    n = t.size(d)
    start = g.rng.randint(0, n)
    return f"{g.new()} = {x}.narrow({d}, {start}, {g.rng.randint(0, n - start)})"


def v_diagonal(g):
    x, t = _t(g, lambda t: t.dim() >= 2)
    if x is None:
        return None
    d1, d2 = g.rng.sample(range(t.dim()), 2)
    off = g.rng.randint(-1, 1)
    return f"{g.new()} = {x}.diagonal({off}, {d1}, {d2})"


def v_t(g):
    x, _ = _t(g, lambda t: t.dim() <= 2)
    if x is None:
        return None
    return f"{g.new()} = {x}.{g.rng.choice(['t()', 'T'])}" if g.rng.random() < 0.3 else \
        f"{g.new()} = {x}.t()"


def v_transpose(g):
    x, t = _t(g, lambda t: t.dim() >= 1)
    if x is None:
        return None
    d1, d2 = g.dim(t), g.dim(t)
    fn = g.rng.choice(["transpose", "transpose", "swapaxes", "swapdims"])
    return f"{g.new()} = {x}.{fn}({d1}, {d2})"


def v_mT(g):
    x, _ = _t(g, lambda t: t.dim() >= 2)
    if x is None:
        return None
    return f"{g.new()} = {x}.{g.rng.choice(['mT', 'mH', 'adjoint()'])}"


def v_permute(g):
    x, t = _t(g)
    perm = list(range(t.dim()))
    g.rng.shuffle(perm)
    return f"{g.new()} = {x}.permute({shp(perm)})"


def v_movedim(g):
    x, t = _t(g, lambda t: t.dim() >= 1)
    if x is None:
        return None
    return f"{g.new()} = {x}.movedim({g.dim(t)}, {g.dim(t)})"


def v_expand(g):
    x, t = _t(g)
    rng = g.rng
    shape = [rng.choice([s, 2, 3]) if s == 1 else (s if rng.random() < 0.8 else -1)
             for s in t.shape]
    if rng.random() < 0.4 or not shape:
        shape = [rng.randint(1, 3)] + shape
    return f"{g.new()} = {x}.expand({shp(shape)})"


def v_expand_as(g):
    x, t = _t(g)
    y = g.pick(lambda u: u.dim() >= t.dim() and all(
        a == b or a == 1 for a, b in zip(reversed(t.shape), reversed(u.shape))))
    return f"{g.new()} = {x}.expand_as({y})"


def v_unsqueeze(g):
    x, t = _t(g)
    d = g.rng.randint(-t.dim() - 1, t.dim())
    return f"{g.new()} = {x}.unsqueeze({d})" if g.rng.random() < 0.8 else f"{g.new()} = {x}[None]"


def v_squeeze(g):
    x, t = _t(g, prefer=lambda t: 1 in t.shape)
    ones = [i for i, s in enumerate(t.shape) if s == 1]
    form = g.rng.random()
    if form < 0.3 or not ones:
        return f"{g.new()} = {x}.squeeze()"
    if form < 0.8 or len(ones) < 2:
        return f"{g.new()} = {x}.squeeze({g.rng.choice(ones)})"
    return f"{g.new()} = {x}.squeeze({shp(ones[:2])})"


def v_unfold(g):
    x, t = _t(g, lambda t: t.dim() >= 1 and t.numel() > 0)
    if x is None:
        return None
    d = g.dim(t)
    size = g.rng.randint(1, t.size(d))
    step = g.rng.randint(1, 3)
    return f"{g.new()} = {x}.unfold({d}, {size}, {step})"


def _pick_parts(g, call, count):
    """v = call[k], or two parts of the same call on one line."""
    rng = g.rng
    if count <= 0:
        return None
    if count >= 2 and rng.random() < 0.3:
        a, b = rng.sample(range(count), 2)
        n1, n2 = g.new(), g.new()
        return f"{n1}, {n2} = (lambda p: (p[{a}], p[{b}]))({call})"
    return f"{g.new()} = {call}[{rng.randrange(count)}]"


def v_unbind(g):
    x, t = _t(g, lambda t: t.dim() >= 1 and t.numel() > 0)
    if x is None:
        return None
    d = g.dim(t)
    return _pick_parts(g, f"{x}.unbind({d})", t.size(d))


def v_split(g):
    x, t = _t(g, lambda t: t.dim() >= 1)
    if x is None:
        return None
    d = g.dim(t)
    n = t.size(d)
    size = g.rng.randint(1, max(1, n))
    fn = g.rng.choice(["split", "split", "unsafe_split"])
    return _pick_parts(g, f"{x}.{fn}({size}, {d})", max(1, -(-n // size)))


def v_chunk(g):
    x, t = _t(g, lambda t: t.dim() >= 1)
    if x is None:
        return None
    d = g.dim(t)
    k = g.rng.randint(1, 4)
    fn = g.rng.choice(["chunk", "chunk", "unsafe_chunk"])
    n = t.size(d)
    count = len(torch.empty(n).chunk(k)) if n else 1
    return _pick_parts(g, f"{x}.{fn}({k}, {d})", count)


def v_tensor_split(g):
    x, t = _t(g, lambda t: t.dim() >= 1)
    if x is None:
        return None
    d = g.dim(t)
    n = t.size(d)
    if g.rng.random() < 0.5:
        k = g.rng.randint(1, 4)
        return _pick_parts(g, f"{x}.tensor_split({k}, {d})", k)
    idx = sorted(g.rng.randint(0, n) for _ in range(g.rng.randint(1, 3)))
    return _pick_parts(g, f"{x}.tensor_split({idx}, {d})", len(idx) + 1)


def v_split_with_sizes(g):
    x, t = _t(g, lambda t: t.dim() >= 1)
    if x is None:
        return None
    d = g.dim(t)
    n = t.size(d)
    sizes, left = [], n
    while left > 0:
        s = g.rng.randint(1, left)
        sizes.append(s)
        left -= s
    if not sizes:
        sizes = [0]
    fn = g.rng.choice(["split_with_sizes", "split_with_sizes", "unsafe_split_with_sizes"])
    return _pick_parts(g, f"{x}.{fn}({sizes}, {d})", len(sizes))


def v_as_strided(g):
    x, t = _t(g)
    rng = g.rng
    n = t.untyped_storage().nbytes() // t.element_size()
    if n == 0:
        return None
    nd = rng.randint(1, 3)
    size = [rng.randint(1, 4) for _ in range(nd)]
    stride = [rng.choice([0, 1, 1, 2, 3, 4]) for _ in range(nd)]
    extent = sum((s - 1) * st for s, st in zip(size, stride))
    if extent >= n:
        return None
    off = rng.randint(0, n - 1 - extent)
    return f"{g.new()} = {x}.as_strided({shp(size)}, {shp(stride)}, {off})"


def v_view_dtype(g):
    x, t = _t(g, lambda t: t.dtype != torch.bool)
    if x is None:
        return None
    rng = g.rng
    size = t.element_size()
    if rng.random() < 0.75:
        choices = [d for d in SAME_SIZE.get(size, []) if d != t.dtype] or SAME_SIZE.get(size, [])
    else:
        choices = SAME_SIZE[rng.choice([s for s in SAME_SIZE if s != size and s <= 8])]
    dt = rng.choice(choices)
    return f"{g.new()} = {x}.view({DTYPE_NAMES[dt]})"


def v_view_as_real(g):
    x, t = _t(g, lambda t: t.is_complex())
    if x is None:
        return None
    return f"{g.new()} = torch.view_as_real({x})"


def v_view_as_complex(g):
    x, t = _t(g, lambda t: t.dtype in FLOAT and t.dim() >= 1, prefer=lambda t: t.size(-1) == 2)
    if x is None:
        return None
    return f"{g.new()} = torch.view_as_complex({x})"


def v_real_imag(g):
    x, t = _t(g, prefer=lambda t: t.is_complex())
    fn = g.rng.choice(["real", "imag", "conj()"]) if t.is_complex() else "real"
    return f"{g.new()} = {x}.{fn}"


def v_alias(g):
    x, t = _t(g)
    rng = g.rng
    form = weighted(rng, [("alias", 3), ("view_as", 2), ("detach", 1), ("ellipsis", 1)])
    if form == "alias":
        return f"{g.new()} = torch.ops.aten.alias({x})"
    if form == "view_as":
        y = g.pick(lambda u: u.numel() == t.numel())
        return f"{g.new()} = {x}.view_as({y})"
    if form == "detach":
        return f"{g.new()} = {x}.detach()"
    return f"{g.new()} = {x}[...]"


def v_flatten(g):
    x, t = _t(g)
    if t.dim() == 0:
        return f"{g.new()} = {x}.flatten()"
    s = g.rng.randrange(t.dim())
    e = g.rng.randint(s, t.dim() - 1)
    return f"{g.new()} = {x}.flatten({s}, {e})"


def v_unflatten(g):
    x, t = _t(g, lambda t: t.dim() >= 1)
    if x is None:
        return None
    d = g.dim(t)
    sizes = factorize(g.rng, t.size(d), 3)
    if g.rng.random() < 0.3 and t.size(d):
        sizes[g.rng.randrange(len(sizes))] = -1
    return f"{g.new()} = {x}.unflatten({d}, {shp(sizes)})"


def v_maybe_alias(g):
    # Ops that return self when nothing needs to change, a copy otherwise.
    x, t = _t(g)
    rng = g.rng
    form = rng.choice(["contiguous()", "to(dtype)", "float()", "reshape_as", "flatten()",
                       "type_as"])
    if form == "to(dtype)":
        dt = t.dtype if rng.random() < 0.6 else weighted(rng, DTYPES)
        return f"{g.new()} = {x}.to({DTYPE_NAMES[dt]})"
    if form == "reshape_as":
        y = g.pick(lambda u: u.numel() == t.numel())
        return f"{g.new()} = {x}.reshape_as({y})"
    if form == "type_as":
        y = g.pick()
        return f"{g.new()} = {x}.type_as({y})"
    return f"{g.new()} = {x}.{form}"


