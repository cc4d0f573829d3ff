"""Training loops written with torch.optim inside the functionalized function, as client code
writes them: every optimizer of the installed torch, for-loop, foreach and fused where it has
them, k >= 2 steps of zero_grad, forward, backward() and step(). Against eager: losses,
parameters, optimizer state and .grad, in both remove modes, eagerly, as a make_fx graph and as
a capture (reference.assert_client_matches_eager); and a model whose parameters f captures,
trained eagerly inside f."""
import inspect

import pytest
import torch

from torch.fx.experimental.proxy_tensor import make_fx

from torch_functionalize.testing._internal.reference import (
    REMOVE_MODES, TEST_DEVICE, assert_captured_module_step_matches_eager,
    assert_client_matches_eager,
)
from torch_functionalize import capture, functionalize

# Constructor arguments beyond the defaults, per optimizer: a learning rate that moves the
# parameters visibly in two steps, and the options whose code paths differ.
OPTIONS = {
    "SGD": [dict(lr=0.1), dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)],
    "Adam": [dict(lr=0.05), dict(lr=0.05, amsgrad=True, weight_decay=0.01)],
    "AdamW": [dict(lr=0.05), dict(lr=0.05, amsgrad=True)],
    "Adamax": [dict(lr=0.05)],
    "Adadelta": [dict(lr=0.5)],
    "Adagrad": [dict(lr=0.1)],
    "Adafactor": [dict(lr=0.05)],
    "ASGD": [dict(lr=0.05, t0=1)],
    "NAdam": [dict(lr=0.05), dict(lr=0.05, decoupled_weight_decay=True, weight_decay=0.01)],
    "RAdam": [dict(lr=0.05)],
    "RMSprop": [dict(lr=0.01), dict(lr=0.01, centered=True, momentum=0.5)],
    "Rprop": [dict(lr=0.01)],
    "LBFGS": [dict(lr=0.5, max_iter=3)],
    "Muon": [dict(lr=0.05)],
}


def _optimizers():
    found = sorted(n for n, c in vars(torch.optim).items()
                   if inspect.isclass(c) and issubclass(c, torch.optim.Optimizer)
                   and c is not torch.optim.Optimizer)
    return found


def _variants(name):
    """(id, extra kwargs) per implementation the optimizer has on this device."""
    params = inspect.signature(getattr(torch.optim, name).__init__).parameters
    out = [("for_loop", dict(foreach=False) if "foreach" in params else {})]
    if "foreach" in params:
        out.append(("foreach", dict(foreach=True)))
    device = torch.device(TEST_DEVICE).type
    if "fused" in params and name in _FUSED_ON.get(device, ()):
        out.append(("fused", dict(fused=True)))
    if "capturable" in params and device == "cuda":
        # Step counts stay tensors on the device: the graph-friendly form (nothing is read).
        out.append(("capturable", dict(capturable=True, foreach=True)))
    return out


# Optimizers with a fused kernel per device type, as their documentation lists them (Adagrad's
# fused kernel is CPU-only).
_FUSED_ON = {"cpu": ("SGD", "Adam", "AdamW", "Adagrad"), "cuda": ("SGD", "Adam", "AdamW")}


def _cases():
    cases = []
    for name in _optimizers():
        if name == "SparseAdam":
            continue  # sparse gradients only: test_sparse_gradient_training_matches_eager below
        for i, options in enumerate(OPTIONS.get(name, [dict(lr=0.05)])):
            for variant, extra in _variants(name):
                cases.append(pytest.param(name, {**options, **extra},
                                          id=f"{name}-{i}-{variant}"))
    return cases


def _make_inputs():
    # A two-layer MLP's parameters (leaves that require grad) and a batch.
    return (torch.randn(4, 8).requires_grad_(), torch.zeros(8).requires_grad_(),
            torch.randn(8, 3).requires_grad_(), torch.randn(6, 4), torch.randn(6, 3))


def _loss(w1, b1, w2, x, y):
    return ((torch.tanh(x @ w1 + b1) @ w2 - y) ** 2).mean()


