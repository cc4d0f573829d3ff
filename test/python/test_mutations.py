"""In-place, out= and metadata-mutating ops under functionalize, compared with eager."""

import pytest
import torch

from reference import assert_matches_eager

# (id, input factory, in-place program). Each program mutates its first input in place and
# returns something read after the mutation; the final state of every input is compared too.
INPLACE_CASES = [
    (
        "add_tensor_alpha",
        lambda: (torch.randn(3, 4), torch.randn(3, 4)),
        lambda x, y: x.add_(y, alpha=2),
    ),
    ("add_broadcast", lambda: (torch.randn(3, 4), torch.randn(4)), lambda x, y: x.add_(y)),
    ("add_scalar", lambda: (torch.randn(3, 4),), lambda x: x.add_(2.5)),
    ("iadd_operator", lambda: (torch.randn(3), torch.randn(3)), lambda x, y: x.__iadd__(y)),
    ("mul_python_scalar", lambda: (torch.randn(5),), lambda x: x.mul_(-3)),
    (
        "div_rounding_floor_int",
        lambda: (torch.arange(-6, 6),),
        lambda x: x.div_(4, rounding_mode="floor"),
    ),
    (
        "sub_int_tensor",
        lambda: (torch.arange(10, dtype=torch.int32), torch.ones(10, dtype=torch.int32)),
        lambda x, y: x.sub_(y),
    ),
    (
        "add_wider_dtype_operand",
        lambda: (torch.randn(4), torch.randn(4, dtype=torch.float64)),
        lambda x, y: x.add_(y),
    ),
    ("fill_scalar", lambda: (torch.randn(3, 3),), lambda x: x.fill_(7)),
    (
        "fill_zero_dim_tensor",
        lambda: (torch.randn(3, 3), torch.tensor(4.0)),
        lambda x, v: x.fill_(v),
    ),
    ("zero_", lambda: (torch.randn(2, 5),), lambda x: x.zero_()),
    ("copy_same_shape", lambda: (torch.randn(3, 4), torch.randn(3, 4)), lambda x, y: x.copy_(y)),
    ("copy_broadcast", lambda: (torch.randn(3, 4), torch.randn(4)), lambda x, y: x.copy_(y)),
    (
        "copy_dtype_conversion",
        lambda: (torch.randn(3, 4), torch.arange(12).view(3, 4)),
        lambda x, y: x.copy_(y),
    ),
    (
        "copy_float_to_int_truncates",
        lambda: (torch.zeros(5, dtype=torch.int64), torch.randn(5) * 10),
        lambda x, y: x.copy_(y),
    ),
    (
        "copy_broadcast_and_dtype",
        lambda: (torch.zeros(2, 3, dtype=torch.float64), torch.tensor([1, 2, 3], dtype=torch.int8)),
        lambda x, y: x.copy_(y),
    ),
    (
        "copy_from_transposed",
        lambda: (torch.randn(3, 4), torch.randn(4, 3)),
        lambda x, y: x.copy_(y.t()),
    ),
    (
        "index_put_",
        lambda: (torch.randn(5, 3), torch.tensor([0, 3]), torch.randn(2, 3)),
        lambda x, i, v: x.index_put_((i,), v),
    ),
    (
        "index_put_accumulate_duplicates",
        lambda: (torch.zeros(4), torch.tensor([1, 1, 3]), torch.tensor([1.0, 2.0, 3.0])),
        lambda x, i, v: x.index_put_((i,), v, accumulate=True),
    ),
    (
        "index_put_two_indices",
        lambda: (torch.randn(4, 4), torch.tensor([0, 2]), torch.tensor([1, 3])),
        lambda x, i, j: x.index_put_((i, j), torch.tensor(-1.0)),
    ),
    (
        "setitem_tensor_index",
        lambda: (torch.randn(5, 3), torch.tensor([4, 0])),
        lambda x, i: x.__setitem__(i, 0.5) or x,
    ),
    ("setitem_bool_mask", lambda: (torch.randn(4, 4),), lambda x: x.__setitem__(x > 0, 0.0) or x),
    (
        "setitem_slice_from_tensor",
        lambda: (torch.randn(4, 4), torch.randn(2, 4)),
        lambda x, y: x.__setitem__(slice(1, 3), y) or x,
    ),
    ("masked_fill_", lambda: (torch.randn(3, 4),), lambda x: x.masked_fill_(x < 0, -1.0)),
    (
        "masked_fill_broadcast_mask",
        lambda: (torch.randn(3, 4), torch.tensor([True, False, True, False])),
        lambda x, m: x.masked_fill_(m, 9),
    ),
    (
        "masked_scatter_",
        lambda: (torch.zeros(2, 3), torch.arange(6.0)),
        lambda x, s: x.masked_scatter_(torch.tensor([[1, 0, 1], [0, 1, 1]]).bool(), s),
    ),
    (
        "scatter_",
        lambda: (torch.zeros(3, 5), torch.tensor([[0, 1, 2, 0, 1]]), torch.ones(1, 5)),
        lambda x, i, s: x.scatter_(0, i, s),
    ),
    (
        "scatter_add_",
        lambda: (torch.zeros(3), torch.tensor([0, 0, 2, 1]), torch.arange(4.0)),
        lambda x, i, s: x.scatter_add_(0, i, s),
    ),
    (
        "index_add_",
        lambda: (torch.ones(5, 2), torch.tensor([4, 0, 4]), torch.randn(3, 2)),
        lambda x, i, s: x.index_add_(0, i, s, alpha=2),
    ),
    (
        "index_fill_",
        lambda: (torch.randn(3, 4), torch.tensor([0, 3])),
        lambda x, i: x.index_fill_(1, i, -5),
    ),
    ("clamp_", lambda: (torch.randn(10),), lambda x: x.clamp_(-0.5, 0.5)),
    ("relu_", lambda: (torch.randn(10),), lambda x: torch.relu_(x)),
    ("sigmoid_", lambda: (torch.randn(10),), lambda x: x.sigmoid_()),
    (
        "addmm_",
        lambda: (torch.randn(2, 4), torch.randn(2, 3), torch.randn(3, 4)),
        lambda x, a, b: x.addmm_(a, b, beta=0.5),
    ),
    ("lerp_", lambda: (torch.randn(4), torch.randn(4)), lambda x, y: x.lerp_(y, 0.25)),
    (
        "bitwise_and_int",
        lambda: (torch.arange(16, dtype=torch.int16),),
        lambda x: x.bitwise_and_(6),
    ),
    ("shift_left_int64", lambda: (torch.arange(8),), lambda x: x.__ilshift__(2)),
    ("bool_logical_not_", lambda: (torch.tensor([True, False, True]),), lambda m: m.logical_not_()),
    (
        "bool_bitwise_or_",
        lambda: (torch.tensor([True, False, False]), torch.tensor([False, False, True])),
        lambda m, n: m.bitwise_or_(n),
    ),
    ("complex_mul_imaginary", lambda: (torch.randn(4, dtype=torch.cfloat),), lambda z: z.mul_(1j)),
    (
        "complex_add_from_real",
        lambda: (torch.randn(4, dtype=torch.cdouble), torch.randn(4, dtype=torch.float64)),
        lambda z, r: z.add_(r),
    ),
    ("nan_values_kept", lambda: (torch.tensor([0.0, float("nan"), 1.0]),), lambda x: x.mul_(2)),
    ("zero_dim_input", lambda: (torch.tensor(3.0),), lambda x: x.pow_(2)),
    ("empty_input", lambda: (torch.randn(0, 3),), lambda x: x.add_(1)),
]
INPLACE_IDS = [c[0] for c in INPLACE_CASES]


