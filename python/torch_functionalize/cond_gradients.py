"""The gradient of torch.cond inside a functionalized function: traced (a second cond of
functional gradient branches) and eager (zero gradients for what the branch not taken reads).
See Note [Control flow: gradients]; control_flow.py calls traced_cond and eager_cond."""
from __future__ import annotations

import contextlib
import operator
from typing import Any, Callable, Iterator

import torch
from torch._C import DispatchKey
from torch.utils import _pytree as pytree

from . import _C, rng_state


# Note [Control flow: gradients]
# Under make_fx, a torch.cond whose operands (or closure tensors) require grad is traced with
# its gradient as a second cond: the forward call becomes an autograd.Function on the operands'
# values (where autograd runs, Note [Wrapper: autograd mirrored]), whose forward is the traced
# operator with functional branches, and whose backward is torch.cond again, on the same
# predicate, between two gradient branches: each runs its forward branch on the saved operands
# and returns autograd.grad of its outputs against the incoming gradients. That backward call
# goes through this same path, so each gradient branch is functionalized in a layer of its own
# and traced into a functional subgraph (and is itself differentiable: a gradient penalty
# differentiates it again). The rules a graph must keep, each eager's:
#  - every operand and closure tensor that requires grad gets a gradient, zeros from the branch
#    that does not read it, and every output requires grad (torch's cond is one autograd node);
#    a value a branch writes into an operand or closure (Note [Control flow: branches that write])
#    requires grad only if it is computed from one that does, in either branch's subgraph, as
#    the write would make it in eager;
#  - a branch that draws random numbers (dropout) draws the same ones when the gradient branch
#    runs it again: the generator's state is saved before the forward call as a traced value
#    (Note [Graphs: random state saved and restored]) and set around the rerun, which leaves the
#    generator where it was. Found in the traced subgraphs; where there are none (another
#    dispatch mode than make_fx's) the state is saved and set for every call.
# Eager calls (no tracer) run the taken branch as plain code, autograd recording its ops as
# eager's does; what they lack is the first rule's zeros, for tensors only the other branch
# reads. Those are found as torch finds them, by looking through both branches without running
# them: on fake operands, closures lifted as under make_fx, tensors of the caller read as they
# are (a module's own parameters) collected by a dispatch mode around each branch. Those that
# require grad are joined to the outputs by an autograd.Function that passes the outputs'
# gradients through and gives each of them zeros. Cost: one fake run of both branches per call
# in grad mode (a cond of two Linear layers: ~6 ms, where eager's own torch.cond compiles with
# dynamo at ~14 ms a call).
# Rejected: torch's own autograd kernel for cond (it materializes the backward branches with
# make_fx on placeholders made by factory calls, which inside our layer become our wrappers, so
# the joint graph it traces ran in the enclosing layer and lost its gradients: zeros,
# silently); saving the forward's intermediates instead of rerunning the branch (the two
# branches save different tensors, and cond's branches must return the same ones); gradients
# of while_loop, scan, map and associative_scan, whose backward needs the carried values of
# every iteration: those are refused by name under make_fx.
def traced_cond(op: Any, pred: Any, true_fn: Callable[..., Any], false_fn: Callable[..., Any],
                operands: list[Any], written: int) -> Any:
    """The operator on the operands' values, differentiable (an inner call, under a tracer):
    its flat outputs, the last `written` of them values its branches write."""
    return _CondWithGradient.apply(op, pred, true_fn, false_fn, _RandomState(operands), written,
                                   *operands)


class _CondWithGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, op: Any, pred: Any, true_fn: Callable[..., Any],
                false_fn: Callable[..., Any], rng: _RandomState, written: int,
                *operands: Any) -> Any:
        ctx.op, ctx.pred, ctx.branches, ctx.rng = op, pred, (true_fn, false_fn), rng
        # The autograd keys dispatch uses here, which torch's autograd kernel for the operator
        # excludes while it traces the branches of the backward call.
        excluded = torch._C._dispatch_tls_local_exclude_set()
        ctx.autograd = [k for k in _AUTOGRAD_KEYS if not excluded.has(k)]
        # Tensors through save_for_backward; other operands (ints, SymInts) kept as they are.
        ctx.save_for_backward(*[o for o in operands if isinstance(o, torch.Tensor)])
        ctx.others = [None if isinstance(o, torch.Tensor) else o for o in operands]
        with torch._C._AutoDispatchBelowAutograd():
            out = tuple(op(pred, true_fn, false_fn, operands))
        traced = _traced_call(op, out)
        if traced is not None:
            tracer, node, subgraphs = traced
            # The gradient branches rerun what was traced, on the operands it was traced on
            # (closures lifted): the Python branches may read other tensors by then
            # (functional_call has put a module's own parameters back).
            ctx.branches = subgraphs
            if any(_draws(g) for g in subgraphs):
                rng.record_before(tracer, node)
            else:
                ctx.rng = None
            differentiable = {i for i, o in enumerate(operands)
                              if isinstance(o, torch.Tensor) and o.requires_grad}
            reads = [_dependencies(g) for g in subgraphs]
            ctx.mark_non_differentiable(*[
                out[k] for k in range(len(out) - written, len(out))
                if not any(r[k] & differentiable for r in reads)])
        return out

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        saved = iter(ctx.saved_tensors)
        operands = [next(saved) if o is None else o for o in ctx.others]
        wanted = [i for i, needed in enumerate(ctx.needs_input_grad[6:]) if needed]
        rng = ctx.rng
        branches = [_gradient_branch(fn, len(operands), wanted, ctx.autograd, rng)
                    for fn in ctx.branches]
        state = (rng.state,) if rng is not None else ()
        got = ctx.op(ctx.pred, *branches, (*operands, *grads, *state))
        result: list[Any] = [None] * len(operands)
        for i, g in zip(wanted, got):
            result[i] = g
        return (None, None, None, None, None, None, *result)


