"""reinplace(gm): a functional graph of ATen ops rewritten to write buffers in place wherever no
alias can tell the difference, each decision proved from the exact storage regions of one
fake-tensor run (_alias_analysis.py) and listed with the rule that made it. See Note [Reinplace:
the rules] and docs/reinplace.md.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from typing import Any, Literal, overload

import torch
import torch.fx as fx

from ._alias_analysis import (DEST, OUTPUT, READ, VIEW, WRITE, AliasAnalysis, InputLayout, PropagationError,
                              Region, is_view_op, placeholder_values, propagate)

aten = torch.ops.aten
_COPY_ = aten.copy_.default

# Note [Reinplace: the rules]
# A functional op `out = op(a, ...)` allocates `out`; writing it into `a` instead (`op_(a, ...)`,
# or for `*_scatter(base, src, ...)` a copy_ of src through the view of base) is invisible to
# the program when all of these hold, checked in this order and named in explain's report:
# 1. the op is deterministic (a random op's in-place form may draw differently), its geometry
#    is static, and autograd does not record it with a tensor that requires grad (an in-place
#    write could change a tensor saved for backward, or a leaf);
# 2. `out` has a's dtype, sizes, strides (later views of out must see the same layout) and
#    device, is a fresh allocation, and a addresses each byte once; where anything computed
#    from `out` is read through storage coordinates (as_strided counts from the storage's
#    start; an offset travels through views and through ops that copy their input's layout),
#    a starts where `out` does and is no graph input nor laid out as one (a make_fx graph's
#    input may come at any offset, and a *_scatter of it keeps that offset);
# 3. no other operand of the op overlaps the written region W (a pointwise op may read exactly
#    W: each element is read before it is written; any other overlap is the upstream bug
#    pytorch/pytorch#198031);
# 4. after the op, nothing reads W's old bytes (through any alias, the graph's outputs
#    included) before a copy_ overwrites all of W from a value that is not W's old content;
#    after that copy_, nothing reads `out` unless the copy_ wrote out itself back (otherwise out's
#    bytes would already be gone: the case of pytorch/pytorch#198094); and a returned `out` may
#    not land in an input's memory or in memory another output shares (the caller would see
#    outputs alias where eager's do not);
# 5. W lies in a graph input (or a constant) only where the program wrote that input: rule 4's
#    copy_ must be there (an epilogue write covering W); the write then happens earlier, and
#    that copy_ becomes a copy of the value onto itself, which is removed.
# An op that has no in-place form but has an out= form and whose result is copied whole into a
# region D (the epilogue's `copy_(input, op(...))`) writes D directly under the same rules with
# W = D. Candidates are tried in graph order, repeatedly, until none changes: a rewrite can
# free the buffer another candidate needed (the copy_ of a scatter, once in place, no longer
# reads its base). The analysis follows each rewrite (the rewritten value's storage joins the
# written one), so later decisions see earlier ones. Rejected: pattern rules without the
# storage analysis (Inductor's: the cluster of upstream bugs in docs/reinplace.md); reordering
# nodes to make more buffers dead (reads would move past writes: a scheduling problem left to
# compilers).

# Ops whose offset argument counts from the storage's start, not from the tensor's.
_STORAGE_COORDINATES = frozenset({aten.as_strided.default, aten.as_strided_copy.default,
                                  aten.as_strided_scatter.default})


def _readers(node: fx.Node) -> list[fx.Node]:
    """The nodes that read `node`'s result: its users, and for a list result (a foreach op) the
    users of its getitems."""
    readers = []
    for user in node.users:
        if user.target is operator.getitem:
            readers.extend(user.users)
        else:
            readers.append(user)
    return readers


# A `*_scatter` op and the view it writes through (the view takes the scatter's arguments after
# src). as_strided_scatter is not here: its geometry is relative to a fresh contiguous output.
_SCATTERS = {
    aten.slice_scatter.default: aten.slice.Tensor,
    aten.select_scatter.default: aten.select.int,
    aten.diagonal_scatter.default: aten.diagonal.default,
}


@dataclass
class Decision:
    """What reinplace did with one candidate node, and the rule that decided it."""

    node: str
    op: str
    action: Literal["in place", "out=", "scatter in place", "copy removed", "kept"]
    rule: str

    def __str__(self) -> str:
        return f"{self.node:<24} {self.op:<32} {self.action:<17} {self.rule}"


class Report(list):
    """The decisions of one reinplace call, one per candidate, in graph order."""

    def __str__(self) -> str:
        head = f"{'node':<24} {'op':<32} {'action':<17} rule"
        return "\n".join([head] + [str(d) for d in self])

    def changed(self) -> list[Decision]:
        return [d for d in self if d.action != "kept"]


@overload
def reinplace(gm: fx.GraphModule, *example_inputs: Any,
              explain: Literal[False] = False) -> fx.GraphModule: ...


@overload
def reinplace(gm: fx.GraphModule, *example_inputs: Any,
              explain: Literal[True]) -> tuple[fx.GraphModule, Report]: ...


def reinplace(gm: fx.GraphModule, *example_inputs: Any, explain: bool = False) -> Any:
    """A copy of the functional graph ``gm`` whose ops write in place where that is invisible to
    the program (Note [Reinplace: the rules]): ``add`` becomes ``add_``, ``index_copy``
    ``index_copy_``, a ``*_scatter`` a copy_ through its view, a result copied into an input an
    out= op writing the input, and the epilogue copies made redundant disappear.

    ``gm`` is a graph of ATen ops: ``capture``'s, or ``make_fx(torch.func.functionalize(f))``'s.
    Its storages are read from one fake-tensor run on ``example_inputs`` (the call's arguments;
    optional for graphs that recorded them: capture's and make_fx's). The result assumes, as
    ``gm`` does, that its inputs share memory exactly as those did; capture's graphs guard that.
    With ``explain=True`` returns ``(graph, report)``: every candidate with the rule that kept or
    changed it."""
    if not isinstance(gm, fx.GraphModule):
        raise TypeError(f"reinplace: expected an fx.GraphModule, got {type(gm).__name__}.")
    result = _copy_module(gm)
    report = Report()
    changes_metadata = next((n for n in result.graph.nodes if n.op == "call_function" and
                             isinstance(n.target, torch._ops.OpOverload) and
                             n.target._schema.is_mutable and _is_view_like(n.target)), None)
    if changes_metadata is not None:
        report.append(Decision("(graph)", str(changes_metadata.target), "kept",
                               "not analysed: the graph changes a tensor's metadata in place"))
        return (result, report) if explain else result
    inputs = _inputs_of(gm, example_inputs)
    try:
        values, grad = propagate(result, inputs)
    except PropagationError as error:
        report.append(Decision("(graph)", "", "kept", f"not analysed: {error}"))
        return (result, report) if explain else result
    _Reinplacer(result, AliasAnalysis(result.graph, values, grad), report).run()
    result.graph.lint()
    result.recompile()
    return (result, report) if explain else result


def _is_view_like(op: Any) -> bool:
    """An in-place op that changes a tensor's metadata (squeeze_, as_strided_) or storage."""
    return torch.Tag.inplace_view in op.tags or op._schema.name in _STORAGE_OPS