@pytest.mark.parametrize("name, make_inputs, op", INPLACE_CASES, ids=INPLACE_IDS)
def test_inplace_op_on_input_matches_eager(name, make_inputs, op, remove, device):
    # The in-place op is written back to the input, and its return value (self) is right.
    def f(*args):
        out = op(*args)
        return out, args[0] + 0

    assert_matches_eager(f, *[t.to(device) for t in make_inputs()], remove=remove)


@pytest.mark.parametrize("name, make_inputs, op", INPLACE_CASES, ids=INPLACE_IDS)
def test_inplace_op_on_intermediate_matches_eager(name, make_inputs, op, remove):
    # The same op applied to a fresh intermediate leaves every input untouched.
    def f(first, *rest):
        tmp = first.clone()
        op(tmp, *rest)
        return tmp

    assert_matches_eager(f, *make_inputs(), remove=remove)


def test_python_scalar_arguments_are_passed_through(remove):
    # Python int/float/bool arguments reach f unchanged and mix with tensors.
    def f(x, alpha, n, flag):
        x.add_(alpha).mul_(n)
        return x * 2 if flag else x, n + 1

    assert_matches_eager(f, torch.randn(3), 0.5, 3, True, remove=remove)


def test_repeated_mutations_of_one_input(remove):
    # Several mutations of one input collapse into one final write-back with the last value.
    def f(x):
        for i in range(4):
            x.mul_(2).add_(i)
        return x.sum()

    assert_matches_eager(f, torch.randn(3, 2), remove=remove)


