"""Which bytes of which storage every value of an FX graph of ATen ops occupies, and who touches
them: one fake-tensor run of the graph gives each node its Region; the analysis indexes every use
of a storage by position and role (read, view, write, copy destination, graph output). It never
changes the graph; reinplace.py decides with it and keeps it up to date as it rewrites.
"""
from __future__ import annotations

import bisect
import contextlib
import logging
import operator
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.multiprocessing.reductions import StorageWeakRef

from ._fx import example_value

_COPY_ = torch.ops.aten.copy_.default


@dataclass(frozen=True)
class Region:
    """The bytes a tensor addresses: storage (an id shared by every alias), byte offset, sizes
    and byte strides. ``sizes`` is None where the geometry is symbolic (unknown bytes: it
    overlaps everything in its storage and covers nothing)."""

    storage: int
    offset: int
    sizes: tuple[int, ...] | None
    strides: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool
    device: torch.device | None = None  # None: not known (a value the run did not place)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def numel(self) -> int:
        n = 1
        for s in self.sizes or ():
            n *= s
        return n

    def span(self) -> tuple[int, int]:
        """[first byte, one past the last byte) addressed; empty for a tensor without elements."""
        assert self.sizes is not None
        if self.numel == 0:
            return (self.offset, self.offset)
        lo = hi = self.offset
        for size, stride in zip(self.sizes, self.strides):
            step = (size - 1) * stride
            lo, hi = (lo + step, hi) if step < 0 else (lo, hi + step)
        return (lo, hi + self.itemsize)

    def geometry(self) -> tuple[Any, ...]:
        """What two regions of one storage must share to address the same bytes the same way
        (dimensions of size 1 have no stride that matters)."""
        assert self.sizes is not None
        kept = [(s, st) for s, st in zip(self.sizes, self.strides) if s != 1]
        return (self.offset, tuple(kept), self.itemsize) if self.numel else ("empty",)

    def same(self, other: Region) -> bool:
        """Whether both address exactly the same bytes in the same order and element type."""
        return (self.storage == other.storage and self.sizes is not None and
                other.sizes is not None and self.dtype == other.dtype and
                self.geometry() == other.geometry())

    def overlaps(self, other: Region) -> bool:
        """Whether the two may share a byte: exact for regions on one lattice of strides (two
        slices of a tensor, Note [Reinplace: overlap of strided regions]) and for small ones,
        conservative (their spans) otherwise."""
        if self.storage != other.storage:
            return False
        if self.sizes is None or other.sizes is None:
            return True
        (a, b), (c, d) = self.span(), other.span()
        if not (a < d and c < b):
            return False
        boxes = _boxes_overlap(self, other)
        if boxes is not None:
            return boxes
        if self.numel <= _ENUMERATE and other.numel <= _ENUMERATE:
            return bool(set(self.bytes()) & set(other.bytes()))
        return True

    def bytes(self) -> list[int]:
        """Every byte offset the region addresses (for small regions only)."""
        assert self.sizes is not None
        starts = torch.zeros((), dtype=torch.int64)
        for size, stride in zip(self.sizes, self.strides):
            starts = (starts.unsqueeze(-1) + torch.arange(size, dtype=torch.int64) * stride)
        starts = starts.reshape(-1, 1) + self.offset + torch.arange(self.itemsize)
        return starts.reshape(-1).tolist()

    def covers(self, other: Region) -> bool:
        """Whether writing every element of self writes every byte of other."""
        if self.same(other):
            return True
        if self.storage != other.storage or self.sizes is None or other.sizes is None:
            return False
        lo, hi = self.span()
        dense = self.self_disjoint() and hi - lo == self.numel * self.itemsize
        (c, d) = other.span()
        return dense and lo <= c and d <= hi

    def self_disjoint(self) -> bool:
        """Whether no two elements share a byte (sufficient test: each stride, sorted, clears
        the extent of the dimensions below it; what eager's in-place kernels require)."""
        if self.sizes is None:
            return False
        extent = self.itemsize
        for stride, size in sorted((abs(st), s) for s, st in zip(self.sizes, self.strides)
                                   if s > 1):
            if stride < extent:
                return False
            extent = stride * (size - 1) + extent
        return True

    def shifted(self, storage: int, by: int) -> Region:
        return replace(self, storage=storage, offset=self.offset + by)

    def meta_tensor(self) -> torch.Tensor:
        """A meta tensor with this geometry (an op run on it gives the geometry of its view)."""
        assert self.sizes is not None
        lo, hi = self.span()
        storage = torch.UntypedStorage(max(hi, self.offset + self.itemsize), device="meta")
        t = torch.empty(0, dtype=self.dtype, device="meta")
        return t.set_(storage, self.offset // self.itemsize, self.sizes,
                      [s // self.itemsize for s in self.strides])


_ENUMERATE = 1 << 12  # regions up to this many elements are compared element by element


# Note [Reinplace: overlap of strided regions]
# Two slices of one tensor (x[:, 0:4] and x[:, 8:12]) have overlapping spans but no common
# element, and reinplacing a write into one must not be refused because of a read of the other.
# Where both regions step with the same strides and those strides nest (each clears the extent
# of the dimensions below it, the layout of any slice of a dense tensor), the byte distance
# between their starts decomposes uniquely into a coordinate per dimension, each region is a
# box in those coordinates, and they overlap exactly when their boxes do. The decomposition is
# only trusted when each box stays inside one step of the next dimension (no wrap-around into
# the next row). Otherwise small regions are compared byte by byte, and large ones by span.
# Rejected: span-only overlap (refused every write through a column slice).
def _boxes_overlap(a: Region, b: Region) -> bool | None:
    """Exact overlap of two regions on one nested lattice of strides, or None if not."""
    if a.itemsize != b.itemsize or a.numel == 0 or b.numel == 0:
        return None
    dims_a = {st: s for s, st in zip(a.sizes or (), a.strides) if s > 1}
    dims_b = {st: s for s, st in zip(b.sizes or (), b.strides) if s > 1}
    strides = sorted(set(dims_a) | set(dims_b))
    if any(st <= 0 for st in strides) or len(dims_a) != len([s for s in a.sizes or () if s > 1]) \
            or len(dims_b) != len([s for s in b.sizes or () if s > 1]):
        return None
    # Lattice steps: each stride must be a multiple of the one below, nested above the item.
    below = a.itemsize
    for st in strides:
        if st % below or st < below:
            return None
        below = st
    d = b.offset - a.offset
    coordinate: dict[int, int] = {}
    for st in reversed(strides):
        coordinate[st], d = divmod(d, st)
    if d:
        return None  # the starts are not on one lattice point apart
    for i, st in enumerate(strides):
        room = strides[i + 1] // st if i + 1 < len(strides) else None
        lo_a, hi_a = 0, dims_a.get(st, 1)
        lo_b = coordinate[st]
        hi_b = lo_b + dims_b.get(st, 1)
        if room is not None and (hi_a > room or lo_b < 0 or hi_b > room):
            return None  # a box wraps into the next step
        if hi_a <= lo_b or hi_b <= lo_a:
            return False
    return True


# The roles a use of a value plays at the node that uses it.
READ, VIEW, WRITE, DEST, OUTPUT = "read", "view", "write", "copy destination", "output"


@dataclass
class Use:
    position: float
    node: fx.Node      # the node that uses the value
    value: fx.Node     # the node whose value is used
    index: int | None  # the element, where that value is a list of tensors
    role: str


def is_view_op(target: Any) -> bool:
    """An op whose result aliases its input and that writes nothing (a view), or getitem."""
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    schema = target._schema
    return (any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
            and not schema.is_mutable)


def written_arguments(target: Any) -> set[int]:
    """Positions of the arguments an op's schema marks as written (``Tensor(a!)``)."""
    if not isinstance(target, torch._ops.OpOverload):
        return set()
    return {i for i, a in enumerate(target._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write}


class PropagationError(RuntimeError):
    """A node the fake-tensor run could not compute: nothing is known about what it aliases."""


class AliasAnalysis:
    """Regions of every node's value and the uses of every storage, in graph order."""

    def __init__(self, graph: fx.Graph, values: dict[fx.Node, Any],
                 grad_mode: dict[fx.Node, bool]) -> None:
        self.graph = graph
        self.grad_mode = grad_mode
        self.position: dict[fx.Node, float] = {}
        self.regions: dict[fx.Node, Region | list[Region | None] | None] = {}
        self.uses: dict[int, list[Use]] = {}
        self.first_node: dict[int, fx.Node] = {}  # the node whose value first holds a storage
        self.members: dict[int, list[fx.Node]] = {}  # the nodes with a value in each storage
        self.input_storages: set[int] = set()
        # Storages laid out as an input: their offsets, like an input's, are the traced input's,
        # not every input's. See Note [Reinplace: results laid out as eager's kernels lay them out].
        self.input_laid_out: set[int] = set()
        self._ids: dict[Any, int] = {}
        for i, node in enumerate(graph.nodes):
            self.position[node] = float(i)
            self.regions[node] = self._region_of(values.get(node))
            for r in self._flat(node):
                self.first_node.setdefault(r.storage, node)
                self.members.setdefault(r.storage, []).append(node)
                if node.op in ("placeholder", "get_attr"):
                    self.input_storages.add(r.storage)
            if node.target in _KEEP_INPUT_STORAGE and isinstance(node.args[0], fx.Node):
                src, out = self.regions.get(node.args[0]), self.regions[node]
                if isinstance(src, Region) and isinstance(out, Region) and \
                        (src.storage in self.input_storages or src.storage in self.input_laid_out):
                    self.input_laid_out.add(out.storage)
            self._add_uses(node)

    # -- regions -----------------------------------------------------------------------------
    def _region_of(self, value: Any) -> Region | list[Region | None] | None:
        if isinstance(value, list):
            return [self._region_of(v) if v is not None else None for v in value]
        if not isinstance(value, Snapshot):
            return None
        item = value.dtype.itemsize
        static = all(isinstance(s, int) for s in (*value.sizes, *value.strides, value.offset))
        return Region(self._ids.setdefault(value.storage, len(self._ids)),
                      value.offset * item if static else 0,
                      value.sizes if static else None,
                      tuple(s * item for s in value.strides) if static else (),
                      value.dtype, value.requires_grad, value.device)

    def _flat(self, node: fx.Node) -> Iterator[Region]:
        r = self.regions.get(node)
        if isinstance(r, list):
            yield from (x for x in r if x is not None)
        elif r is not None:
            yield r

    def region(self, node: fx.Node, index: int | None = None) -> Region | None:
        r = self.regions.get(node)
        if isinstance(r, list):
            return r[index] if index is not None else None
        return r

    def set_region(self, node: fx.Node, region: Region | None, position: float) -> None:
        """Registers a node the transform made (position: where it stands in graph order)."""
        self.position[node] = position
        self.regions[node] = region
        if region is not None:
            self.members.setdefault(region.storage, []).append(node)
        self._add_uses(node)

    # -- uses --------------------------------------------------------------------------------
    def tensor_inputs(self, node: fx.Node) -> Iterator[tuple[int, int | None, fx.Node,
                                                              int | None]]:
        """(argument position, place in that list argument or None, input node, element of a
        list-valued input or None) of every tensor the node reads."""
        args = list(node.args) + list(node.kwargs.values())
        for i, a in enumerate(args):
            listed = isinstance(a, (list, tuple))
            for place, x in enumerate(a if listed else [a]):
                if not isinstance(x, fx.Node):
                    continue
                slot = place if listed else None
                r = self.regions.get(x)
                if isinstance(r, list):
                    if node.target is operator.getitem:
                        yield (i, slot, x, node.args[1])  # type: ignore[misc]
                    else:
                        yield from ((i, slot, x, k) for k, e in enumerate(r) if e is not None)
                elif r is not None:
                    yield (i, slot, x, None)

    def _role(self, node: fx.Node, argument: int) -> str:
        if node.op == "output":
            return OUTPUT
        if is_view_op(node.target):
            return VIEW
        if node.target is _COPY_ and argument == 0:
            return DEST
        if argument in written_arguments(node.target):
            return WRITE
        return READ

    def _add_uses(self, node: fx.Node) -> None:
        for argument, _, value, index in self.tensor_inputs(node):
            region = self.region(value, index)
            if region is None:
                continue
            lst = self.uses.setdefault(region.storage, [])
            use = Use(self.position[node], node, value, index, self._role(node, argument))
            bisect.insort(lst, use, key=lambda u: u.position)

    def remove_uses_by(self, node: fx.Node) -> None:
        storages = set()
        for _, _, value, index in self.tensor_inputs(node):
            region = self.region(value, index)
            if region is not None:
                storages.add(region.storage)
        for s in storages:
            self.uses[s] = [u for u in self.uses.get(s, []) if u.node is not node]

    def uses_after(self, storage: int, position: float) -> list[Use]:
        lst = self.uses.get(storage, [])
        return lst[bisect.bisect_right(lst, position, key=lambda u: u.position):]

    def merge(self, fresh: int, into: int, offset: int,
              replaced: dict[fx.Node, fx.Node] | None = None) -> None:
        """Every value in storage ``fresh`` now lives in ``into``, ``offset`` bytes further
        (a value the transform wrote in place of a fresh allocation); uses of a node in
        ``replaced`` become uses of its replacement."""
        replaced = replaced or {}
        members = self.members.pop(fresh, [])
        self.members.setdefault(into, []).extend(members)
        for node in members:
            r = self.regions.get(node)
            if isinstance(r, Region) and r.storage == fresh:
                self.regions[node] = r.shifted(into, offset)
            elif isinstance(r, list):
                self.regions[node] = [e.shifted(into, offset) if e is not None and
                                      e.storage == fresh else e for e in r]
        moved = self.uses.pop(fresh, [])
        for u in moved:
            if u.value in replaced:
                u.value, u.index = replaced[u.value], None
        lst = self.uses.setdefault(into, [])
        lst.extend(moved)
        lst.sort(key=lambda u: u.position)


class InputLayout:
    """The geometry of a graph's inputs and how they share memory, without the tensors (a
    captured graph must not keep its inputs alive): what the fake-tensor run starts from.
    ``leaves``: the graph's flat inputs, tensors (real or fake) and other values."""

    def __init__(self, leaves: list[Any]) -> None:
        self.leaves = list(leaves)
        self.tensors: dict[int, tuple[Any, ...]] = {}  # position -> what fakes() rebuilds
        groups: dict[int, int] = {}
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor):
                storage = leaf.untyped_storage()
                self.leaves[i] = None
                self.tensors[i] = (groups.setdefault(storage._cdata, len(groups)),
                                   storage.nbytes(), tuple(leaf.shape), leaf.stride(),
                                   leaf.storage_offset(), leaf.dtype, leaf.device,
                                   leaf.requires_grad)

    def devices(self) -> list[torch.device | None]:
        """Each input's device (None for a value that is not a tensor)."""
        out: list[torch.device | None] = [None] * len(self.leaves)
        for i, fields in self.tensors.items():
            out[i] = fields[6]
        return out

    def tensors_on(self, mode: FakeTensorMode | None) -> list[Any]:
        """The inputs rebuilt with their geometry, dtypes and sharing of memory: fake tensors of
        ``mode`` on the inputs' devices, or meta tensors when mode is None."""
        bases: dict[int, torch.Tensor] = {}
        out = list(self.leaves)
        with mode if mode is not None else contextlib.nullcontext():
            for i, (group, nbytes, sizes, strides, offset, dtype, device, grad) in \
                    self.tensors.items():
                device = device if mode is not None else torch.device("meta")
                base = bases.get(group)
                if base is None:
                    base = bases[group] = torch.empty(nbytes, dtype=torch.uint8, device=device)
                t = torch.empty(0, dtype=dtype, device=device).set_(
                    base.untyped_storage(), offset, sizes, strides)
                out[i] = t.requires_grad_(grad) if grad else t
        return out


def propagate(gm: fx.GraphModule, layout: InputLayout) -> tuple[dict[fx.Node, Any],
                                                                 dict[fx.Node, bool]]:
    """A Snapshot of every node's tensor value (a list of them for a list) from one run of the
    graph on tensors laid out as ``layout`` says, and the grad mode each node ran under (the
    graph's own set_grad_enabled nodes switch it; the caller's is taken as enabled, the mode
    where autograd records most). The run uses meta tensors (no computation, a few
    microseconds an op); a graph with an op meta tensors cannot run (one whose result's size
    depends on values, a device-specific kernel) runs again on fake tensors, which can."""
    try:
        return _propagate(gm, layout.tensors_on(None), contextlib.nullcontext(),
                          lambda t: t.to("meta"), layout.devices())
    except PropagationError:
        mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
        fake_log = logging.getLogger("torch._subclasses.fake_tensor")
        level = fake_log.level
        fake_log.setLevel(logging.CRITICAL)  # an op it cannot run is our answer, not its error
        try:
            return _propagate(gm, layout.tensors_on(mode), mode, mode.from_tensor, None)
        finally:
            fake_log.setLevel(level)


# Note [Reinplace: devices on meta tensors]
# Meta tensors have no device, yet a rewrite must not move a computation between devices: a
# CPU constant (a Python scalar written into a CUDA tensor is lifted as one) copied into a CUDA
# input cannot become `lift_fresh_copy.out(constant, out=input)`, which fails where the copy_
# it replaced crossed devices. The meta run carries each value's device beside it, by ATen's
# rule: a factory's `device=` argument, else the device of the first tensor argument that is not
# a 0-dimensional CPU tensor (those mix with any device), else the first tensor argument's. The
# fake-tensor run reads the devices off its fake tensors. Rejected: fake tensors always (about
# ten times slower than meta on large graphs, the common case has one device).


def _device_by_rule(node: fx.Node, values: dict[fx.Node, Any],
                    devices: dict[fx.Node, Any]) -> torch.device | None:
    named = node.kwargs.get("device")
    if named is not None:
        return torch.device(named)
    seen: list[tuple[bool, torch.device]] = []

    def visit(n: fx.Node) -> fx.Node:
        d = devices.get(n)
        if d is not None:
            v = values.get(n)
            mixes = isinstance(v, torch.Tensor) and v.dim() == 0 and d.type == "cpu"
            seen.append((mixes, d))
        return n

    fx.node.map_arg((node.args, node.kwargs), visit)
    for mixes, d in seen:
        if not mixes:
            return d
    return seen[0][1] if seen else None


# Note [Reinplace: results laid out as eager's kernels lay them out]
# The analysis runs ops' meta functions, which must place each result where eager's kernel
# would: rule 2 compares offsets, and an as_strided reads storage coordinates. They do not for
# the ops that start by copying their input's whole storage (torch's clone_preserve_strides:
# select_, slice_, diagonal_ and as_strided_scatter, and the functional copy): on CPU and CUDA
# their result keeps the input's strides and offset in a copy of its storage (a select_scatter of
# x = b[1:, ::2] is at offset 2), their meta functions return a compact tensor at offset 0. Their
# results are made so here (an input whose elements overlap is cloned compactly by torch too).
# Rejected: trusting the meta functions (reinplace then wrote add_ into such a result and an
# as_strided at offset 0 read the storage's first element, silently).
_KEEP_INPUT_STORAGE = frozenset({
    torch.ops.aten.select_scatter.default, torch.ops.aten.slice_scatter.default,
    torch.ops.aten.diagonal_scatter.default, torch.ops.aten.as_strided_scatter.default,
    torch.ops.aten.copy.default})


def _in_input_storage(result: Any, base: Any) -> Any:
    """``result`` moved into a fresh storage of ``base``'s size at ``base``'s geometry, where
    eager's kernel puts it (Note [Reinplace: results laid out as eager's kernels lay them out])."""
    if not isinstance(result, torch.Tensor) or not isinstance(base, torch.Tensor) or \
            result.layout != torch.strided or base.layout != torch.strided or \
            result.shape != base.shape or result.dtype != base.dtype:
        return result
    try:
        if torch._debug_has_internal_overlap(base) == 1:  # MemOverlap::Yes: cloned compactly
            return result
        elements = base.untyped_storage().nbytes() // base.element_size()
        buffer = torch.empty(elements, dtype=result.dtype, device=result.device)
        return buffer.as_strided(base.shape, base.stride(), base.storage_offset())
    except Exception:  # noqa: BLE001  (symbolic geometry: the meta result stays)
        return result


def _propagate(gm: fx.GraphModule, inputs: list[Any], mode: Any,
               constant: Callable[[torch.Tensor], torch.Tensor],
               input_devices: list[torch.device | None] | None
               ) -> tuple[dict[fx.Node, Any], dict[fx.Node, bool]]:
    """``input_devices``: the inputs' devices when ``inputs`` are meta tensors (None: the
    values carry their own; Note [Reinplace: devices on meta tensors])."""
    def fake(x: Any) -> Any:
        return constant(x) if isinstance(x, torch.Tensor) else x

    values: dict[fx.Node, Any] = {}
    devices: dict[fx.Node, torch.device | None] = {}
    snapshots: dict[fx.Node, Any] = {}
    grad: dict[fx.Node, bool] = {}
    placeholders = iter(inputs)
    placeholder_devices = iter(input_devices or [])
    with torch.set_grad_enabled(True), mode:
        for node in gm.graph.nodes:
            grad[node] = torch.is_grad_enabled()
            if node.op == "placeholder":
                values[node] = next(placeholders)
                if input_devices is not None:
                    devices[node] = next(placeholder_devices)
            elif node.op == "get_attr":
                target: Any = gm
                for part in node.target.split("."):  # type: ignore[union-attr]
                    target = getattr(target, part)
                values[node] = fake(target)
                if input_devices is not None and isinstance(target, torch.Tensor):
                    devices[node] = target.device
            elif node.op == "call_function":
                args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])
                try:
                    values[node] = node.target(*args, **kwargs)  # type: ignore[operator]
                    if node.target in _KEEP_INPUT_STORAGE:
                        values[node] = _in_input_storage(values[node], args[0])
                except Exception as error:
                    raise PropagationError(
                        f"{node.format_node()}: {type(error).__name__}: "
                        f"{str(error).splitlines()[0] if str(error) else ''}") from error
                if input_devices is not None:
                    devices[node] = _device_by_rule(node, values, devices)
            elif node.op != "output":
                raise PropagationError(f"{node.format_node()}: a {node.op} node (only ATen "
                                       "call_function graphs are analysed)")
            if node in values:
                snapshots[node] = _snapshot(values[node], devices.get(node)
                                            if input_devices is not None else None)
    return snapshots, grad


@dataclass(frozen=True)
class Snapshot:
    """A tensor's storage and geometry when its node ran (a later in-place view op, such as
    squeeze_, changes the tensor object's own metadata)."""

    storage: Any
    offset: Any
    sizes: tuple[Any, ...]
    strides: tuple[Any, ...]
    dtype: torch.dtype
    requires_grad: bool
    device: torch.device | None


def _snapshot(value: Any, device: torch.device | None) -> Any:
    """``device``: the value's device where it is a meta tensor (else read off the value)."""
    if isinstance(value, (list, tuple)):
        return [_snapshot(v, device) if isinstance(v, torch.Tensor) else None for v in value]
    if not isinstance(value, torch.Tensor):
        return None
    return Snapshot(StorageWeakRef(value.untyped_storage()), value.storage_offset(),
                    tuple(value.size()), tuple(value.stride()), value.dtype,
                    value.requires_grad, device if value.device.type == "meta" else value.device)


def placeholder_values(gm: fx.GraphModule) -> list[Any] | None:
    """The example values make_fx and torch.export record on the placeholders, if all have one."""
    out = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if "val" not in node.meta and "example_value" not in node.meta:
                return None
            out.append(example_value(node))
    return out
