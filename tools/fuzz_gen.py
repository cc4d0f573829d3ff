"""Random straight-line programs for tools/fuzz.py: the program model (make_inputs + f as source
text) and the generator. Programs are built one statement at a time on live eager tensors, so the
generator knows every variable's shape, dtype and strides, and a statement eager rejects is dropped
(and counted) before it is kept. Generation depends only on the program seed and torch's eager.
"""
from __future__ import annotations

import dataclasses
import math
import random
import re
import warnings

import torch
import torch.nn.functional as F  # noqa: F401  (programs use F.*)

MAX_NUMEL = 256  # no tensor of a program grows past this (keeps a program a few ms)

FLOAT = (torch.float32, torch.float64)
DTYPES = [  # (dtype, weight) of inputs and factories
    (torch.float32, 60), (torch.float64, 6), (torch.int64, 10), (torch.int32, 4),
    (torch.bool, 4), (torch.complex64, 8), (torch.bfloat16, 2),
]
DTYPE_NAMES = {d: "torch." + str(d).split(".")[1] for d, _ in DTYPES}
DTYPE_NAMES.update({torch.int16: "torch.int16", torch.uint8: "torch.uint8",
                    torch.float16: "torch.float16", torch.complex128: "torch.complex128"})
# Reinterpretations view(dtype) may pick, by element size.
SAME_SIZE = {4: [torch.float32, torch.int32], 8: [torch.float64, torch.int64, torch.complex64],
             2: [torch.int16, torch.bfloat16, torch.float16], 1: [torch.uint8, torch.bool],
             16: [torch.complex128]}


@dataclasses.dataclass
class Stmt:
    label: str  # the op this statement exercises: class keys and reports use it
    code: str   # one line of Python (several assignments joined by "; " at most)


@dataclasses.dataclass
class Program:
    seed: int
    input_seed: int
    rng_seed: int
    bases: list[str]    # lines of make_inputs that build the base tensors
    inputs: list[str]   # one expression per input of f, over the bases (aliasing views)
    stmts: list[Stmt]
    returns: list[str]  # names of returned tensors
    names: list[str] | None = None  # parameter names (default x0, x1, ...; shrinking drops some)

    def params(self):
        return self.names if self.names is not None else [f"x{i}" for i in range(len(self.inputs))]

    def make_inputs_source(self):
        body = [f"    torch.manual_seed({self.input_seed})"] + ["    " + b for b in self.bases]
        ret = ", ".join(self.inputs) + ("," if len(self.inputs) == 1 else "")
        return "def make_inputs():\n" + "\n".join(body) + f"\n    return ({ret})\n"

    def f_source(self):
        lines = [f"def f({', '.join(self.params())}):", f"    torch.manual_seed({self.rng_seed})"]
        lines += ["    " + s.code for s in self.stmts]
        ret = ", ".join(self.returns) + ("," if len(self.returns) == 1 else "")
        lines.append(f"    return ({ret})")
        return "\n".join(lines) + "\n"

    def source(self):
        return self.make_inputs_source() + "\n\n" + self.f_source()

    # First line of f's statements in source(): tracebacks map back to statement indices.
    def stmt_of_line(self, lineno):
        first = self.make_inputs_source().count("\n") + 2 + 2 + 1  # blank lines, def, seed
        k = lineno - first
        return k if 0 <= k < len(self.stmts) else None

    def to_json(self):
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(d):
        d = dict(d)
        d["stmts"] = [Stmt(**s) for s in d["stmts"]]
        return Program(**d)

    def replace(self, **kw):
        return dataclasses.replace(self, **kw)


PRELUDE = "import torch\nimport torch.nn.functional as F\n"


def compile_program(prog: Program):
    """(make_inputs, f) compiled from the program's source; tracebacks name '<fuzz>'."""
    ns = {"torch": torch, "F": torch.nn.functional}
    exec(compile(prog.source(), "<fuzz>", "exec"), ns)
    return ns["make_inputs"], ns["f"]


# ---------------------------------------------------------------------------------------------
# Small code-building helpers


def shp(shape):
    shape = tuple(shape)
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def lit_list(values, shape):
    if not shape:
        return repr(values[0])
    step = len(values) // shape[0] if shape[0] else 0
    return "[" + ", ".join(lit_list(values[i * step:(i + 1) * step], shape[1:])
                           for i in range(shape[0])) + "]"


def factorize(rng, n, max_dims=4):
    """A random shape with numel n (n >= 0), 1 to max_dims dims, sometimes with 1s."""
    if n == 0:
        dims = [rng.randint(1, 3) for _ in range(rng.randint(0, 2))]
        dims.insert(rng.randint(0, len(dims)), 0)
        return dims
    primes, m, p = [], n, 2
    while m > 1:
        while m % p == 0:
            primes.append(p)
            m //= p
        p += 1
    k = rng.randint(1, max(1, min(max_dims, len(primes) or 1)))
    dims = [1] * k
    for q in primes:
        dims[rng.randrange(k)] *= q
    if rng.random() < 0.2 and len(dims) < max_dims:
        dims.insert(rng.randint(0, len(dims)), 1)
    return dims


def weighted(rng, pairs):
    total = sum(w for _, w in pairs)
    r = rng.uniform(0, total)
    for item, w in pairs:
        r -= w
        if r <= 0:
            return item
    return pairs[-1][0]


def scalar_for(rng, dtype):
    if dtype == torch.bool:
        return rng.choice(["True", "False"])
    if dtype.is_floating_point or dtype.is_complex:
        return rng.choice(["0.5", "-1.5", "2.0", "0.0", "3", "-0.25"])
    return str(rng.randint(-3, 4))


