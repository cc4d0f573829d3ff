"""The fuzz program model and the helpers that write its code: a program is make_inputs + f as
source text (Program, Stmt), compiled by compile_program; dtype tables, shape and literal helpers,
and the variable pickers shared by the input and op generators (generator.py, *_ops.py).
"""
from __future__ import annotations

import dataclasses

import torch

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


def pick_tensor(g, pred=None, prefer=None):
    """(name, live tensor) of a variable the generator `g` picks, or (None, None)."""
    name = g.pick(pred, prefer)
    return (name, g.ns[name]) if name else (None, None)


def pick_destination(g):
    """pick_tensor for the target of a write."""
    # Writes go mostly to aliases of the inputs: the interesting case.
    return pick_tensor(g, prefer=g.input_alias)
