"""torch.autograd.Function subclasses (custom forward/backward) called inside a functionalized
function: see Note [Autograd: custom Functions]. Installed once, when the package is imported
(install()); costs one check per Function call outside functionalize."""
import inspect
import weakref
from typing import Any

import torch
from torch.autograd.function import FunctionCtx, _is_setup_context_defined

from . import _C

# Note [Autograd: custom Functions]
# A custom Function's forward runs at our layer, on the wrappers, under no_grad as eager runs it:
# its in-place ops and views are functionalized like any op of f (a `mark_dirty` Function writing
# a view of an intermediate updates the base; a view inside the forward leaves no view in a
# views-removed graph), and its writes of arguments that it does not mark dirty reach every
# alias as writes autograd does not see (Note [Autograd: writes autograd does not see]). The
# user's ctx is ours (a FunctionCtx that records what the forward asks for). Autograd is then
# joined at the level where it runs, the values (Note [Wrapper: autograd mirrored]): a bridge
# Function, applied to the arguments' values from before the forward, returns the outputs'
# values, saves what the user's ctx saved (an argument or output by its value, so a saved
# output has the bridge's history as eager's has the Function's node), and its backward calls
# the user's backward with the user's ctx. An argument marked dirty is then written with its
# bridge output under grad mode, so it and its aliases take the Function's history (the write
# is eager's mark_dirty version bump). Costs of this form: outputs aliasing an argument come back
# as new tensors (a later write of the argument is not seen through them; eager refuses writes
# to such outputs), and code outside the dispatcher (a pybind kernel reading data pointers) sees
# wrappers and is refused by name (register it with torch.library instead, as torch.compile
# also asks).
# Rejected: running the Function on the wrappers' values (the form before this one): its
# in-place ops and views stayed in graphs as written, and a write through a view argument under
# remove="mutations_and_views" never reached the base (a wrong value, silently); and applying
# the Function to the wrappers (autograd then attaches its node to the wrappers, while the ops
# of f run on the values, whose gradients were silently None).
_original_apply: Any = None


def _apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
    if _C._layer_active():
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if any(_C._is_layer_wrapper(t) for t in tensors):
            return _apply_at_layer(cls, args, kwargs)
    return _original_apply(cls, *args, **kwargs)


class _UserCtx(FunctionCtx):
    """The ctx a custom Function sees inside functionalize: FunctionCtx records save_for_backward,
    mark_dirty, mark_non_differentiable and set_materialize_grads; saved_tensors reads the bridge's
    saved values during the backward."""

    def __init__(self, needs_input_grad: tuple[bool, ...]) -> None:
        self.needs_input_grad = needs_input_grad
        self._bridge_ctx: Any = None

    @property
    def saved_tensors(self) -> tuple:
        if self._bridge_ctx is None:
            raise RuntimeError("saved_tensors is read in the backward, after save_for_backward")
        return self._bridge_ctx.saved_tensors

    saved_variables = saved_tensors

    def save_for_forward(self, *tensors: torch.Tensor) -> None:
        raise NotImplementedError(
            "functionalize: ctx.save_for_forward (forward-mode AD of a custom autograd.Function) "
            "is not supported inside functionalize. Use reverse mode (backward) inside f, or "
            "torch.func.jvp outside it.")


# What FunctionCtx and _UserCtx keep on a ctx for the bridge itself, not the user's attributes.
_CTX_BOOKKEEPING = frozenset({"needs_input_grad", "_bridge_ctx", "to_save", "dirty_tensors",
                              "non_differentiable", "materialize_grads"})


class _Plan:
    """What the bridge needs from the forward that already ran: the Function, the user's ctx,
    the outputs' values, each saved tensor as ("out", output index) or ("value", the tensor's
    value), and the indices of outputs marked non-differentiable."""

    def __init__(self, cls: Any, ctx: _UserCtx, out_values: list, saved: list,
                 non_differentiable: list[int]) -> None:
        self.cls, self.ctx, self.out_values = cls, ctx, out_values
        self.saved, self.non_differentiable = saved, non_differentiable
        self.removes_views = _C._layer_removes_views()


class _Bridge(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, plan: _Plan, *values: Any) -> Any:
        outs = plan.out_values
        if plan.removes_views:
            # An argument returned as is becomes a view of it (autograd's view_as), which a graph
            # without views must not hold: a copy of it instead (the output is a new tensor
            # under the layer either way).
            passed = {id(v) for v in values if isinstance(v, torch.Tensor)}
            outs = [torch.ops.aten.alias_copy(o) if id(o) in passed else o for o in outs]
            plan.out_values = outs
        ctx.save_for_backward(*[outs[what] if kind == "out" else what for kind, what in plan.saved])
        ctx.mark_non_differentiable(*[outs[i] for i in plan.non_differentiable])
        ctx.set_materialize_grads(getattr(plan.ctx, "materialize_grads", True))
        ctx.plan = plan
        # What the user's forward or setup_context put on its ctx is on eager's node too, where
        # code holding the output reads it (out.grad_fn.name; torch 2.11's checkpoint reads
        # ctx.get_args from its _NoopSaveInputs node in a saved-tensor hook).
        for name, value in vars(plan.ctx).items():
            if name not in _CTX_BOOKKEEPING and not hasattr(ctx, name):
                setattr(ctx, name, value)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        plan = ctx.plan
        plan.ctx._bridge_ctx = ctx
        if getattr(plan.cls, "boxed_grads_call", False):
            result = plan.cls.backward(plan.ctx, list(grads))
        else:
            result = plan.cls.backward(plan.ctx, *grads)
        if not isinstance(result, tuple):
            result = (result,)
        return (None, *result)


