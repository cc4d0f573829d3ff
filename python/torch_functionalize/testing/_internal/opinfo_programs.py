"""From an OpInfo entry to the small programs of the OpInfo differential sweep: the ops (op_db plus
view entries op_db lacks) and the dtypes swept for each, their samples (generated under a fixed seed
on DEVICE, flattened so that the tensor leaves become a program's inputs), the eager probe of the
plain op on a sample, and `build_program`, which places the op in a program (the placements of
opinfo_cases.PLACEMENTS). Cases, the runner and the fast subset are in opinfo_cases.py.
"""

import contextlib
import dataclasses
import functools
import os
import random
import warnings
from typing import Callable, Optional

import torch
import torch.utils._pytree as pytree

from torch_functionalize.testing import clone_inputs

# The device of every sample: TFZ_TEST_DEVICE, as for the rest of the tests (conftest.py);
# tools/opinfo_sweep.py --device sets it for its workers.
DEVICE = os.environ.get("TFZ_TEST_DEVICE", "cpu")
# Random OpInfos call torch.manual_seed(42) inside the op (wrapper_set_seed), which a make_fx
# graph does not record; seeding every run with the same 42 makes the graph replay comparable.
SEED = 42

# Dtype choice per op: the first supported float-like dtype and the first integer-or-bool one.
FLOAT_PREFERENCE = (torch.float32, torch.float64, torch.complex64, torch.bfloat16, torch.float16)
INT_PREFERENCE = (torch.int64, torch.int32, torch.bool, torch.int16, torch.int8, torch.uint8)


# ---------------------------------------------------------------------------------------------
# Ops: op_db plus view entries that op_db lacks.


def _view_extras():
    """OpInfos for view ops with no op_db entry (alias, detach, swapaxes, view(dtype), ...)."""
    from torch.testing._internal.common_dtype import all_types_and
    from torch.testing._internal.opinfo.core import OpInfo, SampleInput
    from torch.testing import make_tensor

    def tensors(device, dtype, requires_grad):
        make = functools.partial(
            make_tensor, device=device, dtype=dtype, requires_grad=requires_grad
        )
        yield make((3, 4))
        yield make((2, 3, 4), noncontiguous=True)
        yield make((4, 5)).t()

    def unary(op_info, device, dtype, requires_grad, **kwargs):
        for t in tensors(device, dtype, requires_grad):
            yield SampleInput(t)

    def swap(op_info, device, dtype, requires_grad, **kwargs):
        for t in tensors(device, dtype, requires_grad):
            yield SampleInput(t, args=(0, 1))
            yield SampleInput(t, args=(-1, 0))

    same_size = {
        torch.float32: torch.int32,
        torch.int64: torch.float64,
        torch.bool: torch.uint8,
        torch.int32: torch.float32,
    }

    def view_dtype(op_info, device, dtype, requires_grad, **kwargs):
        for t in tensors(device, dtype, requires_grad):
            yield SampleInput(t, args=(same_size[dtype],))

    dtypes = all_types_and(torch.bool)
    return [
        OpInfo("alias", op=torch.ops.aten.alias.default, dtypes=dtypes,
               sample_inputs_func=unary, supports_out=False),
        OpInfo("detach", op=torch.Tensor.detach, inplace_variant=torch.Tensor.detach_,
               dtypes=dtypes, sample_inputs_func=unary, supports_out=False),
        OpInfo("swapaxes", op=torch.swapaxes, inplace_variant=torch.Tensor.swapaxes_,
               dtypes=dtypes, sample_inputs_func=swap, supports_out=False),
        OpInfo("swapdims", op=torch.swapdims, inplace_variant=torch.Tensor.swapdims_,
               dtypes=dtypes, sample_inputs_func=swap, supports_out=False),
        OpInfo("moveaxis", op=torch.moveaxis, dtypes=dtypes, sample_inputs_func=swap,
               supports_out=False),
        OpInfo("adjoint", op=torch.adjoint, dtypes=dtypes, sample_inputs_func=unary,
               supports_out=False),
        OpInfo("view", variant_test_name="dtype", op=torch.Tensor.view,
               dtypes=(torch.float32, torch.int64, torch.bool, torch.int32),
               sample_inputs_func=view_dtype, supports_out=False),
        OpInfo("_neg_view", op=torch.ops.aten._neg_view.default, dtypes=dtypes,
               sample_inputs_func=unary, supports_out=False),
    ]


