"""Fused optimizer kernels and torch.optim optimizer steps under functionalize, compared with eager
in both remove modes.
"""

import pytest
import torch

from torch_functionalize.testing._internal.reference import (
    assert_functional_graph,
    assert_matches_eager,
    call_targets,
    trace,
)


def _two():
    return [torch.randn(3), torch.randn(2, 2)]


def _two_zeros():
    return [torch.zeros(3), torch.zeros(2, 2)]


def _steps(value=0.0):
    return [torch.tensor(value), torch.tensor(value)]


def _adam_kwargs(**overrides):
    kwargs = dict(
        lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False
    )
    kwargs.update(overrides)
    return kwargs


@pytest.mark.parametrize("op", ["_fused_adam_", "_fused_adamw_"])
def test_fused_adam_three_steps_updates_params_and_state(op, remove):
    # Three _fused_adam(w)_ steps update params, both moments and the step tensors in place.
    fused = getattr(torch, op)

    def f(params, grads, exp_avgs, exp_avg_sqs, steps):
        for _ in range(3):
            torch._foreach_add_(steps, 1)
            fused(params, grads, exp_avgs, exp_avg_sqs, [], steps, **_adam_kwargs())
        return params[0] * 1

    assert_matches_eager(f, _two(), _two(), _two_zeros(), _two_zeros(), _steps(), remove=remove)


def test_fused_adamw_amsgrad_with_grad_scale_and_found_inf(remove):
    # amsgrad keeps max_exp_avg_sqs (mutated too); grad_scale/found_inf are read-only tensors.
    def f(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, grad_scale, found_inf):
        for _ in range(3):
            torch._foreach_add_(steps, 1)
            torch._fused_adamw_(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                max_exp_avg_sqs,
                steps,
                **_adam_kwargs(amsgrad=True),
                grad_scale=grad_scale,
                found_inf=found_inf,
            )
        return params

    assert_matches_eager(
        f,
        _two(),
        _two(),
        _two_zeros(),
        _two_zeros(),
        _two_zeros(),
        _steps(),
        torch.tensor(2.0),
        torch.tensor(0.0),
        remove=remove,
    )


def test_fused_adam_tensor_lr_maximize(remove):
    # The Tensor-lr overload of _fused_adam_ with maximize=True.
    def f(params, grads, exp_avgs, exp_avg_sqs, steps, lr):
        torch._fused_adam_(
            params, grads, exp_avgs, exp_avg_sqs, [], steps, **_adam_kwargs(lr=lr, maximize=True)
        )
        return params

    assert_matches_eager(
        f,
        _two(),
        _two(),
        _two_zeros(),
        _two_zeros(),
        _steps(1.0),
        torch.tensor(0.05),
        remove=remove,
    )


def test_fused_adam_on_views_of_flat_parameter_buffer(remove):
    # Params and grads are views of flat buffers (as in a flattened parameter); updates reach them.
    def f(flat, grad_flat, steps):
        params = [flat[:3], flat[3:].view(2, 2)]
        grads = [grad_flat[:3], grad_flat[3:].view(2, 2)]
        exp_avgs, exp_avg_sqs = _two_zeros(), _two_zeros()
        torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], steps, **_adam_kwargs())
        return exp_avgs

    assert_matches_eager(f, torch.randn(7), torch.randn(7), _steps(1.0), remove=remove)


@pytest.mark.parametrize("nesterov", [False, True], ids=["plain", "nesterov"])
def test_fused_sgd_momentum_three_steps(nesterov, remove):
    # Three _fused_sgd_ steps with momentum buffers (first step initializes them).
    def f(params, grads, momentum_buffers):
        for i in range(3):
            torch._fused_sgd_(
                params,
                grads,
                momentum_buffers,
                weight_decay=0.01,
                momentum=0.9,
                lr=0.1,
                dampening=0.0,
                nesterov=nesterov,
                maximize=False,
                is_first_step=(i == 0),
            )
        return params

    assert_matches_eager(f, _two(), _two(), _two_zeros(), remove=remove)