_STORAGE_OPS = {"aten::resize_", "aten::resize_as_", "aten::set_"}


def _inputs_of(gm: fx.GraphModule, example_inputs: tuple) -> InputLayout:
    if example_inputs:
        return InputLayout(list(gm.graph.process_inputs(*example_inputs)))
    recorded = placeholder_values(gm)
    if recorded is not None:  # make_fx's fake tensors (of as many fake modes as inputs)
        return InputLayout(recorded)
    layout = getattr(gm, "_tfz_input_layout", None)
    if layout is not None:
        return layout
    raise ValueError(
        "reinplace: the graph records no example values for its inputs (neither capture's "
        "input layout nor make_fx's node.meta['val']); pass them: reinplace(gm, *inputs).")


def _copy_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A new module of gm's class over a copy of its graph, with capture's guards and flags."""
    graph = fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    graph._codegen = gm.graph._codegen
    cls = type(gm)
    while cls.__qualname__.endswith("GraphModuleImpl"):  # FX's per-instance subclass
        cls = cls.__mro__[1]
    result = cls(gm, graph)
    for attr in ("_tfz_inputs", "_tfz_restores_grad", "_tfz_input_layout"):
        if attr in gm.__dict__:
            setattr(result, attr, gm.__dict__[attr])
    return result


def _inplace_variant(op: Any) -> Any:
    """The in-place overload of a functional ATen op with the same arguments, or None."""
    if not isinstance(op, torch._ops.OpOverload) or is_view_op(op) or op._schema.is_mutable:
        return None
    namespace = getattr(torch.ops, op.namespace)
    packet = getattr(namespace, op._schema.name.split("::")[1] + "_", None)
    variant = getattr(packet, op._overloadname, None) if packet is not None else None
    if variant is None:
        return None
    ours, theirs = op._schema.arguments, variant._schema.arguments
    if len(ours) != len(theirs) or not theirs or not _writes_first(variant):
        return None
    if any(a.name != b.name or str(a.type) != str(b.type) for a, b in zip(ours, theirs)):
        return None
    return variant


def _writes_first(op: Any) -> bool:
    first = op._schema.arguments[0]
    return first.alias_info is not None and first.alias_info.is_write


_out_cache: dict[Any, Any] = {}


def _out_variant(op: Any) -> tuple[Any, str] | None:
    """The out= overload of a functional ATen op with one tensor result, and its out name."""
    if op in _out_cache:
        return _out_cache[op]
    found = None
    if isinstance(op, torch._ops.OpOverload) and len(op._schema.returns) == 1 and \
            not is_view_op(op) and not op._schema.is_mutable:
        packet = op.overloadpacket
        for name in packet.overloads():
            candidate = getattr(packet, name)
            args = candidate._schema.arguments
            outs = [a for a in args if a.is_out]
            rest = [a for a in args if not a.is_out]
            if len(outs) == 1 and len(rest) == len(op._schema.arguments) and all(
                    a.name == b.name and str(a.type) == str(b.type)
                    for a, b in zip(rest, op._schema.arguments)):
                found = (candidate, outs[0].name)
                break
    _out_cache[op] = found
    return found


def _reads_values_only(user: fx.Node, value: fx.Node) -> bool:
    """Whether ``user`` reads ``value`` as the source of a copy (its strides do not matter)."""
    return (user.target is _COPY_ or user.target in _SCATTERS) and \
        user.args[1] is value and value not in (user.args[0], *user.args[2:])


class _Rejected(Exception):
    """A candidate that a rule keeps functional; the message names the rule."""


class _Reinplacer:
    def __init__(self, gm: fx.GraphModule, analysis: AliasAnalysis, report: Report) -> None:
        self.gm, self.graph, self.a, self.report = gm, gm.graph, analysis, report
        self.decisions: dict[fx.Node, Decision] = {}
        self.done: set[fx.Node] = set()
        self.has_storage_coordinates = any(n.target in _STORAGE_COORDINATES
                                           for n in gm.graph.nodes)

    def run(self) -> None:
        for _ in range(8):  # a rewrite frees buffers for earlier candidates: repeat until stable
            changed = False
            for node in list(self.graph.nodes):
                if node.op == "call_function" and node not in self.done:
                    changed |= self._try(node)
            if not changed:
                break
        self._remove_copies_onto_themselves()
        self._remove_unused_views()
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        self.report.extend(d for _, d in sorted(
            ((order.get(n, -1), d) for n, d in self.decisions.items()), key=lambda p: p[0]))

    def _decide(self, node: fx.Node, op: str, action: Any, rule: str) -> None:
        self.decisions[node] = Decision(node.name, op, action, rule)
        if action != "kept":
            self.done.add(node)

    # -- candidates ----------------------------------------------------------------------------
    def _try(self, node: fx.Node) -> bool:
        target = node.target
        name = str(target)
        try:
            if target in _SCATTERS:
                self._scatter(node)
                self._decide(node, name, "scatter in place",
                             "base not read after; src copied through the view")
                return True
            variant = _inplace_variant(target)
            in_place_refused: _Rejected | None = None
            if variant is not None:
                try:
                    self._in_place(node, variant)
                    self._decide(node, name, "in place", f"self dead after: {variant}")
                    return True
                except _Rejected as why:  # the out= form may still write the copy_'s target
                    in_place_refused = why
            if _out_variant(target) is not None and self._copied_whole(node) is not None:
                out_op = self._out_form(node)
                self._decide(node, name, "out=", f"result's copy_ target written directly: "
                             f"{out_op}")
                return True
            if in_place_refused is not None:
                raise in_place_refused
        except _Rejected as why:
            self._decide(node, name, "kept", str(why))
        except Exception as error:  # noqa: BLE001  (an op the analysis cannot follow stays)
            self._decide(node, name, "kept", f"not analysed: {type(error).__name__}: {error}")
        return False

    def _common_checks(self, node: fx.Node, written: list[Region]) -> None:
        """Rule 1, and a written region that addresses each byte once (rule 2)."""
        target = node.target
        if isinstance(target, torch._ops.OpOverload) and \
                torch.Tag.nondeterministic_seeded in target.tags:
            raise _Rejected("rule 1: random op (its in-place form may draw differently)")
        for w in written:
            if w.sizes is None:
                raise _Rejected("rule 1: symbolic geometry")
            if not w.self_disjoint():
                raise _Rejected("rule 2: the written tensor addresses a byte twice")
        out = self.a.regions.get(node)
        outs = out if isinstance(out, list) else [out]
        grad_on = self.a.grad_mode.get(node, True)
        for w, o in zip(written, outs):
            needs_grad = w.requires_grad or (o is not None and o.requires_grad)
            if needs_grad and (grad_on or w.storage not in self.a.input_storages):
                raise _Rejected("rule 1: autograd records a tensor that requires grad here "
                                "(an in-place write could change a tensor saved for backward)")

    def _fresh(self, node: fx.Node, out: Region | None, like: Region) -> None:
        """Rule 2: the functional result is a fresh allocation laid out like the written region,
        or read only as the source of copies (which read values, not layouts: `x[:, 1:3] *= 2`
        computes a contiguous product of a strided slice and copies it back)."""
        if out is None or out.sizes is None:
            raise _Rejected("rule 2: result not a tensor of static geometry")
        if self.a.first_node.get(out.storage) is not node:
            raise _Rejected("rule 2: result aliases an existing buffer")
        if out.device != like.device:  # Note [Reinplace: devices on meta tensors]
            raise _Rejected(f"rule 2: result on {out.device}, the written tensor on "
                            f"{like.device}")
        if out.dtype != like.dtype or out.sizes != like.sizes:
            raise _Rejected(f"rule 2: result {out.sizes} {out.dtype} differs from the written "
                            f"tensor's {like.sizes} {like.dtype}")
        if out.numel > 1 and out.geometry()[1:] != like.geometry()[1:] and not all(
                _reads_values_only(user, node) for user in node.users):
            raise _Rejected(f"rule 2: result strides {out.strides} differ from the written "
                            f"tensor's {like.strides}, and a user depends on them")
        if (out.offset != like.offset or like.storage in self.a.input_storages or
                like.storage in self.a.input_laid_out) and \
                self._read_through_storage_coordinates(node):
            raise _Rejected("rule 2: a user reads the result through storage coordinates "
                            "(as_strided), and the written tensor starts elsewhere in its storage "
                            "or is (laid out as) an input's, whose offset a make_fx graph does not "
                            "fix")

    def _read_through_storage_coordinates(self, node: fx.Node) -> bool:
        """Whether an as_strided reads `node`'s result or anything computed from it. Not only
        direct readers: a value's offset travels through views and through ops whose result
        copies their input's layout, and eager's kernels and their meta functions disagree on
        which those are (CPU's select_scatter of a tensor at offset 1 returns one at offset 1,
        its meta function one at offset 0), so any path from the result counts."""
        if not self.has_storage_coordinates:
            return False
        seen: set[fx.Node] = set()
        todo = [node]
        while todo:
            for reader in _readers(todo.pop()):
                if reader.target in _STORAGE_COORDINATES:
                    return True
                if reader not in seen:
                    seen.add(reader)
                    todo.append(reader)
        return False

    def _operands_apart(self, node: fx.Node, written: list[tuple[fx.Node, Region]],
                        skip: set[tuple[int, int | None]]) -> None:
        """Rule 3. ``skip``: (argument, place in a list argument) of the written operands."""
        pointwise = isinstance(node.target, torch._ops.OpOverload) and \
            torch.Tag.pointwise in node.target.tags
        for argument, place, value, index in self.a.tensor_inputs(node):
            if (argument, place) in skip:
                continue
            r = self.a.region(value, index)
            for _, w in written:
                # Exactly the same geometry, size-1 strides included: eager's in-place kernels
                # call anything else a partial overlap and raise.
                exact = r is not None and r.storage == w.storage and r.offset == w.offset and \
                    r.sizes == w.sizes and r.strides == w.strides and r.dtype == w.dtype
                # An empty operand overlaps nothing, but the very tensor passed twice is refused
                # by eager's overlap assert whatever its size (index_copy_(t, 0, i, t)).
                if r is not None and (r.overlaps(w) or exact) and not (pointwise and exact):
                    raise _Rejected(f"rule 3: operand {value.name} overlaps the written region")
        regions = [w for _, w in written]
        for i in range(len(regions)):
            for j in range(i):
                if regions[i].overlaps(regions[j]):
                    raise _Rejected("rule 3: two written tensors overlap")

    def _dead_after(self, node: fx.Node, w: Region, out: Region | None, at: int,
                    until: fx.Node | None = None) -> None:
        """Rules 4 and 5 for writing region w at node, whose result ``out`` then lives in w's
        storage at byte offset ``at``: returns when w's old bytes are dead, else raises.
        ``until``: the copy_ that must be the one overwriting w (the out= form)."""
        position = self.a.position[node]
        kill: fx.Node | None = None
        for use in self.a.uses_after(w.storage, position):
            if use.node is node:
                continue
            r = self.a.region(use.value, use.index)
            if r is None or not r.overlaps(w) or use.role == VIEW:
                continue
            if use.role == DEST:
                src = use.node.args[1]
                s = self.a.region(src) if isinstance(src, fx.Node) else None
                if s is not None and s.overlaps(w):
                    raise _Rejected(f"rule 4: {use.node.name} copies old bytes of the region")
                if not r.covers(w):
                    raise _Rejected(f"rule 4: {use.node.name} writes part of the region; the "
                                    "rest would keep the in-place result")
                kill = use.node
                break
            if until is not None:
                raise _Rejected(f"rule 4: {use.node.name} uses the target before the copy_")
            what = {OUTPUT: "returns", WRITE: "writes", READ: "reads"}[use.role]
            raise _Rejected(f"rule 4: {use.node.name} {what} the old value later")
        if until is not None and kill is not until:
            raise _Rejected("rule 4: the copy_ does not overwrite the target region first")
        if kill is None and w.storage in self.a.input_storages:
            raise _Rejected("rule 5: a graph input the program does not overwrite there")
        if out is not None:
            # The result's buffer becomes w's: a write into it later (an earlier rewrite made
            # one) would then change w's memory under readers that expect w's value.
            for use in self.a.uses_after(out.storage, position):
                if use.role in (WRITE, DEST) and use.node is not kill:
                    raise _Rejected(f"rule 4: {use.node.name} writes the result's buffer later")
        if out is not None and any(u.role == OUTPUT for u in self.a.uses.get(out.storage, [])) \
                and (w.storage in self.a.input_storages or
                     any(u.role == OUTPUT for u in self.a.uses.get(w.storage, []))):
            raise _Rejected("rule 4: the result is returned, and in place it would share memory "
                            "with an input or another output")
        if kill is None or out is None:
            return
        if self._writes_back(kill, out, w, at):
            # The copy_ writes the value back onto itself: w holds the result from here on, so
            # nothing may write w again while the result is still read (other such copies of it
            # back are no writes).
            for use in self.a.uses_after(w.storage, self.a.position[kill]):
                r = self.a.region(use.value, use.index)
                if use.role in (WRITE, DEST) and r is not None and r.overlaps(w) and not (
                        use.role == DEST and (self._writes_back(use.node, out, w, at) or
                                              self._onto_itself(use.node))):
                    raise _Rejected(f"rule 4: {use.node.name} overwrites the region after "
                                    f"{kill.name}")
            return
        later = self.a.uses_after(out.storage, self.a.position[kill])
        if later:
            raise _Rejected(f"rule 4: {later[0].node.name} reads the result after "
                            f"{kill.name} overwrote it")

    def _onto_itself(self, copy: fx.Node) -> bool:
        """Whether a copy_ copies a region onto itself (a no-op the clean-up removes)."""
        dest, src = copy.args[0], copy.args[1]
        d = self.a.region(dest) if isinstance(dest, fx.Node) else None
        s = self.a.region(src) if isinstance(src, fx.Node) else None
        return d is not None and s is not None and d.same(s)

    def _writes_back(self, copy: fx.Node, out: Region, w: Region, at: int) -> bool:
        """Whether ``copy`` (a copy_) will copy the result onto itself once the result lives in
        w's storage at byte offset ``at``: its source is the result (or a view of it, when the
        result is laid out as w is) and its destination is where that lands."""
        src = copy.args[1]
        s = self.a.region(src) if isinstance(src, fx.Node) else None
        dest = self.a.region(copy.args[0])  # type: ignore[arg-type]
        if s is None or dest is None or s.storage != out.storage:
            return False
        if s.same(out):
            moved = replace(w, requires_grad=s.requires_grad)
        elif out.geometry()[1:] == replace(w, offset=out.offset).geometry()[1:]:
            moved = s.shifted(w.storage, at - out.offset)
        else:
            return False
        return moved.same(dest)

    # -- rewrites ------------------------------------------------------------------------------
    def _in_place(self, node: fx.Node, variant: Any) -> None:
        first = node.args[0]
        foreach = isinstance(first, (list, tuple))
        selves = list(first) if foreach else [first]  # type: ignore[list-item]
        written = []
        for k, s in enumerate(selves):
            r = self.a.region(s) if isinstance(s, fx.Node) else None
            if r is None:
                raise _Rejected("rule 2: self is not a tensor")
            written.append((s, r))
        self._common_checks(node, [r for _, r in written])
        out = self.a.regions.get(node)
        outs = out if foreach else [out]
        if not isinstance(outs, list) or len(outs) != len(written):
            raise _Rejected("rule 2: result is not one tensor per written tensor")
        for o, (_, w) in zip(outs, written):
            self._fresh(node, o, w)
        skip = {(0, k if foreach else None) for k in range(len(selves))}
        self._operands_apart(node, written, skip)
        for o, (_, w) in zip(outs, written):
            self._dead_after(node, w, o, w.offset)
        # Rewrite: the node writes its self; its result (or the getitems of a foreach's list)
        # is that self.
        self.a.remove_uses_by(node)
        node.target = variant
        replaced: dict[fx.Node, fx.Node] = {}
        if foreach:
            for user in list(node.users):
                if user.target is operator.getitem:
                    self_k = selves[user.args[1]]  # type: ignore[index]
                    user.replace_all_uses_with(self_k)
                    replaced[user] = self_k
                    self.graph.erase_node(user)
            self.a.regions[node] = None
        for o, (_, w) in zip(outs, written):
            self.a.merge(o.storage, w.storage, w.offset - o.offset, replaced)  # type: ignore
        if not foreach:  # the result is self now, also where rule 2 let its strides differ
            self.a.regions[node] = written[0][1]
        self.a._add_uses(node)

    def _scatter(self, node: fx.Node) -> None:
        base, src, *view_args = node.args
        if not isinstance(base, fx.Node) or not isinstance(src, fx.Node):
            raise _Rejected("rule 2: base or src is not a tensor")
        b = self.a.region(base)
        if b is None or b.sizes is None:
            raise _Rejected("rule 1: symbolic geometry")
        view_op = _SCATTERS[node.target]  # type: ignore[index]
        v = self._view_region(b, view_op, view_args)
        self._common_checks(node, [v])
        out = self.a.region(node)
        self._fresh(node, out, b)
        self._operands_apart(node, [(base, v)], {(0, None)})
        self._dead_after(node, v, out, b.offset)
        assert out is not None
        # Rewrite: view = view_op(base, ...); view.copy_(src); the result is base.
        position = self.a.position[node]
        self.a.remove_uses_by(node)
        with self.graph.inserting_before(node):
            view = self.graph.call_function(view_op, (base, *view_args))
            copy = self.graph.call_function(_COPY_, (view, src))
        self.a.set_region(view, v, position - 0.5)
        self.a.set_region(copy, v, position - 0.25)
        node.replace_all_uses_with(base)
        self.graph.erase_node(node)
        self.a.merge(out.storage, b.storage, b.offset - out.offset, {node: base})

    @staticmethod
    def _view_region(base: Region, view_op: Any, view_args: list[Any]) -> Region:
        t = view_op(base.meta_tensor(), *view_args)
        item = t.dtype.itemsize
        return Region(base.storage, t.storage_offset() * item, tuple(t.size()),
                      tuple(s * item for s in t.stride()), t.dtype, base.requires_grad,
                      base.device)

    def _copied_whole(self, node: fx.Node) -> fx.Node | None:
        """The copy_ that writes this node's whole result into another region, if one does."""
        for user in node.users:
            if user.target is _COPY_ and user.args[1] is node and user.args[0] is not node:
                return user
        return None

    def _out_form(self, node: fx.Node) -> Any:
        out_op, out_name = _out_variant(node.target)  # type: ignore[misc]
        copy = self._copied_whole(node)
        assert copy is not None
        dest = copy.args[0]
        d = self.a.region(dest) if isinstance(dest, fx.Node) else None
        out = self.a.region(node)
        if d is None:
            raise _Rejected("rule 2: copy_ target is not a tensor")
        self._common_checks(node, [d])
        self._fresh(node, out, d)
        self._operands_apart(node, [(dest, d)], set())  # type: ignore[list-item]
        self._dead_after(node, d, out, d.offset, until=copy)
        target = self._available_before(dest, node)  # type: ignore[arg-type]
        assert out is not None
        self.a.remove_uses_by(node)
        node.target = out_op
        node.kwargs = {**node.kwargs, out_name: target}
        self.a._add_uses(node)
        self.a.merge(out.storage, d.storage, d.offset - out.offset)
        self.a.regions[node] = d
        return out_op

    def _available_before(self, value: fx.Node, node: fx.Node) -> fx.Node:
        """``value`` if it is computed before ``node``, else a copy of its chain of views made
        just before node (the epilogue's views of an input come after the op)."""
        if self.a.position[value] < self.a.position[node]:
            return value
        if not is_view_op(value.target) or not isinstance(value.args[0], fx.Node):
            raise _Rejected(f"rule 5: the copy_ target {value.name} is computed after the op")
        base = self._available_before(value.args[0], node)
        with self.graph.inserting_before(node):
            view = self.graph.call_function(value.target, (base, *value.args[1:]),  # type: ignore
                                            dict(value.kwargs))
        self.a.set_region(view, self.a.region(value), self.a.position[node] - 0.5)
        return view

    # -- clean-up ------------------------------------------------------------------------------
    def _remove_copies_onto_themselves(self) -> None:
        for node in list(self.graph.nodes):
            if node.target is not _COPY_:
                continue
            if self._onto_itself(node):
                node.replace_all_uses_with(node.args[0])
                self.graph.erase_node(node)
                self._decide(node, str(_COPY_), "copy removed",
                             "the value is already in place (rule 5)")

    def _remove_unused_views(self) -> None:
        for node in reversed(list(self.graph.nodes)):
            if node.op == "call_function" and not node.users and is_view_op(node.target) and \
                    node.target is not operator.getitem:
                self.graph.erase_node(node)
