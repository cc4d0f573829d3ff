"""The torch.compile backend and aliasing across graph breaks: outputs of a graph that eager made
views of its inputs, or of each other, or of an intermediate, and tensors eager returns under two
names, come back as eager's (same geometry, dtype, bits and storage), so code after a break that
writes through them, resizes them or reads their storage order sees what eager's sees
(Note [Dynamo: the backend], Note [Dynamo: outputs that view inputs]).
"""

import pytest
import torch
import torch._dynamo
from torch.fx.experimental.proxy_tensor import make_fx

import torch_functionalize
from torch_functionalize.testing._internal.compiled import Recorder, compile_matches_eager
from torch_functionalize.testing._internal.reference import REMOVE_MODES, assert_trees_match
from torch_functionalize import backend, functionalize

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("mutate_first", [False, True])
def test_output_view_of_input_written_after_graph_break(remove, mutate_first):
    # The first graph returns a view of an input; eager code after the break writes through it.
    def f(x):
        if mutate_first:
            x.mul_(2)
        y = x[1:].t()
        torch._dynamo.graph_break()
        y.add_(1)
        return x

    compile_matches_eager(f, torch.randn(4, 3), remove=remove, calls=2)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_input_rebound_by_an_in_place_operator_before_a_graph_break(remove):
    # `x *= -0.25` rebinds x to x itself; dynamo returns it from the first graph and the code after
    # the break resizes it: it must be the caller's tensor, not a view of it (which resize_ left
    # the caller's x as it was) (a fuzzer program through torch.compile, thirty-first session).
    def f(x, y):
        x *= -0.25
        torch._dynamo.graph_break()
        x.resize_as_(y)
        x.zero_()
        return y * 1

    compile_matches_eager(f, torch.randn(4), torch.randn(3, 2), remove=remove, calls=2)


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("view", ["int32", "conj", "real"])
def test_output_view_of_input_of_another_dtype_or_bit_after_a_graph_break(remove, view):
    # An output viewing an input is rebuilt on the input with the output's dtype and conjugate
    # bit, not the input's (x.view(torch.int32) came back float32; x.conj() unconjugated).
    views = {"int32": lambda x: x.view(torch.int32), "conj": lambda x: x.conj(),
             "real": lambda x: torch.view_as_real(x)}

    def f(x):
        x.mul_(2)
        y = views[view](x)[1:]
        torch._dynamo.graph_break()
        return y * 1, y.dtype, y.is_conj()

    x = torch.randn(4) if view == "int32" else torch.randn(4, dtype=torch.complex64)
    compile_matches_eager(f, x, remove=remove, calls=2)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_output_view_of_input_with_dynamic_shapes(remove):
    def f(x):
        x.mul_(2)
        y = x[1:]
        torch._dynamo.graph_break()
        y.add_(1)
        return x

    recorder = Recorder()
    compiled = torch.compile(f, backend=backend(compiler=recorder, remove=remove), dynamic=True)
    for n in (4, 6, 9):
        x = torch.randn(n, 3)
        expected_in = x.clone()
        expected = f(expected_in)
        assert_trees_match(compiled(x), expected, f"output, {n} rows")
        assert_trees_match(x, expected_in, f"input, {n} rows")
    assert len(recorder.graphs) <= 4, "dynamic shapes recompiled per size"


def test_out_into_an_empty_view_of_an_input_passed_twice_after_a_graph_break():
    # Fuzzer program 952129: dynamo graph-breaks at the out= call, so eager's torch.mm writes
    # into the first graph's output v0 = x0.diagonal(-1, 1, 0), which is empty. Dynamo's fake
    # value gives that view offset 1 (a Python reference of diagonal), eager's kernel offset 0;
    # the out= call resizes v0 from its offset, so a view rebuilt from the fake value wrote
    # other elements than eager (Note [Dynamo: outputs that view inputs]). Functionalize itself
    # refuses the same program by name (the out= overlaps an operand).
    def f(x0, x1):
        x0.add_(x0)
        v0 = x0.diagonal(-1, 1, 0)
        v1 = x1.split(1, 0)[0]
        torch.mm(x1, v1, out=v0)
        return x0, v1, x1

    eager_x = torch.arange(1.0, 3.0, dtype=torch.float64).view(2, 1)
    compiled_x, functional_x = eager_x.clone(), eager_x.clone()
    with pytest.raises(NotImplementedError, match="shares memory"):
        functionalize(f)(functional_x, functional_x)
    expected = f(eager_x, eager_x)
    actual = torch.compile(f, backend="tfz")(compiled_x, compiled_x)
    assert_trees_match(actual, expected, "outputs")
    assert_trees_match(compiled_x, eager_x, "the input")