def test_mutation_of_one_input_from_another(remove):
    # Mutating input a with values of input b leaves b untouched and updates a.
    def f(a, b):
        a.copy_(b * 2)
        b.neg()
        return a + b

    assert_matches_eager(f, torch.randn(4), torch.randn(4), remove=remove)


def test_foreach_add_list_input(remove):
    # _foreach_add_ on a list input writes every list element back.
    def f(xs, ys):
        torch._foreach_add_(xs, ys, alpha=0.5)
        return [x.sum() for x in xs]

    xs = [torch.randn(3), torch.randn(2, 2), torch.randn(1)]
    ys = [torch.randn(3), torch.randn(2, 2), torch.randn(1)]
    assert_matches_eager(f, xs, ys, remove=remove)


def test_foreach_mul_scalar_list(remove):
    # _foreach_mul_ with a list of Python scalars mutates each tensor of the list.
    def f(xs):
        torch._foreach_mul_(xs, [2.0, -1.0])
        return xs[0] + xs[1]

    assert_matches_eager(f, [torch.randn(4), torch.randn(4)], remove=remove)


def test_out_add_into_input(remove):
    # torch.add(..., out=o) with o an input of the right size writes o.
    def f(a, b, o):
        r = torch.add(a, b, alpha=3, out=o)
        return r, o.sum()

    assert_matches_eager(f, torch.randn(3, 4), torch.randn(3, 4), torch.empty(3, 4), remove=remove)


def test_out_variant_resizes_output(remove):
    # An out= tensor of the wrong size created in f is resized to the result's size.
    def f(a, b):
        o = torch.empty(0)
        torch.add(a, b, out=o)
        return o, o.shape[0]

    assert_matches_eager(f, torch.randn(3, 4), torch.randn(4), remove=remove)


@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
def test_out_variant_resizes_wrong_sized_intermediate(remove):
    # A wrongly sized (non-empty) out tensor is resized and fully overwritten.
    def f(x):
        o = torch.zeros(7)
        torch.mul(x, 2, out=o)
        return o + 1

    assert_matches_eager(f, torch.randn(2, 3), remove=remove)


def test_out_variant_into_empty_input_resizes_input(remove):
    # An empty input used as out= ends with the result's shape and values.
    def f(a, o):
        torch.sin(a, out=o)
        return o * 1

    assert_matches_eager(f, torch.randn(2, 3), torch.empty(0), remove=remove)


def test_out_variant_aliasing_input(remove):
    # out= naming one of the op's own inputs behaves like an in-place op.
    def f(a, b):
        torch.mul(a, b, out=a)
        return a

    assert_matches_eager(f, torch.randn(5), torch.randn(5), remove=remove)


def test_out_variant_wider_dtype(remove):
    # An int64 out tensor receives an int32 result, cast as in eager.
    def f(a, b, o):
        torch.add(a, b, out=o)
        return o

    a = torch.arange(6, dtype=torch.int32)
    assert_matches_eager(f, a, a, torch.empty(6, dtype=torch.int64), remove=remove)


def test_out_variant_into_slice_of_intermediate(remove):
    # out= into a view of an intermediate writes that slice of its base.
    def f(x):
        buf = torch.zeros(4, 3)
        torch.exp(x, out=buf[1:3])
        return buf

    assert_matches_eager(f, torch.randn(2, 3), remove=remove)


def test_out_cat(remove):
    # A TensorList op with out= (cat) writes a preallocated output.
    def f(a, b):
        o = torch.empty(5, 2)
        torch.cat([a, b], out=o)
        return o

    assert_matches_eager(f, torch.randn(2, 2), torch.randn(3, 2), remove=remove)


def test_multi_output_aminmax(remove):
    # A multi-output op (aminmax) returns both results, and mutating one does not touch input.
    def f(x):
        lo, hi = torch.aminmax(x, dim=1)
        lo.add_(hi)
        return lo, hi

    assert_matches_eager(f, torch.randn(3, 5), remove=remove)


