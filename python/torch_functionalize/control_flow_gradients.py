"""Gradients of control flow inside a functionalized function: torch.cond traced (a second
cond of functional gradient branches) and eager (zero gradients for what the branch not taken
reads), scan traced (a second scan over the reversed steps), map traced (a second map).
See Note [Control flow: gradients]; control_flow.py calls traced_cond, eager_cond, traced_scan,
traced_map."""
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
# predicate, between two gradient branches: each reruns its forward branch's traced subgraph on
# the saved operands (not the Python branch, which may read other tensors by then:
# functional_call has put a module's own parameters back) and returns autograd.grad of its
# outputs against the incoming gradients. That backward call
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
# scan's backward is a scan over the reversed steps. The forward also returns the carry each
# step was given (stacked); each backward step reruns the traced combine subgraph on that carry
# and its slice and differentiates it against the carried gradient (plus the gradient of that
# step's carry output, which a gradient of the gradient brings) and the output's, carrying the
# sums of the additional inputs' gradients. A combine function that draws random numbers is
# refused by name (the rerun would need each step's generator state), as are integer carries.
# map's backward is a map over the same slices and the outputs' gradients: each step reruns the
# traced body on its slice and differentiates it; the gradients of the arguments every step
# shares come out stacked, one per step, and are summed (a body that draws: refused by name).
# Rejected: torch's own autograd kernel for cond (it materializes the backward branches with
# make_fx on placeholders made by factory calls, which inside our layer become our wrappers, so
# the joint graph it traces ran in the enclosing layer and lost its gradients: zeros,
# silently); saving the forward's intermediates instead of rerunning the branch (the two
# branches save different tensors, and cond's branches must return the same ones). Gradients of
# while_loop (its trip count known only when it runs, so its carries cannot be stacked ahead)
# and associative_scan are refused by name under make_fx.
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
        ctx.autograd = _autograd_keys_dispatched()
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


def traced_scan(op: Any, combine: Callable[..., Any], init: list[Any], xs: list[Any],
                additional: tuple, real: Callable[..., Any]) -> Any:
    """scan on the values, differentiable (an inner call, under a tracer): its flat outputs,
    the final carries then the stacked outputs (Note [Control flow: gradients], scan). `real`
    gives a traced call's real outputs (Note [Control flow: scan's outputs under a real
    tracer])."""
    out = _ScanWithGradient.apply(op, combine, real, len(init), len(xs), *init, *xs,
                                  *additional)
    return out[:len(out) - len(init)]  # (the stacked carries are for the backward)


