"""The view calls that lead from an input (or another output) of a dynamo graph to an output,
replayed on the real tensors after the graph ran: the torch.compile backend's way of giving an
output that eager made a view the exact view eager made (see Note [Dynamo: outputs that view
inputs]).
"""
from __future__ import annotations

import functools
import operator
from typing import Any, Optional, Sequence

import torch
import torch.fx

# Note [Dynamo: outputs that view inputs]
# An output of a dynamo graph that eager made a view of an input must come back as such a view
# (Note [Dynamo: the backend]). Its sizes, strides and offset are eager's only if eager's kernels
# compute them: dynamo's fake values take several view ops through Python reference
# implementations whose geometry differs from the C++ kernels' at the edges (an empty
# x.diagonal(-1, 1, 0) of a 2x1 input: offset 1 under dynamo's fake mode, 0 in eager; an out=
# write into that view then resizes it from another element). So where the graph reaches the
# output from a placeholder through view calls alone (torch-level calls whose ATen schema
# returns an alias of a self it does not write, view properties such as x.mT, unsafe_split, and
# getitem of their tuples), the backend replays those calls on the real input after each run:
# eager's own kernels then make the view, with eager's geometry, dtype, conjugate bit and view
# history. Without views the same holds for an output reached from another output (v1 = v0[2]).
# In-place data writes on the way (y = x.add_(1); y.view(-1); x -= y) and calls that return their
# self are skipped; in-place changes of a view's geometry (v.unsqueeze_(0)) are replayed on the
# replayed view, in the graph's order. No replay where the walk meets anything else, an argument
# computed in the graph (view_as(y)), a change of the root's own geometry after the calls read
# it (the real root has its final geometry when the replay starts; an out= into an input that
# ends as it began wrote in place), or a view's resize_, set_ or out= use (the storage may
# change too). Those outputs are rebuilt with as_strided in the geometry of a run of the graph on
# meta inputs laid out as the real ones (eager's C++ kernels; once, at compile time, with static
# shapes), or of the fake value where that cannot run; and so are the others in a call where an
# input's geometry changed in a way the graph does not show (x.flatten(1, 1) is x in eager, a new
# tensor in dynamo's fake values, and its swapdims_ swaps the input after the views were taken):
# the backend compares each input's geometry before and after the run. Rejected: correcting the
# fake geometry op by op (each divergence of a reference from its kernel would be a case of ours
# to find and keep).

# In-place operators that change only a tensor's sizes, strides or offset: on a view of the
# chain they are replayed too (on the replayed view, in the graph's order).
_METADATA_WRITES = frozenset({
    "t_", "transpose_", "swapdims_", "swapaxes_", "squeeze_", "unsqueeze_", "as_strided_",
})
# Python's augmented assignments, which dynamo records as operator.isub(x, y) and the like: on
# a tensor each writes x in place and returns it.
_IN_PLACE_OPERATORS = frozenset({
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
    operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift,
    operator.irshift, operator.imatmul,
})
# Ops that return views without saying so in their schema (no alias annotation: autograd does
# not track them as views).
_UNANNOTATED_VIEWS = frozenset({"unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk"})
# Tensor properties that are views of the tensor.
_VIEW_PROPERTIES = frozenset({"T", "mT", "H", "mH", "real", "imag"})
# In-place operators that change a tensor's sizes, strides, offset or storage.
_GEOMETRY_WRITES = _METADATA_WRITES | {"resize_", "resize_as_", "set_", "unsafe_set_"}


