"""Finds ATen ops whose eager kernels change an argument their schema does not declare written.

    python tools/hidden_writes.py                          # every OpInfo op, CPU, prints the list
    python tools/hidden_writes.py --ops nn.functional.batch_norm,add
    python tools/hidden_writes.py --device cuda            # the same on CUDA tensors
    python tools/hidden_writes.py --json hidden.json       # also keep the raw findings
    python tools/hidden_writes.py --out docs/reports/hidden_writes.md   # the report (what CI's doc holds)

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
compared, so a write of the value already there is invisible. docs/reports/hidden_writes.md keeps
the list with how each finding is handled; test/python/test_hidden_writes.py checks that each finding
is handled (a row of the special-op table, csrc/kernels/SpecialOps.cpp) and repeats the search on
the OpInfo entries that reach one.
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


# How each op the search can find is handled; a finding missing here is reported as unhandled.
HANDLING = {
    "aten.native_batch_norm.default": "row `batch norm (hidden stat writes)` of the special-op "
    "table: in training mode with both stats, _native_batch_norm_legit_functional + the input "
    "epilogue (Note [Kernel: native_batch_norm])",
    "aten.cudnn_batch_norm.default": "row `batch norm (hidden stat writes)` of the special-op "
    "table, as native_batch_norm (Note [Kernel: cudnn_batch_norm and miopen_batch_norm])",
    "aten.miopen_batch_norm.default": "row `batch norm (hidden stat writes)` of the special-op "
    "table, as native_batch_norm (Note [Kernel: cudnn_batch_norm and miopen_batch_norm])",
}

# Known from reading schemas and kernels, not reachable from CPU OpInfo samples.
NOT_SEARCHABLE_HERE = [
    ("aten.cudnn_batch_norm / aten.miopen_batch_norm", "running_mean, running_var",
     "CUDA / ROCm kernels only; same row as native_batch_norm (see SpecialOps.cpp: "
     "Note [Kernel: cudnn_batch_norm and miopen_batch_norm]); CPU stand-ins test it"),
    ("aten._cudnn_rnn", "dropout_state",
     "cuDNN keeps its dropout RNG state in this buffer; it is not the program's: ATen's CUDA "
     "RNN path takes it from a per-device cache (get_dropout_state), so a write to it is RNG "
     "state like the global generator's, made as in eager. The cache's first buffer, made by "
     "_cudnn_init_dropout_state inside a functionalized call, stays plain "
     "(Note [Kernel: cuDNN's dropout state]; CPU stand-in test; the first GPU run stopped earlier, at cuDNN's "
     "set_, since supported: Note [Kernel: set_ onto a storage from outside the function])"),
]


def write_report(found, keys, device, seconds, out):
    import datetime

    lines = [
        "# Hidden writes",
        "",
        f"Generated by `python tools/hidden_writes.py --out {out}` on "
        f"{datetime.date.today()} (torch {torch.__version__}, device {device}). Do not edit by "
        "hand.",
        "",
        "An op whose eager kernel changes an argument that its schema does not declare written "
        "(`Tensor(a!)`) defeats any schema-driven functionalization: the write lands in the "
        "wrapped value, outside the graph and the input epilogue. The search runs every OpInfo "
        f"sample ({len(keys)} entries, functional and in-place variants, each op's first float "
        "and integer dtype) under a TorchDispatchMode that compares every argument of every ATen "
        f"call before and after (values, sizes, strides, offset); {seconds:.0f} s.",
        "",
        "| op | argument | change | found through | handling |",
        "|---|---|---|---|---|",
    ]
    for (opname, arg), entry in sorted(found.items()):
        handling = HANDLING.get(opname, "**not handled**")
        lines.append(f"| `{opname}` | `{arg}` | {entry['change']} | "
                     f"`{entry['samples'][0]}` | {handling} |")
    if not found:
        lines.append("| (none) | | | | |")
    lines += ["", "Not reachable from these samples on this device (from reading schemas and "
              "kernels):", "", "| op | argument | status |", "|---|---|---|"]
    reached = {opname.split(".")[1] for opname, _ in found}  # "aten.cudnn_batch_norm.default"
    lines += [f"| `{o}` | {a} | {s} |" for o, a, s in NOT_SEARCHABLE_HERE
              if not all(name.strip().split(".")[1] in reached for name in o.split("/"))]
    with open(out, "w") as fh:
        fh.write("\n".join(lines) + "\n")


def _scan_in_workers(keys, args, argv):
    """Runs args.jobs copies of this command, each on every jobs-th key, and merges their JSON."""
    import subprocess
    import tempfile

    argv = list(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory() as tmp:
        workers = []
        for index in range(args.jobs):
            path = os.path.join(tmp, f"{index}.json")
            command = [sys.executable, os.path.abspath(__file__), "--device", args.device,
                       "--ops", ",".join(keys), "--shard", f"{index}/{args.jobs}", "--json", path]
            workers.append((subprocess.Popen(command), path))
        found = {}
        for worker, path in workers:
            if worker.wait() != 0:
                raise SystemExit(f"hidden_writes: a worker failed (rc {worker.returncode})")
            with open(path) as fh:
                for entry in json.load(fh):
                    key = (entry.pop("op"), entry.pop("argument"))
                    if key in found:
                        found[key]["samples"] += entry["samples"]
                    else:
                        found[key] = entry
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help="comma-separated OpInfo keys (default: all)")
    parser.add_argument("--device", default=os.environ.get("TFZ_TEST_DEVICE", "cpu"))
    parser.add_argument("--json", help="write the findings here")
    parser.add_argument("--out",
                        help="write the markdown report here (docs/reports/hidden_writes.md)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="worker processes, each searching every N-th OpInfo entry")
    parser.add_argument("--shard", help=argparse.SUPPRESS)  # "i/n": a worker's share
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("hidden_writes: no CUDA device on this machine (torch.cuda.is_available() is "
              "False); run it where one is, or with --device cpu", file=sys.stderr)
        return 2
    import opinfo_cases as oc

    keys = args.ops.split(",") if args.ops else list(oc.all_ops())
    start = time.time()
    if args.shard:
        index, count = map(int, args.shard.split("/"))
        keys = keys[index::count]
    if args.jobs > 1 and not args.shard:
        found = _scan_in_workers(keys, args, argv)
    else:
        found = scan(keys, args.device, verbose=True)
    print(f"{len(keys)} OpInfo entries on {args.device} in {time.time() - start:.0f} s: "
          f"{len(found)} hidden writes")
    for (opname, arg), entry in sorted(found.items()):
        print(f"  {opname}  argument `{arg}`: {entry['change']}  (e.g. {entry['samples'][0]})")
    if args.out:
        write_report(found, keys, args.device, time.time() - start, args.out)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([{"op": o, "argument": a, **e} for (o, a), e in sorted(found.items())], fh,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
