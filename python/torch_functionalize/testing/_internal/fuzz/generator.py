"""Random straight-line programs for tools/fuzz.py: the generator. Programs (program.py) are
built one statement at a time on live eager tensors, so the generator knows every variable's shape,
dtype and strides, and a statement eager rejects is dropped (and counted) before it is kept. It
draws from the op generators of view_ops.py, write_ops.py and value_ops.py (the OPS table below).
Generation depends only on the program seed and torch's eager.
"""
from __future__ import annotations

import math
import random
import re
import warnings

import torch

from . import value_ops as values
from . import view_ops as views
from . import write_ops as writes
from .program import (
    DTYPES, MAX_NUMEL, Program, Stmt, compile_program, ctor, lit_list, random_shape, scalar_for,
    shp, weighted,
)

# ---------------------------------------------------------------------------------------------
# Inputs: 1-3 tensors, independent or views of one another (or of a base f never sees).


def alias_expr(rng, name, t):
    """An expression for a view of `t` (named `name`), valid for its shape and dtype."""
    nd = t.dim()
    opts = [(f"{name}", 3), (f"{name}.view(-1)", 2)]
    if nd >= 1 and t.size(0) > 1:
        opts += [(f"{name}[1:]", 3), (f"{name}[::2]", 2), (f"{name}[:{t.size(0) - 1}]", 2),
                 (f"{name}.select(0, {rng.randrange(t.size(0))})", 1),
                 (f"{name}.narrow(0, 1, {t.size(0) - 1})", 1)]
    if nd == 2:
        opts += [(f"{name}.t()", 4), (f"{name}.diagonal()", 3), (f"{name}[:, 1:]", 2)]
    if nd >= 2:
        opts += [(f"{name}.transpose(0, {nd - 1})", 2), (f"{name}.unsqueeze(1)", 1)]
    if nd >= 1 and t.numel() >= 3:
        n = t.numel()
        opts.append((f"{name}.as_strided(({n // 2}, 2), (1, {rng.choice([1, 2])}), 0)", 2))
        opts.append((f"{name}.as_strided(({n - 1},), (1,), 1)", 1))
    if t.dtype == torch.float32:
        opts.append((f"{name}.view(torch.int32)", 3))
    if t.dtype == torch.int64:
        opts.append((f"{name}.view(torch.float64)", 1))
    if t.is_complex():
        opts += [(f"{name}.real", 2), (f"torch.view_as_real({name})", 2)]
    return weighted(rng, opts)


def _valid_alias(rng, name, t, ns, live):
    for _ in range(10):
        expr = alias_expr(rng, name, t)
        try:
            eval(expr, ns, live)
            return expr
        except Exception:
            pass
    return name


def gen_inputs(rng):
    n = weighted(rng, [(1, 4), (2, 4), (3, 2)])
    bases, inputs, live = [], [], {}
    ns = {"torch": torch}
    for i in range(n):
        form = weighted(rng, [("fresh", 5), ("alias", 5 if inputs else 0), ("hidden", 2),
                              ("strided", 2)])
        if form == "alias":
            # A view of an earlier input, or of that input's base (siblings over a hidden base).
            j = rng.randrange(len(inputs))
            src, t = inputs[j], live[f"_in{j}"]
            base = re.search(r"b\d+", src).group(0)  # src may start "(" or "torch."
            if src != base and rng.random() < 0.4:
                src, t = base, live[base]
            inputs.append(_valid_alias(rng, src if src.isidentifier() else f"({src})", t, ns, live))
            live[f"_in{i}"] = eval(inputs[-1], ns, live)
            continue
        dtype = weighted(rng, DTYPES)
        shape = random_shape(rng)
        name = f"b{len(bases)}"
        bases.append(f"{name} = {ctor(rng, dtype, shape)}")
        live[name] = eval(bases[-1].split(" = ", 1)[1], ns, live)
        t = live[name]
        if form == "fresh":
            inputs.append(name)
        elif form == "hidden":
            # A view of a base f does not see: writes through it must reach the base.
            inputs.append(_valid_alias(rng, name, t, ns, live))
        else:
            # A non-contiguous input whose base is hidden (transposed, sliced, expanded).
            opts = [(f"{name}[..., ::2]", 2)] if t.dim() else [(name, 1)]
            if t.dim() >= 2:
                opts += [(f"{name}.transpose(0, 1)", 3), (f"{name}[1:, ::2]", 2)]
            if t.dim() >= 1 and t.size(-1) == 1:
                opts.append((f"{name}.expand({shp(list(t.shape[:-1]) + [3])})", 1))
            inputs.append(weighted(rng, opts))
        live[f"_in{i}"] = eval(inputs[-1], ns, live)
    return bases, inputs


