"""Ops that change a tensor's storage: resize_ (Note [Kernel: resize_]) and set_ (Note [Kernel:
set_]: served onto tensors of the function, inputs included, refused otherwise), compared with
eager or checked for their error.
"""

import itertools

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


def test_resize_shrink_input(remove):
    # Shrinking an input keeps its leading elements; the epilogue resizes the caller's tensor.
    def f(x):
        x.resize_(2, 3)
        x.mul_(2)
        return x + 1

    assert_matches_eager(f, torch.randn(3, 4), remove=remove)


def test_resize_grow_input_then_fill_new_elements(remove):
    # Growing an input keeps the old elements; the new ones are written before being read.
    def f(x):
        x.resize_(4, 4)
        x[2:].fill_(3.0)
        return x * 1

    assert_matches_eager(f, torch.randn(2, 4), remove=remove)


def test_resize_grow_input_then_views_and_mutations(remove):
    # After growing, views of the input (row, column) are written and read like eager.
    def f(x):
        x.resize_(3, 3)
        x[2] = torch.tensor([7.0, 8.0, 9.0])
        x[:, 1].mul_(10)
        return x.sum(0)

    assert_matches_eager(f, torch.randn(6), remove=remove)


def test_resize_input_after_mutation_then_view_write(remove):
    # An input mutated, then shrunk, then written through a flat view.
    def f(x):
        x.mul_(3)
        x.resize_(2, 2)
        x.view(-1)[1:3] = 0
        return x.t() + 0

    assert_matches_eager(f, torch.randn(3, 3), remove=remove)


def test_resize_non_contiguous_input(remove):
    # A column-major (non-view) input: shrinking resets eager's contiguous strides; resizing to
    # the same shape keeps the original strides.
    def shrink(x):
        x.resize_(2, 2)
        return x + 0

    def same(x):
        x.resize_(4, 3)
        return x + 0

    col_major = torch.empty_strided((4, 3), (1, 4)).copy_(torch.randn(4, 3))
    assert_matches_eager(shrink, col_major, remove=remove)
    assert_matches_eager(same, col_major, remove=remove)


def test_resize_intermediates_shrink_and_grow(remove):
    # resize_ on clones of the input: shrink to 5 elements, grow to 3x3 with the tail overwritten.
    def f(x):
        shrunk = x.clone()
        shrunk.resize_(5)
        grown = x.clone()
        grown.resize_(3, 3)
        grown[2:].zero_()
        return shrunk, grown

    assert_matches_eager(f, torch.randn(2, 3), remove=remove)


def test_resize_to_zero_elements_and_resize_as(remove):
    # resize_(0) empties an input; resize_as_ reshapes another to a tensor's shape.
    def f(x, y, like):
        x.resize_(0)
        y.resize_as_(like)
        y.copy_(like)
        return x, y

    assert_matches_eager(f, torch.randn(3), torch.randn(3), torch.randn(2, 2), remove=remove)


def test_resize_int_input_grow(remove):
    # Growing an int64 input; the new row is written.
    def f(x):
        x.resize_(2, 5)
        x[1] = torch.arange(5)
        return x

    assert_matches_eager(f, torch.arange(5), remove=remove)


# Fresh values for every test that reads uninitialized-looking memory: a buffer freed by an earlier
# test with the same values could otherwise be handed out again and hide a wrong result.
_SPARE_STORAGE_SEEDS = itertools.count(1000)


def _inputs_with_spare_storage():
    """make_inputs for a 16-element tensor (not a view) whose storage holds 32 elements.

    Eager's resize_ reuses spare storage when growing, so the values past numel are
    deterministic: each call returns a new tensor with the same storage contents.
    """
    values = torch.randn(32, generator=torch.Generator(torch.get_default_device()).manual_seed(next(_SPARE_STORAGE_SEEDS)))

    def make_inputs():
        spare = values.clone()
        spare.resize_(16)
        return (spare,)

    return make_inputs


RESIZE_STORAGE_CASES = [
    ("grow_into_spare_storage", lambda x: x.resize_(32)),
    ("shrink_then_grow", lambda x: x.resize_(4).resize_(32)),
]


@pytest.mark.parametrize("name, op", RESIZE_STORAGE_CASES, ids=[c[0] for c in RESIZE_STORAGE_CASES])
def test_resize_grow_within_storage_keeps_storage_elements(name, op, remove):
    # Eager's resize_ never shrinks or reallocates a storage that is big enough, so growing shows
    # the elements already in the storage.
    def f(x):
        op(x)
        return x + 0

    assert_matches_eager(f, make_inputs=_inputs_with_spare_storage(), remove=remove)


# (id, program, expected message fragment). Each raises NotImplementedError naming aten::resize_.
RESIZE_ERROR_CASES = [
    (
        "input_grown_past_storage_with_live_view",
        lambda x: (x.view(-1), x.resize_(5, 5)),
        "views of it are alive",
    ),
    (
        "intermediate_with_live_view",
        lambda x: (lambda t: (t[0], t.resize_(20)))(x.clone()),
        "views of it are alive",
    ),
]


