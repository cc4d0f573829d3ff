"""The unboxed fast path (Note [Kernel: unboxed fast path]) against eager, at its edges.

The listed ops skip the boxed kernel, so each rule the boxed kernel applies per argument is
exercised here once more through them: optional and undefined tensors, tuple results, writes
through views, out= resizing and dtype casts, the eager errors of in-place ops, plain and
escaped tensors, boxed callers (torch.ops) and symbolic tracing. Every behaviour test compares
with eager through `assert_matches_eager` (outputs, input state, functional make_fx graph).
"""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import torch_functionalize._C as _C
from torch_functionalize.testing._internal.reference import assert_matches_eager, call_targets
from torch_functionalize import capture, functionalize


def _installed():
    functionalize(lambda x: x + 1)(torch.ones(1))  # a layer entry registers pending ops
    return set(_C._unboxed_registered_ops())


def test_every_listed_op_gets_its_unboxed_kernel():
    # A listed op whose classification is not the plan its unboxed kernel implements silently
    # falls back to the boxed kernel; this names it. CompositeImplicitAutograd ops are never
    # registered at all (they decompose), so they are exempt.
    installed = _installed()
    missing = []
    for name in _C._unboxed_listed_ops():
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd"):
            continue
        if name not in installed:
            missing.append(name)
    assert missing == []
    assert {"aten::add.Tensor", "aten::add_.Tensor", "aten::mul.out", "aten::mm"} <= installed


def test_unboxed_set_is_the_listed_set():
    # Nothing outside the list gets an unboxed kernel.
    assert _installed() <= set(_C._unboxed_listed_ops())


# ---------------------------------------------------------------------------------------------
# functional ops
# ---------------------------------------------------------------------------------------------


def test_chain_of_pointwise_ops_on_a_stale_view(remove):
    # The inputs of a listed functional op are synced first: `v` is stale after the write.
    def f(x):
        y = x.clone()
        v = y[1:]
        y.mul_(2)
        return torch.add(v, 1), torch.mul(y, v.sum()), torch.where(y > 2, y, -y)

    assert_matches_eager(f, torch.arange(4.0), remove=remove)


def test_optional_tensor_arguments_none_and_given(remove):
    def f(x, lo, w, b):
        a = torch.clamp(x, min=lo)          # clamp.Tensor, max None
        c = F.layer_norm(x, (4,), w, None)  # native_layer_norm, bias None
        d = F.layer_norm(x, (4,), w, b)
        return a, c, d

    x = torch.randn(3, 4)
    assert_matches_eager(f, x, torch.zeros(3, 4), torch.randn(4), torch.randn(4), remove=remove)


def test_tuple_results_with_undefined_members(remove):
    # convolution_backward returns undefined tensors where output_mask is False.
    def f(grad, x, w):
        gi, gw, gb = torch.ops.aten.convolution_backward(
            grad, x, w, [2], [1], [0], [1], False, [0], 1, [True, False, True]
        )
        vals, idx = torch.max(x, dim=1)
        return gi, gw, gb, vals, idx

    x, w = torch.randn(1, 2, 5), torch.randn(2, 2, 3)
    grad = torch.randn(1, 2, 3)
    out = functionalize(f)(grad, x, w)
    assert out[1] is None
    assert_matches_eager(f, grad, x, w, remove=remove)


def test_boxed_callers_reach_the_unboxed_kernel(remove):
    # torch.ops overloads call boxed; the dispatcher unboxes into the same kernel.
    def f(x, y):
        a = torch.ops.aten.add.Tensor(x, y, alpha=2)
        z = x.clone()
        torch.ops.aten.mul_.Tensor(z, y)
        torch.ops.aten.mul.out(a, y, out=z)
        return a, z

    assert_matches_eager(f, torch.randn(3), torch.randn(3), remove=remove)


def test_plain_tensors_only_pass_through():
    # A listed op on tensors created outside the function runs untouched.
    g = torch.randn(3)

    def f(x):
        return x + torch.exp(g)

    assert torch.equal(functionalize(f)(torch.ones(3)), torch.ones(3) + torch.exp(g))


def test_escaped_wrapper_is_refused_by_name():
    leaked = []

    def f(x):
        y = x * 2
        leaked.append(y)
        return y

    functionalize(f)(torch.ones(2))
    with pytest.raises(RuntimeError, match=r"aten::add\.Tensor: got a functional tensor that escaped"):
        functionalize(lambda x: x + leaked[0])(torch.ones(2))