# ---------------------------------------------------------------------------------------------
# The generator


class Generator:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        rng = self.rng
        bases, inputs = gen_inputs(rng)
        self.prog = Program(seed=seed, input_seed=rng.randrange(1 << 30),
                            rng_seed=rng.randrange(1 << 30), bases=bases, inputs=inputs,
                            stmts=[], returns=[])
        self.rejected = 0
        self.counter = 0
        self.rebuild()

    # -- live state ----------------------------------------------------------------------------
    def rebuild(self):
        """Re-runs make_inputs and the kept statements: the live tensors of the program so far."""
        prog = self.prog
        make_inputs, _ = compile_program(prog.replace(stmts=[], returns=prog.params()))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = make_inputs()
            self.ns = {"torch": torch, "F": torch.nn.functional}
            self.ns.update(zip(prog.params(), args))
            self.input_ptrs = {t.untyped_storage().data_ptr() for t in args}
            torch.manual_seed(prog.rng_seed)
            for s in prog.stmts:
                exec(s.code, self.ns)

    def try_stmt(self, stmt: Stmt) -> bool:
        before = {k for k in self.ns}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(stmt.code, self.ns)
            for k, v in self.ns.items():
                if k[:1] in "xv" and k[1:2].isdigit():
                    if not isinstance(v, torch.Tensor) or v.numel() > MAX_NUMEL:
                        raise ValueError("too large")
                    if v.untyped_storage().nbytes() > 16 * MAX_NUMEL:
                        raise ValueError("storage too large")
            new = [k for k in self.ns if k not in before and not k.startswith("__")]
            if any(not (k[:1] == "v" and k[1:].isdigit()) for k in new):
                raise ValueError(f"stray names {new}")
            return True
        except Exception:
            self.rejected += 1
            self.rebuild()
            return False

    def tensors(self, pred=None):
        out = []
        for k, v in self.ns.items():
            if k[:1] in "xv" and k[1:].isdigit() and isinstance(v, torch.Tensor):
                if pred is None or pred(v):
                    out.append(k)
        return out

    def pick(self, pred=None, prefer=None):
        names = self.tensors(pred)
        if not names:
            return None
        if prefer is not None:
            good = [n for n in names if prefer(self.ns[n])]
            if good and self.rng.random() < 0.7:
                return self.rng.choice(good)
        return self.rng.choice(names)

    def new(self):
        self.counter += 1
        return f"v{self.counter - 1}"

    def input_alias(self, t):
        return t.untyped_storage().data_ptr() in self.input_ptrs

    # -- building blocks -----------------------------------------------------------------------
    def dim(self, t, extra=0):
        nd = t.dim() + extra
        if nd == 0:
            return None
        d = self.rng.randrange(nd)
        return d - nd if self.rng.random() < 0.2 else d

    def operand(self, target_shape, dtype=None, allow_scalar=True):
        """A scalar literal or a variable that broadcasts to target_shape (same storage welcome)."""
        rng = self.rng

        def fits(t):
            if t.dim() > len(target_shape):
                return False
            return all(a == b or a == 1 for a, b in zip(reversed(t.shape), reversed(target_shape)))

        if allow_scalar and rng.random() < 0.3:
            return scalar_for(rng, dtype or torch.float32)
        name = self.pick(fits, prefer=(lambda t: t.dtype == dtype) if dtype else None)
        if name is None:
            return scalar_for(rng, dtype or torch.float32) if allow_scalar else None
        return name

    def index_lit(self, size, n=None, unique=False):
        rng = self.rng
        n = n if n is not None else rng.randint(1, max(1, min(size, 4)))
        if unique:
            vals = rng.sample(range(size), min(n, size))
        else:
            vals = [rng.randrange(size) for _ in range(n)] if size else []
        if rng.random() < 0.15 and size:
            vals = [v - size for v in vals]  # negative indices
        return f"torch.tensor({vals}, dtype=torch.long)", len(vals)

    def mask_expr(self, shape):
        """A bool mask that broadcasts to shape: a literal or a comparison of a variable."""
        rng = self.rng
        if rng.random() < 0.5 or not shape:
            n = math.prod(shape)
            vals = [rng.random() < 0.5 for _ in range(n)]
            return f"torch.tensor({lit_list(vals, list(shape))}, dtype=torch.bool)"
        name = self.operand(shape, allow_scalar=False)
        if name is None:
            return f"torch.ones({shp(shape)}, dtype=torch.bool)"
        t = self.ns[name]
        if t.dtype == torch.bool:
            return name
        if t.is_complex():
            return f"({name}.real > 0)"
        return f"({name} > 0)"

    def out_target(self, dtype=None, shape=None, avoid=()):
        """out=: an existing variable (any size: eager resizes), preferably of dtype and not
        sharing storage with the op's operands (eager rejects most partial overlaps)."""
        rng = self.rng
        ptrs = {self.ns[a].untyped_storage().data_ptr() for a in avoid if a in self.ns}
        name = self.pick(prefer=lambda t: (dtype is None or t.dtype == dtype)
                         and t.untyped_storage().data_ptr() not in ptrs
                         and (shape is None or tuple(t.shape) == tuple(shape) or t.numel() == 0
                              or rng.random() < 0.3))
        return name

    def source(self, x, pred):
        """A variable for pred, preferably not sharing storage with x (a source of x's write)."""
        ptr = self.ns[x].untyped_storage().data_ptr()
        return self.pick(pred, prefer=lambda u: u.untyped_storage().data_ptr() != ptr)

    # -- statement generation ------------------------------------------------------------------
    def gen_stmt(self):
        rng = self.rng
        cat = weighted(rng, [("view", 30), ("inplace", 26), ("out", 10), ("meta", 6),
                             ("factory", 6), ("random", 6), ("functional", 12), ("alias_write", 6)])
        table = OPS[cat]
        label, fn = weighted(rng, [((lbl, fn), w) for lbl, w, fn in table])
        code = fn(self)
        if code is None:
            return None
        return Stmt(label, code)

    def choose_returns(self):
        rng = self.rng
        names = self.tensors()
        k = min(len(names), weighted(rng, [(1, 4), (2, 4), (3, 2)]))
        viewish = [n for n in names if self.input_alias(self.ns[n]) and not n.startswith("x")]
        chosen = []
        if viewish and rng.random() < 0.5:
            chosen.append(rng.choice(viewish))
        pool = [n for n in names if n.startswith("v")] or names
        while len(chosen) < k:
            n = rng.choice(pool if rng.random() < 0.7 else names)
            if n not in chosen:
                chosen.append(n)
            elif len(set(names)) <= len(chosen):
                break
        return chosen


