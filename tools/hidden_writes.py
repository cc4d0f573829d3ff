"""Finds ATen ops whose eager kernels change an argument their schema does not declare written.

    python tools/hidden_writes.py                          # every OpInfo op, CPU, prints the list
    python tools/hidden_writes.py --ops nn.functional.batch_norm,add
    python tools/hidden_writes.py --device cuda            # the same on CUDA tensors
    python tools/hidden_writes.py --json hidden.json       # also keep the raw findings

The engine classifies every op from its schema (core/OpSchemaInfo.cpp): an argument is written
only if its alias annotation says so (`Tensor(a!)`). An eager kernel that writes anything else
(native_batch_norm's running stats in training mode) is a hidden write: run generically, it would
land in the wrapped value, out of the traced graph and out of the input epilogue. This tool looks
for such writes by running every OpInfo sample (each op's first float-like and first integer
dtype, as the OpInfo sweep does) eagerly under a TorchDispatchMode that, at every ATen call the
sample makes, snapshots each tensor argument (lists included), runs the op and compares the
arguments' values, sizes, strides and storage offsets afterwards. A change to an argument whose
schema argument carries no write annotation, and which shares no memory with a declared-written
argument, is a finding: (op overload, argument name, what changed, the OpInfo sample).

Limits, stated so the list is read right: it sees the ATen ops that OpInfo samples reach on the
given device (cudnn_batch_norm / miopen_batch_norm exist on CUDA / ROCm only, so a CPU run cannot
see them: they are in SpecialOps.cpp's table by reading their schemas and kernels); values are
compared, so a write of the value already there is invisible. docs/coverage.md keeps the list
(section "Hidden writes"); test/python/test_hidden_writes.py checks that each finding is handled.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "test", "python"))

import torch  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402


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
    now = t.detach()
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
    import opinfo_cases as oc

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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help="comma-separated OpInfo keys (default: all)")
    parser.add_argument("--device", default=os.environ.get("TFZ_TEST_DEVICE", "cpu"))
    parser.add_argument("--json", help="write the findings here")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("hidden_writes: no CUDA device on this machine (torch.cuda.is_available() is "
              "False); run it where one is, or with --device cpu", file=sys.stderr)
        return 2
    import opinfo_cases as oc

    keys = args.ops.split(",") if args.ops else list(oc.all_ops())
    start = time.time()
    found = scan(keys, args.device, verbose=True)
    print(f"{len(keys)} OpInfo entries on {args.device} in {time.time() - start:.0f} s: "
          f"{len(found)} hidden writes")
    for (opname, arg), entry in sorted(found.items()):
        print(f"  {opname}  argument `{arg}`: {entry['change']}  (e.g. {entry['samples'][0]})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([{"op": o, "argument": a, **e} for (o, a), e in sorted(found.items())], fh,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
