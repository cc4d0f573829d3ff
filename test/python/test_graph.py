"""functionalize_graph: mutating graphs from symbolic_trace, make_fx, dynamo and torch.export.

Each case retraces a graph, checks that the only mutations left are the trailing write-backs into
inputs or module state, and runs the result against the original graph on copies of the inputs.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from torch_functionalize.testing._internal.reference import (
    EPILOGUE_OPS, assert_trees_match, clone_inputs,
)
from torch_functionalize.graph import functionalize_graph
from torch_functionalize import functionalize


class MutatingModule(torch.nn.Module):
    """Mutates a buffer, an intermediate through a view, and its input."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        self.count.add_(x.sum(0))
        y = self.lin(x)
        y.relu_()
        y[:, 0].mul_(2)
        x.mul_(2)
        return y + self.count


def mutating_function(x, w):
    y = x.view(-1)
    y.add_(1)
    z = w.clone()
    z.t()[0].add_(x[0])
    return z.sum(1), x


def _schema(node):
    return getattr(node.target, "_schema", None) if node.op == "call_function" else None


def _is_mutable(node):
    return _schema(node) is not None and _schema(node).is_mutable


def _is_view(node):
    schema = _schema(node)
    return schema is not None and any(
        r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
    )


def _is_write_back(node):
    """An epilogue op writing a placeholder or a state attribute, directly or via another one."""
    if not _is_mutable(node) or _schema(node).name.split("::")[-1] not in EPILOGUE_OPS:
        return False
    written = node.args[0]
    return written.op in ("placeholder", "get_attr") or _is_write_back(written)


def assert_functional_graph(gm, remove):
    """Mutable ops only in the trailing write-backs; no view op left with mutations_and_views."""
    epilogue = set()
    for node in reversed(gm.graph.nodes):
        if _is_mutable(node):
            if not _is_write_back(node):
                break
            epilogue.add(node)
    for node in gm.graph.nodes:
        assert not _is_mutable(node) or node in epilogue, (
            f"mutable op {node.target} left:\n{gm.code}"
        )
        if remove == "mutations_and_views":
            assert not _is_view(node), f"view op {node.target} left in the graph:\n{gm.code}"


def assert_matches_graph(original, functional, inputs):
    """Outputs, final inputs and final module state agree with running `original` eagerly."""
    expected_module = copy.deepcopy(original)
    expected_inputs, actual_inputs = clone_inputs(inputs), clone_inputs(inputs)
    expected = expected_module(*expected_inputs)
    actual = functional(*actual_inputs)
    assert_trees_match(actual, expected, "output")
    assert_trees_match(actual_inputs, expected_inputs, "input")
    expected_state = dict(expected_module.named_buffers())
    actual_state = dict(functional.named_buffers())
    for name, tensor in actual_state.items():
        if name in expected_state:
            assert_trees_match(tensor, expected_state[name], f"buffer {name}")