_AUTOGRAD_KEYS = (DispatchKey.AutogradFunctionality, DispatchKey.AutogradOther,
                  DispatchKey.AutogradNestedTensor)


def _gradient_branch(branch: Callable[..., Any], n: int, wanted: list[int],
                     autograd: list[DispatchKey],
                     rng: _RandomState | None) -> Callable[..., Any]:
    """The backward of one forward branch: (operands, output gradients[, generator state]) ->
    gradients of the operands in `wanted` (Note [Control flow: gradients]), with the `autograd`
    keys dispatched again."""
    def gradient(*xs: Any) -> tuple:
        operands = list(xs[:n])
        grads = xs[n:len(xs) - 1] if rng is not None else xs[n:]
        # Differentiated itself (the backward of this backward): its graph is kept.
        create_graph = torch.is_grad_enabled()
        excluded = torch._C._dispatch_tls_local_exclude_set()
        for k in autograd:
            excluded = excluded.remove(k)
        with torch.enable_grad(), torch._C._ForceDispatchKeyGuard(
                torch._C._dispatch_tls_local_include_set(), excluded):
            for i in wanted:
                # One that requires grad is differentiated as given: a detach here would stay in
                # the traced gradient branch and cut a gradient of this gradient.
                if not operands[i].requires_grad:
                    operands[i] = operands[i].detach().requires_grad_()
            if rng is None:
                outs = pytree.tree_leaves(branch(*operands))
            else:
                with rng.replayed(xs[-1]):
                    outs = pytree.tree_leaves(branch(*operands))
            pairs = [(o, g) for o, g in zip(outs, grads)
                     if isinstance(o, torch.Tensor) and o.requires_grad]
            inputs = [operands[i] for i in wanted]
            got: Any = [None] * len(inputs)
            if pairs:
                got = torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs],
                                          allow_unused=True, create_graph=create_graph)
        return tuple(torch.zeros_like(x) if g is None else g for x, g in zip(inputs, got))

    gradient.__name__ = f"{getattr(branch, '__name__', 'branch')}_gradient"
    return gradient


class _RandomState:
    """The state of the generator a differentiable cond's branches may draw from, read before
    the forward call. Under make_fx, when a branch does draw, the read becomes a traced value
    (Note [Graphs: random state saved and restored]) placed before the call's node."""

    def __init__(self, operands: list[Any]) -> None:
        device = next((o.device for o in operands if isinstance(o, torch.Tensor)), None)
        self.device = str(device) if device is not None and device.type == "cuda" else "cpu"
        self.state = rng_state.get_state(self.device)

    def record_before(self, tracer: Any, node: Any) -> None:
        rng_state.record_get_before(tracer, node, self.state, self.device)

    @contextlib.contextmanager
    def replayed(self, state: torch.Tensor) -> Iterator[None]:
        """The generator at `state` (an operand of the gradient branch: this layer's wrapper of
        the saved state) for the rerun, then where it was."""
        now = torch.get_rng_state() if self.device == "cpu" else torch.cuda.get_rng_state(
            self.device)
        _C._sync(state)
        inner = _C._from_functional(state) if _C._is_functional(state) else state
        rng_state.set_state_recorded(inner, self.device)
        try:
            yield
        finally:
            rng_state.set_state_recorded(now, self.device)


def _proxy_of(t: torch.Tensor) -> tuple[Any, Any] | None:
    """(make_fx's tracer, the proxy of `t`) while make_fx traces `t`, else None."""
    from torch.fx.experimental.proxy_tensor import get_proxy_slot

    tracer = rng_state.tracer()
    if tracer is None:
        return None
    proxy = get_proxy_slot(t, tracer, None, lambda slot: slot.proxy)
    return None if proxy is None else (tracer, proxy)