def _view_geometry(t):
    return t.shape, t.stride(), t.storage_offset(), t.dtype


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("case", ["empty diagonal", "through an in-place write", "split",
                                  "size from an input", "t_ after the view",
                                  "empty diagonal after x -= 1",
                                  "unsqueeze_ of an empty diagonal", "view_as"])
def test_output_view_of_written_input_has_eagers_geometry(remove, case):
    # Each output views the written input x. The first four are remade by replaying the graph's
    # view calls on x; the last two cannot be (a geometry change of the view on the way, a view
    # of another tensor's shape) and are rebuilt from dynamo's fake value: both must give eager's
    # view (Note [Dynamo: outputs that view inputs]).
    def f(x, n):
        x.mul_(2)
        if case == "empty diagonal":
            y = x.diagonal(-1, 1, 0)
        elif case == "through an in-place write":
            y = x.add_(1)[1:].view(-1)
        elif case == "split":
            y = x.split(1, 0)[1]
        elif case == "size from an input":
            y = x.view(n.shape[0], -1)
        elif case == "t_ after the view":
            y = x[1:]
            y.t_()
        elif case == "empty diagonal after x -= 1":
            x -= 1
            y = x.diagonal(-1, 1, 0)
        elif case == "unsqueeze_ of an empty diagonal":
            y = x.diagonal(-1, 1, 0)
            y.unsqueeze_(-2)
        else:
            y = x.view_as(n)
        torch._dynamo.graph_break()
        return y, _view_geometry(y), y._base is not None

    x = torch.arange(2.0).view(2, 1) if "empty diagonal" in case else torch.arange(6.0).view(3, 2)
    compile_matches_eager(f, x, torch.zeros(2, 3), remove=remove, calls=2)


@pytest.mark.parametrize("case, replayed", [("x[1:].t()", True), ("x.add_(1).split(1)[0]", True),
                                            ("x.view_as(n)", True), ("x[1:].t_()", True),
                                            ("x.t_()[1:]", False), ("x[1:].resize_(2)", False),
                                            ("x.add_(1).t_()[1:]", False), ("x[1:].mT", True),
                                            ("x.view_as(n + 1)", False), ("out=", False)])
def test_which_output_views_are_remade_by_replaying_view_calls(case, replayed):
    from torch_functionalize._view_chain import view_chain

    def f(x, n):
        if case == "x[1:].t()":
            return x[1:].t()
        if case == "x.add_(1).split(1)[0]":
            return x.add_(1).split(1)[0]
        if case == "x[1:].t_()":  # a view's geometry changed in place: replayed too
            return x[1:].t_()
        if case == "x.t_()[1:]":  # the input's own geometry changed
            return x.t_()[1:]
        if case == "x[1:].resize_(2)":
            return x[1:].resize_(2)
        if case == "x.add_(1).t_()[1:]":  # add_ returns x: the t_ is the input's own
            return x.add_(1).t_()[1:]
        if case == "x[1:].mT":  # a property: getattr(x, "mT") in the graph
            return x[1:].mT
        if case == "x.view_as(n)":  # n is an input: replayed on the real n
            return x.view_as(n)
        if case == "x.view_as(n + 1)":  # a tensor computed in the graph
            return x.view_as(n + 1)
        y = x[1:]
        torch.mul(n[:2, :2], 2, out=y)
        return y

    # Traced symbolically (the calls as written): dynamo itself breaks the graph before a
    # change of an input's geometry or a resize_, but the walk must hold for any graph.
    gm = torch.fx.symbolic_trace(f)
    output = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    assert (view_chain(gm, output) is not None) == replayed


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("of", ["input", "intermediate"])
def test_one_tensor_under_two_names_stays_one_across_a_graph_break(remove, of):
    # v1 = v0.to(v0.dtype) is v0: the code after the break resizes v0 through an out= and
    # reads v1, which eager resized too (fuzzer program 976079 through torch.compile).
    def f(x):
        v0 = x[1:] if of == "input" else x * 2
        v1 = v0.to(v0.dtype)
        torch._dynamo.graph_break()
        torch.linspace(0, 1, 6, out=v0)
        return v1 * 1, v1 is v0

    compile_matches_eager(f, torch.randn(4, 2), remove=remove, calls=2)


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("write", ["through the base", "through the view", "out= into a view"])
@pytest.mark.parametrize("base", ["mean", "transposed"])
def test_output_viewing_another_output_stays_its_view_across_a_graph_break(remove, write, base):
    # Without views the graph returns v0 and v1 = v0[2] as separate tensors; eager's v1 views
    # v0, so a write after the break shows through both (fuzzer programs 980050, 980074 through
    # torch.compile, remove="mutations_and_views"). A transposed v0 (eager's strides (1, 3)) is
    # laid out as eager's before its views are remade: an out= resize of v0[1:] names elements
    # through them (969396).
    def f(x):
        v0 = x.mean(1) if base == "mean" else x[0].t() * 1
        v1 = v0[2]
        v2 = v0[1:]
        torch._dynamo.graph_break()
        if write == "through the base":
            v0.mul_(v0)
        elif write == "through the view":
            v1.add_(1)
        else:
            torch.neg(x[0, 0, 1:], out=v2[0])
        return v0 * 1, v1 * 1, v2 * 1

    compile_matches_eager(f, torch.randn(3, 3, 5), remove=remove, calls=2)


