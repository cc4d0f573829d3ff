"""In-place ops under functionalize, compared with eager: arithmetic, copy_ / fill_ / zero_,
_foreach_ lists, and the ones that change metadata (t_, transpose_, squeeze_, unsqueeze_). Ops
called with out=: test_out_arguments.py; indexed writes (index_put_, scatter_, masked_*):
test_indexed_writes.py."""

import warnings

import pytest
import torch

from torch_functionalize.testing._internal.reference import assert_matches_eager

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


def test_multi_output_aminmax(remove):
    # A multi-output op (aminmax) returns both results, and mutating one does not touch input.
    def f(x):
        lo, hi = torch.aminmax(x, dim=1)
        lo.add_(hi)
        return lo, hi

    assert_matches_eager(f, torch.randn(3, 5), remove=remove)


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


def test_copy_broadcast_and_dtype_conversion_into_views(remove):
    # copy_ broadcasts a float64 row into a row view, a bool scalar into a column, and converts a
    # transposed float view into an int8 input.
    def f(x, row, out_int8):
        x[1].copy_(row)
        x[:, 0].copy_(torch.tensor(True))
        out_int8.copy_(x.t()[:2, :2] * 10)
        return x, out_int8

    assert_matches_eager(
        f,
        torch.randn(3, 4),
        torch.randn(4, dtype=torch.float64),
        torch.zeros(2, 2, dtype=torch.int8),
        remove=remove,
    )


def test_copy_broadcast_into_intermediate_then_mutated(remove):
    # copy_ broadcasts a (3, 1) input into an empty (2, 3, 4) tensor, which is then filled in parts.
    def f(x):
        t = torch.empty(2, 3, 4)
        t.copy_(x)
        t[0].fill_(torch.tensor(2, dtype=torch.int32))
        t[1, :, ::2].zero_()
        return t

    assert_matches_eager(f, torch.randn(3, 1), remove=remove)


def test_copy_complex_into_real_discards_imaginary(remove):
    # copy_ from complex into a real input keeps the real part, like eager (which warns).
    def f(x, z):
        return x.copy_(z)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_matches_eager(f, torch.zeros(3), torch.randn(3, dtype=torch.cfloat), remove=remove)


def test_fill_and_zero_on_strided_views(remove):
    # fill_ with an int64 tensor value on every other row, zero_ on the diagonal, fill_(True) on int.
    def f(x, value, ints):
        x[::2].fill_(value)
        x.diagonal().zero_()
        ints.fill_(True)
        return x

    assert_matches_eager(
        f, torch.randn(4, 4), torch.tensor(7), torch.zeros(3, dtype=torch.int32), remove=remove
    )


def test_polygamma_inplace_whose_functional_variant_orders_arguments_differently(remove):
    # polygamma_(self, n) against polygamma(n, self): paired by argument names; torch.func refuses
    # it. See Note [Schema: functional variants matched by argument names].
    def f(x):
        x[1:].polygamma_(1)
        return x.polygamma(2)

    assert_matches_eager(f, torch.rand(4) + 0.5, remove=remove)
