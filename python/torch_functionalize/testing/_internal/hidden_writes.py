"""The search for hidden writes: ATen ops whose eager kernels change an argument their schema does
not declare written (tools/hidden_writes.py is its command line and report; the whole method and
its limits are in that file's header).

HiddenWriteMode is a TorchDispatchMode that, at every ATen call, snapshots each plain tensor
argument (lists included), runs the op and compares the arguments' values, sizes, strides and
storage offsets afterwards; a change to an argument whose schema carries no write annotation, and
which shares no memory with a declared-written argument, is a finding. `scan` runs the OpInfo
samples of the given entries (opinfo_programs.py) under it.
"""

from __future__ import annotations

import sys
import warnings

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from . import opinfo_programs as oc


def _is_plain(t) -> bool:
    return (isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_meta
            and not t.is_quantized and type(t) in (torch.Tensor, torch.nn.Parameter))


def _snapshot(t):
    return (t.detach().clone(), tuple(t.shape), tuple(t.stride()), t.storage_offset())


def _what_changed(t, snap) -> str | None:
    value, shape, stride, offset = snap
    if (tuple(t.shape), tuple(t.stride()), t.storage_offset()) != (shape, stride, offset):
        return f"metadata {list(shape)}/{list(stride)}+{offset} -> " \
               f"{list(t.shape)}/{list(t.stride())}+{t.storage_offset()}"
    # Compared as clones: inside __torch_dispatch__ a comparison reads a conjugate or negative
    # view's memory without applying its bit, while clone() applies it (so clone the both sides).
    now = t.detach().clone()
    if now.dtype.is_floating_point or now.dtype.is_complex:
        same = (now == value) | (now.isnan() & value.isnan())
    else:
        same = now == value
    return None if bool(same.all()) else "values"


def _memory(t):
    """(storage data pointer, first byte, last byte + 1) of a strided tensor."""
    if t.numel() == 0:
        return None
    size = t.element_size()
    last = t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    base = t.untyped_storage().data_ptr()
    return base, t.storage_offset() * size, (last + 1) * size


def _overlaps(a, b) -> bool:
    ma, mb = _memory(a), _memory(b)
    return ma is not None and mb is not None and ma[0] == mb[0] and ma[1] < mb[2] and mb[1] < ma[2]


def _arguments(func, args, kwargs):
    """(schema argument, tensor) for every plain tensor the call received, lists included."""
    pairs = []
    schema = func._schema
    for i, arg in enumerate(schema.arguments):
        if arg.kwarg_only or i >= len(args):
            if arg.name not in kwargs:
                continue
            value = kwargs[arg.name]
        else:
            value = args[i]
        for t in pytree.tree_leaves(value):
            if _is_plain(t):
                pairs.append((arg, t))
    return pairs


class HiddenWriteMode(TorchDispatchMode):
    """Records (op, argument, change) for every undeclared change to an argument."""

    def __init__(self):
        super().__init__()
        self.findings = []  # (op overload name, argument name, change)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        pairs = _arguments(func, args, kwargs)
        declared = [t for a, t in pairs if a.alias_info is not None and a.alias_info.is_write]
        watched = [(a, t, _snapshot(t)) for a, t in pairs
                   if not (a.alias_info is not None and a.alias_info.is_write)]
        out = func(*args, **kwargs)
        for a, t, snap in watched:
            if any(_overlaps(t, d) for d in declared):
                continue  # shares memory with a declared write: the declaration covers it
            change = _what_changed(t, snap)
            if change is not None:
                self.findings.append((str(func), a.name, change))
        return out


def scan(keys, device: str, verbose: bool = False):
    """{(op overload, argument): {"change": ..., "samples": [OpInfo key: sample]}} over `keys`."""
    oc.DEVICE = device
    found = {}
    for n, key in enumerate(keys):
        op = oc.all_ops()[key]
        variants = [("", op.op)]
        if op.inplace_variant is not None:
            variants.append(("inplace ", op.inplace_variant))
        for dtype in oc.dtypes_for(op):
            try:
                samples = oc.samples_for(key, oc.dtype_name(dtype), None)
            except Exception:  # noqa: BLE001 - a sample generator that fails has nothing to scan
                continue
            for sample in samples:
                for label, fn in variants:
                    tensors = [t.clone() if _is_plain(t) else t for t in sample.tensors]
                    inp, args, kwargs = sample.unpack(tensors)
                    mode = HiddenWriteMode()
                    try:
                        with warnings.catch_warnings(), mode:
                            warnings.simplefilter("ignore")
                            fn(inp, *args, **kwargs)
                    except Exception:  # noqa: BLE001 - eager errors: nothing was run to scan
                        pass
                    for opname, arg, change in mode.findings:
                        entry = found.setdefault((opname, arg), {"change": change, "samples": []})
                        if len(entry["samples"]) < 3:
                            entry["samples"].append(f"{label}{key}{sample.description}")
        if verbose and n % 50 == 0:
            print(f"  {n}/{len(keys)} ops, {len(found)} findings", file=sys.stderr, flush=True)
    return found