@pytest.mark.parametrize(
    "op",
    [
        lambda x: x[0].resize_(10),
        lambda x: x[0].resize_(2),
        lambda x: x.view(-1).resize_(12),
        lambda x: x.clone().t().resize_(9),
    ],
    ids=["grow_view_within_storage", "shrink_view", "same_size_flat_view", "view_of_intermediate"],
)
def test_resize_of_view_within_storage_matches_eager(op, remove):
    # A view resized within its storage is a view of the storage, as in eager.
    def f(x):
        y = op(x)
        y.add_(1)
        return x + 0, y + 0

    assert_matches_eager(f, torch.randn(4, 3), remove=remove)


def test_resize_within_storage_with_live_view_matches_eager(remove):
    # Shrinking while a view is alive only changes metadata (see Note [Kernel: resize_]): the view
    # keeps its elements, and later writes through either are seen as in eager.
    def f(x):
        flat = x.view(-1)
        x.resize_(2, 2)
        x.add_(1)
        return flat + 0, x + 0

    assert_matches_eager(f, torch.randn(4, 3), remove=remove)


@pytest.mark.parametrize(
    "name, op, message", RESIZE_ERROR_CASES, ids=[c[0] for c in RESIZE_ERROR_CASES]
)
def test_resize_unsupported_raises_not_implemented_naming_op(name, op, message, remove):
    # Unsupported resize_ raises a clear NotImplementedError naming aten::resize_; an earlier
    # mutation of the inputs is not written back.
    def f(x, y):
        y.mul_(2)
        x.add_(1)
        return op(x)

    x, y = torch.randn(3, 4), torch.randn(3)
    x_before, y_before = x.clone(), y.clone()
    with pytest.raises(NotImplementedError, match=rf"aten::resize_: .*{message}"):
        functionalize(f, remove=remove)(x, y)
    assert torch.equal(x, x_before) and x.shape == (3, 4)
    assert torch.equal(y, y_before)


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


def _slice_input():
    return (torch.arange(6.0)[1:],)


def _transposed_input():
    return (torch.arange(6.0).view(2, 3).t(),)


def _write_then_as_strided(x):
    x.add_(1)
    return x.as_strided((2,), (1,), 1) * 2


def _write_then_shrink(x):
    x.add_(1)
    x.resize_(2)
    return x


def _shrink_write_grow(x):
    x.resize_(2)
    x.add_(1)
    x.resize_(4)
    return x + 0


def _write_through_view_after_shrink(x):
    v = x[2:]
    x.resize_(2)
    v.mul_(2)
    return v + 0


def _write_then_grow_past_storage(x):
    x.add_(1)
    x.resize_(7)
    x[5:].fill_(0)
    return x + 0


@pytest.mark.parametrize("program", [
    _write_then_as_strided, _write_then_shrink, _shrink_write_grow,
    _write_through_view_after_shrink, _write_then_grow_past_storage,
], ids=lambda p: p.__name__.strip("_"))
@pytest.mark.parametrize("make", [_slice_input, _transposed_input], ids=["slice", "transposed"])
def test_storage_coordinates_after_writes(remove, program, make):
    # as_strided and resize_ read storage coordinates, and the epilogue must write the elements an
    # input covered on entry before its metadata changes. Each gave wrong values.
    # See Note [Inputs: inputs that do not start their storage].
    # See Note [Inputs: writes before a metadata change].
    # A slice does not span its storage, so make_fx gives it its own base: as_strided on it is
    # refused by name (capture, which guards the layout, keeps the storage's base); its growth
    # counts from its first element, which its final elements cover whole here. See
    # Note [Inputs: storage coordinates under a tracer].
    refusal = None
    if make is _slice_input and program is _write_then_as_strided:
        refusal = "does not span its storage"
    assert_matches_eager(program, make_inputs=make, remove=remove, make_fx_refusal=refusal)


def test_resize_to_no_element_of_an_input_whose_offset_is_past_its_storage(remove):
    # b[1:] of a (3, 0) tensor has storage offset 1 in an empty storage; resize_((0,)) must not take
    # the growth path (a capacity of -1: "Storage size calculation overflowed").
    def f(x):
        x.resize_((0,))
        return x

    assert_matches_eager(f, make_inputs=lambda: (torch.zeros(3, 0, dtype=torch.int64)[1:, ::2],),
                         remove=remove)


@pytest.mark.parametrize("size", [(1, 3), (3,)], ids=["other shape", "its own shape"])
def test_resize_of_an_expanded_input_grows_its_storage(remove, size, deterministic_fill):
    # x = b.expand(3) has one element of storage; x.resize_((1, 3)) grows it to three in eager, and
    # so does the epilogue, although x's sizes are (3,) already (a resize_((3,)) of x would be a
    # no-op, and the as_strided_ after it would fail inside torch: "setStorage: ... out of bounds").
    # See Note [Inputs: metadata epilogue].
    def f(x):
        x.resize_(size)
        return x * 1

    assert_matches_eager(f, make_inputs=lambda: (torch.tensor([1.5]).expand(3),), remove=remove)


