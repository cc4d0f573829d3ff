"""Thread-local state around functionalize: dispatch-key TLS, mode stacks, and inputs when f
raises."""

import threading

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torch_functionalize as tfz


def tls_state():
    """Everything a call may touch and must restore, raw bits included (a leaked backend bit
    does not show in the DispatchKeySet repr)."""
    return {
        "include": torch._C._dispatch_tls_local_include_set().raw_repr(),
        "exclude": torch._C._dispatch_tls_local_exclude_set().raw_repr(),
        "torch_function_stack": torch._C._len_torch_function_stack(),
        "torch_dispatch_stack": torch._C._len_torch_dispatch_stack(),
        "grad_enabled": torch.is_grad_enabled(),
        "inference_mode": torch.is_inference_mode_enabled(),
    }


class Boom(Exception):
    pass


def _mutate_then_raise(x):
    x.add_(1)
    x.t_()
    x[0].fill_(100)
    with torch.no_grad():
        raise Boom("from f")


def test_tls_restored_after_call(remove):
    # The dispatch TLS include/exclude sets and mode stacks are identical before and after.
    def f(x):
        x.view(-1).add_(1)
        return torch.zeros(2) + x.sum()

    before = tls_state()
    tfz.functionalize(f, remove=remove)(torch.randn(2, 2))
    assert tls_state() == before


def test_tls_restored_after_f_raises(remove):
    # When f raises, the exception propagates unchanged and the TLS is restored.
    before = tls_state()
    error = Boom("original")

    def f(x):
        x.mul_(2)
        raise error

    with pytest.raises(Boom) as info:
        tfz.functionalize(f, remove=remove)(torch.randn(3))
    assert info.value is error
    assert tls_state() == before


def test_tls_restored_after_engine_error():
    # An error raised by the engine itself (mutating a plain tensor) also restores the TLS.
    g = torch.zeros(2)

    def f(x):
        g.add_(x)
        return x

    # Run eagerly the write reaches g (Note [Kernel: writes into captured tensors]); a capture
    # cannot write it and raises.
    before = tls_state()
    with pytest.raises(RuntimeError, match="^functionalize: aten::add_"):
        tfz.capture(f, torch.randn(2))
    assert tls_state() == before


def test_tls_restored_after_nested_error():
    # The nested-call error leaves the TLS as it was before the outer call.
    def f(x):
        with tfz.enable():
            return x + 1

    before = tls_state()
    with pytest.raises(RuntimeError, match="nested"):
        tfz.functionalize(f)(torch.randn(2))
    assert tls_state() == before


def test_tls_restored_after_enable_block(remove):
    # enable() restores the TLS on exit, also when its body raises.
    a, b = torch.randn(2), torch.randn(2)
    before = tls_state()
    with tfz.enable(remove=remove):
        tfz.from_functional(tfz.to_functional(a) * 2)
    assert tls_state() == before
    with pytest.raises(Boom):
        with tfz.enable(remove=remove):
            tfz.to_functional(b).add_(1)
            raise Boom()
    assert tls_state() == before


def test_tls_restored_after_make_fx_trace(remove):
    # Tracing a functionalized program with make_fx (real and fake) restores the TLS.
    def f(x):
        x[0].add_(1)
        return x * 2

    before = tls_state()
    for mode in ("real", "fake"):
        make_fx(tfz.functionalize(f, remove=remove), tracing_mode=mode)(torch.randn(2, 2))
        assert tls_state() == before, mode


def test_inputs_untouched_when_f_raises_after_mutating_them(remove):
    # No write-back happens when f raises: input values, shape and strides stay as they were.
    x = torch.randn(2, 3)
    snapshot = x.clone()
    with pytest.raises(Boom):
        tfz.functionalize(_mutate_then_raise, remove=remove)(x)
    assert x.shape == snapshot.shape
    assert x.stride() == snapshot.stride()
    torch.testing.assert_close(x, snapshot)
    assert torch.is_grad_enabled()


def test_view_input_and_its_base_untouched_when_f_raises(remove):
    # An input that is a view of a larger base leaves both untouched when f raises.
    base = torch.randn(4, 3)
    snapshot = base.clone()
    with pytest.raises(Boom):
        tfz.functionalize(_mutate_then_raise, remove=remove)(base[1:3])
    torch.testing.assert_close(base, snapshot)


def test_call_after_failed_call_works(remove):
    # A failed call leaves nothing behind that affects the next call.
    with pytest.raises(Boom):
        tfz.functionalize(_mutate_then_raise, remove=remove)(torch.randn(2, 3))

    def f(x):
        x.add_(1)
        return x.t()

    x = torch.zeros(2, 3)
    out = tfz.functionalize(f, remove=remove)(x)
    torch.testing.assert_close(x, torch.ones(2, 3))
    torch.testing.assert_close(out, torch.ones(3, 2))
    assert not tfz.is_functional(out)


def test_plain_ops_after_call_are_unaffected():
    # Plain eager ops after a call (factories, in-place, views) behave as before the call.
    tfz.functionalize(lambda t: t.add_(1))(torch.randn(2))
    a = torch.zeros(3)
    a.view(-1)[1:].fill_(2)
    assert not tfz.is_functional(a)
    torch.testing.assert_close(a, torch.tensor([0.0, 2.0, 2.0]))


def test_call_in_another_thread_leaves_this_thread_alone(remove):
    # TLS is per thread: a call in a worker thread works and changes nothing here.
    before = tls_state()
    results = {}

    def worker():
        x = torch.zeros(3)
        worker_before = tls_state()
        out = tfz.functionalize(lambda t: t.add_(2) * 1, remove=remove)(x)
        results["ok"] = tls_state() == worker_before and torch.equal(x, out)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert results == {"ok": True}
    assert tls_state() == before