_VIEWS_OF_AN_INTERMEDIATE = {
    "slices": lambda v0: (v0[0], v0[:, 1::2]),
    # an input of the next graph whose elements overlap: its fake value keeps the storage it views
    # (Note [Graph: tracing on fake inputs as they are])
    "overlapping as_strided": lambda v0: (v0.as_strided((2, 3, 3), (2, 2, 3), 0), v0[:, 1::2]),
}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("write", ["add_", "out="])
@pytest.mark.parametrize("views", sorted(_VIEWS_OF_AN_INTERMEDIATE))
def test_outputs_viewing_an_intermediate_the_graph_does_not_return(remove, write, views):
    # Fuzzer program 996311 through torch.compile: without views the graph returned v1 and v2 as
    # copies; eager's are views of v0, so a write through v2 after the break shows in v1.
    def f(x):
        v0 = x * 2
        v1, v2 = _VIEWS_OF_AN_INTERMEDIATE[views](v0)
        torch._dynamo.graph_break()
        if write == "add_":
            v2.add_(1)
        else:
            torch.abs(x[:, :2], out=v2)
        torch._dynamo.graph_break()
        return v1.clone(), v2  # v1 alone is the input of the last graph

    compile_matches_eager(f, torch.randn(4, 4), remove=remove, calls=2)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_input_transposed_in_place_after_a_rebinding_write(remove):
    # x += x rebinds x, so dynamo takes x.t_() into the graph without seeing an input's metadata
    # change, and leaves it on the placeholder's fake value: traced on that, the graph gave the
    # input back untransposed (fuzzer program 980567 through torch.compile). Static shapes:
    # with dynamic ones dynamo's own guards on that fake value fail (its eager backend too), and
    # the backend refuses such a graph by name.
    def f(x):
        x += x
        x.t_()
        return x * 1

    compile_matches_eager(f, torch.arange(6.0).view(3, 2), remove=remove, calls=2, dynamic=False)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_output_view_of_an_input_written_by_an_out_of_its_own_shape(remove):
    # An out= into x of x's own shape writes x in place: the empty view taken before it is
    # remade by replaying the view calls, with eager's offset (fuzzer program 981549 through
    # torch.compile, where the out= was torch.randn's).
    def f(x):
        v0 = x.unfold(1, 1, 3)
        torch.mul(x, 2, out=x)
        v1 = v0.diagonal(-1, 0, 2)
        torch._dynamo.graph_break()
        return v1.storage_offset(), v1.shape, v0 * 1

    compile_matches_eager(f, torch.randn(4, 1).t(), remove=remove, calls=2)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_output_view_that_cannot_be_replayed_has_eagers_geometry(remove):
    # view_as of a tensor computed in the graph stops the replay of the view calls; the view is
    # then rebuilt with the geometry of a run on meta inputs (eager's kernels: offset 0 for an
    # empty diagonal of a (2, 1) input), not dynamo's fake value's (offset 1).
    def f(x, n):
        x.mul_(2)
        v = x.diagonal(-1, 1, 0).view_as(n * 2)
        torch._dynamo.graph_break()
        return v.storage_offset(), v * 1

    compile_matches_eager(f, torch.arange(2.0).view(2, 1), torch.zeros(0), remove=remove,
                          calls=2)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_input_squeezed_in_place_through_another_name(remove):
    # x1.to(x1.dtype) is x1, so v1.squeeze_(1) squeezes the input: the view of x0 returned beside
    # it is remade without replaying that change on the caller's x1 a second time (fuzzer
    # program 982177 through torch.compile raised an IndexError).
    def f(x0, x1):
        v1 = x1.to(torch.float32)
        v3 = torch.ops.aten.alias(x0)
        v1.squeeze_(1)
        v3.mul_(v3)
        return v1, v3

    compile_matches_eager(f, torch.randn(6, 1), torch.randn(3, 1), remove=remove)