def training_loop(name, options, steps=2):
    def f(w1, b1, w2, x, y):
        # Muon orthogonalizes matrix updates: 2-D parameters only.
        params = [w1, w2] if name == "Muon" else [w1, b1, w2]
        opt = getattr(torch.optim, name)(params, **options)
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            if name == "LBFGS":
                def closure():
                    opt.zero_grad()
                    loss = _loss(w1, b1, w2, x, y)
                    loss.backward()
                    return loss
                losses.append(opt.step(closure).detach())
                continue
            loss = _loss(w1, b1, w2, x, y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        state = [v for p in params for _, v in sorted(opt.state[p].items())
                 if isinstance(v, torch.Tensor)]
        return losses, state

    return f


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name,options", _cases())
def test_optimizer_training_loop_matches_eager(name, options, remove):
    # Eager's fused kernels write the parameters without bumping their version counters (the
    # for-loop and foreach paths bump them per write); ours count every write.
    f = training_loop(name, options)
    reads_values = name in READS_VALUES and not options.get("capturable")
    assert_client_matches_eager(f, _make_inputs, remove=remove,
                                graphs=("capture",) if reads_values else ("make_fx", "capture"),
                                check_version=not options.get("fused"))
    if reads_values:
        # make_fx refuses the read itself (plain make_fx does the same); capture guards it.
        with pytest.raises(RuntimeError, match="get value out of a tracing tensor"):
            make_fx(functionalize(f, remove=remove))(*_make_inputs())


# Optimizers whose step reads values out of tensors on this device (ASGD's and Adafactor's
# step-dependent rates, LBFGS's line search and convergence tests): a graph either guards the
# values (capture) or refuses them (make_fx).
READS_VALUES = {"ASGD", "Adafactor", "LBFGS"}


def test_value_read_by_an_optimizer_is_guarded_in_capture():
    # ASGD's eta and mu are read with .item(): the captured graph holds guards, and a replay whose
    # state gives other values raises instead of computing with the captured ones.
    def f(w, x, step):
        opt = torch.optim.ASGD([w], lr=0.05, t0=1)
        opt.zero_grad()
        ((x @ w) ** 2).sum().backward()
        opt.state[w]["step"] = step.clone()  # the step count as the caller passes it
        opt.state[w]["eta"] = torch.tensor(0.05)
        opt.state[w]["mu"] = torch.tensor(1.0)
        opt.state[w]["ax"] = torch.zeros_like(w)
        opt.step()
        return w * 1

    make = lambda s: (torch.randn(3, 2).requires_grad_(), torch.randn(4, 3), torch.tensor(s))  # noqa: E731
    gm = capture(f, *make(1.0))
    assert any("_guard_value" in str(n.target) for n in gm.graph.nodes), gm.code
    gm(*make(1.0))
    with pytest.raises(RuntimeError, match="specialized on it"):
        gm(*make(7.0))


# The optimizers of the installed torch that take sparse gradients, with the options whose
# sparse code paths differ (SGD's momentum buffer is a sparse clone of the first gradient).
SPARSE_OPTIONS = [
    ("SGD", dict(lr=0.1)), ("SGD", dict(lr=0.1, momentum=0.9)), ("Adagrad", dict(lr=0.1)),
    ("SparseAdam", dict(lr=0.05)),
]


def _sparse_embedding_loop(name, options, module="Embedding", steps=2):
    # nn.Embedding(sparse=True) as client code writes it: its backward gives a sparse COO
    # gradient (torch.sparse_coo inside the function too), which AccumulateGrad stores as it is
    # and the optimizer's sparse path reads (coalesce, _indices, _values, grad.new(...)).
    def f(weight, idx, target):
        emb = getattr(torch.nn, module)(10, 3, sparse=True, device=weight.device)
        opt = getattr(torch.optim, name)([weight], **options)
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            out = torch.func.functional_call(emb, {"weight": weight}, (idx,))
            loss = (((out.sum(1) if module == "Embedding" else out) - target) ** 2).mean()
            loss.backward()
            assert weight.grad.is_sparse and weight.grad.layout == torch.sparse_coo
            opt.step()
            losses.append(loss.detach())
        return losses, [v for _, v in sorted(opt.state[weight].items())
                        if isinstance(v, torch.Tensor)]

    return f


def _sparse_inputs():
    return (torch.randn(10, 3, device=TEST_DEVICE).requires_grad_(),
            torch.tensor([[1, 4], [4, 7], [0, 1]], device=TEST_DEVICE),
            torch.randn(3, 3, device=TEST_DEVICE))


@pytest.mark.parametrize("module", ["Embedding", "EmbeddingBag"])
@pytest.mark.parametrize("name,options", SPARSE_OPTIONS,
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(SPARSE_OPTIONS)])
def test_sparse_gradient_training_matches_eager(name, options, module):
    f = _sparse_embedding_loop(name, options, module)
    graphs = ("make_fx", "capture")
    try:
        make_fx(f)(*_sparse_inputs())
    except NotImplementedError as error:
        # torch 2.14's SGD starts its momentum buffer with grad.detach().clone(), which plain
        # make_fx cannot trace on a sparse tensor ("Cannot access storage of SparseTensorImpl");
        # make_fx of the functionalized loop stops there too, and capture records it.
        assert "SparseTensorImpl" in str(error)
        graphs = ("capture",)
    assert_client_matches_eager(f, _sparse_inputs, remove="mutations", graphs=graphs)


def test_sparse_gradient_without_views_is_refused_by_name():
    # Without views, _indices/_values of a sparse gradient would need _indices_copy/_values_copy,
    # which torch implements for strided tensors only: a named error, not torch's dispatch error.
    f = _sparse_embedding_loop("SGD", dict(lr=0.1))
    with pytest.raises(NotImplementedError,
                       match=r"aten::_indices of a Sparse tensor: remove=\"mutations_and_views\""):
        functionalize(f, remove="mutations_and_views")(*_sparse_inputs())