def op_key(op) -> str:
    """The op's report and test-id name: `name` or `name.variant`."""
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@functools.lru_cache(maxsize=None)
def all_ops() -> dict:
    """op key -> OpInfo, for every op_db entry and every extra view entry, in op_db order."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from torch.testing._internal.common_methods_invocations import op_db
        except ImportError as e:
            raise ImportError(
                f"the OpInfo sweep needs torch's test helpers and their dependencies "
                f"(pip install expecttest numpy; .ci/setup.sh installs them): {e}") from e

        ops = {}
        for op in list(op_db) + _view_extras():
            key = op_key(op)
            assert key not in ops, f"duplicate op key {key}"
            ops[key] = op
    return ops


def extra_op_keys() -> frozenset:
    return frozenset(op_key(op) for op in _view_extras())


def dtypes_for(op) -> list:
    """The dtypes to sweep for `op`: one float-like (float32 first) and one integer or bool."""
    supported = op.supported_dtypes(DEVICE)
    chosen = []
    for preference in (FLOAT_PREFERENCE, INT_PREFERENCE):
        for dtype in preference:
            if dtype in supported:
                chosen.append(dtype)
                break
    return chosen


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def dtype_from_name(name: str):
    return getattr(torch, name)


# ---------------------------------------------------------------------------------------------
# Samples and programs.


@dataclasses.dataclass
class Sample:
    """One OpInfo sample, flattened: the tensor leaves become the program's positional inputs."""

    leaves: list
    spec: object
    tensor_positions: list
    description: str
    input_is_tensor: bool
    broadcasts_input: bool

    @staticmethod
    def from_sample_input(s) -> "Sample":
        leaves, spec = pytree.tree_flatten((s.input, s.args, s.kwargs))
        positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        return Sample(leaves, spec, positions, _describe(s), isinstance(s.input, torch.Tensor),
                      bool(getattr(s, "broadcasts_input", False)))

    @property
    def tensors(self) -> list:
        return [self.leaves[i] for i in self.tensor_positions]

    def unpack(self, tensors):
        """(input, args, kwargs) with `tensors` in place of the sample's tensor leaves."""
        leaves = list(self.leaves)
        for i, t in zip(self.tensor_positions, tensors):
            leaves[i] = t
        return pytree.tree_unflatten(leaves, self.spec)


def _describe(s) -> str:
    def one(v):
        if isinstance(v, torch.Tensor):
            layout = "" if v.layout == torch.strided else f"<{str(v.layout)[13:]}>"
            dense_nc = v.layout == torch.strided and not v.is_contiguous()
            return f"T{list(v.shape)}{layout}{'nc' if dense_nc else ''}"
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(one(x) for x in v) + "]"
        return repr(v)

    parts = [one(s.input)] + [one(a) for a in s.args]
    parts += [f"{k}={one(v)}" for k, v in s.kwargs.items()]
    text = "(" + ", ".join(parts) + ")"
    return text if len(text) <= 120 else text[:117] + "..."


@functools.lru_cache(maxsize=64)
def samples_for(key: str, dtype_str: str, max_samples: Optional[int]) -> tuple:
    """The op's samples for one dtype, generated under a fixed seed (same in every process)."""
    op = all_ops()[key]
    _seed()
    random.seed(SEED)
    try:
        import numpy

        numpy.random.seed(SEED)
    except ImportError:
        pass
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, s in enumerate(op.sample_inputs(DEVICE, dtype_from_name(dtype_str),
                                               requires_grad=False)):
            if max_samples is not None and i >= max_samples:
                break
            out.append(Sample.from_sample_input(s))
    return tuple(out)


def _seed():
    # The CPU generator only: torch.manual_seed also queues seeds for every lazy accelerator
    # module, with a stack capture each, which costs more than the small cases it seeds.
    torch.default_generator.manual_seed(SEED)
    if DEVICE != "cpu":  # samples and random ops on an accelerator draw from its generator
        torch.manual_seed(SEED)


def _clone(tensors):
    """Fresh copies; strided tensors keep their strides, sparse ones are cloned."""
    return list(clone_inputs(tuple(tensors)))


def _tensor_leaves(tree):
    return [v for v in pytree.tree_leaves(tree) if isinstance(v, torch.Tensor)]


def _mutate(t):
    """An in-place update that every dtype supports."""
    if t.dtype == torch.bool:
        t.logical_not_()
    else:
        t.add_(1)


