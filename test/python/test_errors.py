"""Every user-facing error: its exception type and a fragment of its message."""

import subprocess
import sys

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torch_functionalize as tfz


@pytest.mark.parametrize("not_callable", [None, 3, "f", torch.zeros(2)], ids=["None", "int", "str", "tensor"])
def test_non_callable_func_raises_type_error(not_callable):
    # functionalize rejects a non-callable func up front with a prefixed TypeError.
    with pytest.raises(TypeError, match=r"^functionalize:"):
        tfz.functionalize(not_callable)


@pytest.mark.parametrize("bad", ["views", "mutation", "", None, True])
def test_bad_remove_raises_value_error(bad):
    # An unknown remove value raises a prefixed ValueError naming the allowed values.
    with pytest.raises(ValueError, match=r"^functionalize:.*mutations_and_views"):
        tfz.functionalize(torch.sin, remove=bad)


def test_bad_remove_for_enable_raises_value_error():
    # enable() validates remove like functionalize does.
    with pytest.raises(ValueError, match=r"^functionalize:.*mutations_and_views"):
        with tfz.enable(remove="all"):
            pass


def test_enable_inside_functionalized_function_raises():
    # A second layer on the thread (enable() inside a functionalized function) is refused with a
    # message that says "nested"; nested functionalize calls work (Note [API: nested calls]).
    def f(x):
        with tfz.enable():
            return x + 1

    with pytest.raises(RuntimeError, match=r"^functionalize:.*nested"):
        tfz.functionalize(f)(torch.randn(2))


@pytest.mark.parametrize(
    "use",
    [
        pytest.param(lambda t: t + 1, id="add"),
        pytest.param(lambda t: t.add_(1), id="add_"),
        pytest.param(lambda t: t.view(-1), id="view"),
        pytest.param(lambda t: t.sum(), id="sum"),
        pytest.param(lambda t: torch.zeros(3) * t, id="plain_times_escaped"),
    ],
)
def test_escaped_wrapper_used_after_call_raises(use):
    # A functional tensor leaked out of a finished call raises "escaped" when an op uses it.
    leaked = []

    def f(x):
        y = x * 2
        leaked.append(y)
        return y.sum()

    tfz.functionalize(f)(torch.randn(3))
    with pytest.raises(RuntimeError, match=r"^functionalize:.*escaped"):
        use(leaked[0])


def test_optimizer_state_made_inside_a_call_names_the_case_and_its_remedy_works():
    # An optimizer made outside the function: its first step inside the call makes its state
    # there, and the next call meets it escaped. The message names the case; its remedy (the
    # state made by one eager step first) then steps as eager does.
    def make():
        torch.manual_seed(0)
        w = torch.randn(3, requires_grad=True)
        opt = torch.optim.Adam([w], lr=0.1)

        def step(x):
            opt.zero_grad()
            (w * x).square().sum().backward()
            opt.step()
            return w.detach().clone()
        return step

    xs = [torch.full((3,), float(i)) for i in (1, 2, 3)]
    step = tfz.functionalize(make())
    step(xs[0])
    with pytest.raises(RuntimeError, match="escaped.*an optimizer made outside the function"):
        step(xs[1])
    eager = make()
    expected = [eager(x) for x in xs]
    remedied = make()
    got = [remedied(xs[0])] + [tfz.functionalize(remedied)(x) for x in xs[1:]]
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def test_plain_tensor_mutated_with_functional_tensor_raises_in_graphs():
    # A global plain tensor mutated in place with a functional tensor: eager's write when run
    # eagerly (Note [Kernel: writes into captured tensors]); a traced or captured graph cannot
    # write it, and the error names the op.
    g = torch.zeros(3)

    def f(x):
        g.add_(x)
        return x

    x = torch.randn(3)
    with pytest.raises(RuntimeError, match=r"^functionalize: aten::add_\.Tensor"):
        tfz.capture(f, x)
    with pytest.raises(RuntimeError, match=r"^functionalize: aten::add_\.Tensor"):
        make_fx(tfz.functionalize(f))(x)
    torch.testing.assert_close(g, torch.zeros(3))
    tfz.functionalize(f)(x)
    torch.testing.assert_close(g, x)


def test_plain_tensor_copied_from_functional_tensor_raises_in_graphs():
    # copy_ of a functional tensor into a plain tensor names aten::copy_ under a capture.
    g = torch.zeros(3)

    def f(x):
        g.copy_(x)
        return x

    with pytest.raises(RuntimeError, match=r"^functionalize: aten::copy_"):
        tfz.capture(f, torch.randn(3))
    torch.testing.assert_close(g, torch.zeros(3))


def test_to_functional_outside_any_call_raises():
    # to_functional needs an active functionalize call or enable() block.
    with pytest.raises(RuntimeError, match=r"^functionalize:"):
        tfz.to_functional(torch.randn(2))


def test_to_functional_after_enable_exits_raises():
    # Leaving enable() ends the scope in which to_functional works.
    with tfz.enable():
        pass
    with pytest.raises(RuntimeError, match=r"^functionalize:"):
        tfz.to_functional(torch.randn(2))


def test_inplace_broadcast_error_matches_eager():
    # An in-place op whose result cannot fit self fails as in eager, although its functional
    # variant alone would broadcast without error.
    def f(x, y):
        x.add_(y)
        return x

    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        f(torch.randn(3, 1), torch.randn(3, 4))
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        tfz.functionalize(f)(torch.randn(3, 1), torch.randn(3, 4))