def test_multi_output_aminmax_out(remove):
    # aminmax with out=(min, max) writes both out tensors, one of them an input.
    def f(x, mx):
        mn = torch.empty(0)
        res = torch.aminmax(x, out=(mn, mx))
        return res.min, res.max, mn, mx

    assert_matches_eager(f, torch.randn(4, 3), torch.empty(()), remove=remove)


def test_multi_output_max_dim_out(remove):
    # torch.max(x, dim, out=(values, indices)) writes both outputs, indices as int64.
    def f(x, values, indices):
        torch.max(x, 1, keepdim=True, out=(values, indices))
        return values * 2, indices + 1

    x = torch.randn(3, 5)
    assert_matches_eager(
        f, x, torch.empty(3, 1), torch.empty(3, 1, dtype=torch.int64), remove=remove
    )


@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
def test_multi_output_max_dim_out_resized(remove):
    # torch.max with wrongly sized out tensors resizes both.
    def f(x):
        values, indices = torch.empty(1), torch.empty(1, dtype=torch.long)
        torch.max(x, 0, out=(values, indices))
        return values, indices

    assert_matches_eager(f, torch.randn(4, 6), remove=remove)


def test_metadata_mutation_t_on_input(remove):
    # x.t_() on an input transposes the caller's tensor (sizes and strides).
    def f(x):
        x.t_()
        return x + 1

    assert_matches_eager(f, torch.randn(2, 3), remove=remove)


def test_metadata_mutation_transpose_on_input(remove):
    # x.transpose_(0, 1) on a 3-d input is replayed on the input.
    def f(x):
        x.transpose_(0, 1)
        return x.sum(0)

    assert_matches_eager(f, torch.randn(2, 3, 4), remove=remove)


def test_metadata_mutation_unsqueeze_on_input(remove):
    # x.unsqueeze_(0) gives the caller's tensor a new leading dimension.
    def f(x):
        x.unsqueeze_(0)
        return x * 1, list(x.shape)

    assert_matches_eager(f, torch.randn(3, 2), remove=remove)


def test_metadata_mutation_squeeze_on_input(remove):
    # x.squeeze_(1) drops a size-1 dimension of the caller's tensor.
    def f(x):
        x.squeeze_(1)
        return x * 3

    assert_matches_eager(f, torch.randn(3, 1, 2), remove=remove)


def test_metadata_and_data_mutation_on_input(remove):
    # A transposed input mutated afterwards: both the layout and the values reach the caller.
    def f(x):
        x.t_()
        x[0].fill_(1)
        return x.clone()

    assert_matches_eager(f, torch.randn(2, 3), remove=remove)


def test_metadata_mutation_of_intermediate(remove):
    # Metadata mutations of an intermediate followed by data mutations through a view.
    def f(x):
        a = x.clone()
        a.unsqueeze_(0).transpose_(1, 2)
        a[0, 0].add_(10)
        return a, x + 0

    assert_matches_eager(f, torch.randn(3, 4), remove=remove)


# In-place ops on values only the wrapper can observe run on the value itself; each case below
# must still see eager's values where something else could observe the write.
# See Note [Kernel: in-place on the inner value].
@pytest.mark.parametrize(
    "program",
    [
        lambda x: (lambda y: (y.add_(1), y.mul_(y), y.sub_(2).div_(3)))(x.clone())[-1],
        lambda x: (lambda y, v: (y.add_(1), v.clone()))(*(lambda y: (y, y[0]))(x.clone()))[1],
        lambda x: (lambda y, d: (y.mul_(2), d.clone()))(*(lambda y: (y, y.detach()))(x.clone()))[1],
        lambda x: (lambda y: (y.add_(y), y.t().clone()))(x.clone())[1],
        lambda x: (lambda y, z: (y.add_(1), z))(*(lambda y: (y, y))(x.clone())),
        lambda x: (x.add_(1), x.mul_(2), x)[-1],
    ],
    ids=[
        "fresh_chain",
        "live_view",
        "detached_alias",
        "self_as_other",
        "same_wrapper_twice",
        "input",
    ],
)
def test_in_place_writes_on_fresh_values_match_eager(program, remove):
    assert_matches_eager(program, torch.randn(2, 3), remove=remove)
