"""Which operators reach our kernel: CompositeExplicitAutograd ops and torch.library ops defined
after import do; CompositeImplicitAutograd ops decompose first. See Note [Kernel: registration]."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torch_functionalize as tfz
from torch_functionalize import _C

from torch_functionalize.testing._internal.reference import (
    assert_matches_eager, assert_trees_match, graph_ops,
)

KERNEL = "torch_functionalize per-op kernel [kernel]"


def _table(op):
    tfz.functionalize(lambda x: x)(torch.ones(1))  # registration happens on layer entry
    return dict(
        line.split(": ", 1) for line in torch._C._dispatch_dump_table(op).splitlines() if ": " in line
    )


def test_every_non_composite_implicit_op_is_registered():
    # Thousands of operators get the per-op kernel (a fallback alone would miss most of them).
    tfz.functionalize(lambda x: x)(torch.ones(1))
    assert _C._registered_op_count() > 2000


def test_composite_explicit_ops_reach_our_kernel():
    # transpose.int, t and alias have CompositeExplicitAutograd kernels, which beat any fallback.
    for op in ["aten::transpose.int", "aten::t", "aten::alias", "aten::add.Tensor"]:
        table = _table(op)
        assert table["AutogradPrivateUse3"] == KERNEL, op
        assert table["PrivateUse3"] == KERNEL, op
        assert table["SparsePrivateUse3"] == KERNEL, op


def test_mutation_through_composite_explicit_views_is_removed(remove):
    # A write through t() / transpose() / alias() is functionalized: no in-place op in the graph.
    def f(x):
        x.t().mul_(2)
        x.transpose(0, 1).add_(1)
        torch.ops.aten.alias(x).sub_(3)
        return x

    assert_matches_eager(f, torch.randn(2, 3), remove=remove)
    ops = graph_ops(f, torch.randn(2, 3), remove=remove)
    assert not {"aten.mul_.Tensor", "aten.add_.Tensor", "aten.sub_.Tensor"} & set(ops)


def test_composite_implicit_ops_decompose_before_us():
    # reshape is CompositeImplicitAutograd: we register nothing for it, so it decomposes to view.
    table = _table("aten::reshape")
    assert "torch_functionalize" not in table["AutogradPrivateUse3"]
    ops = graph_ops(lambda x: x.reshape(-1).add_(1), torch.randn(2, 3), remove="mutations")
    assert "aten.reshape.default" not in ops and "aten.view.default" in ops


# Defined once, after torch_functionalize was imported (module level: redefining one op name
# per parametrization re-registers it under live OpOverload caches, which crashes torch itself).
@torch.library.custom_op("tfz_test_dispatch::scale", mutates_args=())
def scale(x: torch.Tensor, k: float) -> torch.Tensor:
    return x * k


@scale.register_fake
def _(x, k):
    return torch.empty_like(x)


def test_custom_op_defined_after_import_reaches_our_kernel(remove):
    # A torch.library op registered after the extension loaded gets our kernel on the next call.
    def f(x):
        y = scale(x, 3.0)
        y.add_(1)
        x.mul_(2)
        return y

    assert_matches_eager(f, torch.randn(4), remove=remove)
    assert _table("tfz_test_dispatch::scale")["AutogradPrivateUse3"] == KERNEL
    gm = make_fx(tfz.functionalize(f, remove=remove))(torch.randn(4))
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "tfz_test_dispatch.scale.default" in targets
    assert "aten.add_.Tensor" not in targets


def test_plain_sparse_tensor_inside_f_keeps_its_sparse_kernels():
    # While a layer is active, a plain sparse tensor must still run sparse kernels.
    s = torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (3,))

    def f(y):
        return y + (s * 2).to_dense(), (s + s).coalesce().values()

    assert_matches_eager(f, torch.ones(3), remove="mutations", check_graph=False)


def test_sparse_tensor_built_from_functional_tensors_is_sparse():
    # A sparse COO tensor made inside the function from its tensors wraps a sparse value: it must
    # report torch.sparse_coo as in eager, so sparse methods (coalesce, _values) and code that
    # branches on is_sparse work (Note [Wrapper: mirrored conjugate and negative bits]).
    def f(values, dense):
        s = torch.sparse_coo_tensor(torch.tensor([[0, 2, 2]]), values, (4,))
        assert s.is_sparse and s.layout == torch.sparse_coo
        c = s.coalesce()
        c._values().mul_(3)  # a write through the values of a sparse tensor reaches it
        dense.add_(c)
        return c.to_dense(), (s * 2).to_dense(), torch.mv(s.to_dense()[None].T, values[:1])

    assert_matches_eager(f, torch.randn(3), torch.zeros(4), remove="mutations")


def test_sparse_csr_tensor_built_from_functional_tensors_is_sparse_csr():
    # As the COO case, for a compressed layout: the wrapper carries the SparseCsr bit and names
    # its value's layout (before: "Sparse CSR tensors do not have strides" when it was wrapped).
    def f(values, dense):
        s = torch.sparse_csr_tensor(torch.tensor([0, 1, 3]), torch.tensor([1, 0, 2]), values, (2, 3))
        assert s.layout == torch.sparse_csr
        dense.add_(s @ torch.ones(3, 2))
        return s.to_dense(), s.values() * 2, s.crow_indices() + 0

    assert_matches_eager(f, torch.randn(3), torch.randn(2, 2), remove="mutations",
                         check_graph=False)
    # A graph: capture records it; make_fx fails as plain make_fx(f) does (torch's fake CSR
    # tensors ask for strides).
    gm = tfz.capture(f, torch.randn(3), torch.randn(2, 2))
    values, dense = torch.randn(3), torch.randn(2, 2)
    expected_dense = dense.clone()
    expected = f(values, expected_dense)
    assert_trees_match(list(gm(values, dense)), list(expected), "capture replay: outputs")
    assert_trees_match(dense, expected_dense, "capture replay: written input")
    with pytest.raises(RuntimeError, match="do not have strides"):
        make_fx(f)(torch.randn(3), torch.randn(2, 2))
