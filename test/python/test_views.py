"""Views under functionalize: a mutation through each view op updates its base and siblings."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_functionalize.testing._internal.reference import REMOVE_MODES, assert_matches_eager
from torch_functionalize import functionalize

# (id, input factory, view function). Every view here aliases all of its elements with the
# input, so a mutation through it must reach the input and a base mutation must reach it.
VIEW_CASES = [
    ("view", lambda: torch.randn(4, 6), lambda x: x.view(-1)),
    ("view_split_dim", lambda: torch.randn(4, 6), lambda x: x.view(2, 2, 3, 2)),
    ("reshape", lambda: torch.randn(4, 6), lambda x: x.reshape(6, 4)),
    ("flatten", lambda: torch.randn(2, 3, 4), lambda x: x.flatten(1)),
    ("unflatten", lambda: torch.randn(4, 6), lambda x: x.unflatten(1, (2, 3))),
    ("slice", lambda: torch.randn(4, 6), lambda x: x[1:3]),
    ("slice_step", lambda: torch.randn(4, 6), lambda x: x[:, ::2]),
    ("slice_negative_start", lambda: torch.randn(4, 6), lambda x: x[-2:, 1:-1]),
    ("select", lambda: torch.randn(4, 6), lambda x: x[1]),
    ("select_negative", lambda: torch.randn(4, 6), lambda x: x.select(1, -1)),
    ("narrow", lambda: torch.randn(4, 6), lambda x: x.narrow(1, 1, 3)),
    ("transpose", lambda: torch.randn(4, 6), lambda x: x.transpose(0, 1)),
    ("swapaxes", lambda: torch.randn(2, 3, 4), lambda x: x.swapaxes(0, 2)),
    ("permute", lambda: torch.randn(2, 3, 4), lambda x: x.permute(2, 0, 1)),
    ("movedim", lambda: torch.randn(2, 3, 4), lambda x: x.movedim(0, -1)),
    ("t", lambda: torch.randn(4, 6), lambda x: x.t()),
    ("t_1d", lambda: torch.randn(5), lambda x: x.t()),
    ("diagonal", lambda: torch.randn(4, 4), lambda x: x.diagonal()),
    ("diagonal_offset", lambda: torch.randn(4, 6), lambda x: torch.diagonal(x, offset=2)),
    ("diagonal_dims", lambda: torch.randn(3, 2, 3), lambda x: x.diagonal(0, 0, 2)),
    ("squeeze", lambda: torch.randn(1, 4, 1, 3), lambda x: x.squeeze()),
    ("squeeze_dim", lambda: torch.randn(4, 1, 3), lambda x: x.squeeze(1)),
    ("squeeze_dims", lambda: torch.randn(1, 4, 1, 3), lambda x: x.squeeze((0, 2))),
    ("unsqueeze", lambda: torch.randn(4, 6), lambda x: x.unsqueeze(1)),
    ("unsqueeze_negative", lambda: torch.randn(4, 6), lambda x: x.unsqueeze(-1)),
    ("split", lambda: torch.randn(5, 3), lambda x: x.split(2)[1]),
    ("split_last_chunk", lambda: torch.randn(5, 3), lambda x: x.split(2)[2]),
    ("split_with_sizes", lambda: torch.randn(4, 6), lambda x: x.split([1, 3, 2], dim=1)[1]),
    ("chunk", lambda: torch.randn(4, 6), lambda x: x.chunk(2, dim=1)[0]),
    ("unbind", lambda: torch.randn(3, 4), lambda x: x.unbind(0)[2]),
    ("unbind_dim1", lambda: torch.randn(3, 4), lambda x: x.unbind(1)[1]),
    ("unfold_size_equals_step", lambda: torch.randn(6, 3), lambda x: x.unfold(0, 2, 2)),
    ("as_strided", lambda: torch.randn(12), lambda x: x.as_strided((3, 2), (4, 1), 1)),
    ("as_strided_transposed", lambda: torch.randn(12), lambda x: x.as_strided((2, 3), (1, 4))),
    ("view_as_real", lambda: torch.randn(3, 2, dtype=torch.cfloat), torch.view_as_real),
    ("view_as_complex", lambda: torch.randn(3, 4, 2), torch.view_as_complex),
    ("real", lambda: torch.randn(3, 2, dtype=torch.cfloat), lambda x: x.real),
    ("imag", lambda: torch.randn(3, 2, dtype=torch.cfloat), lambda x: x.imag),
    ("alias", lambda: torch.randn(4, 6), lambda x: torch.ops.aten.alias.default(x)),
    ("detach", lambda: torch.randn(4, 6), lambda x: x.detach()),
    ("index_with_none_and_ellipsis", lambda: torch.randn(3, 4, 5), lambda x: x[None, ..., 1]),
    ("view_as", lambda: torch.randn(4, 6), lambda x: x.view_as(torch.empty(24))),
]
VIEW_IDS = [c[0] for c in VIEW_CASES]

# Chains of views (views of views), each ending in a tensor that aliases part of the input.
CHAIN_CASES = [
    ("view_slice_t", lambda: torch.randn(4, 6), lambda x: x.view(6, 4)[1:4].t()),
    ("t_select_unsqueeze", lambda: torch.randn(4, 6), lambda x: x.t()[2].unsqueeze(0)),
    ("permute_diagonal", lambda: torch.randn(3, 4, 3), lambda x: x.permute(1, 0, 2).diagonal(0, 1, 2)),
    ("split_view_transpose", lambda: torch.randn(6, 4), lambda x: x.split(3)[1].view(2, 6).transpose(0, 1)),
    ("unbind_narrow_unsqueeze", lambda: torch.randn(3, 8), lambda x: x.unbind(0)[1].narrow(0, 2, 4).unsqueeze(1)),
    ("chunk_t_slice_step", lambda: torch.randn(6, 6), lambda x: x.chunk(3, dim=1)[1].t()[:, ::2]),
    ("squeeze_view_select", lambda: torch.randn(1, 4, 6), lambda x: x.squeeze(0).view(2, 12).select(1, 5)),
    ("real_transpose_slice", lambda: torch.randn(3, 4, dtype=torch.cfloat), lambda x: torch.view_as_real(x).transpose(0, 2)[1]),
    ("slice_slice_slice", lambda: torch.randn(8, 8), lambda x: x[1:7][1:5, 2:][::2]),
    ("unfold_diagonal", lambda: torch.randn(8, 2), lambda x: x.unfold(0, 2, 2).diagonal(0, 1, 2)),
    ("alias_view_alias", lambda: torch.randn(4, 6), lambda x: torch.ops.aten.alias.default(x.view(24)).view(3, 8)),
    ("detach_select_view", lambda: torch.randn(4, 6), lambda x: x.detach()[3].view(2, 3)),
]
CHAIN_IDS = [c[0] for c in CHAIN_CASES]


@pytest.mark.parametrize("name, make_input, view", VIEW_CASES, ids=VIEW_IDS)
def test_mutation_through_view_updates_input(name, make_input, view, remove, device):
    # An in-place add through a view of an input writes through to the input, and reading the
    # input inside f afterwards already sees it.
    def f(x):
        y = view(x)
        y.add_(1)
        return y, x * 2

    assert_matches_eager(f, make_input().to(device), remove=remove)


@pytest.mark.parametrize("name, make_input, view", VIEW_CASES, ids=VIEW_IDS)
def test_mutation_through_view_updates_intermediate_base(name, make_input, view, remove):
    # A mutation through a view of an intermediate updates the intermediate; input untouched.
    def f(x):
        a = x.clone()
        y = view(a)
        y.mul_(3)
        return a, y

    assert_matches_eager(f, make_input(), remove=remove)


@pytest.mark.parametrize("name, make_input, view", VIEW_CASES, ids=VIEW_IDS)
def test_base_mutation_is_visible_through_live_view(name, make_input, view, remove):
    # A view taken before its base is mutated reads the mutated values afterwards.
    def f(x):
        a = x.clone()
        y = view(a)
        a.add_(2)
        return y

    assert_matches_eager(f, make_input(), remove=remove)


@pytest.mark.parametrize("name, make_input, view", VIEW_CASES, ids=VIEW_IDS)
def test_input_mutation_is_visible_through_live_view(name, make_input, view, remove):
    # A view of an input, taken before the input is mutated in place, reads the new values.
    def f(x):
        y = view(x)
        x.sub_(1)
        return y + 0

    assert_matches_eager(f, make_input(), remove=remove)


@pytest.mark.parametrize("name, make_input, view", CHAIN_CASES, ids=CHAIN_IDS)
def test_mutation_through_view_chain_updates_input(name, make_input, view, remove):
    # A mutation at the end of a chain of views replays back through every link to the input.
    def f(x):
        y = view(x)
        y.mul_(2)
        return y, x.sum()

    assert_matches_eager(f, make_input(), remove=remove)


@pytest.mark.parametrize("name, make_input, view", CHAIN_CASES, ids=CHAIN_IDS)
def test_base_mutation_is_visible_through_view_chain(name, make_input, view, remove):
    # Every link of a view chain taken before a base mutation is regenerated on read.
    def f(x):
        a = x.clone()
        y = view(a)
        a.mul_(-1)
        return y

    assert_matches_eager(f, make_input(), remove=remove)


def test_expand_reads_mutated_base(remove):
    # expand is read-only: mutating its base afterwards is visible through the expanded view.
    def f(x):
        a = x.clone()
        e = a.expand(3, 4)
        a.add_(1)
        return e, e.sum(0)

    assert_matches_eager(f, torch.randn(1, 4), remove=remove)


def test_expand_of_view_reads_mutated_input(remove):
    # An expand of a slice of the input reflects a later mutation of that input.
    def f(x):
        e = x[:, 0:1].expand(2, 5)
        x.mul_(2)
        return e.clone()

    assert_matches_eager(f, torch.randn(2, 3), remove=remove)


def test_mutation_through_one_view_is_visible_in_sibling_views(remove):
    # Two overlapping views of one base: writing one is seen by the other and by the base.
    def f(x):
        a = x.clone()
        row = a[1]
        col = a[:, 2]
        diag = a.diagonal()
        row.fill_(5)
        return col, diag, a

    assert_matches_eager(f, torch.randn(4, 4), remove=remove)


def test_mutations_through_several_views_apply_in_order(remove):
    # Overlapping writes through different views of one base apply in program order.
    def f(x):
        a = x.view(3, 4)
        b = x.t()
        a[0].fill_(1)
        b[0].mul_(10)
        x.view(-1)[5:].add_(100)
        return a.sum(), b

    assert_matches_eager(f, torch.randn(4, 3), remove=remove)


def test_mutation_of_view_of_view_then_read_middle_view(remove):
    # The middle link of a chain is regenerated after a write through its child.
    def f(x):
        a = x.clone()
        mid = a.view(4, 3)
        leaf = mid[1:3].t()
        leaf.add_(7)
        return mid, leaf, a

    assert_matches_eager(f, torch.randn(12), remove=remove)


def test_split_outputs_each_mutated(remove):
    # Mutating every output of split (a multi-output view) rebuilds the whole base.
    def f(x):
        parts = x.split([1, 2, 3], dim=1)
        for i, p in enumerate(parts):
            p.add_(i)
        return x.clone()

    assert_matches_eager(f, torch.randn(3, 6), remove=remove)


def test_unbind_outputs_each_mutated(remove):
    # Mutating each output of unbind writes back one row each.
    def f(x):
        for i, row in enumerate(x.unbind(0)):
            row.mul_(i + 1)
        return x.sum(1)

    assert_matches_eager(f, torch.randn(3, 5), remove=remove)


def test_chunk_outputs_read_after_base_mutation(remove):
    # Every chunk taken before a base mutation sees it.
    def f(x):
        a = x + 1
        chunks = a.chunk(3)
        a.zero_()
        return [c + 1 for c in chunks]

    assert_matches_eager(f, torch.randn(6, 2), remove=remove)


def test_view_of_input_returned_after_mutation(remove):
    # A view of a mutated input returned as an output carries the mutated values.
    def f(x):
        x.add_(1)
        return x.view(-1), x[0]

    assert_matches_eager(f, torch.randn(2, 3), remove=remove)


def test_non_contiguous_input_mutated_through_view(remove):
    # An input with transposed strides keeps them, and the mutation lands in the right places.
    def make_inputs():
        return (torch.arange(12.0).view(3, 4).t(),)

    def f(x):
        x[1:].select(1, 0).add_(10)
        x.diagonal().add_(1)
        return x.contiguous()

    assert_matches_eager(f, remove=remove, make_inputs=make_inputs)


def test_view_input_mutation_writes_to_its_base(remove):
    # An input that is itself a view of a larger tensor: writing it updates the caller's base.
    def make_inputs():
        base = torch.arange(20.0).view(4, 5)
        return (base[1:3, 1:4],)

    def f(x):
        x.t()[0].mul_(-1)
        return x + 0

    assert_matches_eager(f, remove=remove, make_inputs=make_inputs)


def test_complex_roundtrip_views_mutated(remove):
    # view_as_real of view_as_complex of a real tensor: a write to the inner real view lands.
    def f(x):
        c = torch.view_as_complex(x)
        r = torch.view_as_real(c)
        r[..., 1].fill_(0.5)
        return c * 2, x.clone()

    assert_matches_eager(f, torch.randn(3, 2), remove=remove)


def test_reshape_of_non_contiguous_view_copies(remove):
    # reshape of a transposed view must copy (as in eager), so mutating the result leaves the
    # base alone, in both remove modes.
    def f(x):
        a = x.clone()
        y = a.t().reshape(-1)
        y.add_(1)
        return a, y

    assert_matches_eager(f, torch.randn(2, 3), remove=remove)


def test_strides_of_views_match_eager_inside_f(remove):
    # Views inside f report eager's sizes, strides and contiguity, so code that branches on
    # them takes the eager path.
    def f(x):
        t = x.t()
        d = x.diagonal()
        return t.stride(), t.is_contiguous(), d.stride(), x[:, 1:].is_contiguous()

    assert_matches_eager(f, torch.randn(3, 3), remove=remove)


def test_matmul_of_sliced_view_matches_eager(remove):
    # matmul decomposes into expand plus a stride-carrying reshape (_reshape_alias) of a
    # non-contiguous slice; the replay must still read the slice's elements.
    def f(c, q):
        return c[:, :3] @ q.unsqueeze(-1)

    assert_matches_eager(f, torch.randn(2, 5, 4), torch.randn(2, 4), remove=remove)


def _apply_view_step(t, choice):
    """One view op picked by `choice` among those valid for t's shape; t itself if none is."""
    steps = [
        lambda t: t.transpose(0, -1) if t.dim() >= 2 else None,
        lambda t: t.select(0, t.shape[0] // 2) if t.dim() >= 2 and t.shape[0] > 0 else None,
        lambda t: t[1:] if t.dim() >= 1 and t.shape[0] > 1 else None,
        lambda t: t.unsqueeze(0) if t.dim() < 4 else None,
        lambda t: t.diagonal() if t.dim() >= 2 and min(t.shape[:2]) > 0 else None,
        lambda t: t.permute(*reversed(range(t.dim()))),
        lambda t: t.narrow(-1, 1, t.shape[-1] - 1) if t.dim() >= 1 and t.shape[-1] > 1 else None,
        lambda t: t.unbind(0)[-1] if t.dim() >= 2 and t.shape[0] > 0 else None,
    ]
    out = steps[choice](t)
    return t if out is None else out


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(0, 7), min_size=1, max_size=5), st.sampled_from(REMOVE_MODES))
def test_random_view_chain_mutation_matches_eager(choices, remove):
    # Property: any chain of views of an input, mutated at its end, matches eager.
    def f(x):
        y = x
        for c in choices:
            y = _apply_view_step(y, c)
        y.mul_(2).add_(1)
        return y, x.sum()

    assert_matches_eager(f, torch.randn(4, 5, 3), remove=remove)


