"""Parameters made inside the functionalized function from its tensors, as library code makes
them: nn.Parameter of an intermediate, weight_norm's parametrization, fuse_conv_bn_eval's fused
module, and a deep copy of a module made inside f. Each runs eagerly, as a capture and as a make_fx
graph replayed on other inputs, against eager."""
import copy

import pytest
import torch
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx

from torch_functionalize.testing._internal.reference import assert_trees_match
from torch_functionalize import capture, functionalize


def _parameter_of_an_intermediate(x):
    return torch.nn.Parameter(x * 2) + 1


def _weight_norm_made_inside(w, x):
    m = nn.Linear(4, 3, bias=False)
    with torch.no_grad():
        m.weight.copy_(w)
    m = torch.nn.utils.parametrizations.weight_norm(m)  # new Parameters from f's tensors
    return m(x).pow(2).mean()


def _conv_and_batch_norm_fused(stats, x):
    # fuse_conv_bn_eval makes the fused module's Parameters from f's tensors (and random init).
    conv, bn = nn.Conv2d(3, 4, 3, padding=1).eval(), nn.BatchNorm2d(4).eval()
    with torch.no_grad():
        bn.running_mean.copy_(stats[0])
        bn.running_var.copy_(stats[1].abs() + 0.5)
    fused = torch.nn.utils.fuse_conv_bn_eval(conv, bn)
    return fused(x).detach(), bn(conv(x)).detach()


def _deep_copy_of_a_module_made_inside(w, x):
    m = nn.Linear(4, 3)
    with torch.no_grad():
        m.weight.copy_(w)
    copied = copy.deepcopy(m)  # Parameter.__deepcopy__: new Parameters of f's tensors
    with torch.no_grad():
        copied.weight.mul_(2)
    return copied(x).detach(), m(x).detach()


_PARAMETER_PROGRAMS = {
    "parameter_of_an_intermediate": (_parameter_of_an_intermediate, lambda: (torch.randn(3),)),
    "weight_norm_made_inside": (_weight_norm_made_inside,
                                lambda: (torch.randn(3, 4), torch.randn(5, 4))),
    "conv_and_batch_norm_fused": (_conv_and_batch_norm_fused,
                                  lambda: (torch.randn(2, 4), torch.randn(2, 3, 5, 5))),
    "deep_copy_of_a_module_made_inside": (_deep_copy_of_a_module_made_inside,
                                          lambda: (torch.randn(3, 4), torch.randn(5, 4))),
}


@pytest.mark.parametrize("remove", ["mutations", "mutations_and_views"])
@pytest.mark.parametrize("name", sorted(_PARAMETER_PROGRAMS))
def test_parameter_made_from_a_functional_tensor_captures_and_runs(name, remove):
    f, make = _PARAMETER_PROGRAMS[name]
    torch.manual_seed(0)
    traced_on, other = make(), make()
    want = _seeded(f, other)
    assert_trees_match(_seeded(functionalize(f, remove=remove), other), want, "eager call")
    graph = capture(f, *traced_on, remove=remove)
    assert_trees_match(_seeded(graph, other), want, "capture on other inputs")


# nn.Parameter(t) detaches t with make_fx's mode set aside (Tensor._make_subclass): the graph held
# t's traced value as a constant before the rule of
# Note [Graphs: views taken with the tracer set aside]
@pytest.mark.parametrize("remove", ["mutations", "mutations_and_views"])
@pytest.mark.parametrize("name", sorted(_PARAMETER_PROGRAMS))
def test_parameter_made_from_a_functional_tensor_make_fx_graph_replays_other_inputs(name, remove):
    f, make = _PARAMETER_PROGRAMS[name]
    torch.manual_seed(0)
    traced_on, other = make(), make()
    gm = make_fx(functionalize(f, remove=remove))(*traced_on)
    assert_trees_match(_seeded(gm, other), _seeded(f, other), "replay on other inputs")


def _seeded(f, args):
    torch.manual_seed(1)  # programs that make modules draw their initial weights
    return f(*args)