def _shares_storage(a, b) -> bool:
    if a is b:
        return True
    if a.layout != torch.strided or b.layout != torch.strided:
        return False
    try:
        pa, pb = a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr()
    except Exception:
        return False
    return pa != 0 and pa == pb


@dataclasses.dataclass
class Probe:
    """What the plain op does eagerly on one sample: its outputs (for out= shapes) and aliasing."""

    error: Optional[str] = None
    out_meta: Optional[list] = None  # [(shape, dtype)] per output, when all outputs are tensors
    out_is_tuple: bool = False
    alias: Optional[tuple] = None  # (output leaf index, input index) of the first alias


def probe(op, sample: Sample) -> Probe:
    inputs = _clone(sample.tensors)
    _seed()
    try:
        with _quiet():
            inp, args, kwargs = sample.unpack(inputs)
            out = op(inp, *args, **kwargs)
    except Exception as e:  # noqa: BLE001 - eager failures make cases not applicable
        return Probe(error=_first_line(e))
    result = Probe()
    leaves = pytree.tree_leaves(out)
    if leaves and all(isinstance(v, torch.Tensor) and v.layout == torch.strided for v in leaves):
        if isinstance(out, torch.Tensor):
            result.out_meta = [(tuple(out.shape), out.dtype)]
        elif isinstance(out, tuple) and all(isinstance(v, torch.Tensor) for v in out):
            result.out_meta = [(tuple(v.shape), v.dtype) for v in out]
            result.out_is_tuple = True
    for k, v in enumerate(leaves):
        if not isinstance(v, torch.Tensor):
            continue
        for j, t in enumerate(inputs):
            if _shares_storage(v, t):
                result.alias = (k, j)
                break
        if result.alias:
            break
    return result


def build_program(op, placement: str, sample: Sample, pr: Probe) -> Callable:
    """The program f(*tensor inputs) that places `op` as `placement` says."""
    call = op.__call__
    inplace = op.inplace_variant

    if placement == "plain":
        def f(*ts):
            inp, args, kwargs = sample.unpack(ts)
            return call(inp, *args, **kwargs)
    elif placement == "inplace_intermediate":
        def f(*ts):
            inp, args, kwargs = sample.unpack(ts)
            y = inp.clone()
            inplace(y, *args, **kwargs)
            return y
    elif placement == "inplace_input":
        def f(*ts):
            inp, args, kwargs = sample.unpack(ts)
            return inplace(inp, *args, **kwargs)
    elif placement == "inplace_view":
        def f(*ts):
            inp, args, kwargs = sample.unpack(ts)
            base = torch.stack([inp, inp], dim=-1)  # a strided view: every other element
            inplace(base.select(-1, 1), *args, **kwargs)
            return base
    elif placement in ("out", "out_resized"):
        resized = placement == "out_resized"

        def f(*ts):
            inp, args, kwargs = sample.unpack(ts)
            outs = tuple(
                torch.zeros((0,) if resized else shape, dtype=dtype, device=DEVICE)
                for shape, dtype in pr.out_meta
            )
            out = outs if pr.out_is_tuple else outs[0]
            call(inp, *args, **kwargs, out=out)
            return out
    elif placement == "view_mutate":
        k, j = pr.alias

        def f(*ts):
            bases = [t.clone() for t in ts]
            inp, args, kwargs = sample.unpack(bases)
            v = call(inp, *args, **kwargs)
            _mutate(_tensor_leaves_all(v)[k])
            return bases[j], v
    elif placement == "view_input_mutate":
        k, _ = pr.alias

        def f(*ts):
            inp, args, kwargs = sample.unpack(ts)
            v = call(inp, *args, **kwargs)
            _mutate(_tensor_leaves_all(v)[k])
            return v
    elif placement == "view_base_mutate":
        _, j = pr.alias

        def f(*ts):
            bases = [t.clone() for t in ts]
            inp, args, kwargs = sample.unpack(bases)
            v = call(inp, *args, **kwargs)
            _mutate(bases[j])
            return v
    else:
        raise ValueError(f"unknown placement {placement!r}")
    return f


def _tensor_leaves_all(tree):
    # Index k of probe() counts every leaf, tensor or not; keep the same numbering.
    return pytree.tree_leaves(tree)


# ---------------------------------------------------------------------------------------------
# Helpers shared with opinfo_cases.py.


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _first_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    text = f"{type(e).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