_bridges: "weakref.WeakKeyDictionary[type, type]" = weakref.WeakKeyDictionary()


def _bridge_for(cls: type) -> Any:
    """A _Bridge subclass named as the user's Function, so its outputs' grad_fn reads as eager's
    (`<Name>Backward`): torch's module backward hooks find their node by that name."""
    bridge = _bridges.get(cls)
    if bridge is None:
        bridge = type(cls.__name__, (_Bridge,), {"__module__": cls.__module__,
                                                 "__qualname__": cls.__qualname__})
        _bridges[cls] = bridge
    return bridge


def _positional(cls: Any, args: tuple, kwargs: dict) -> tuple:
    """The forward's arguments as positions, defaults applied (what eager's apply hands on)."""
    if not kwargs:
        return args
    if _is_setup_context_defined(cls.setup_context):
        bound = inspect.signature(cls.forward).bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.args
    bound = inspect.signature(cls.forward).bind(None, *args, **kwargs)
    bound.apply_defaults()
    return bound.args[1:]


def _run_forward(cls: Any, ctx: _UserCtx, args: tuple) -> Any:
    with torch.no_grad():
        try:
            if _is_setup_context_defined(cls.setup_context):
                out = cls.forward(*args)
                cls.setup_context(ctx, args, out)
                return out
            return cls.forward(ctx, *args)
        except RuntimeError as error:
            text = str(error)
            if "data pointer" not in text and "doesn't have storage" not in text:
                raise
            raise NotImplementedError(
                f"functionalize: the forward of the autograd.Function {cls.__name__} reads the "
                "memory of a functional tensor outside the dispatcher (a kernel bound without "
                "torch.library). Register that kernel as a custom op with torch.library "
                "(torch.library.custom_op), so functionalize sees its writes "
                "(Note [Autograd: custom Functions]).") from error


def _value(t: Any) -> Any:
    return _C._from_functional(t) if isinstance(t, torch.Tensor) and _C._is_layer_wrapper(t) else t


def _apply_at_layer(cls: Any, args: tuple, kwargs: dict) -> Any:
    args = _positional(cls, args, kwargs)
    grad_on = torch.is_grad_enabled()
    needs = tuple(grad_on and isinstance(a, torch.Tensor) and a.requires_grad for a in args)
    ctx = _UserCtx(needs)
    before = [_value(a) for a in args]
    out = _run_forward(cls, ctx, args)
    dirty = list(getattr(ctx, "dirty_tensors", ()))
    if not any(needs):
        for t in dirty:  # eager's mark_dirty bumps the version once more, grad or not
            torch.autograd.graph.increment_version(t)
        return out
    is_tuple = isinstance(out, tuple)
    outs = list(out) if is_tuple else [out]
    position = {id(o): i for i, o in enumerate(outs) if isinstance(o, torch.Tensor)}
    arg_position = {id(a): i for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    out_values = [_value(o) if isinstance(o, torch.Tensor) else o for o in outs]
    saved = []
    for t in getattr(ctx, "to_save", ()):
        if t is None:
            saved.append(("value", None))
        elif id(t) in position:
            saved.append(("out", position[id(t)]))
        else:
            saved.append(("value", _value(t)))
    non_differentiable = [position[id(t)] for t in getattr(ctx, "non_differentiable", ())
                          if id(t) in position]
    plan = _Plan(cls, ctx, out_values, saved, non_differentiable)
    scope = _C._InnerCall()
    try:
        bridged = _bridge_for(cls).apply(plan, *before)
    finally:
        scope.close()
    results = []
    dirty_ids = {id(t) for t in dirty}
    for o, b in zip(outs, bridged):
        if not isinstance(o, torch.Tensor):
            results.append(o)
        elif id(o) in dirty_ids and id(o) in arg_position:
            o.copy_(_C._to_functional(b))  # the Function's history, and mark_dirty's version bump
            results.append(o)
        else:
            results.append(_C._to_functional(b))
    for t in dirty:
        if id(t) not in position:
            torch.autograd.graph.increment_version(t)
    return tuple(results) if is_tuple else results[0]


def install() -> None:
    """Routes torch.autograd.Function.apply through ours. Idempotent."""
    global _original_apply
    if _original_apply is not None:
        return
    original = torch.autograd.Function.__dict__["apply"]
    if isinstance(original, classmethod):
        _original_apply = original.__func__
    else:
        # torch 2.14 defines apply in C (a classmethod_descriptor, no __func__): bound to each
        # Function subclass as it is called.
        def _original_apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
            return original.__get__(None, cls)(*args, **kwargs)
    torch.autograd.Function.apply = classmethod(_apply)  # type: ignore[assignment]