def _grouped_steps(make_optimizer):
    def f(w1, b1, w2, x, y):
        opt = make_optimizer([w1, b1, w2])
        losses = []
        for step in range(3):
            opt.zero_grad()
            loss = _loss(w1, b1, w2, x, y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            if step == 0 and len(opt.param_groups) == 1:
                # A group added after the first step (fine-tuning unfreezes a layer).
                opt.param_groups[0]["params"] = opt.param_groups[0]["params"][:2]
                opt.add_param_group({"params": [w2], "lr": 0.01})
        state = opt.state_dict()
        opt.load_state_dict(state)
        return losses, state["state"]

    return f


PARAM_GROUPS = {
    "adam_groups_amsgrad_maximize": lambda ps: torch.optim.Adam(
        [{"params": ps[:2], "lr": 0.01, "amsgrad": True},
         {"params": ps[2:], "lr": 0.1, "maximize": True, "weight_decay": 0.1}], foreach=False),
    "sgd_nesterov_group_added": lambda ps: torch.optim.SGD(
        ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-2, foreach=True),
    "rmsprop_centered_momentum": lambda ps: torch.optim.RMSprop(
        ps, lr=0.01, centered=True, momentum=0.5, foreach=True),
}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(PARAM_GROUPS))
def test_param_groups_and_state_dict_round_trip_match_eager(name, remove):
    # Parameter groups with their own options, a group added between steps, and the optimizer's
    # state_dict saved and loaded inside f.
    assert_client_matches_eager(_grouped_steps(PARAM_GROUPS[name]), _make_inputs, remove=remove)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad"])
def test_training_a_captured_model_matches_eager(name, remove):
    # The model called as model(x) (parameters and BatchNorm buffers captured, not passed in) and
    # trained two steps inside f: run eagerly, the optimizer's writes of f's values into the
    # captured parameters are eager's (Note [Kernel: writes into captured tensors]); outputs,
    # state and .grad are eager's. A graph cannot write them: capture refuses by name.
    import copy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU(),
                                torch.nn.Linear(4, 2)).to(TEST_DEVICE)
    x = torch.randn(5, 3, device=TEST_DEVICE)

    def step(m):
        def f(x):
            opt = getattr(torch.optim, name)(m.parameters(), lr=0.01)
            for _ in range(2):
                opt.zero_grad()
                m(x).pow(2).mean().backward()
                opt.step()
            return m(x).detach()
        return f

    assert_captured_module_step_matches_eager(model, step, (x,), remove)
    with pytest.raises(RuntimeError, match="traced or captured graph|under a tracer or a capture"):
        capture(step(copy.deepcopy(model)), x, remove=remove)


# Training idioms beyond one optimizer's loop: a differentiable optimizer stepped inside the
# graph a meta-gradient flows through (MAML), optimizer steps run by post-accumulate-grad hooks
# (the optimizer-in-backward pattern), and gradient accumulation over micro-batches.
def _leaves(module):
    return {k: v.detach().clone().requires_grad_() for k, v in module.named_parameters()}


def _maml():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 1)

    def f(p, x, y):
        fast = [v.clone() for v in p.values()]
        opt = torch.optim.SGD(fast, lr=0.1, momentum=0.9, differentiable=True)
        for _ in range(2):
            loss = (torch.nn.functional.linear(x, *fast).squeeze(-1) - y).square().mean()
            for t, g in zip(fast, torch.autograd.grad(loss, fast, create_graph=True)):
                t.grad = g
            opt.step()
        meta = (torch.nn.functional.linear(x, *fast).squeeze(-1) - y).square().mean()
        return meta, torch.autograd.grad(meta, list(p.values()))

    return f, lambda: (_leaves(lin), torch.randn(6, 3), torch.randn(6))


def _optimizer_in_backward():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)

    def f(p, x):
        opts = {q: torch.optim.SGD([q], lr=0.1) for q in p.values()}

        def step(q):
            opts[q].step()
            opts[q].zero_grad()

        for q in p.values():
            q.register_post_accumulate_grad_hook(step)
        for _ in range(2):
            torch.func.functional_call(lin, p, (x,)).square().sum().backward()
        return [q.detach().clone() for q in p.values()]

    return f, lambda: (_leaves(lin), torch.randn(4, 3))


def _accumulated_micro_batches():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 1)

    def f(p, x, y):
        opt = torch.optim.AdamW(list(p.values()), lr=0.1, foreach=True, amsgrad=True,
                                maximize=True)
        for _ in range(2):
            for k in range(2):
                out = torch.func.functional_call(lin, p, (x[k::2],)).squeeze(-1)
                ((out - y[k::2]).square().mean() / 2).backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        return [q.detach().clone() for q in p.values()]

    return f, lambda: (_leaves(lin), torch.randn(8, 3), torch.randn(8))


IDIOMS = {"maml": _maml, "optimizer_in_backward": _optimizer_in_backward,
          "accumulated_micro_batches": _accumulated_micro_batches}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(IDIOMS))
def test_training_idiom_matches_eager(name, remove):
    f, make_inputs = IDIOMS[name]()
    assert_client_matches_eager(f, make_inputs, remove=remove)
