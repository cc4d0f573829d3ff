"""set_ (Note [Kernel: set_]): served onto tensors of the function, inputs included, and onto
storages of the function; refused by name otherwise, compared with eager or checked for its error.
resize_ and other storage changes: test_storage_ops.py.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.utils.parametrize as parametrize
from torch.fx.experimental.proxy_tensor import make_fx

from torch_functionalize.testing._internal.reference import (
    TEST_DEVICE,
    assert_client_matches_eager,
    assert_matches_eager,
)
from torch_functionalize import capture, functionalize


SET_CASES = [
    ("source_storage", lambda x, y: x.set_(y.untyped_storage())),
    ("source_storage_offset", lambda x, y: x.set_(y.untyped_storage(), 1, (2,), (1,))),
    ("no_source", lambda x, y: x.set_()),
]


@pytest.mark.parametrize("name, op", SET_CASES, ids=[c[0] for c in SET_CASES])
def test_set_raises_not_implemented_naming_op(name, op, remove):
    # Every set_ overload raises NotImplementedError naming aten::set_; inputs stay untouched.
    def f(x, y):
        x.add_(1)
        return op(x, y)

    x, y = torch.randn(3), torch.randn(4)
    x_before, y_before = x.clone(), y.clone()
    with pytest.raises(NotImplementedError, match=r"functionalize: aten::set_"):
        functionalize(f, remove=remove)(x, y)
    assert torch.equal(x, x_before) and torch.equal(y, y_before)
    assert x.untyped_storage().data_ptr() != y.untyped_storage().data_ptr()


# A tensor made inside f set_ onto another tensor of f shares it from then on, as `x.data = y`
# does (Note [Kernel: set_ onto another functional tensor]): writes through either reach the
# other, an input source included.
SET_ONTO_TENSOR = {
    "onto_an_input_then_written": lambda x, y: x.clone().set_(y).mul_(3) + y,
    "onto_an_intermediate": lambda x, y: x.clone().set_(y * 2).add_(1),
    "onto_itself": lambda x, y: x.clone().set_(x.clone()).add_(1),
    "source_written_after": lambda x, y: _set_then_write_source(x, y),
    "old_view_keeps_old_storage": lambda x, y: _old_view_after_set(x, y),
}


def _set_then_write_source(x, y):
    z, w = x.clone(), y * 1
    z.set_(w)
    w.add_(5)
    return z, w


def _old_view_after_set(x, y):
    z = x.clone()
    view = z[1:]
    z.set_(y.clone())
    z.add_(1)
    view.mul_(2)
    return z, view


@pytest.mark.parametrize("name", sorted(SET_ONTO_TENSOR))
def test_set_of_a_tensor_made_inside_onto_another_matches_eager(name, remove):
    assert_matches_eager(SET_ONTO_TENSOR[name], torch.randn(3), torch.randn(4), remove=remove)


# An input set_ onto another tensor of f ends with that tensor's values and geometry, as eager's;
# a view of an input set_ elsewhere leaves the input as it was
# (Note [Inputs: an input given other data]).
SET_OF_INPUT = {
    "onto_an_intermediate_then_written": lambda x, y: x.set_(y * 2).add_(1) * 1,
    "onto_a_transposed_intermediate": lambda x, y: x.set_((y * 2).view(2, 2).t()) + 0,
    "onto_the_other_input_then_written": lambda x, y: x.set_(y).mul_(3) + y,
    "source_written_after": lambda x, y: _set_input_then_write_source(x, y),
    "view_of_the_input_set_elsewhere": lambda x, y: (x[1:].set_(y * 2).add_(1), x.add_(2)),
}


def _set_input_then_write_source(x, y):
    w = y * 1
    x.set_(w)
    w.add_(5)
    return x + 0, w


# Under a tracer or capture an input's set_ is refused by name: a graph cannot give its input
# another tensor's memory (a view of an input set_ elsewhere is a tensor of f: served).
SERVED_IN_GRAPHS = {"view_of_the_input_set_elsewhere"}


@pytest.mark.parametrize("name", sorted(SET_OF_INPUT))
def test_set_of_an_input_onto_another_tensor_matches_eager(name, remove):
    f = SET_OF_INPUT[name]
    assert_matches_eager(f, torch.randn(3), torch.randn(4), remove=remove,
                         check_graph=name in SERVED_IN_GRAPHS)
    if name not in SERVED_IN_GRAPHS:
        with pytest.raises(NotImplementedError, match=r"aten::set_.source_Tensor: .*outside "
                           "tracers and capture"):
            capture(f, torch.randn(3), torch.randn(4), remove=remove)


@pytest.mark.parametrize("name", sorted(SET_OF_INPUT))
def test_set_of_an_input_viewing_a_buffer_leaves_the_buffer_as_eager(name, remove):
    # Eager's x takes other memory and the buffer x viewed keeps its values (checked as the
    # inputs' base).
    def make_inputs():
        return torch.arange(10.0)[1:4], torch.arange(4.0) - 2

    assert_matches_eager(SET_OF_INPUT[name], make_inputs=make_inputs, remove=remove,
                         check_graph=False)


def test_set_of_an_input_onto_a_tensor_in_its_own_memory_is_refused_by_name(remove):
    # Eager's x would take y's geometry in the storage both view, which no epilogue replays.
    def f(x, y):
        x.set_(y)
        return x * 1

    buffer = torch.arange(10.0)
    with pytest.raises(NotImplementedError, match=r"aten::set_.source_Tensor: .*outside its memory"):
        functionalize(f, remove=remove)(buffer[1:4], buffer[5:9])
    assert torch.equal(buffer, torch.arange(10.0))


def test_graph_of_an_input_given_other_data_refuses_an_input_viewing_a_buffer(remove):
    # `x.data = y` under make_fx writes the input's own memory: the graph checks its layout
    # first, so a view of a larger buffer is refused at replay, not written.
    def f(x, y):
        x.data = y * 2
        return x + 1

    gm = make_fx(functionalize(f, remove=remove))(torch.randn(3), torch.randn(3))
    buffer = torch.randn(10)
    before = buffer.clone()
    with pytest.raises(RuntimeError, match="input given other data"):
        gm(buffer[1:4], torch.randn(3))
    assert torch.equal(buffer, before)


@pytest.mark.parametrize("remove", ["mutations", "mutations_and_views"])
def test_parametrization_registered_and_removed_inside_f_trains_as_eager(remove):
    # register_parametrization set_s the original onto its right inverse (onto itself without
    # one); remove_parametrizations set_s it onto the parametrized value.
    class Symmetric(nn.Module):
        def forward(self, x):
            return x.triu() + x.triu(1).transpose(-1, -2)

        def right_inverse(self, a):
            return a.triu()

    def f(w, x):
        m = nn.Linear(3, 3)
        with torch.no_grad():
            m.weight.copy_(w)
        parametrize.register_parametrization(m, "weight", Symmetric())
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            with parametrize.cached():
                m(x).pow(2).mean().backward()
            opt.step()
        parametrize.remove_parametrizations(m, "weight")
        return m.weight.detach(), m(x).detach()

    assert_client_matches_eager(f, lambda: (torch.randn(3, 3), torch.randn(4, 3)), remove=remove)


@pytest.mark.parametrize("remove", ["mutations", "mutations_and_views"])
def test_orthogonal_parametrization_made_inside_f_trains_as_eager(remove):
    # Its right inverse returns a fresh -I written through a diagonal view: the set_ onto it
    # must read that pending write. make_fx cannot trace its allclose read (torch's own error).
    def f(x):
        m = nn.utils.parametrizations.orthogonal(nn.Linear(4, 4))
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            loss = m(x).pow(2).mean()
            loss.backward()
            opt.step()
        return loss.detach(), m.weight.detach()

    assert_client_matches_eager(f, lambda: (torch.randn(5, 4),), remove=remove,
                                graphs=("capture",))


# cuDNN's RNN path (LSTM/GRU/RNN modules on CUDA) checks for a flat weight buffer with
# `at::empty({0}).set_(weights[0].storage())`.
# See Note [Kernel: set_ onto a storage from outside the function]
# The same calls: a tensor made inside f set_ onto a captured parameter's storage reads that memory
# as eager does; a write through it, a set_ of an input and a set_ under a tracer are refused by
# name, and on the CPU the set_ stays refused. Per device: a CPU run checks the supported case on
# meta tensors (shapes; meta has no values), a CUDA run on CUDA tensors (values).
# A tensor made inside f set_ onto the storage of a tensor of f (cuDNN's flat-weights check with
# the weights passed into f, as torch.func.functional_call of an LSTM does) is a view of that
# storage: reads see writes through the source made after the set_, and writes through it reach
# the source, an input included (Note [Kernel: set_ onto a functional tensor's storage]).
def _storage_of(t):
    return torch.empty(0, device=t.device, dtype=t.dtype).set_(t.untyped_storage())


def _read_after_source_written(w, x):
    buf = _storage_of(w)
    w.add_(1)
    return buf * 2 + 0, buf.narrow(0, 1, 3) * x[:3]


def _write_through_it(w, x):
    buf = _storage_of(w)
    buf.narrow(0, 2, 4).mul_(3)
    return w + 0


def _part_of_an_intermediate(w, x):
    h = w * 2
    buf = torch.empty(0, dtype=h.dtype).set_(h.untyped_storage(), 1, (2, 2), (3, 1))
    buf.add_(x[:2])
    return h, buf + 0


def _cudnn_style_check(w, x):
    # cuDNN's try_get_weight_buf: the first weight's storage as a flat buffer, narrowed, then
    # compared by address; the weights are then used as they are.
    buf = _storage_of(w).narrow(0, 0, w.numel())
    same = buf.data_ptr() == w.data_ptr()
    return (w @ x[:4].reshape(2, 2)).sum() + float(same) * 0


def _weights_that_require_grad(w, x):
    # A leaf made inside f, checked as cuDNN checks its weights, then trained through.
    w = w.detach().requires_grad_()
    flat = _storage_of(w)
    loss = (torch.tanh(x[:3, None] * w) ** 2).sum() + flat.sum().detach()
    (g,) = torch.autograd.grad(loss, w)
    return loss.detach(), g


SET_ONTO_STORAGE = {
    "weights_that_require_grad": _weights_that_require_grad,
    "read_after_source_written": _read_after_source_written,
    "write_through_it": _write_through_it,
    "part_of_an_intermediate": _part_of_an_intermediate,
    "cudnn_style_check": _cudnn_style_check,
}


@pytest.mark.parametrize("name", sorted(SET_ONTO_STORAGE))
def test_set_of_a_tensor_made_inside_onto_a_storage_of_the_function_matches_eager(name, remove):
    assert_client_matches_eager(SET_ONTO_STORAGE[name],
                                lambda: (torch.randn(3, 2), torch.randn(6)), remove=remove)


def test_set_onto_a_storage_of_the_function_with_another_dtype_is_refused_by_name(remove):
    def f(w):
        return torch.empty(0, dtype=torch.int32).set_(w.untyped_storage()) + 1

    with pytest.raises(NotImplementedError, match="set_.source_Storage: .*same dtype"):
        functionalize(f, remove=remove)(torch.randn(4))


_SET_DEVICE = "meta" if TEST_DEVICE == "cpu" else TEST_DEVICE


def _read_through_set(parameter):
    def f(x):
        w = torch.empty(0, device=x.device).set_(parameter.untyped_storage())
        return x + w[:3] * 2, w[3:].sum()
    return f


def test_set_onto_a_captured_storage_reads_it_as_eager(remove):
    parameter, x = torch.randn(6, device=_SET_DEVICE), torch.ones(3, device=_SET_DEVICE)
    f = _read_through_set(parameter)
    expected = f(x)
    actual = functionalize(f, remove=remove)(x)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and a.device == e.device
        if _SET_DEVICE != "meta":
            torch.testing.assert_close(a, e)


def test_set_onto_a_captured_storage_writes_eagerly_refuses_inputs_tracers_and_the_cpu(remove):
    parameter = torch.randn(6, device=_SET_DEVICE)

    def write(x):
        w = torch.empty(0, device=x.device).set_(parameter.untyped_storage())
        w.add_(1)
        return x

    def set_input(x):
        x.set_(parameter.untyped_storage())
        return x

    x = torch.ones(3, device=_SET_DEVICE)
    # Run eagerly, the write reaches the parameter's memory as eager's does
    # (Note [Kernel: writes into captured tensors]); no graph can hold the storage.
    expected = parameter.clone() + 1
    functionalize(write, remove=remove)(x)
    if _SET_DEVICE != "meta":
        torch.testing.assert_close(parameter, expected)
    with pytest.raises(NotImplementedError, match="set_.source_Storage: set_ swaps"):
        make_fx(functionalize(write, remove=remove))(x)
    with pytest.raises(NotImplementedError, match="set_.source_Storage: set_ swaps"):
        functionalize(set_input, remove=remove)(x)
    with pytest.raises(NotImplementedError, match="set_.source_Storage: set_ swaps"):
        make_fx(functionalize(_read_through_set(parameter), remove=remove))(x)
    cpu_parameter = torch.randn(6, device="cpu")
    with pytest.raises(NotImplementedError, match="set_.source_Storage: set_ swaps"):
        functionalize(_read_through_set(cpu_parameter), remove=remove)(torch.ones(3, device="cpu"))


def test_input_set_onto_a_tensor_of_f_then_shrunk_keeps_its_whole_storage(remove):
    # Eager's x0 takes v0's whole storage and keeps it when an out= shrinks x0 to one element;
    # without views x0's value held its own elements only, so it came back with a storage of one
    # element (fuzzer program 972192). See Note [Inputs: an input given other data].
    def f(x0):
        v0 = x0 * 2
        x0.set_(v0)
        torch.eye(1, out=x0)
        return v0 + 0

    def state(x):
        storage = torch.tensor([], dtype=x.dtype).set_(x.untyped_storage())
        return x.shape, x.stride(), x.storage_offset(), storage.tolist()

    eager_x, ours_x = torch.arange(4.0).view(2, 2), torch.arange(4.0).view(2, 2)
    expected = f(eager_x)
    actual = functionalize(f, remove=remove)(ours_x)
    assert torch.equal(actual, expected)
    assert state(ours_x) == state(eager_x)