def test_fused_sgd_without_momentum(remove):
    # _fused_sgd_ with no momentum buffers mutates only the params.
    def f(params, grads):
        torch._fused_sgd_(
            params,
            grads,
            [],
            weight_decay=0.1,
            momentum=0.0,
            lr=0.1,
            dampening=0.0,
            nesterov=False,
            maximize=False,
            is_first_step=False,
        )
        return params

    assert_matches_eager(f, _two(), _two(), remove=remove)


def test_fused_adam_graph_uses_functional_variant(remove):
    # The graph records aten._fused_adam (functional) and no _fused_adam_.
    def f(params, grads, exp_avgs, exp_avg_sqs, steps):
        torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], steps, **_adam_kwargs())

    gm = trace(f, _two(), _two(), _two_zeros(), _two_zeros(), _steps(1.0), remove=remove)
    assert_functional_graph(gm, remove)
    ops = call_targets(gm)
    assert "aten._fused_adam.default" in ops
    assert "aten._fused_adam_.default" not in ops


OPTIMIZERS = [
    ("sgd_momentum", torch.optim.SGD, {"momentum": 0.9, "weight_decay": 0.01}),
    (
        "sgd_nesterov_maximize",
        torch.optim.SGD,
        {"momentum": 0.9, "nesterov": True, "maximize": True, "weight_decay": 0.01},
    ),
    ("adam", torch.optim.Adam, {"weight_decay": 0.01}),
    ("adam_amsgrad", torch.optim.Adam, {"amsgrad": True}),
    ("adamw", torch.optim.AdamW, {"weight_decay": 0.05}),
]
IMPLEMENTATIONS = [
    ("for_loop", {"foreach": False}),
    ("foreach", {"foreach": True}),
    ("fused", {"fused": True}),
]


def _optimizer_params():
    return [torch.randn(3, 2), torch.randn(2)]


@pytest.mark.parametrize(
    "impl_name, impl_kwargs", IMPLEMENTATIONS, ids=[i[0] for i in IMPLEMENTATIONS]
)
@pytest.mark.parametrize("opt_name, cls, kwargs", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_optimizer_three_steps_state_built_inside(
    opt_name, cls, kwargs, impl_name, impl_kwargs, remove
):
    # An optimizer built inside f over the input params takes 3 steps with grads set inside;
    # params are written back and the returned state equals eager's.
    def f(params, grads):
        opt = cls(params, lr=0.1, **kwargs, **impl_kwargs)
        for step in range(3):
            for p, g in zip(params, grads):
                p.grad = g * (step + 1)
            opt.step()
        return [dict(opt.state[p]) for p in params]

    assert_matches_eager(f, _optimizer_params(), _optimizer_params(), remove=remove)


@pytest.mark.parametrize(
    "impl_name, impl_kwargs", IMPLEMENTATIONS, ids=[i[0] for i in IMPLEMENTATIONS]
)
@pytest.mark.parametrize("opt_name, cls, kwargs", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_optimizer_three_steps_state_passed_in(
    opt_name, cls, kwargs, impl_name, impl_kwargs, remove
):
    # Optimizer state from an eager warm-up step is passed in and mutated over 3 more steps; the
    # grads are passed in and assigned to .grad as they are, so they must stay as eager leaves them.
    def make_inputs():
        g = torch.Generator(torch.get_default_device()).manual_seed(0)
        params = [torch.randn(3, 2, generator=g), torch.randn(2, generator=g)]
        grads = [torch.randn(3, 2, generator=g), torch.randn(2, generator=g)]
        warmup = cls(params, lr=0.1, **kwargs, **impl_kwargs)
        for p, grad in zip(params, grads):
            p.grad = grad.clone()
        warmup.step()
        for p in params:
            p.grad = None
        return params, grads, [dict(warmup.state[p]) for p in params]

    def f(params, grads, state):
        opt = cls(params, lr=0.1, **kwargs, **impl_kwargs)
        for p, s in zip(params, state):
            opt.state[p] = s
        for _ in range(3):
            for p, g in zip(params, grads):
                p.grad = g
            opt.step()
        return params[0] * 1

    # The for-loop and foreach Adam variants read the (input) step tensor with .item(), which
    # make_fx cannot trace from a placeholder; their graphs are checked by the test above.
    uses_item = cls is not torch.optim.SGD and impl_name != "fused"
    assert_matches_eager(f, make_inputs=make_inputs, remove=remove, check_graph=not uses_item)