def _targets(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_symbolic_trace_module_with_example_inputs(remove):
    # symbolic_trace records call_module/call_method nodes and no meta values: inputs are required.
    gm = torch.fx.symbolic_trace(MutatingModule())
    x = torch.randn(3, 4)
    functional = functionalize_graph(gm, x, remove=remove)
    assert_functional_graph(functional, remove)
    # The buffer update is a write-back into the buffer, the input update one into x.
    written = [n.args[0] for n in functional.graph.nodes if str(n.target) == "aten.copy_.default"]
    assert sorted(w.op for w in written) == ["get_attr", "placeholder"]
    assert [w.target for w in written if w.op == "get_attr"] == ["count"]
    assert_matches_graph(gm, functional, (x,))


def test_graph_traced_on_real_inputs_refuses_other_sizes():
    # Its sizes are the example inputs' (Note [Capture: guards on inputs]).
    def f(x):
        return x.new_zeros(x.shape[0]).add_(x.sum())

    functional = functionalize_graph(make_fx(f)(torch.ones(3)), torch.ones(3))
    assert_trees_match(functional(torch.full((3,), 2.0)), f(torch.full((3,), 2.0)), "output")
    with pytest.raises(RuntimeError, match="with sizes"):
        functional(torch.ones(5))


def test_functionalize_graph_does_not_mutate_example_inputs_or_state():
    # Tracing runs the program on copies: the caller's tensors keep their values.
    gm = torch.fx.symbolic_trace(MutatingModule())
    x = torch.randn(3, 4)
    x_before, count_before = x.clone(), gm.count.clone()
    functionalize_graph(gm, x)
    assert torch.equal(x, x_before)
    assert torch.equal(gm.count, count_before)


def test_result_shares_module_state():
    # The functional graph reads and writes the original module's parameters and buffers.
    gm = torch.fx.symbolic_trace(MutatingModule())
    functional = functionalize_graph(gm, torch.randn(3, 4))
    assert functional.count is gm.count
    assert functional.lin.weight is gm.lin.weight
    functional(torch.randn(3, 4))
    assert gm.count.abs().sum() > 0


def test_symbolic_trace_with_fake_tensor_prop_needs_no_inputs(remove):
    # FakeTensorProp records meta["val"] on the placeholders, which is enough to retrace.
    gm = torch.fx.symbolic_trace(MutatingModule())
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(mode.from_tensor(torch.randn(3, 4)))
    functional = functionalize_graph(gm, remove=remove)
    assert_functional_graph(functional, remove)
    assert_matches_graph(gm, functional, (torch.randn(3, 4),))


def test_batch_norm_running_stats_stay_updated():
    # Training-mode batch norm updates its running statistics; the functional graph must too.
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).train()
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(6, 4)
    functional = functionalize_graph(gm, x)
    assert_functional_graph(functional, "mutations")
    assert_matches_graph(gm, functional, (x,))


def test_batch_norm_running_stats_are_write_backs():
    # The running statistics should reach the buffers through the epilogue like num_batches_tracked.
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).train()
    functional = functionalize_graph(torch.fx.symbolic_trace(model), torch.randn(6, 4))
    written = {
        n.args[0].target for n in functional.graph.nodes if str(n.target) == "aten.copy_.default"
    }
    assert written == {"1.num_batches_tracked", "1.running_mean", "1.running_var"}


@pytest.mark.parametrize("tracing_mode", ["real", "fake", "symbolic"])
@pytest.mark.parametrize("with_inputs", [True, False], ids=["inputs", "meta"])
def test_make_fx_graph(remove, tracing_mode, with_inputs):
    # make_fx graphs carry meta["val"] on placeholders (symbolic ones with SymInt sizes).
    inputs = (torch.randn(3, 4), torch.randn(4, 5))
    gm = make_fx(mutating_function, tracing_mode=tracing_mode)(*clone_inputs(inputs))
    assert "aten.add_.Tensor" in _targets(gm)
    args = inputs if with_inputs else ()
    functional = functionalize_graph(gm, *args, remove=remove)
    assert_functional_graph(functional, remove)
    assert "aten.add_.Tensor" not in _targets(functional)
    assert_matches_graph(gm, functional, inputs)


def test_make_fx_graph_with_nested_inputs_keeps_signature():
    # A dict input: the result is called with the same structure as the original graph.
    def f(d):
        d["a"].add_(d["b"])
        return d["a"] * 2

    inputs = ({"a": torch.randn(3), "b": torch.randn(3)},)
    gm = make_fx(f)(*clone_inputs(inputs))
    functional = functionalize_graph(gm)
    assert_functional_graph(functional, "mutations")
    assert_matches_graph(gm, functional, inputs)


def test_export_program(remove):
    # torch.export: an ExportedProgram is accepted as is, through its unlifted .module().
    x = torch.randn(3, 4)
    exported = torch.export.export(MutatingModule(), (x.clone(),))
    functional = functionalize_graph(exported, remove=remove)
    assert_functional_graph(functional, remove)
    assert_matches_graph(exported.module(), functional, (x,))


def test_export_program_with_example_inputs():
    x = torch.randn(3, 4)
    exported = torch.export.export(MutatingModule(), (x.clone(),))
    functional = functionalize_graph(exported, x)
    assert_functional_graph(functional, "mutations")
    assert_matches_graph(exported.module(), functional, (x,))