class _ScanWithGradient(torch.autograd.Function):
    """scan whose backward is a scan over the reversed steps: each reruns the traced combine
    subgraph on the carry it was given (saved, stacked, by the forward) and its slice, and
    differentiates it against the carried and the output gradients."""

    @staticmethod
    def forward(ctx: Any, op: Any, combine: Callable[..., Any], real: Callable[..., Any],
                n_init: int, n_xs: int, *operands: Any) -> Any:
        init, xs = operands[:n_init], operands[n_init:n_init + n_xs]
        additional = operands[n_init + n_xs:]
        ctx.autograd = _autograd_keys_dispatched()

        def with_carries(*args: Any) -> tuple:
            # The carry each step was given, as one more stacked output.
            return (*combine(*args), *[c.clone() for c in args[:n_init]])

        out, subgraph = _loop_traced(
            op, [with_carries, list(init), list(xs), tuple(additional)], real, "scan",
            "combine function")
        ctx.op, ctx.body, ctx.n = op, subgraph, (n_init, n_xs)
        ctx.others = [None if isinstance(o, torch.Tensor) else o for o in operands]
        # The carry each step was given is an output too, so that a gradient of the gradient
        # reaches what the carries were computed from. Kept as themselves, not through
        # save_for_backward: a saved output is unpacked as a new tensor, which the tracer does
        # not know (the graph would hold the traced call's carries as constants). The
        # reference cycle this makes (ctx -> output -> its node -> ctx) lives as long as the
        # trace's autograd graph.
        ctx.carries = out[len(out) - n_init:]
        ctx.save_for_backward(*[o for o in operands if isinstance(o, torch.Tensor)])
        return out

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        n_init, n_xs = ctx.n
        carries = ctx.carries
        it = iter(ctx.saved_tensors)
        operands = [next(it) if o is None else o for o in ctx.others]
        init, xs = operands[:n_init], operands[n_init:n_init + n_xs]
        additional = operands[n_init + n_xs:]
        needs = ctx.needs_input_grad[5:]

        if not all(_differentiable(t) for t in (*init, *xs)):
            raise NotImplementedError(
                "functionalize: the gradient of scan under make_fx is traced for floating-point "
                "carries and inputs only. Carry integer counters outside scan.")
        # Carried backward: each carry's gradient, then the sums of the gradients of the
        # additional inputs that need one. (Gradients come materialized: zeros where unused.)
        a_at = [i for i, a in enumerate(additional)
                if needs[n_init + n_xs + i] and _differentiable(a)]
        g_final = grads[:n_init]
        g_ys, g_carries = grads[n_init:len(grads) - n_init], grads[len(grads) - n_init:]
        # (Dense carries: scan checks that its body's carries keep the strides it was given,
        # and a gradient may come expanded.)
        bw_init = [g.clone(memory_format=torch.contiguous_format) for g in g_final] + [
            torch.zeros_like(additional[i], memory_format=torch.contiguous_format) for i in a_at]
        bw_xs = [torch.flip(t, [0]) for t in (*carries, *xs, *g_ys, *g_carries)]
        body = _scan_gradient_body(ctx.body, ctx.autograd, n_init, n_xs, a_at, len(g_ys))
        out = ctx.op(body, bw_init, bw_xs, tuple(additional))
        g_init = out[:n_init]
        g_add = out[n_init:n_init + len(a_at)]
        g_xs = [torch.flip(t, [0]) for t in out[n_init + len(a_at):]]
        result: list[Any] = [*g_init, *g_xs, *[None] * len(additional)]
        for i, g in zip(a_at, g_add):
            result[n_init + n_xs + i] = g
        return (None, None, None, None, None, *result)


def _loop_traced(op: Any, args: list[Any], real: Callable[..., Any], name: str,
                 body: str) -> tuple[tuple, torch.fx.GraphModule]:
    """A loop operator (scan, map) run below autograd and traced: its real outputs and its body's
    subgraph, which the gradient reruns; refused where there is none, or where the body draws
    (the rerun would draw again)."""
    with torch._C._AutoDispatchBelowAutograd():
        traced_out = op(*args)
        traced = _traced_call(op, tuple(traced_out))
        out = tuple(real(op, args, {}, traced_out))
    if traced is None:
        raise NotImplementedError(
            f"functionalize: {name} with operands that require grad is traced with its "
            "gradient under make_fx only (another dispatch mode is active).")
    subgraph = traced[2][0]
    if _draws(subgraph):
        raise NotImplementedError(
            f"functionalize: {name} under make_fx with operands that require grad: its {body} "
            f"draws random numbers, which its gradient would draw again. Draw them outside "
            f"{name} and pass them in xs.")
    return out, subgraph


def _scan_gradient_body(body: Callable[..., Any], autograd: list[DispatchKey], n_init: int,
                        n_xs: int, a_at: list[int], n_ys: int) -> Callable[..., Any]:
    """One backward step: (carry gradients, sums; the step's carry, slices, output gradients
    and carry-output gradients; the additional inputs) -> (carry gradients, sums; the slices'
    gradients)."""
    def step(*args: Any) -> tuple:
        na = len(a_at)
        g_c, sums = args[:n_init], args[n_init:n_init + na]
        rest = args[n_init + na:]
        c_t, x_t = rest[:n_init], rest[n_init:n_init + n_xs]
        g_y = rest[n_init + n_xs:n_init + n_xs + n_ys]
        g_given = rest[n_init + n_xs + n_ys:2 * n_init + n_xs + n_ys]  # of the carry output
        additional = list(rest[2 * n_init + n_xs + n_ys:])

        def run(primals: list[torch.Tensor]) -> list[Any]:
            given = list(additional)
            for i, p in zip(a_at, primals[n_init + n_xs:]):
                given[i] = p
            return list(body(*primals[:n_init + n_xs], *given))[:n_init + n_ys]

        got = _vjp(run, [*c_t, *x_t, *[additional[i] for i in a_at]], (*g_c, *g_y), autograd)
        g_carry, g_slices = got[:n_init], got[n_init:n_init + n_xs]
        g_add = got[n_init + n_xs:]
        return (*[g + d for g, d in zip(g_carry, g_given)], *[s + g for s, g in zip(sums, g_add)],
                *g_slices)

    return step