def test_the_meta_run_of_a_graph_consumes_no_random_numbers():
    # An output view that cannot be replayed is rebuilt in the geometry of a run on meta inputs;
    # a random factory in that graph must not draw from the caller's generator when the backend
    # compiles (dynamo keeps the generator's state around its own compiles; a direct call of the
    # backend is the caller's).
    def f(x, n):
        x.mul_(2)
        noise = torch.randn(3)
        v = x.diagonal(-1, 1, 0).view_as(n * 2)
        return v, noise

    graphs = []

    def keep(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm

    torch.compile(f, backend=keep)(torch.arange(2.0).view(2, 1), torch.zeros(0))
    (gm, example_inputs), = graphs
    state = torch.get_rng_state()
    compiled = torch_functionalize.backend(gm, example_inputs)
    assert torch.equal(torch.get_rng_state(), state), "compiling drew random numbers"
    x = torch.arange(2.0).view(2, 1)
    v, _ = compiled(x, torch.zeros(0))
    assert v.storage_offset() == torch.arange(2.0).view(2, 1).diagonal(-1, 1, 0).storage_offset()


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_view_taken_after_its_base_changed_geometry_in_place(remove):
    # v0.unsqueeze_(1) before v1 = v0.unsqueeze(-1): the change is in v0's final geometry, so v1
    # is still remade from v0, and the out= into v0 after the break shows through it (fuzzer
    # program 983571 through torch.compile, without views).
    def f(x0):
        v0 = x0 / 2
        v0.unsqueeze_(1)
        v1 = v0.unsqueeze(-1)
        torch._dynamo.graph_break()
        torch.sum(v0, 0, keepdim=True, out=v0)
        return v0 * 1, v1 * 1

    compile_matches_eager(f, torch.arange(1.0, 3.0), remove=remove, calls=2)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_copy_of_an_output_taken_before_a_write_keeps_its_values(remove):
    # v2 = v1.to(torch.complex64) copies v1 (another dtype): it is no view of output v1 to remake
    # from v1 after v0.cos_() wrote it (fuzzer program 984669 through torch.compile, without
    # views, gave v2 the written values).
    def f(x0):
        v0 = x0.view((8,))
        v1 = x0.detach()
        v2 = v1.to(torch.complex64)
        v0.cos_()
        return v0, v1, v2

    compile_matches_eager(f, torch.randn(2, 4), remove=remove, calls=2)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_unsafe_split_of_an_output_stays_its_view(remove):
    # unsafe_split returns views without an alias annotation in its schema; without views the
    # piece came back a copy, and v1.floor_() after the break did not show through it (fuzzer
    # program 986491 through torch.compile).
    def f(x):
        v1 = x * -1.5
        v2 = v1.unsafe_split(2, -1)[0]
        torch._dynamo.graph_break()
        v1.floor_()
        return v1 * 1, v2 * 1

    compile_matches_eager(f, torch.randn(2, 4), remove=remove, calls=2)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_view_of_an_input_whose_geometry_changes_through_another_name(remove):
    # x1.flatten(1, 1) is x1 itself in eager (a new tensor in dynamo's fake values), so
    # swapdims_ on it swaps the input after v0 was taken: v0 is rebuilt in the geometry of a meta
    # run, not replayed on the swapped input (fuzzer program 992167 through torch.compile).
    def f(x1):
        v0 = x1.diagonal(-1, 2, 0)
        v1 = x1.flatten(1, 1)
        v1.swapdims_(-1, -3)
        v0[:, torch.tensor([2, 1, 1])] = -0.25
        return v0, v1

    compile_matches_eager(f, torch.randn(3, 4, 5), remove=remove)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_output_resized_after_a_break_reads_eagers_storage_order(remove):
    # v2 inherits v1's transposed layout in eager; without views the graph's value was
    # contiguous, so v2.resize_(32) after the break read its elements in another order (fuzzer
    # program 995775 through torch.compile). Outputs are laid out in eager's strides.
    def f(x):
        v1 = x.swapaxes(2, 0)
        v2 = v1.select_scatter(torch.ones(4, 2), 2, 3)
        torch._dynamo.graph_break()
        v2.resize_((32,))
        return v1 * 1, v2 * 1

    compile_matches_eager(f, torch.randn(4, 2, 4), remove=remove)


# Fuzzer programs 990374, 993282, 994514 through torch.compile: unfold's inverse scattered at the
# input's storage offset into a value of the input's own elements; dynamo's fake values (before
# torch 2.15) and the gradient's form do not keep the offset there (a raw as_strided_scatter error).
@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_write_through_unfold_of_an_input_viewed_at_an_offset(remove):
    def f(x):
        v = x.unfold(-1, 2, 3)
        v.neg_()
        return v * 1

    eager_base, compiled_base = torch.arange(8.0).view(4, 2), torch.arange(8.0).view(4, 2)
    expected = f(eager_base.narrow(0, 1, 3))
    actual = torch.compile(f, backend=backend(remove=remove))(compiled_base.narrow(0, 1, 3))
    assert_trees_match(actual, expected, "output")
    assert_trees_match(compiled_base, eager_base, "the input's base")


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("v0_returned", [True, False])
def test_output_view_written_by_an_out_of_its_own_shape_stays_a_view_of_another(remove,
                                                                              v0_returned):
    # Fuzzer program 1004023 through torch.compile: v1 = v0.view(-1), then an out= into v1 of
    # its own shape; the out= stops the replay of the view call (an out= may resize), so without
    # views v1 came back a copy and an out= into v0[1:] after the break (dynamo breaks at the
    # resizing out=) did not show in v1. Now it is an as_strided view of v0 (returned by the
    # graph for that where f does not return it), which is its whole storage, in the geometry
    # of the graph's meta run.
    def f(x, y):
        v0 = torch.randn_like(x)
        v1 = v0.view(-1)
        torch.sub(x, x, out=v1)
        torch.add(y, y, out=v0[1:])
        return (v0, v1) if v0_returned else v1

    with pytest.warns(UserWarning, match="was resized"):
        compile_matches_eager(f, torch.randn(7), torch.randn(2, 1).t(), remove=remove, calls=2)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_inputs_sharing_a_storage_with_dynamic_shapes(remove):
    # b[:n] and b[2:] as two inputs with symbolic sizes: the engine cannot give them one base
    # (its storage coordinates need concrete sizes), so they were functionalized apart and the
    # write through x was not seen through y (wrong values, with a warning). The backend traces
    # such a graph per layout of its arguments; make_fx's symbolic mode refuses the write by name.
    # See Note [Dynamo: inputs sharing a storage with dynamic shapes].
    def f(x, y):
        x.add_(1)
        return y * 2

    def make_inputs(n):
        b = torch.arange(n + 2.0)
        return b[:n], b[2:]

    recorder = Recorder()
    compiled = torch.compile(f, backend=backend(compiler=recorder, remove=remove), dynamic=True)
    for n in (4, 6, 4, 9):
        eager_inputs, compiled_inputs = make_inputs(n), make_inputs(n)
        assert_trees_match(compiled(*compiled_inputs), f(*eager_inputs), f"output, n={n}")
        assert_trees_match(compiled_inputs[0]._base, eager_inputs[0]._base, f"buffer, n={n}")
    assert len(recorder.graphs) == 3, "one functional graph per layout"
    with pytest.raises(NotImplementedError, match="shares its storage with another input"):
        make_fx(functionalize(f, remove=remove), tracing_mode="symbolic")(*make_inputs(4))


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_view_changed_in_place_through_another_name_of_it(remove):
    # Fuzzer program 1011303 through torch.compile: v5 = v2.real of a real v2 is v2 itself, so
    # v5.unsqueeze_(-1) changes v2 too; the replay of v2's view calls did not replay a change of
    # geometry made through its other name.
    def f(x):
        x.sub_(x)
        v0 = x.select(0, 1)
        v2 = v0[4]
        v5 = v2.real
        v5.unsqueeze_(-1)
        return v0, v2, v5

    compile_matches_eager(f, torch.randint(-4, 5, (5, 2)).t(), remove=remove, calls=2)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_base_whose_view_is_its_whole_storage_stays_a_base(remove):
    # Fuzzer program 1011329 through torch.compile: v2 = v0.flatten() of a 0-d v0 is its whole
    # storage too, and was taken for v0's base, so v0 came back a view of it and v0.detach_()
    # after the break raised "Can't detach views in-place".
    def f(x):
        v0 = torch.scalar_tensor(-0.25, dtype=torch.float64)
        v1 = v0.clone()
        v2 = v0.flatten()
        torch.logsumexp(v2, 0, keepdim=True, out=v1)
        v0.detach_()
        return v0 + x.sum(), v1, v2

    with pytest.warns(UserWarning, match="was resized"):
        compile_matches_eager(f, torch.zeros(2), remove=remove, calls=2)