def _storage_values(t):
    return torch.tensor([], dtype=t.dtype).set_(t.untyped_storage()).clone()


def test_writes_to_a_grown_storage_survive_a_later_shrink(remove):
    # ones(out=x) grows x's storage to 12 elements and writes them all; x.resize_((2,)) then covers
    # 2, and the epilogue writes the whole grown storage, not only those 2
    # (Note [Inputs: writes to a grown storage]).
    def f(x):
        torch.ones((4, 3), out=x)
        x.resize_((2,))
        return x * 1

    x_e, x_o = torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.float64)
    expected = f(x_e)
    got = functionalize(f, remove=remove)(x_o)
    torch.testing.assert_close(got, expected)
    assert x_o.shape == x_e.shape and x_o.stride() == x_e.stride()
    torch.testing.assert_close(_storage_values(x_o), _storage_values(x_e))
    if remove == "mutations_and_views":
        with pytest.raises(NotImplementedError, match="cannot write the others back"):
            capture(f, torch.zeros(2, 3, dtype=torch.float64), remove=remove)
    else:
        gm = capture(f, torch.zeros(2, 3, dtype=torch.float64), remove=remove)
        x_g = torch.zeros(2, 3, dtype=torch.float64)
        torch.testing.assert_close(gm(x_g), expected)
        torch.testing.assert_close(_storage_values(x_g), _storage_values(x_e))


def test_write_between_two_resizes_of_a_strided_input_reaches_its_storage(remove):
    # x = b[1:, ::2] resized to (4,) covers elements 4..7 of b's storage, index_fill_ writes 4, 5
    # and 7, and x.resize_((2, 1)) then covers 4 and 5: element 7 is in neither x's entry nor its
    # final elements, and its write reaches b all the same
    # (Note [Inputs: writes outside every input's elements]).
    def f(x):
        x.resize_((4,))
        x.index_fill_(0, torch.tensor([0, 1, 1, 3]), -1.5)
        x.resize_((2, 1))
        return x * 1

    def make():
        return torch.arange(12.0).view(3, 4)

    b_e, b_o = make(), make()
    expected = f(b_e[1:, ::2])
    got = functionalize(f, remove=remove)(b_o[1:, ::2])
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(b_o, b_e)


def test_write_through_a_view_of_a_grown_input_after_its_as_strided_(remove, deterministic_fill):
    # x = b[::2] of 6 elements; x.resize_((4, 2)) grows the storage to 8, v = x[2:] views elements
    # 4..7, x.as_strided_((2, 2), (2, 3), 2) leaves x covering 2, 4, 5, 7, and a write through v
    # reaches element 6 too. A graph with views writes the grown storage whole after its metadata
    # ops (before them the storage is still the caller's 6 elements, and element 6 would keep the
    # new memory's fill, NaN under deterministic_fill). Without views the graph refuses by name: v's
    # step no longer counts as x's once as_strided_ replaced it without covering it.
    def f(x):
        x.resize_((4, 2))
        v = x.tensor_split([2], -2)[1]
        x.as_strided_((2, 2), (2, 3), 2)
        v.fill_(5.0)
        return v + 0

    def make_inputs():
        return (torch.arange(6.0)[::2],)

    if remove == "mutations_and_views":
        assert_matches_eager(f, make_inputs=make_inputs, remove=remove, check_graph=False)
        with pytest.raises(NotImplementedError, match="cannot write those elements back"):
            capture(f, *make_inputs(), remove=remove)
    else:
        assert_matches_eager(f, make_inputs=make_inputs, remove=remove)
        eager, graph = make_inputs()[0], make_inputs()[0]
        f(eager)
        capture(f, *make_inputs())(graph)
        whole = torch.tensor([]).set_(graph.untyped_storage())
        assert whole[4:].tolist() == [5.0] * 4
        torch.testing.assert_close(whole, torch.tensor([]).set_(eager.untyped_storage()),
                                   rtol=0, atol=0, equal_nan=True)


def test_set_of_a_resized_input_onto_its_own_view_is_refused_by_name(remove):
    # Fuzzer program 550254: the input grew past its storage (a new storage, no longer the
    # caller's), then set_ onto a view of it; the epilogue then failed with torch's shape error.
    def f(x):
        x.resize_((4, 2))
        v = x.unsafe_chunk(3, 1)[0]
        x.set_(v)
        return v

    x = torch.rand(4, 1, 1) > 0.5
    before = x.clone()
    with pytest.raises(NotImplementedError, match=r"aten::set_.source_Tensor: set_ swaps"):
        functionalize(f, remove=remove)(x)
    assert torch.equal(x, before) and x.shape == (4, 1, 1)