def traced_map(op: Any, body: Callable[..., Any], xs: list[Any], pos_args: tuple,
               real: Callable[..., Any]) -> Any:
    """map_impl on the values, differentiable (an inner call, under a tracer): its flat stacked
    outputs (Note [Control flow: gradients], map)."""
    return _MapWithGradient.apply(op, body, real, len(xs), *xs, *pos_args)


class _MapWithGradient(torch.autograd.Function):
    """map whose backward is a map over the same slices and the outputs' gradients: each step
    reruns the traced body subgraph on its slice and differentiates it; the gradients of the
    arguments every step shares are summed over the steps."""

    @staticmethod
    def forward(ctx: Any, op: Any, body: Callable[..., Any], real: Callable[..., Any],
                n_xs: int, *operands: Any) -> Any:
        ctx.autograd = _autograd_keys_dispatched()
        out, subgraph = _loop_traced(
            op, [body, list(operands[:n_xs]), tuple(operands[n_xs:])], real, "map", "function")
        ctx.op, ctx.body, ctx.n_xs = op, subgraph, n_xs
        ctx.others = [None if isinstance(o, torch.Tensor) else o for o in operands]
        ctx.save_for_backward(*[o for o in operands if isinstance(o, torch.Tensor)])
        return out

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        it = iter(ctx.saved_tensors)
        operands = [next(it) if o is None else o for o in ctx.others]
        n_xs = ctx.n_xs
        xs, shared = operands[:n_xs], operands[n_xs:]
        needs = ctx.needs_input_grad[4:]
        x_at = [i for i in range(n_xs) if needs[i] and _differentiable(xs[i])]
        s_at = [i for i, a in enumerate(shared) if needs[n_xs + i] and _differentiable(a)]
        body = _map_gradient_body(ctx.body, ctx.autograd, n_xs, x_at, s_at, len(grads))
        # (Dense gradients: a gradient may come expanded, and map slices its xs.)
        out = ctx.op(body, [*xs, *[g.contiguous() for g in grads]], tuple(shared))
        result: list[Any] = [None] * len(operands)
        for i, g in zip(x_at, out[:len(x_at)]):
            result[i] = g
        for i, g in zip(s_at, out[len(x_at):]):
            result[n_xs + i] = g.sum(0)  # one gradient per step, of the argument they share
        return (None, None, None, None, *result)


def _differentiable(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())


def _map_gradient_body(body: Callable[..., Any], autograd: list[DispatchKey], n_xs: int,
                       x_at: list[int], s_at: list[int], n_ys: int) -> Callable[..., Any]:
    """One backward step: (slices, output gradients' slices, shared arguments) -> (the wanted
    slices' gradients, this step's gradients of the wanted shared arguments)."""
    def step(*args: Any) -> tuple:
        x_t, g_y = list(args[:n_xs]), args[n_xs:n_xs + n_ys]
        shared = list(args[n_xs + n_ys:])

        def run(primals: list[torch.Tensor]) -> list[Any]:
            slices, given = list(x_t), list(shared)
            for i, p in zip(x_at, primals):
                slices[i] = p
            for i, p in zip(s_at, primals[len(x_at):]):
                given[i] = p
            return list(body(*slices, *given))

        got = _vjp(run, [*[x_t[i] for i in x_at], *[shared[i] for i in s_at]], g_y, autograd)
        # map refuses outputs that are its inputs (an identity body's gradient is its input).
        return tuple(g.clone() if any(g is a for a in args) else g for g in got)

    return step