@pytest.mark.parametrize(
    "split",
    [
        lambda t: torch.unsafe_split(t, 2),
        lambda t: torch.unsafe_split_with_sizes(t, [1, 3]),
        lambda t: torch.unsafe_chunk(t, 2),
        lambda t: t.unsafe_split(3),
    ],
    ids=["unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk", "method"],
)
def test_unsafe_split_outputs_alias_their_input(split, remove):
    # "unsafe" only means autograd does not track the outputs as views; they share the input's
    # storage, so writes through them reach the input and its aliases; torch.func loses these
    # writes. See Note [Kernel: unsafe_split].
    def f(x):
        alias = x.view(-1)
        parts = split(x)
        parts[0].mul_(2)
        parts[-1].add_(1)
        return alias.clone(), [p.clone() for p in parts]

    assert_matches_eager(f, torch.randn(4), remove=remove)


def test_unsafe_chunk_of_intermediate_updates_it(remove):
    def f(x):
        y = x.clone()
        torch.unsafe_chunk(y, 2, dim=1)[1].zero_()
        return y

    assert_matches_eager(f, torch.randn(2, 4), remove=remove)


@pytest.mark.parametrize(
    "split",
    [
        pytest.param(lambda x: torch.unsafe_split(x, 3), id="unsafe_split"),
        pytest.param(lambda x: torch.unsafe_chunk(x, 2), id="unsafe_chunk"),
        pytest.param(lambda x: torch.unsafe_split_with_sizes(x, [2, 4]), id="with_sizes"),
    ],
)
def test_write_through_unsafe_split_output_reaches_input(split, remove):
    # Note [Kernel: unsafe_split]: the outputs alias the input in eager, without view tracking.
    def f(x):
        a, b = split(x)
        b.mul_(2)
        return a + 1

    assert_matches_eager(f, torch.randn(6), remove=remove)


