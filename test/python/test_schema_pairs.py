"""The in-place/out=/mutable -> functional pairing derived from runtime schemas (see
Note [Schema: functional variants]) equals torchgen's grouping of the installed torch's own
native_functions.yaml, for every group that has a functional variant."""
import os

import pytest
import torch
import torchgen
from torchgen.gen import get_grouped_native_functions, parse_native_yaml
from torchgen.model import NativeFunctionsGroup

from torch_functionalize import _C

# set_ is not paired on purpose (it swaps storages; see OpSchemaInfo.cpp); its source overloads
# go to the special-op row, which serves some cases and refuses the rest, the others are refused.
# See Note [Kernel: set_ onto a storage from outside the function] and
# See Note [Kernel: set_ onto another functional tensor].
REFUSED = {"aten::set_"}
SET_ROW_OVERLOADS = {"source_Storage", "source_Storage_storage_offset", "source_Tensor"}


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
            info = _C._classify(name, overload)
            if overload in SET_ROW_OVERLOADS:
                assert info["special"] is not None, info
            else:
                assert info["kind"] == "unsupported", info
            continue
        info = _C._classify(name, overload)
        got = info["view"] if info["kind"] == "inplace_view" else info["functional"]
        if got != expected:
            mismatches.append((f"{name}.{overload}", expected, got, info["kind"]))
    assert mismatches == []


def _written(arg):
    return arg.alias_info is not None and arg.alias_info.is_write


def test_every_inplace_op_with_a_functional_variant_is_mapped():
    # Wider than torchgen's grouping: any mutable aten op for which an operator of the same base
    # name exists that writes nothing and takes the same argument names (in any order, out=
    # arguments aside) must be mapped, not refused; polygamma_ is one torchgen leaves unpaired.
    # See Note [Schema: functional variants matched by argument names].
    schemas = {}
    for full in torch._C._dispatch_get_all_op_names():
        if full.startswith("aten::"):
            name, _, overload = full.partition(".")
            schemas[(name, overload)] = torch._C._get_schema(name, overload)
    functional_names = {}
    for (name, _), schema in schemas.items():
        if not any(_written(a) for a in schema.arguments):
            functional_names.setdefault(name, set()).add(frozenset(a.name for a in schema.arguments))
    refused = []
    for (name, overload), schema in schemas.items():
        if name in REFUSED or not any(_written(a) for a in schema.arguments):
            continue
        base = name[:-1] if name.endswith("_") else name
        mine = frozenset(a.name for a in schema.arguments if not (_written(a) and a.kwarg_only))
        if mine in functional_names.get(base, ()):
            if _C._classify(name, overload)["kind"] == "unsupported":
                refused.append(f"{name}.{overload}")
    assert refused == []
    assert _C._classify("aten::polygamma_", "")["functional"] == "aten::polygamma"


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