# ---------------------------------------------------------------------------------------------
# in-place and out= ops
# ---------------------------------------------------------------------------------------------


def test_inplace_through_a_view_updates_base_and_input(remove):
    def f(x):
        x[1:].add_(1).mul_(3)
        x[:2].clamp_(min=0.5)
        return x.sum()

    assert_matches_eager(f, torch.arange(4.0), remove=remove)


def test_inplace_on_input_is_written_back(remove):
    def f(x, y):
        x.addcmul_(y, y, value=0.5).sqrt_()
        return x

    assert_matches_eager(f, torch.rand(3) + 1, torch.randn(3), remove=remove)


def test_out_resized_and_cast_like_eager(remove):
    # out has the wrong shape (resized, with eager's warning) and a wider dtype (cast on write).
    def f(a, b, out):
        torch.mul(a, b, out=out)
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_matches_eager(
            f, torch.randn(3), torch.randn(3), torch.zeros(1, dtype=torch.float64), remove=remove
        )


def test_out_aliasing_an_input(remove):
    def f(a, b):
        torch.add(a, b, alpha=3, out=a)
        m = torch.zeros(2, 2)
        torch.mm(a[:2].view(2, 1), b[:2].view(1, 2), out=m)
        torch.mul(b, a, out=b)
        return a, m

    assert_matches_eager(f, torch.randn(3), torch.randn(3), remove=remove)


@pytest.mark.parametrize(
    "program, message",
    [
        (lambda x: x.clone().add_(torch.ones(2, 3)), r"aten::add_\.Tensor: output with shape"),
        (lambda x: x.long().add_(1.5), r"aten::add_\.Tensor: result type Float can.t be cast"),
        (
            lambda x: torch.mul(x, x, out=torch.zeros(3, dtype=torch.long)),
            r"aten::mul\.out: result type Float can't be cast",
        ),
        (
            lambda x: torch.add(x, x, out=torch.zeros(1).expand(3)),
            r"aten::add\.out: the tensor passed as 'out' has internal overlap",
        ),
    ],
    ids=["broadcast_into_self", "float_into_long", "out_dtype", "out_overlap"],
)
def test_eager_errors_of_listed_mutable_ops(program, message):
    with pytest.raises(RuntimeError):
        program(torch.ones(3))  # eager refuses it too
    x = torch.ones(3)
    with pytest.raises(RuntimeError, match=message):
        functionalize(program)(x)
    assert torch.equal(x, torch.ones(3))


def test_writing_into_a_captured_plain_tensor_is_refused_in_graphs():
    g = torch.zeros(3)

    def f(x):
        torch.mul(x, x, out=g)
        return x

    # Under a capture no graph can write g; run eagerly, the write reaches it as in eager
    # (Note [Kernel: writes into captured tensors]).
    with pytest.raises(RuntimeError, match=r"aten::mul\.out: cannot write functional values into "
                                           r"the plain tensor passed as 'out'"):
        capture(f, torch.ones(3))
    assert torch.equal(g, torch.zeros(3))
    x = torch.randn(3)
    functionalize(f)(x)
    assert torch.equal(g, x * x)


def test_inplace_on_plain_tensors_only_passes_through():
    # No wrapper among the arguments: the op runs on the captured tensor, as eager would.
    g = torch.zeros(3)

    def f(x):
        g.add_(1)
        return x * 2

    functionalize(f)(torch.ones(3))
    assert torch.equal(g, torch.ones(3))


# ---------------------------------------------------------------------------------------------
# graphs
# ---------------------------------------------------------------------------------------------


def test_graph_of_listed_mutable_ops_is_functional():
    def f(x, out):
        y = x.clone()
        y.mul_(2).add_(1)
        torch.sub(y, x, out=out)
        return y

    gm = make_fx(functionalize(f))(torch.randn(3), torch.zeros(3))
    targets = call_targets(gm)
    assert "aten.mul.Tensor" in targets and "aten.add.Tensor" in targets
    assert "aten.sub.Tensor" in targets
    assert not {"aten.mul_.Tensor", "aten.add_.Tensor", "aten.sub.out"} & set(targets)


def test_symbolic_trace_of_listed_ops(remove):
    def f(x, y):
        z = x.clone()
        z.mul_(y).add_(1)
        return torch.mm(z.view(-1, 1), y.view(1, -1)), z

    x, y = torch.randn(4), torch.randn(4)
    gm = make_fx(functionalize(f, remove=remove), tracing_mode="symbolic")(x, y)
    expected = f(x.clone(), y.clone())
    actual = gm(x.clone(), y.clone())
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)
