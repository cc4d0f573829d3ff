"""Higher-order operators (torch.cond, while_loop, scan, map, associative_scan, ...) called inside
a functionalized function: see Note [Control flow: higher-order operators]. Installed once, when
the package is imported (install()); costs nothing outside a functionalize call.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
from torch._C import DispatchKey
from torch.utils import _pytree as pytree

from . import _C, control_flow_gradients, rng_state

if TYPE_CHECKING:
    from .api import Remove

# Note [Control flow: higher-order operators]
# torch.cond(pred, true_fn, false_fn, operands) with a tensor predicate (and while_loop, scan,
# map, associative_scan) does not run its branches itself: it hands the call to torch.compile,
# whose dynamo speculates the branches on fake copies of the operands. Dynamo cannot make fake
# copies of our wrappers, so inside functionalize every such call failed with dynamo's internal
# assertion. Two pieces make them run:
#  1. While a layer runs user code on this thread, torch's eager entry
#     (torch._higher_order_ops.utils._hop_compile_and_call, the one place every operator's
#     Python function goes through) calls the operator directly instead of compiling it.
#  2. The operator then dispatches on our wrappers' key, where each operator that has a dense
#     (CompositeExplicitAutograd) kernel gets ours: with nothing recording, torch's own dense
#     kernel runs on the wrappers, in the layer, so the branch or loop body is ordinary user code
#     and every mutation in it (of intermediates, of closure tensors, of the operands themselves,
#     which torch refuses, pytorch/pytorch#147210) is functionalized like any other, and autograd
#     records the ops the branch ran, as eager's does.
# Under make_fx the operator stays in the graph with functional branch subgraphs: its tensor
# arguments are synced and unwrapped, each branch becomes `functionalize(branch)` (a layer of its
# own, entered while ours is suspended), and the operator runs on the inner tensors in an inner
# call, where make_fx's mode traces each branch into a subgraph; the results are wrapped again.
# Tensors of the enclosing function a branch uses are lifted into operands
# (Note [Control flow: closures]), what cond's branches write (operands, closures) comes
# back as outputs written by the enclosing layer (Note [Control flow: branches that write]),
# and a cond, scan or map on tensors that require grad is traced with its gradient
# (Note [Control flow: gradients]).
# Registering a kernel at a key adds the key to the operator's dispatch mask, and our autograd-level
# key carries the autograd functionality bit, which every backend's autograd key shares: an
# operator that falls through AutogradCPU and AutogradCUDA (print, auto_functionalized,
# with_effects) got it back, and then raised "could not find kernel ... at AutogradCPU" for every
# caller once this module was imported (torch.compile with aot_eager and torch.export's
# run_decompositions of a program with a mutating custom op, torch's own print). Such an operator
# gets our kernel at the backend key alone, which our wrappers reach below the autograd key it
# falls through.
# capture records dispatcher ops only, so it refuses the operator by name (a graph that
# inlined the taken branch would be wrong for inputs that take the other). Rejected: routing
# operands through dynamo (it would need a fake form of our TensorImpl), and patching torch.cond
# & co. one by one (user code that imported them earlier keeps the originals; the eager entry is
# shared by all of them).

# The keys an operator can dispatch on inside a layer: our wrappers' autograd-level key, its
# backend twin (code that excludes autograd: inference_mode) and the factory key the layer
# includes (Note [Which dispatch key]), which Python's DispatchKey enum does not name.
_OUR_KEYS = [DispatchKey(k) for k in _C._dispatch_keys()]
_original_compile_and_call: Callable[..., Any] | None = None


def _hop_compile_and_call(fn: Callable[..., Any], args: tuple,
                          kwargs: dict[str, Any] | None = None) -> Any:
    if _C._layer_active():
        return fn(*args, **(kwargs or {}))
    return _original_compile_and_call(fn, args, kwargs)  # type: ignore[misc]


# Note [Control flow: torch 2.11's eager entry]
# torch 2.11 has no shared _hop_compile_and_call: each operator's Python function (cond,
# while_loop, map, scan, associative_scan) runs `with setup_compilation_env() as backend:
# return torch.compile(wrapper, backend=backend, fullgraph=True)(*args)`, looking up both names
# at call time (utils.setup_compilation_env through its module, torch.compile through torch). On
# such a torch, piece 1 of Note [Control flow: higher-order operators] replaces
# setup_compilation_env: inside a layer it arms a one-shot, per-thread bypass instead of setting
# up dynamo, and torch.compile (wrapped once, at the first such call) returns the wrapper
# uncompiled when the bypass is armed on its thread, so the operator is called directly, as the
# later shared entry lets us do. Every other torch.compile call, on any thread, reaches torch's.
# Rejected: patching torch.compile only for the with block (another thread compiling meanwhile
# would race on the module attribute), and patching cond & co. one by one (the reason in the
# Note above).
# Note [Control flow: flex_attention's eager entry]
# flex_attention called outside torch.compile compiles its operator call the way torch 2.11's
# operators do (setup_compilation_env, then torch.compile of a wrapper), through the name it
# imported into torch.nn.attention.flex_attention, which no shared entry replaces: dynamo met our
# wrappers ("you set no_dispatch() before calling into this function"). That module's name is
# pointed at the same bypass, so inside a layer the operator runs directly and its dense kernel
# (the scores materialized, as torch's unfused eager path) runs on the wrappers like the branches
# of Note [Control flow: higher-order operators]. Under make_fx and capture that kernel's ops are
# recorded as they run (score_mod and mask_mod are applied with vmap, the same ops for every
# input), so the graph holds attention as ops rather than the operator: right on any input, with
# no subgraph a backend must know. Rejected: keeping the operator under make_fx (its subgraphs
# are traced by dynamo's machinery, which meets our wrappers as in the eager failure).
_bypass = threading.local()
_original_setup_env: Callable[..., Any] | None = None
_original_compile: Callable[..., Any] | None = None


@contextlib.contextmanager
def _setup_compilation_env(*args: Any, **kwargs: Any) -> Iterator[Any]:
    if not _C._layer_active():
        with _original_setup_env(*args, **kwargs) as backend:  # type: ignore[misc]
            yield backend
        return
    _wrap_compile()
    _bypass.armed = True
    try:
        yield "eager"
    finally:
        _bypass.armed = False


def _wrap_compile() -> None:
    global _original_compile
    if _original_compile is not None:
        return
    original = torch.compile

    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:
        if getattr(_bypass, "armed", False) and (args or "model" in kwargs):
            _bypass.armed = False
            return args[0] if args else kwargs["model"]
        return original(*args, **kwargs)

    _original_compile = original
    torch.compile = compile  # type: ignore[assignment]


# Operators whose dense kernel is a fixed program of ops, the same for every input (no branch,
# no loop whose trip count depends on values): traced or captured, they are recorded as those
# ops, a graph right on any input. See Note [Control flow: flex_attention's eager entry]. The
# same holds for foreach_map (its function applied to each element of its lists), hints_wrapper
# (its body; the hints are for compilers) and out_dtype (the op computed in the output dtype,
# the kernel chosen by the arguments' metadata), which were refused by name under a tracer.
_RECORDED_AS_OPS = frozenset({"flex_attention", "flex_attention_backward", "foreach_map",
                              "hints_wrapper", "out_dtype"})


def _kernel(op: Any, dense: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(dense)
    def run(*args: Any, **kwargs: Any) -> Any:
        if torch._C._len_torch_dispatch_stack() > 0:
            return _traced(op, args, kwargs)
        if _C._ops_are_recorded():
            raise NotImplementedError(
                f"functionalize: {op.name()} (a higher-order operator) under capture is not "
                "supported: capture records dispatcher ops, and a graph of the taken branch "
                "would be wrong for inputs that take the other. Use "
                "make_fx(functionalize(f)), which keeps the operator with functional subgraphs.")
        if op.name() == "cond" and torch.is_grad_enabled():
            return control_flow_gradients.eager_cond(op, dense, args, kwargs, _traced)
        return dense(*args, **kwargs)

    return run


# The operators whose tracing with functional subgraphs is tested (test_control_flow.py). scan
# traces its combine function on padded copies of its operands (clone_input), inputs that do not
# span their storage, which take their own base under make_fx
# (Note [Inputs: storage coordinates under a tracer]). Of these, cond and scan are traced with
# their gradients (Note [Control flow: gradients]).
_TRACED = {"cond", "while_loop", "map_impl", "associative_scan", "scan"}


def _traced(op: Any, args: tuple, kwargs: dict[str, Any], fake: Any = None) -> Any:
    """The operator on inner tensors in an inner call, each callable functionalized: the tracer
    below records it with functional subgraphs (Note [Control flow: higher-order operators]).
    Tensors of this function that a branch closes over are found by tracing, each becomes one
    more trailing operand, and the operator is traced again (Note [Control flow: closures]).
    With `fake` (control_flow_gradients' search mode) the operator runs on fake copies of its
    operands instead, writing nothing, and the closures found are returned."""
    if op.name() not in _TRACED:
        raise NotImplementedError(
            f"functionalize: {op.name()} (a higher-order operator) under make_fx is supported "
            f"for {', '.join(sorted(_TRACED))}. Call the function without tracing (it then runs "
            "eagerly, autograd included), or trace it without functionalize.")
    # (the tensor a branch met, this layer's wrapper that is or stands for it) per closure.
    lifted: list[tuple[torch.Tensor, torch.Tensor]] = []
    written: set[int] = set()  # trailing operands (then closures) some branch writes
    while True:
        _C._take_foreign_wrapper()  # nothing left over from an earlier error
        try:
            out = _traced_with(op, args, kwargs, lifted, written, fake)
            return out if fake is None else [w for _, w in lifted]
        except _BranchWrites as more:
            if more.indices <= written:  # written through a copy already: cannot happen twice
                raise RuntimeError(f"functionalize: {op.name()}: {more}") from more
            written |= more.indices
        except RuntimeError:
            foreign = _C._take_foreign_wrapper()
            if foreign is None:
                raise
            own = _lifted_here(foreign)
            if own is None or any(own is w for _, w in lifted):
                _C._note_foreign_wrapper(foreign)  # for an enclosing operator to lift
                raise
            lifted.append((foreign, own))


class _BranchWrites(Exception):
    """A branch wrote trailing operands or closures that are not yet returned: trace again."""

    def __init__(self, indices: set[int]) -> None:
        super().__init__(f"branch writes operands {sorted(indices)}")
        self.indices = indices


# The closures lifted into the branch running on this thread (id of the tensor user code holds
# -> the branch layer's wrapper standing for it), innermost last: a nested operator lifts
# through it.
_substitutes: list[dict[int, torch.Tensor]] = []


def _lifted_here(foreign: torch.Tensor) -> torch.Tensor | None:
    """The wrapper of the current layer (the one running the operator) that `foreign` is, or that
    stands for it in the branch being traced; None if it is neither."""
    if _substitutes and id(foreign) in _substitutes[-1]:
        return _substitutes[-1][id(foreign)]
    return foreign if _C._is_layer_wrapper(foreign) else None


def _traced_with(op: Any, args: tuple, kwargs: dict[str, Any],
                 lifted: list[tuple[torch.Tensor, torch.Tensor]], written: set[int],
                 fake: Any = None) -> Any:
    from .api import functionalize

    seen = [t for t, _ in lifted]
    closures = [w for _, w in lifted]
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    differentiable = (fake is None and torch.is_grad_enabled()
                      and any(t.requires_grad for t in tensors + closures))
    if differentiable and op.name() not in ("cond", "scan", "map_impl"):
        raise NotImplementedError(
            f"functionalize: {op.name()} (a higher-order operator) under make_fx is supported "
            "on operands (and closure tensors) that do not require grad; of the operators, "
            "torch.cond, scan and map are traced with their gradients "
            "(Note [Control flow: gradients]). Call the function without tracing, or under "
            "torch.no_grad().")
    # A differentiable call returns its outputs flat (autograd.Function's outputs).
    flat = differentiable or bool(written)
    remove: Remove = "mutations_and_views" if _C._layer_removes_views() else "mutations"
    trailing = list(args[-1]) + closures  # what each callable gets after its own arguments
    extra = len(closures)
    out_spec: list[Any] = []

    def functional(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*xs: Any) -> Any:
            first = len(xs) - len(trailing)  # the callable's own arguments come first
            before = [x._version if isinstance(x, torch.Tensor) else None for x in xs]
            # See Note [Control flow: branches that write]: what a branch writes it writes to a
            # copy, which it returns.
            # (Looking for closures, every write goes to a copy: nothing of this run is kept.)
            ys = [x.clone() if i - first in written or (fake is not None and
                                                        isinstance(x, torch.Tensor)) else x
                  for i, x in enumerate(xs)]
            _C._lift_closures(seen, ys[len(ys) - extra:] if extra else [])
            _substitutes.append({id(t): s for t, s in zip(seen, ys[len(ys) - extra:])})
            try:
                with fake.reads if fake is not None else contextlib.nullcontext():
                    out = fn(*ys[:len(ys) - extra])
            finally:
                _substitutes.pop()
            # A branch that returns a closure tensor itself returns a copy of the operand standing
            # for it (torch's tracing refuses outputs that alias operands).
            stand_in = {id(t): s for t, s in zip(seen, ys[len(ys) - extra:])}
            out = pytree.tree_map_only(
                torch.Tensor, lambda t: stand_in[id(t)].clone() if id(t) in stand_in else t, out)
            for t in pytree.tree_leaves(out):  # a closure returned before any op met it
                if isinstance(t, torch.Tensor) and _C._is_functional(t) and \
                        not _C._is_layer_wrapper(t):
                    _C._note_foreign_wrapper(t)
                    raise RuntimeError("functionalize: a branch returns a tensor it closes over")
            more = {i - first for i, (x, v) in enumerate(zip(xs, before))
                    if v is not None and x._version != v and i >= first}
            if more and fake is None:
                if op.name() != "cond":
                    raise NotImplementedError(
                        f"functionalize: {op.name()} under make_fx: its function writes a tensor "
                        "it is given or closes over, which only torch.cond's branches may do "
                        "here. Return the new value instead.")
                raise _BranchWrites(more)
            if not flat:
                return out
            leaves, spec = pytree.tree_flatten(out)
            out_spec[:] = [spec]
            return (*leaves, *[ys[first + i] for i in sorted(written)])

        def branch(*xs: Any) -> Any:  # not functools.wraps: tracers read the signature
            return functionalize(run, remove=remove)(*xs)

        branch.__name__ = getattr(fn, "__name__", "branch")
        return branch

    def inner(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return _C._from_functional(a) if _C._is_functional(a) else a
        return functional(a) if callable(a) else a

    inner_args = list(pytree.tree_map(inner, args))
    inner_kwargs = pytree.tree_map(inner, kwargs)
    if closures:
        # Every traced operator takes its trailing operands (cond's operands, while_loop's,
        # scan's and associative_scan's additional_inputs, map_impl's pos_args) last, passed to
        # each callable after its own arguments.
        inner_args[-1] = (*inner_args[-1], *[_C._from_functional(w) for w in closures])
    scope = _C._InnerCall()
    try:
        if fake is not None:
            if torch._C._functorch.peek_interpreter_stack() is not None:
                # A torch.func transform around the layer (back in place for this inner call)
                # would take the operator first; under it, torch's cond has no rule for most.
                return None
            with fake:
                out = op(*pytree.tree_map_only(torch.Tensor, fake.from_tensor, inner_args),
                         **inner_kwargs)
        elif differentiable and op.name() == "scan":
            out = control_flow_gradients.traced_scan(op, *inner_args, real=_real_outputs)
        elif differentiable and op.name() == "map_impl":
            out = control_flow_gradients.traced_map(op, *inner_args, real=_real_outputs)
        elif differentiable:
            pred, true_fn, false_fn, operands = inner_args
            out = control_flow_gradients.traced_cond(op, pred, true_fn, false_fn, operands,
                                                     len(written))
        else:
            out = op(*inner_args, **inner_kwargs)
            out = _real_outputs(op, inner_args, inner_kwargs, out)
    finally:
        scope.close()
    if fake is not None:
        return None
    out = pytree.tree_map_only(torch.Tensor, _C._to_functional, out)
    if not flat:
        return out
    leaves = list(out)
    new_values = leaves[len(leaves) - len(written):]
    for i, value in zip(sorted(written), new_values):
        trailing[i].copy_(value)  # the write, in this layer (functionalized like any other)
    return pytree.tree_unflatten(leaves[:len(leaves) - len(written)], out_spec[0])


# Note [Control flow: scan's outputs under a real tracer]
# make_fx (tracing_mode="real") records scan with outputs made from its combine subgraph's
# metadata: fake tensors, where every other op gives real ones. The next op that met a real
# tensor failed ("Please convert all Tensors to FakeTensors first"), plain make_fx's as well, and
# capture, which traces in real mode, refused every program that used a scan's result with its
# inputs. So after such a call the operator also runs for real (its dense kernel, each step a
# functionalized call as in an eager one) with tracing off, and the real results take the fake
# ones' place under the same graph nodes. Costs one more run of the loop, at trace time only.
# Rejected: tracing symbolically whenever scan appears (sizes would become symbols for the whole
# program, guards included).
def _real_outputs(op: Any, args: list[Any], kwargs: dict[str, Any], out: Any) -> Any:
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.experimental.proxy_tensor import (
        disable_proxy_modes_tracing, get_proxy_slot, track_tensor_tree,
    )

    leaves = pytree.tree_leaves(out)
    if not any(isinstance(t, FakeTensor) for t in leaves) or any(
            isinstance(t, FakeTensor) for t in pytree.tree_leaves(args)):
        return out
    tracer = rng_state.tracer()
    if tracer is None:
        return out
    with disable_proxy_modes_tracing():
        real = op(*args, **kwargs)
    for fake, value in zip(leaves, pytree.tree_leaves(real)):
        if isinstance(fake, torch.Tensor):
            proxy = get_proxy_slot(fake, tracer, None, lambda slot: slot.proxy)
            if proxy is not None:
                with disable_proxy_modes_tracing():
                    track_tensor_tree(value, proxy, constant=None, tracer=tracer)
    return real


# Note [Control flow: branches that write]
# torch.cond's tracing refuses branches that write their operands or closure tensors (a
# subgraph with a copy_ into its input is not functional, and which branch ran is known only at
# run time). Under make_fx each branch runs in a layer of its own, whose epilogue would put
# exactly that copy_ in the subgraph. Instead, a branch that writes trailing operand i (an
# operand, or a closure lifted as one: Note [Control flow: closures]) is found by its version
# counter, and the operator is traced again with every branch writing a copy of operand i and
# returning the copy's final value as one more output (the branch that does not write returns
# the unchanged copy); the enclosing layer then writes each returned value into its operand with
# copy_, functionalized like any write. The subgraphs stay functional and the program means what
# the branch taken did. Loops (while_loop, map, associative_scan) that write what they are given
# are refused by name: their bodies' outputs are fixed by the operator (the carried values).
# Rejected: returning every operand from every branch (a copy per operand in each subgraph for
# the rare branch that writes).


def _call_subgraph(subgraph: Callable[..., Any], *operands: Any, **kwargs: Any) -> Any:
    return subgraph(*operands)


def install() -> None:
    """Points torch's eager entry for higher-order operators at ours and registers our kernel on
    every operator that has a dense kernel. Idempotent."""
    global _original_compile_and_call, _original_setup_env
    import torch._higher_order_ops  # noqa: F401  (registers the operators)
    from torch._higher_order_ops import utils
    from torch._ops import _higher_order_ops

    if _original_setup_env is not None:
        return
    original = getattr(utils, "_hop_compile_and_call", None)
    _original_setup_env = utils.setup_compilation_env
    if original is not None:
        _original_compile_and_call = original
        utils._hop_compile_and_call = _hop_compile_and_call
    else:  # Note [Control flow: torch 2.11's eager entry]
        utils.setup_compilation_env = _setup_compilation_env
    # See Note [Control flow: flex_attention's eager entry].
    try:
        from torch.nn.attention import flex_attention as flex
    except ImportError:
        flex = None
    if flex is not None and getattr(flex, "setup_compilation_env", None) is _original_setup_env:
        flex.setup_compilation_env = _setup_compilation_env
    try:
        from torch._higher_order_ops.base_hop import BaseHOP
    except ImportError:  # a torch without it has no BaseHOP operators
        BaseHOP = ()  # noqa: N806

    for op in list(_higher_order_ops.values()):
        dense = op.py_kernels.get(DispatchKey.CompositeExplicitAutograd)
        if dense is None:
            continue
        if isinstance(op, BaseHOP) and op.name() in _RECORDED_AS_OPS:
            # BaseHOP's dense kernel refuses to run under a dispatch mode (a tracer); what it
            # runs is the subgraph on the operands.
            dense = _call_subgraph
        for key in _OUR_KEYS:
            # Not at a key the operator falls through (its mask lacks it): see the Note above.
            if key not in op.py_kernels and op.non_fallthrough_keys.has(key):
                op.py_impl(key)(dense if op.name() in _RECORDED_AS_OPS else _kernel(op, dense))