def _traced_call(op: Any, out: tuple) -> tuple[Any, Any, list[torch.fx.GraphModule]] | None:
    """(make_fx's tracer, the node, its two branch subgraphs) of the operator call make_fx just
    traced, or None."""
    tensor = next((o for o in out if isinstance(o, torch.Tensor)), None)
    found = _proxy_of(tensor) if tensor is not None else None
    if found is None:
        return None
    tracer, node = found[0], found[1].node
    if node.target is operator.getitem:
        node = node.args[0]
    if node.target is not op:
        return None
    return tracer, node, [getattr(tracer.root, a.target) for a in node.args[1:3]]


def _dependencies(gm: torch.fx.GraphModule) -> list[set[int]]:
    """For each output of a subgraph, the indices of the inputs it is computed from."""
    deps: dict[Any, set[int]] = {}
    index = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            deps[node] = {index}
            index += 1
        else:
            deps[node] = set().union(*(deps[a] for a in node.all_input_nodes))
        if node.op == "output":
            return [deps[o] if isinstance(o, torch.fx.Node) else set()
                    for o in pytree.tree_leaves(node.args[0])]
    return []


def _draws(gm: torch.fx.GraphModule) -> bool:
    """Does a subgraph (or one nested in it) draw random numbers?"""
    return any(isinstance(n.target, torch._ops.OpOverload)
               and torch.Tag.nondeterministic_seeded in n.target.tags
               for m in gm.modules() if isinstance(m, torch.fx.GraphModule)
               for n in m.graph.nodes)


def eager_cond(op: Any, dense: Callable[..., Any], args: tuple, kwargs: dict[str, Any],
               traced: Callable[..., Any]) -> Any:
    """torch.cond run eagerly in grad mode: the taken branch as plain code, then every operand
    and closure tensor of either branch that requires grad joined to the outputs for a zero
    gradient (Note [Control flow: gradients], eager calls). `traced` is control_flow's, run on
    fake operands to find the closures."""
    operands = args[3]
    reads = _PlainReads()
    with torch.no_grad():
        closures = traced(op, args, kwargs, fake=_DiscoveryMode(reads))
    joined = [t for t in (*operands, *closures)
              if isinstance(t, torch.Tensor) and t.requires_grad]
    plain = list({id(t): t for t in reads.found}.values())
    out = dense(*args, **kwargs)
    if not joined and not plain:
        return out
    leaves, spec = pytree.tree_flatten(out)
    at = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and _C._is_functional(t)]
    values = [_C._from_functional(leaves[i]) for i in at]
    # The values autograd runs on: a wrapper's (synced), a plain tensor itself (a module's own
    # parameter, or one the caller passed as an operand).
    extra = []
    for t in (*joined, *plain):
        if _C._is_functional(t):
            _C._sync(t)
            t = _C._from_functional(t)
        extra.append(t)
    scope = _C._InnerCall()
    try:
        joined_out = _JoinedForGradients.apply(len(values), *values, *extra)
    finally:
        scope.close()
    for i, v in zip(at, joined_out):
        leaves[i] = _C._to_functional(v)
    return pytree.tree_unflatten(leaves, spec)


class _PlainReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Collects the real tensors that require grad among the arguments of the ops a branch
    runs while it is looked through on fake operands: tensors of the caller the branch reads
    as they are (a module's own parameters), which torch's cond lifts into operands too."""

    # A nested operator passes through to the fake mode, which runs its branches.
    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.found: list[torch.Tensor] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        from torch._subclasses.fake_tensor import is_fake

        for t in pytree.tree_leaves((args, kwargs or {})):
            if isinstance(t, torch.Tensor) and t.requires_grad and not is_fake(t):
                self.found.append(t)
        return func(*args, **(kwargs or {}))


class _DiscoveryMode:
    """Fake tensors for the operator's operands; `reads` entered around each branch."""

    def __init__(self, reads: _PlainReads) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.fake = FakeTensorMode(allow_non_fake_inputs=True)
        self.reads = reads

    def from_tensor(self, t: torch.Tensor) -> torch.Tensor:
        return self.fake.from_tensor(t)

    def __enter__(self) -> None:
        self.fake.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.fake.__exit__(*exc)


class _JoinedForGradients(torch.autograd.Function):
    """The outputs unchanged; the other inputs each get a zero gradient (what torch's cond
    gives the tensors the taken branch does not read)."""

    @staticmethod
    def forward(ctx: Any, n: int, *tensors: torch.Tensor) -> Any:
        ctx.n = n
        ctx.extra = [(t.shape, t.dtype, t.device) for t in tensors[n:]]
        outs = tensors[:n]
        ctx.mark_non_differentiable(*[o for o in outs
                                      if not (o.is_floating_point() or o.is_complex())])
        return tuple(o.view_as(o) for o in outs)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        zeros = [torch.zeros(shape, dtype=dtype, device=device)
                 for shape, dtype, device in ctx.extra]
        return (None, *grads, *zeros)