def random_shape(rng, max_dims=3):
    nd = weighted(rng, [(0, 1), (1, 4), (2, 6), (3, 3)][:max_dims + 1])
    dims = [weighted(rng, [(1, 2), (2, 4), (3, 4), (4, 3), (5, 2), (6, 1)]) for _ in range(nd)]
    if dims and rng.random() < 0.03:
        dims[rng.randrange(nd)] = 0
    return dims


def ctor(rng, dtype, shape):
    """Factory code for a deterministic (seeded) tensor of dtype and shape."""
    s = shp(shape)
    if dtype == torch.bool:
        return f"torch.rand({s}) > 0.5"
    if dtype.is_floating_point and dtype != torch.float32:
        return f"torch.randn({s}, dtype={DTYPE_NAMES[dtype]})"
    if dtype == torch.float32:
        return f"torch.randn({s})"
    if dtype.is_complex:
        return f"torch.randn({s}, dtype={DTYPE_NAMES[dtype]})"
    return f"torch.randint(-4, 5, {s}, dtype={DTYPE_NAMES[dtype]})"


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


# ---------------------------------------------------------------------------------------------
# Op generators: each takes the Generator and returns one line of code, or None.


def _t(g, pred=None, prefer=None):
    name = g.pick(pred, prefer)
    return (name, g.ns[name]) if name else (None, None)


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


# In-place ops -------------------------------------------------------------------------------

UNARY_INPLACE = ["abs_", "neg_", "sin_", "cos_", "exp_", "sqrt_", "floor_", "ceil_", "round_",
                 "trunc_", "sigmoid_", "tanh_", "relu_", "reciprocal_", "sign_", "zero_", "frac_",
                 "log1p_", "square_", "nan_to_num_", "logical_not_", "bitwise_not_", "detach_"]
BINARY_INPLACE = [("add_", 6), ("sub_", 4), ("mul_", 5), ("div_", 3), ("pow_", 1), ("lerp_", 1),
                  ("atan2_", 1), ("fmod_", 1), ("remainder_", 1), ("copysign_", 1),
                  ("bitwise_and_", 1), ("bitwise_or_", 1), ("logical_and_", 1), ("maximum", 0),
                  ("hypot_", 1), ("clamp_min_", 1), ("clamp_max_", 1), ("floor_divide_", 1),
                  ("eq_", 1), ("lt_", 1)]


def _dst(g):
    # Writes go mostly to aliases of the inputs: the interesting case.
    return _t(g, prefer=g.input_alias)


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


OPS = {
    "view": [
        ("view", 4, v_view), ("view_flat", 2, v_view_flat), ("reshape", 2, v_reshape),
        ("select", 3, v_select), ("index_int", 2, v_index_int), ("slice", 5, v_slice),
        ("narrow", 2, v_narrow), ("diagonal", 3, v_diagonal), ("t", 3, v_t),
        ("transpose", 3, v_transpose), ("mT", 1, v_mT), ("permute", 2, v_permute),
        ("movedim", 1, v_movedim), ("expand", 3, v_expand), ("expand_as", 1, v_expand_as),
        ("unsqueeze", 2, v_unsqueeze), ("squeeze", 2, v_squeeze), ("unfold", 3, v_unfold),
        ("unbind", 2, v_unbind), ("split", 2, v_split), ("chunk", 2, v_chunk),
        ("tensor_split", 1, v_tensor_split), ("split_with_sizes", 1, v_split_with_sizes),
        ("as_strided", 3, v_as_strided), ("view_dtype", 2, v_view_dtype),
        ("view_as_real", 2, v_view_as_real), ("view_as_complex", 1, v_view_as_complex),
        ("real_imag", 2, v_real_imag), ("alias", 2, v_alias), ("flatten", 2, v_flatten),
        ("unflatten", 1, v_unflatten), ("maybe_alias", 3, v_maybe_alias),
    ],
    "inplace": [
        ("unary_", 5, i_unary), ("fill_", 3, i_fill), ("clamp_", 2, i_clamp),
        ("binary_", 8, i_binary), ("operator_", 3, i_operator), ("addcmul_", 1, i_addcmul),
        ("copy_", 4, i_copy), ("masked_fill_", 2, i_masked_fill), ("index_put_", 3, i_index_put),
        ("setitem", 5, i_setitem), ("index_family_", 3, i_index_family),
        ("scatter_", 3, i_scatter), ("put_", 1, i_put), ("tri_", 1, i_tri),
        ("cumsum_", 1, i_cumsum), ("addmm_", 1, i_addmm), ("foreach_", 1, i_foreach),
        ("set_", 0.15, i_set),
    ],
    "alias_write": [("cross_alias_write", 1, a_cross)],
    "out": [
        ("out_pointwise", 4, o_pointwise), ("out_reduction", 2, o_reduction),
        ("out_matmul", 1, o_matmul), ("out_cat", 1, o_cat), ("out_index", 1, o_index),
        ("out_factory", 1, o_factory), ("out_into_view", 2, o_into_view),
    ],
    "meta": [
        ("t_", 2, m_t), ("transpose_", 2, m_transpose), ("squeeze_", 2, m_squeeze),
        ("resize_", 3, m_resize), ("as_strided_", 1, m_as_strided),
    ],
    "factory": [("factory", 1, f_factory)],
    "random": [("random", 1, r_random)],
    "functional": [("pointwise", 4, fn_pointwise), ("reduce", 1, fn_reduce),
                   ("structural", 2, fn_structural)],
}
