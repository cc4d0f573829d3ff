"""Views whose inverse is not a plain scatter: gapped unfold keeps its gaps, writes into tensors
with internal overlap are refused (Note [Kernel: internal overlap]), and inputs that are already
strided views keep their layout."""
import pytest
import torch

import torch_functionalize as tfz
from reference import assert_matches_eager


def _base(*shape):
    # Deterministic values: make_inputs runs once for eager and once for functionalize.
    n = 1
    for d in shape:
        n *= d
    return torch.arange(n, dtype=torch.float32).view(shape) / 7


@pytest.mark.parametrize(
    "shape, dim, size, step",
    [((7,), 0, 2, 3), ((3, 8), 1, 1, 3), ((5, 2), 0, 2, 2), ((9,), 0, 3, 4)],
    ids=["1d_gapped", "2d_gapped", "tiling", "1d_gapped_tail"],
)
def test_write_through_unfold_leaves_gaps_like_eager(shape, dim, size, step, remove):
    # Elements between windows (size < step) and after the last window keep their values.
    def f(x):
        x.unfold(dim, size, step).mul_(10).add_(1)
        return x

    assert_matches_eager(f, torch.randn(shape), remove=remove)


@pytest.mark.parametrize(
    "make_view",
    [
        lambda x: x[:1].expand(3, 3),
        lambda x: x.view(-1).unfold(0, 3, 1),
        lambda x: x.view(-1).as_strided((3, 3), (1, 1)),
    ],
    ids=["expand", "overlapping_unfold", "overlapping_as_strided"],
)
def test_write_into_tensor_with_internal_overlap_raises(make_view, remove):
    # Which aliased write wins is undefined: a clear error naming the op, inputs untouched.
    def f(x):
        make_view(x.clone()).add_(1)
        return x

    x = torch.randn(3, 3)
    before = x.clone()
    with pytest.raises(RuntimeError, match=r"aten::add_\.Tensor: .*internal overlap"):
        tfz.functionalize(f, remove=remove)(x)
    assert torch.equal(x, before)


def test_expanded_input_can_be_read(remove):
    # A stride-0 input is fine to read; its layout is untouched.
    assert_matches_eager(
        lambda x: x * 2 + x.sum(), make_inputs=lambda: (_base(1, 3).expand(4, 3),), remove=remove
    )


@pytest.mark.parametrize(
    "make_input",
    [
        lambda: _base(3, 4).t(),
        lambda: _base(10)[3:],
        lambda: _base(4, 6)[:, ::2],
    ],
    ids=["transposed", "offset", "strided_slice"],
)
def test_strided_view_inputs_keep_layout_and_receive_values(make_input, remove):
    # The caller's view keeps sizes/strides/offset and receives the new values (checked on the
    # input and on its base by assert_matches_eager).
    def f(x):
        x.mul_(2)
        x[0].add_(1)
        return x.sum()

    assert_matches_eager(f, make_inputs=lambda: (make_input(),), remove=remove)
