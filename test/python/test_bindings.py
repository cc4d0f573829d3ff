"""The extension module and its type stubs agree, and the diagnostics bindings report the engine's
classification (including the special-op rows) for operators of every kind."""
import ast
import pathlib

import pytest

from torch_functionalize import _C

STUBS = pathlib.Path(_C.__file__).with_name("_C.pyi")
if not STUBS.exists():  # editable checkout: the stubs live in the source package
    STUBS = pathlib.Path(__file__).resolve().parents[2] / "python" / "torch_functionalize" / "_C.pyi"


def _stub_names():
    tree = ast.parse(STUBS.read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def _module_names():
    return {n for n in dir(_C) if not n.startswith("__")}


def test_stubs_list_exactly_the_module_bindings():
    assert _stub_names() == _module_names()


@pytest.mark.parametrize(
    "name, overload, kind, special",
    [
        ("aten::add", "Tensor", "functional", None),
        ("aten::slice", "Tensor", "view", None),
        ("aten::t_", "", "inplace_view", None),
        ("aten::add_", "Tensor", "mutable", None),
        ("aten::set_", "source_Tensor", "inplace_view", "set_"),
        ("aten::set_", "", "unsupported", "set_"),
        # resize_ and resize_as_ used to index past the end of the binding's kind names.
        ("aten::resize_", "", "inplace_view", "resize_"),
        ("aten::resize_as_", "", "inplace_view", "resize_"),
        ("aten::native_batch_norm", "", "functional", "batch norm (hidden stat writes)"),
        ("aten::cudnn_batch_norm", "", "functional", "batch norm (hidden stat writes)"),
        ("aten::_unsafe_view", "", "view", "_unsafe_view"),
        ("aten::copy_", "", "mutable", "copy_ onto itself"),
    ],
)
def test_classify_reports_kind_and_special_row(name, overload, kind, special):
    info = _C._classify(name, overload)
    assert info["kind"] == kind
    assert info["special"] == special


def test_classify_unknown_operator_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no operator aten::no_such_op is registered"):
        _C._classify("aten::no_such_op", "")