def _op_name(node: torch.fx.Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        return name.split(".")[0]
    return ""


@functools.lru_cache(maxsize=None)
def _aten_kind(name: str) -> str:
    """'view' where every ATen overload named `name` that takes a tensor self returns an alias
    of it without writing it, 'write' where one writes self, '' otherwise."""
    if name in _UNANNOTATED_VIEWS:
        return "view"
    packet = getattr(torch.ops.aten, name, None)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return ""
    schemas = [getattr(packet, overload)._schema for overload in packet.overloads()]
    schemas = [s for s in schemas  # not aten::split.str and the like
               if s.arguments and isinstance(s.arguments[0].type, torch.TensorType)]
    if not schemas:
        return ""
    if any(s.arguments[0].alias_info is not None and s.arguments[0].alias_info.is_write
           for s in schemas):
        return "write"
    if all(s.arguments[0].alias_info is not None and s.returns
           and s.returns[0].alias_info is not None for s in schemas):
        return "view"
    return ""


def _is_torch_function(target: Any) -> bool:
    name = getattr(target, "__name__", None)
    return name is not None and getattr(torch, name, None) is target


def _step_kind(node: torch.fx.Node) -> str:
    """How the walk treats `node` whose first argument is on the way: 'view' (replayed), 'meta'
    (an in-place change of a view's geometry: replayed), 'write' (an in-place data write, which
    returns its self: skipped), '' (no replay)."""
    if node.op == "call_function" and node.target is operator.getitem:
        return "view"  # of a split's tuple, or basic indexing (the value shares storage)
    if node.op == "call_function" and node.target is getattr and len(node.args) == 2 and \
            node.args[1] in _VIEW_PROPERTIES:
        return "view"  # x.mT, recorded as getattr(x, "mT")
    if node.op == "call_function" and node.target in _IN_PLACE_OPERATORS:
        return "write"  # x -= y is x.__isub__(y), which returns x
    if node.op == "call_method" or (node.op == "call_function"
                                   and _is_torch_function(node.target)):
        name = _op_name(node)
        if "out" in node.kwargs:
            return ""
        if name in _METADATA_WRITES:
            return "meta"
        if name in _GEOMETRY_WRITES:
            return ""
        return _aten_kind(name)
    return ""


def _changes_geometry(user: torch.fx.Node, node: torch.fx.Node, kept: bool = False) -> bool:
    if user.args and user.args[0] is node and _op_name(user) in _GEOMETRY_WRITES:
        return True
    if kept:  # an out= that did not resize (the tensor ends as it began)
        return False
    out = user.kwargs.get("out")
    outs = out if isinstance(out, (tuple, list)) else [out]
    return any(o is node for o in outs)


class ViewChain:
    """The calls from a root (placeholder `index`, or output `root_output` of the graph) to an
    output, in the graph's order; `replay(args)` runs them on the real arguments (and on the
    root output's real value, `root_value`)."""

    def __init__(self, root: torch.fx.Node, index: Optional[int], root_output: Optional[int],
                 output: torch.fx.Node, steps: list[tuple[torch.fx.Node, bool]],
                 arguments: dict[torch.fx.Node, int]) -> None:
        self.index, self.root_output = index, root_output
        self._root = root
        self._output = output
        self._steps = steps  # (node, replayed); not replayed: an in-place data write
        self._arguments = arguments  # placeholders the calls read (sizes) -> arg index

    def replay(self, args: Sequence[Any], root_value: Any = None) -> torch.Tensor:
        env: dict[torch.fx.Node, Any] = {}
        for node, position in self._arguments.items():
            env[node] = args[position]
        env[self._root] = args[self.index] if self.index is not None else root_value
        for node, replayed in self._steps:
            if not replayed:  # its value is its self
                env[node] = env[node.args[0]]
                continue
            call_args = torch.fx.node.map_arg(node.args, lambda n: env[n])
            call_kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
            if node.op == "call_method":
                self_arg, *rest = call_args
                env[node] = getattr(self_arg, str(node.target))(*rest, **call_kwargs)
            else:
                env[node] = node.target(*call_args, **call_kwargs)
        return env[self._output]


def view_chain(gm: torch.fx.GraphModule, output: Any,
               roots: Optional[dict[torch.fx.Node, int]] = None,
               kept_geometry: frozenset[torch.fx.Node] = frozenset()) -> Optional[ViewChain]:
    """The view calls from a placeholder, or from another output of gm (`roots`: output node ->
    output index), to `output` (a node of gm's output), with the changes of geometry made in
    place on views among them, or None where the output cannot be remade by replaying calls
    (see the Note). `kept_geometry`: placeholders that end the graph with the geometry they
    began it with, for which an out= argument is no change of geometry (it wrote in place)."""
    if not isinstance(output, torch.fx.Node):
        return None
    roots = roots or {}
    positions = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    steps: list[tuple[torch.fx.Node, bool]] = []
    on_the_way: list[torch.fx.Node] = []
    node = output
    while node.op != "placeholder" and (node is output or node not in roots):
        kind = _step_kind(node)
        if not kind or not node.args or not isinstance(node.args[0], torch.fx.Node):
            return None
        steps.append((node, kind != "write"))
        on_the_way.append(node)
        node = node.args[0]
    root = node
    chain_nodes = set(on_the_way) | {root}
    # The nodes that are the root itself: in-place writes return their self, and so do calls
    # that may (x.to(x.dtype) is x: their values are one object).
    itself = {root}
    for n in reversed(on_the_way):
        if n.args[0] in itself and (_step_kind(n) == "write" or _same_value(n, n.args[0])):
            itself.add(n)
    # The root's own geometry changed in the graph (x.t_(), or through a name of it) after the
    # calls read it: its real value has its final geometry when the replay starts, not the one
    # the calls saw. (A change before the first call, v0.unsqueeze_(1); v0.unsqueeze(-1), is in
    # that final geometry.)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    first_read = min((order[n] for n, replayed in steps if replayed and n.args[0] in itself),
                     default=len(order))
    if any(_changes_geometry(user, n, root in kept_geometry) and order[user] >= first_read
           for n in itself for user in n.users):
        return None
    for n in on_the_way:  # changes of a view's geometry made in place: replayed where they ran
        if n in itself:
            continue
        # The view under other names that are the same tensor in eager (v.real of a real v,
        # v.to(v.dtype), v.add_(1)): a change of geometry through any of them is one of v.
        names = [n]
        for name in names:
            for user in name.users:
                if user in chain_nodes:
                    continue
                if user.args and user.args[0] is name and _same_value(user, name) and \
                        _step_kind(user) in ("view", "write"):
                    steps.append((user, _step_kind(user) == "view"))
                    chain_nodes.add(user)
                    names.append(user)
                elif user.args and user.args[0] is name and \
                        _op_name(user) in _METADATA_WRITES and "out" not in user.kwargs:
                    steps.append((user, True))
                elif _changes_geometry(user, name):
                    return None  # resize_, set_, an out= argument: the storage may change too
    arguments: dict[torch.fx.Node, int] = {}
    for step, replayed in steps:
        if not replayed:
            continue
        for arg in _node_arguments(step):
            if arg in chain_nodes:
                continue
            if arg.op != "placeholder":
                return None  # computed in the graph (view_as(y), a size read from a tensor)
            arguments[arg] = positions[arg]
    steps.sort(key=lambda step: order[step[0]])
    if root.op == "placeholder":
        return ViewChain(root, positions[root], None, output, steps, arguments)
    return ViewChain(root, None, roots[root], output, steps, arguments)


def view_root(output: Any) -> Optional[torch.fx.Node]:
    """The node an output of the graph is reached from by the calls a view chain replays (views,
    in-place changes of geometry, in-place writes that return their self), where that node is
    computed in the graph (not a placeholder) and is not the output itself; else None."""
    if not isinstance(output, torch.fx.Node):
        return None
    node = output
    while node.op != "placeholder" and _step_kind(node) and node.args and \
            isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return None if node is output or node.op == "placeholder" else node


def _same_value(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    value = a.meta.get("example_value")
    return value is not None and value is b.meta.get("example_value")


def _node_arguments(node: torch.fx.Node) -> list[torch.fx.Node]:
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda n: found.append(n) or n)
    return found
