"""The in-place/out=/mutable -> functional pairing derived from runtime schemas (see
Note [Schema: functional variants]) equals torchgen's grouping of the installed torch's own
native_functions.yaml, for every group that has a functional variant."""
import os

import pytest
import torchgen
from torchgen.gen import get_grouped_native_functions, parse_native_yaml
from torchgen.model import NativeFunctionsGroup

from torch_functionalize import _C

# set_ is refused on purpose (it swaps storages; see OpSchemaInfo.cpp), so its pairs are absent.
REFUSED = {"aten::set_"}


def _name(f):
    overload = f.func.name.overload_name
    return "aten::" + str(f.func.name.name), overload


def _torchgen_pairs():
    root = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native")
    parsed = parse_native_yaml(
        os.path.join(root, "native_functions.yaml"), os.path.join(root, "tags.yaml")
    )
    for group in get_grouped_native_functions(parsed.native_functions):
        if not isinstance(group, NativeFunctionsGroup):
            continue
        fname, foverload = _name(group.functional)
        expected = fname + ("." + foverload if foverload else "")
        for variant in (group.inplace, group.mutable, group.out):
            if variant is not None:
                yield _name(variant), expected


PAIRS = list(_torchgen_pairs())


def test_torchgen_groups_are_found():
    # Guards against the parse silently yielding nothing (the comparison below would then pass).
    assert len(PAIRS) > 1000


def test_every_mutable_op_maps_to_torchgens_functional_variant():
    mismatches = []
    for (name, overload), expected in PAIRS:
        if name in REFUSED:
            assert _C._classify(name, overload)["kind"] == "unsupported"
            continue
        info = _C._classify(name, overload)
        got = info["view"] if info["kind"] == "inplace_view" else info["functional"]
        if got != expected:
            mismatches.append((f"{name}.{overload}", expected, got, info["kind"]))
    assert mismatches == []


@pytest.mark.parametrize(
    "name, overload, expected",
    [
        ("aten::add_", "Tensor", "aten::add.Tensor"),
        ("aten::add", "out", "aten::add.Tensor"),
        ("aten::_native_batch_norm_legit", "", "aten::_native_batch_norm_legit_functional"),
        ("aten::bernoulli_", "float", "aten::bernoulli.p"),
        ("aten::_foreach_add_", "List", "aten::_foreach_add.List"),
        ("aten::_fused_adam_", "", "aten::_fused_adam"),
        ("aten::normal_", "", "aten::normal_functional"),
    ],
)
def test_known_pairs(name, overload, expected):
    # A few pairs spelled out, including torchgen's bernoulli.p exception and generated variants.
    assert _C._classify(name, overload)["functional"] == expected