def test_fake_example_inputs():
    # Fake example inputs trace in their own FakeTensorMode; real module state joins it.
    gm = torch.fx.symbolic_trace(MutatingModule())
    with FakeTensorMode():
        fake_x = torch.empty(3, 4)
    functional = functionalize_graph(gm, fake_x)
    assert_functional_graph(functional, "mutations")
    assert all(not isinstance(t, type(fake_x)) for t in functional.state_dict().values())
    assert_matches_graph(gm, functional, (torch.randn(3, 4),))


def test_dynamo_graph():
    # Dynamo graphs record meta["example_value"] and lift module state to placeholders.
    captured = []

    def backend(gm, example_inputs):
        captured.append(gm)
        return gm.forward

    module = MutatingModule()
    torch.compile(module, backend=backend, fullgraph=True)(torch.randn(3, 4))
    (gm,) = captured
    inputs = [
        torch.randn(*n.meta["example_value"].shape) for n in gm.graph.nodes if n.op == "placeholder"
    ]
    functional = functionalize_graph(gm)
    assert_functional_graph(functional, "mutations")
    assert_matches_graph(gm, functional, inputs)


def test_functional_graph_is_unchanged_in_value():
    # A graph without mutations retraces to the same ops.
    def f(x):
        return F.relu(x @ x.t()).sum(0)

    gm = make_fx(f)(torch.randn(3, 3))
    functional = functionalize_graph(gm)
    assert _targets(functional) == _targets(gm)
    assert_matches_graph(gm, functional, (torch.randn(3, 3),))


def test_missing_inputs_and_meta_is_an_error():
    gm = torch.fx.symbolic_trace(MutatingModule())
    with pytest.raises(
        ValueError, match=r"functionalize_graph: no example inputs .* placeholder\(s\) x"
    ):
        functionalize_graph(gm)


def test_non_graph_module_is_an_error():
    with pytest.raises(TypeError, match="functionalize_graph: expected a torch.fx.GraphModule"):
        functionalize_graph(mutating_function, torch.randn(3, 4), torch.randn(4, 5))


def test_invalid_remove_is_an_error():
    gm = make_fx(mutating_function)(torch.randn(3, 4), torch.randn(4, 5))
    with pytest.raises(ValueError, match="remove must be"):
        functionalize_graph(gm, remove="views")


def _flat_view_written_then_doubled(x):
    v = x.view(25)
    v.narrow(0, 18, 7).add_(-2)
    x.add_(x)
    return v


def test_functionalize_graph_traced_twice_on_one_fake_input():
    # x = b[1:, ::2] has storage offset 5 and does not span its storage: its own base is taken
    # from a scatter's fake result, whose offset FakeTensorMode's cache gave as 0 from the second
    # trace on, so the graph wrote x's elements shifted by five (fuzzer program 933781 through
    # torch.compile). See Note [API: the fake-tensor cache under a tracer].
    f = _flat_view_written_then_doubled
    gm = torch.fx.symbolic_trace(f)
    fake = FakeTensorMode().from_tensor(torch.arange(30).view(6, 1, 5)[1:, ::2])
    for trace in range(3):
        graph = functionalize_graph(gm, fake)
        eager_base, graph_base = torch.arange(30).view(6, 1, 5), torch.arange(30).view(6, 1, 5)
        expected = f(eager_base[1:, ::2])
        assert_trees_match(graph(graph_base[1:, ::2]), expected, f"output of trace {trace}")
        assert_trees_match(graph_base, eager_base, f"the input's base, trace {trace}")


def test_make_fx_in_fake_mode_traced_twice():
    # The same through make_fx(functionalize(f), tracing_mode="fake"), a fresh fake mode each time.
    f = _flat_view_written_then_doubled
    for trace in range(3):
        graph = make_fx(functionalize(f), tracing_mode="fake")(
            torch.arange(30).view(6, 1, 5)[1:, ::2])
        eager_base, graph_base = torch.arange(30).view(6, 1, 5), torch.arange(30).view(6, 1, 5)
        expected = f(eager_base[1:, ::2])
        assert_trees_match(graph(graph_base[1:, ::2]), expected, f"output of trace {trace}")
        assert_trees_match(graph_base, eager_base, f"the input's base, trace {trace}")