def generate(seed: int, max_stmts: int = 12) -> tuple[Program, int]:
    """(program, statements eager rejected while generating) for a program seed."""
    g = Generator(seed)
    rng = g.rng
    n = weighted(rng, [(1, 1), (2, 2), (3, 3), (4, 4), (5, 4), (6, 4), (8, 3), (10, 2),
                       (max_stmts, 1)])
    attempts = 0
    while len(g.prog.stmts) < n and attempts < 8 * n:
        attempts += 1
        try:
            stmt = g.gen_stmt()
        except Exception:  # a generator could not build this op for these tensors
            stmt = None
        if stmt is None:
            continue
        if g.try_stmt(stmt):
            g.prog.stmts.append(stmt)
    g.prog.returns = g.choose_returns()
    return g.prog, g.rejected




OPS = {
    "view": [
        ("view", 4, views.v_view), ("view_flat", 2, views.v_view_flat),
        ("reshape", 2, views.v_reshape), ("select", 3, views.v_select),
        ("index_int", 2, views.v_index_int), ("slice", 5, views.v_slice),
        ("narrow", 2, views.v_narrow), ("diagonal", 3, views.v_diagonal), ("t", 3, views.v_t),
        ("transpose", 3, views.v_transpose), ("mT", 1, views.v_mT), ("permute", 2, views.v_permute),
        ("movedim", 1, views.v_movedim), ("expand", 3, views.v_expand),
        ("expand_as", 1, views.v_expand_as), ("unsqueeze", 2, views.v_unsqueeze),
        ("squeeze", 2, views.v_squeeze), ("unfold", 3, views.v_unfold),
        ("unbind", 2, views.v_unbind), ("split", 2, views.v_split), ("chunk", 2, views.v_chunk),
        ("tensor_split", 1, views.v_tensor_split),
        ("split_with_sizes", 1, views.v_split_with_sizes), ("as_strided", 3, views.v_as_strided),
        ("view_dtype", 2, views.v_view_dtype), ("view_as_real", 2, views.v_view_as_real),
        ("view_as_complex", 1, views.v_view_as_complex), ("real_imag", 2, views.v_real_imag),
        ("alias", 2, views.v_alias), ("flatten", 2, views.v_flatten),
        ("unflatten", 1, views.v_unflatten), ("maybe_alias", 3, views.v_maybe_alias),
    ],
    "inplace": [
        ("unary_", 5, writes.i_unary), ("fill_", 3, writes.i_fill), ("clamp_", 2, writes.i_clamp),
        ("binary_", 8, writes.i_binary), ("operator_", 3, writes.i_operator),
        ("addcmul_", 1, writes.i_addcmul), ("copy_", 4, writes.i_copy),
        ("masked_fill_", 2, writes.i_masked_fill), ("index_put_", 3, writes.i_index_put),
        ("setitem", 5, writes.i_setitem), ("index_family_", 3, writes.i_index_family),
        ("scatter_", 3, writes.i_scatter), ("put_", 1, writes.i_put), ("tri_", 1, writes.i_tri),
        ("cumsum_", 1, writes.i_cumsum), ("addmm_", 1, writes.i_addmm),
        ("foreach_", 1, writes.i_foreach), ("set_", 0.15, writes.i_set),
    ],
    "alias_write": [("cross_alias_write", 1, writes.a_cross)],
    "out": [
        ("out_pointwise", 4, writes.o_pointwise), ("out_reduction", 2, writes.o_reduction),
        ("out_matmul", 1, writes.o_matmul), ("out_cat", 1, writes.o_cat),
        ("out_index", 1, writes.o_index), ("out_factory", 1, writes.o_factory),
        ("out_into_view", 2, writes.o_into_view),
    ],
    "meta": [
        ("t_", 2, writes.m_t), ("transpose_", 2, writes.m_transpose),
        ("squeeze_", 2, writes.m_squeeze), ("resize_", 3, writes.m_resize),
        ("as_strided_", 1, writes.m_as_strided),
    ],
    "factory": [("factory", 1, values.f_factory)],
    "random": [("random", 1, values.r_random)],
    "functional": [
        ("pointwise", 4, values.fn_pointwise), ("reduce", 1, values.fn_reduce),
        ("structural", 2, values.fn_structural),
    ],
}