def _alternating_views(t, depth):
    for i in range(depth):
        t = t.view(2, -1) if i % 2 == 0 else t.view(-1)
    return t


@pytest.mark.parametrize("case", ["reshapes_only", "select_then_reshapes", "mixed_tail",
                                  "intermediate_read", "input_chain"])
def test_write_through_a_run_of_regrouping_views(case, remove):
    # Note [Alias: runs of regrouping views]: a chain ending in view/squeeze steps is inverted in
    # one regrouping; every alias must still see eager's values.
    def f(x):
        base = x if case == "input_chain" else x.clone()
        if case == "select_then_reshapes":
            v = _alternating_views(base[1], 5)
        elif case == "mixed_tail":
            v = base.view(4, 6).unsqueeze(0).squeeze(0).view(2, 12).view(-1)
        else:
            v = _alternating_views(base, 7)
        mid = _alternating_views(base, 3) if case == "intermediate_read" else None
        v.mul_(3).add_(1)
        out = [base * 2, v + 0]
        if mid is not None:
            out.append(mid.sum(0))
        return out

    assert_matches_eager(f, torch.randn(4, 6) if case != "select_then_reshapes"
                         else torch.randn(3, 24), remove=remove)


@pytest.mark.parametrize(
    "name, f",
    [
        ("unfold", lambda x: x.unfold(0, 2, 2).mul_(0)),
        ("unfold with gaps", lambda x: x.unfold(0, 1, 2).mul_(0)),
        ("as_strided with the default offset", lambda x: x.as_strided((3, 2), (2, 1)).mul_(0)),
    ],
)
def test_writes_through_views_of_an_input_that_does_not_start_its_storage(remove, name, f):
    # The input base[1:] starts at storage offset 1: unfold's inverse counts that offset once, and
    # as_strided's default offset is self's, not the storage base's 0, also without views.
    base = torch.arange(1.0, 8.0)
    expected_base = base.clone()
    expected = f(expected_base[1:])
    got = functionalize(f, remove=remove)(base[1:])
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(base, expected_base, rtol=0, atol=0)


def test_write_through_a_transposed_view_of_a_view(remove):
    # v = x.view((2, 15)); v.t_(); v.cumprod_(1): the transpose's inverse hands back a transposed
    # value, which must still be regrouped into x's shape (view() cannot).
    def f(x):
        v = x.view((2, 15))
        v.t_()
        v.cumprod_(1)
        return v

    assert_matches_eager(f, make_inputs=lambda: (torch.arange(30).view(5, 3, 2) % 3 + 1,),
                         remove=remove)