def test_op_error_inside_f_propagates_as_eager_error():
    # An ordinary shape error inside f surfaces as the same RuntimeError eager raises.
    def f(x):
        return x.view(5)

    with pytest.raises(RuntimeError, match="invalid for input of size"):
        tfz.functionalize(f)(torch.randn(2, 3))


def test_printing_an_escaped_wrapper_raises_instead_of_crashing():
    # Tensor printing runs under torch._C._DisableFuncTorch, which excludes functorch's keys;
    # that must not read as a torch.func transform processing the op (FunctorchInterop.h).
    # In a subprocess: the failure this guards against is a segfault.
    code = (
        "import torch, torch_functionalize as tfz\n"
        "kept = []\n"
        "tfz.functionalize(lambda x: kept.append(x * 2) or x.sum())(torch.ones(3))\n"
        "try:\n"
        "    repr(kept[0])\n"
        "except RuntimeError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "escaped" in done.stdout


def test_nested_tensor_inside_f_is_refused_by_name_and_leaves_dispatch_state():
    # nn.TransformerEncoder's eval fast path with a padding mask makes a nested tensor; a wrapper
    # cannot report its sizes (before: torch's "Internal error: NestedTensorImpl doesn't support
    # sizes", as torch.func still gives).
    torch.manual_seed(0)
    encoder = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 1).eval()
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[1, 3:] = True

    def f(x):
        with torch.no_grad():
            return encoder(x, src_key_padding_mask=mask)

    before = (torch._C._dispatch_tls_local_include_set(),
              torch._C._dispatch_tls_local_exclude_set())
    x = torch.randn(2, 5, 8)
    if x.device.type == "cpu":
        with pytest.raises(NotImplementedError, match="made a nested tensor"):
            tfz.functionalize(f)(x)
    else:  # CUDA's fast path may take no nested tensor for wrappers: then eager's values
        try:
            out = tfz.functionalize(f)(x)
        except NotImplementedError as error:
            assert "made a nested tensor" in str(error)
        else:
            torch.testing.assert_close(out, f(x))
    assert (torch._C._dispatch_tls_local_include_set(),
            torch._C._dispatch_tls_local_exclude_set()) == before
    x = torch.randn(3)
    assert torch.equal(tfz.functionalize(lambda t: t.add_(1))(x.clone()), x + 1)


def test_backward_formula_writing_a_view_of_its_temporary_without_views():
    # householder_product's backward fills a view of a temporary it made (parametrizations.
    # orthogonal of a non-square Linear): without views the refusal named a "captured" tensor.
    def f(a, tau):
        a = a.clone().requires_grad_()
        tau = tau.clone().requires_grad_()
        torch.linalg.householder_product(a, tau).sum().backward()
        return a.grad, tau.grad

    a, tau = torch.randn(4, 2), torch.randn(2)
    expected = f(a, tau)
    actual = tfz.functionalize(f, remove="mutations")(a, tau)
    assert all(torch.allclose(x, e) for x, e in zip(actual, expected))
    # Without views, run eagerly the write reaches the temporary through its own view
    # (Note [Kernel: writes into captured tensors]); a traced graph cannot hold it.
    actual = tfz.functionalize(f, remove="mutations_and_views")(a, tau)
    assert all(torch.allclose(x, e) for x, e in zip(actual, expected))
    with pytest.raises(NotImplementedError, match=r"backward formula of "
                       r"LinalgHouseholderProductBackward0 writes through a view of a temporary"):
        make_fx(tfz.functionalize(f, remove="mutations_and_views"))(a, tau)


def test_write_into_a_clone_of_a_global_names_what_works():
    # global.clone() inside f is a plain tensor (an op on plain tensors only stays plain): the
    # error said "clone it inside the function first", which is what the code did.
    constant = torch.ones(3)

    def clone_of_global(x):
        z = constant.clone()
        z.add_(x)
        return z

    def copied_into_a_tensor_of_f(x):
        z = torch.zeros(constant.shape, dtype=constant.dtype).copy_(constant)
        z.add_(x)
        return z

    x = torch.randn(3)
    # Eagerly the clone is written in place, as in eager
    # (Note [Kernel: writes into captured tensors]); a capture cannot write it, and the error
    # names the form that works.
    assert torch.equal(tfz.functionalize(clone_of_global)(x), clone_of_global(x))
    with pytest.raises(RuntimeError, match=r"like global\.clone\(\).*torch\.zeros\(t\.shape"):
        tfz.capture(clone_of_global, x)
    assert torch.equal(tfz.functionalize(copied_into_a_tensor_of_f)(x), copied_into_a_tensor_of_f(x))
    assert torch.equal(tfz.capture(copied_into_a_tensor_of_f, x)(x), copied_into_a_tensor_of_f(x))


@pytest.mark.parametrize("remove", ["mutations", "mutations_and_views"])
def test_legacy_vmap_of_autograd_functional_forward_mode_is_named(remove):
    # torch.autograd.functional's vectorized forward-mode strategy runs torch's legacy vmap below
    # our key: before, the message blamed code that captured a wrapper. The reverse-mode strategy
    # (the default) works, and the message says so.
    import torch.autograd.functional as AF

    def f(x):
        y = x.clone()
        y.mul_(2)
        return y.sin()

    def forward_mode(x):
        return AF.jacobian(f, x, strategy="forward-mode", vectorize=True)

    def reverse_mode(x):
        return AF.jacobian(f, x, vectorize=True)

    x = torch.randn(3)
    with pytest.raises(NotImplementedError, match=r"legacy vmap .* default reverse-mode strategy"):
        tfz.functionalize(forward_mode, remove=remove)(x)
    assert torch.allclose(tfz.functionalize(reverse_mode, remove=remove)(x), reverse_mode(x))