def _leaf(t: torch.Tensor) -> torch.Tensor:
    """A tensor that requires grad, holding t's value, for a gradient body to differentiate
    against: a copy, whose node in the traced body passes gradients on when the body is rerun
    on tensors that require grad (a gradient of this gradient; torch's autograd kernel for scan
    differentiating a replayed graph). Rejected: detach (it cuts that path; without views
    detach_copy has no derivative at all)."""
    return t.clone().requires_grad_()


_AUTOGRAD_KEYS = (DispatchKey.AutogradFunctionality, DispatchKey.AutogradOther,
                  DispatchKey.AutogradNestedTensor)


def _autograd_keys_dispatched() -> list[DispatchKey]:
    """The autograd keys dispatch uses here (a forward call), which torch's autograd kernel for
    the operator excludes while it traces the backward call's bodies: _vjp dispatches them
    again."""
    excluded = torch._C._dispatch_tls_local_exclude_set()
    return [k for k in _AUTOGRAD_KEYS if not excluded.has(k)]


def _gradient_branch(branch: Callable[..., Any], n: int, wanted: list[int],
                     autograd: list[DispatchKey],
                     rng: _RandomState | None) -> Callable[..., Any]:
    """The backward of one forward branch: (operands, output gradients[, generator state]) ->
    gradients of the operands in `wanted` (Note [Control flow: gradients])."""
    def gradient(*xs: Any) -> tuple:
        operands = list(xs[:n])
        grads = xs[n:len(xs) - 1] if rng is not None else xs[n:]

        def run(primals: list[torch.Tensor]) -> list[Any]:
            given = list(operands)
            for i, p in zip(wanted, primals):
                given[i] = p
            if rng is None:
                return pytree.tree_leaves(branch(*given))
            with rng.replayed(xs[-1]):
                return pytree.tree_leaves(branch(*given))

        return tuple(_vjp(run, [operands[i] for i in wanted], grads, autograd))

    gradient.__name__ = f"{getattr(branch, '__name__', 'branch')}_gradient"
    return gradient


def _vjp(run: Callable[[list[torch.Tensor]], list[Any]], primals: list[torch.Tensor],
         cotangents: Any, autograd: list[DispatchKey]) -> list[torch.Tensor]:
    """The gradient of each primal (zeros where unused) through run(primals)'s outputs against
    `cotangents`, with the `autograd` keys dispatched again (torch's autograd kernel for the
    operator excludes them while it traces a backward call). Called in grad mode (the backward of
    this backward), it keeps its graph."""
    create_graph = torch.is_grad_enabled()
    excluded = torch._C._dispatch_tls_local_exclude_set()
    for k in autograd:
        excluded = excluded.remove(k)
    with torch.enable_grad(), torch._C._ForceDispatchKeyGuard(
            torch._C._dispatch_tls_local_include_set(), excluded):
        # One that requires grad is differentiated as given: a detach here would stay in the
        # traced gradient body and cut a gradient of this gradient.
        primals = [p if p.requires_grad else _leaf(p) for p in primals]
        outs = run(primals)
        pairs = [(o, g) for o, g in zip(outs, cotangents)
                 if isinstance(o, torch.Tensor) and o.requires_grad]
        got: Any = [None] * len(primals)
        if pairs:
            got = torch.autograd.grad([o for o, _ in pairs], primals, [g for _, g in pairs],
                                      allow_unused=True, create_graph=create_graph)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(primals, got)]


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
    return tracer, node, [getattr(tracer.root, a.target) for a in node.args
                          if isinstance(a, torch.fx.Node) and a.op == "get_attr"]


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
    try:
        with torch.no_grad():
            closures = traced(op, args, kwargs, fake=_DiscoveryMode(reads))
    except Exception:  # noqa: BLE001
        # A branch fake tensors cannot run (a data-dependent size fake tensors cannot
        # represent): the operands alone get their zeros; the call itself runs as before.
        closures, reads.found = [], []
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
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        # A shape environment, so that ops whose sizes depend on values (nonzero, masks) run.
        self.fake = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
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
