"""torch.compile and torch_functionalize (issue #13, item 3): the "tfz" dynamo backend against eager
on programs with graph breaks, module buffers, optimizer steps and KV-cache writes, the graphs it
hands a user compiler, and torch.compile over a functionalized function.
"""

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import torch_functionalize
from torch_functionalize.testing._internal.reference import (
    REMOVE_MODES, assert_functional_graph, assert_trees_match,
)
from torch_functionalize import backend, functionalize
from torch_functionalize.testing import clone_inputs


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Recorder:
    """A user compiler that records each functional graph and runs it."""

    def __init__(self):
        self.graphs = []
        self.calls = 0

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)

        def run(*args):
            self.calls += 1
            return gm(*args)

        return run


def compile_matches_eager(f, *inputs, remove="mutations", calls=1, dynamic=None):
    """Runs f eagerly and compiled with the backend on copies of `inputs`, `calls` times each;
    outputs and inputs must match eager after every call, and every graph must be functional."""
    recorder = Recorder()
    compiled = torch.compile(f, backend=backend(compiler=recorder, remove=remove), dynamic=dynamic)
    eager_in, comp_in = clone_inputs(inputs), clone_inputs(inputs)
    for i in range(calls):
        expected = f(*eager_in)
        actual = compiled(*comp_in)
        assert_trees_match(actual, expected, f"output of call {i}")
        assert_trees_match(comp_in, eager_in, f"inputs after call {i}", check_strides=True)
    assert recorder.graphs, "dynamo compiled no graph"
    assert recorder.calls >= calls, "the user compiler's callable was not used"
    for gm in recorder.graphs:
        assert_functional_graph(gm, remove)
    return recorder


def test_backend_registered_by_name():
    assert "tfz" in torch._dynamo.list_backends()
    assert torch._dynamo.lookup_backend("tfz") is torch_functionalize.backend
    x = torch.randn(3)
    y = x.clone()

    def f(x):
        x.mul_(2)
        return x + 1

    out = torch.compile(f, backend="tfz")(x)
    expected = f(y)
    assert_trees_match(out, expected, "output")
    assert_trees_match(x, y, "input")


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_graph_break_with_mutations_on_both_sides(remove):
    def f(x, y):
        x.add_(1)
        v = x.view(-1)
        torch._dynamo.graph_break()
        v.mul_(y.view(-1))
        x.t().add_(1)
        y[0].zero_()
        return x.sum() + y.sum()

    compile_matches_eager(f, torch.randn(2, 3), torch.randn(2, 3), remove=remove, calls=2)


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


def _flat_view_written_then_doubled(x):
    # Fuzzer program 933781, shortened: x = b[1:, ::2] has storage offset 5 and a size-1
    # dimension of stride 10.
    v = x.view(25)
    v[18:] += -2
    x += x
    return v


def _compiled_matches_eager_on_a_strided_slice(dynamic, label):
    f = _flat_view_written_then_doubled
    eager_base, compiled_base = torch.arange(30).view(6, 1, 5), torch.arange(30).view(6, 1, 5)
    expected = f(eager_base[1:, ::2])
    actual = torch.compile(f, backend="tfz", dynamic=dynamic)(compiled_base[1:, ::2])
    assert_trees_match(actual, expected, f"output, {label}")
    assert_trees_match(compiled_base, eager_base, f"the input's base, {label}")


def test_write_through_a_view_reading_itself_with_dynamic_shapes():
    # v[18:] += -2 copies a value into a view of itself, which the overlap check compares by
    # geometry: with symbolic sizes that comparison raised torch's "Cannot call storage_offset()
    # on tensor with symbolic sizes/strides".
    _compiled_matches_eager_on_a_strided_slice(True, "dynamic shapes")


def test_input_at_an_offset_written_through_a_flat_view_then_in_place():
    # A second compile of the function wrote the input's rows shifted by one on torch 2.11 and
    # 2.13 (Note [API: the fake-tensor cache under a tracer]; fuzzer program 933781).
    for compile_number in range(2):
        torch._dynamo.reset()
        _compiled_matches_eager_on_a_strided_slice(False, f"compile {compile_number}")


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


def test_batch_norm_buffers_outputs_and_gradients():
    torch.manual_seed(0)
    eager = torch.nn.Sequential(
        torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU(), torch.nn.Linear(5, 2)
    )
    compiled_model = torch.nn.Sequential(
        torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU(), torch.nn.Linear(5, 2)
    )
    compiled_model.load_state_dict(eager.state_dict())
    recorder = Recorder()
    compiled = torch.compile(compiled_model, backend=backend(compiler=recorder))
    for step in range(3):
        x = torch.randn(8, 4)
        expected, actual = eager(x), compiled(x)
        assert_trees_match(actual, expected, f"output of step {step}")
        expected.square().sum().backward()
        actual.square().sum().backward()
        for (name, p), q in zip(eager.named_parameters(), compiled_model.parameters()):
            assert_trees_match(q.grad, p.grad, f"grad of {name}, step {step}")
        for (name, b), c in zip(eager.named_buffers(), compiled_model.buffers()):
            assert_trees_match(c, b, f"buffer {name}, step {step}")
    for gm in recorder.graphs:
        assert_functional_graph(gm, "mutations")
    eager.eval()
    compiled_model.eval()
    x = torch.randn(3, 4)
    assert_trees_match(compiled(x), eager(x), "output in eval mode")


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        lambda ps: torch.optim.Adam(ps, lr=0.01),
        lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=False),
    ],
    ids=["sgd_momentum", "adam", "adamw_for_loop"],
)
def test_optimizer_step(make_optimizer):
    torch.manual_seed(0)
    eager_params = [torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)]
    comp_params = [p.detach().clone().requires_grad_() for p in eager_params]
    eager_opt, comp_opt = make_optimizer(eager_params), make_optimizer(comp_params)
    recorder = Recorder()

    @torch.compile(backend=backend(compiler=recorder))
    def compiled_step():
        comp_opt.step()

    for step in range(3):
        grads = [torch.randn_like(p) for p in eager_params]
        for p, q, g in zip(eager_params, comp_params, grads):
            p.grad, q.grad = g.clone(), g.clone()
        eager_opt.step()
        compiled_step()
        for i, (p, q) in enumerate(zip(eager_params, comp_params)):
            assert_trees_match(q, p, f"parameter {i} after step {step}", check_strides=True)
            for key, value in eager_opt.state[p].items():
                assert_trees_match(comp_opt.state[q][key], value, f"state {key} of {i}, {step}")
    assert recorder.graphs, "dynamo compiled no graph"
    for gm in recorder.graphs:
        assert_functional_graph(gm, "mutations")


class KVCache(torch.nn.Module):
    """One attention head with a key/value cache written in place at a running position."""

    def __init__(self, dim=8, length=16):
        super().__init__()
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * dim)
        self.register_buffer("k_cache", torch.zeros(1, length, dim))
        self.register_buffer("v_cache", torch.zeros(1, length, dim))

    def forward(self, x, pos):
        k, v = self.kv(x).chunk(2, dim=-1)
        end = pos + x.shape[1]
        self.k_cache[:, pos:end] = k
        self.v_cache[:, pos:end].copy_(v)
        keys, values = self.k_cache[:, :end], self.v_cache[:, :end]
        return F.scaled_dot_product_attention(self.q(x), keys, values)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_kv_cache_update(remove):
    torch.manual_seed(0)
    eager, comp = KVCache(), KVCache()
    comp.load_state_dict(eager.state_dict())
    recorder = Recorder()
    compiled = torch.compile(comp, backend=backend(compiler=recorder, remove=remove))
    pos = 0
    with torch.no_grad():
        for length in (4, 1, 1, 2, 1):
            x = torch.randn(1, length, 8)
            assert_trees_match(compiled(x, pos), eager(x, pos), f"output at {pos}")
            assert_trees_match(comp.k_cache, eager.k_cache, f"k_cache at {pos}")
            assert_trees_match(comp.v_cache, eager.v_cache, f"v_cache at {pos}")
            pos += length
    for gm in recorder.graphs:
        assert_functional_graph(gm, remove)


def test_random_ops_draw_from_the_generator_only_at_run_time():
    # The graph is traced on fake values: compiling must not consume random numbers.
    def f(x):
        y = F.dropout(x, 0.5, training=True)
        x.add_(torch.rand_like(x))
        return y

    torch.manual_seed(1)
    x = torch.ones(64)
    expected = f(x)
    torch.manual_seed(1)
    y = torch.ones(64)
    actual = torch.compile(f, backend="tfz")(y)
    assert_trees_match(actual, expected, "output")
    assert_trees_match(y, x, "input")


def test_backend_argument_errors():
    with pytest.raises(TypeError, match="compiler must be callable"):
        backend(compiler=3)
    with pytest.raises(TypeError, match="example_inputs given without a graph"):
        backend(example_inputs=[torch.ones(1)])
    with pytest.raises(ValueError, match="remove"):
        backend(remove="views")


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("compile_backend", ["eager", "aot_eager", "tfz"])
def test_compile_of_functionalized_function(remove, compile_backend):
    # Item 3(b): torch.compile(functionalize(f)) gives functionalize(f)'s results (traced through
    # with remove="mutations", a graph break around the call otherwise), never an assertion.
    def g(x):
        y = x.view(-1)
        y.add_(1)
        return x * 2, y

    x = torch.randn(2, 3)
    expected_x = x.clone()
    expected = functionalize(g, remove=remove)(expected_x)
    actual = torch.compile(functionalize(g, remove=remove), backend=compile_backend)(x)
    assert_trees_match(actual, expected, "output")
    assert_trees_match(x, expected_x, "input")
    aliases_input = actual[1].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert aliases_input == (remove == "mutations"), "output aliasing differs from functionalize"


def test_write_after_the_call_still_fails_the_version_check():
    # Note [Dynamo: saved inputs the epilogue overwrites]: copies are saved only for inputs the
    # epilogue writes; a user write to another saved tensor before backward raises as in eager.
    def f(x, w, counter):
        counter.add_(1)
        return (x * w).sin().sum()

    for run in (f, torch.compile(f, backend="tfz")):
        x, w, counter = torch.randn(3), torch.randn(3, requires_grad=True), torch.zeros(())
        loss = run(x, w, counter)
        x.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()
        assert counter.item() == 1


class _UpdatesItsParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2, 2))

    def forward(self, x):
        y = x @ self.w
        with torch.no_grad():
            self.w.add_(1.0)
        return y


def _renormed_embedding():
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(5, 3, max_norm=1.0)
    with torch.no_grad():
        embedding.weight.mul_(3)
    return embedding


@pytest.mark.parametrize("name", ["parameter_updated_under_no_grad", "embedding_max_norm"])
def test_module_writing_its_parameter_under_no_grad(name):
    # The graph's write of a parameter ran in grad mode: autograd's "a leaf Variable that
    # requires grad is being used in an in-place operation" (eager wrote it under no_grad).
    make, x = {"parameter_updated_under_no_grad": (_UpdatesItsParameter, torch.ones(1, 2)),
               "embedding_max_norm": (_renormed_embedding, torch.tensor([1, 2]))}[name]
    expected_module = make()
    expected = expected_module(x)
    torch._dynamo.reset()
    module = make()
    actual = torch.compile(module, backend="tfz")(x)
    assert_trees_match(actual, expected, "output")
    assert_trees_match(list(module.parameters()), list(expected_module.parameters()),
                       "parameters after the call")


def _step_with_value_writes(w, b, x):
    # A training step whose forward replaces values (aten.copy in the functional graph): an
    # index write, and a copy_ that broadcasts and converts (b is float64, h float32).
    h = x @ w
    h[:, 0] = h[:, 1] * 2.0
    h[1:].copy_(b)
    loss = h.sin().sum()
    loss.backward()
    with torch.no_grad():
        w.sub_(0.1 * w.grad)
        b.sub_(0.1 * b.grad)
    w.grad, b.grad = None, None
    return loss.detach()


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_backward_through_a_compiled_write_that_replaces_values(remove):
    # Note [Graphs: copy's derivative when a graph runs under autograd]: before, backward raised
    # "derivative for aten::copy is not implemented".
    def inputs():
        torch.manual_seed(0)
        return (torch.randn(3, 3, requires_grad=True),
                torch.randn(3, dtype=torch.float64, requires_grad=True), torch.randn(4, 3))

    eager_in, comp_in = inputs(), inputs()
    compiled = torch.compile(_step_with_value_writes, backend=backend(remove=remove))
    for step in range(3):
        expected = _step_with_value_writes(*eager_in)
        actual = compiled(*comp_in)
        assert_trees_match(actual, expected, f"loss of step {step}")
        assert_trees_match(comp_in[:2], eager_in[:2], f"parameters after step {step}")


# A torch.compile'd module or function called inside f runs the code it compiles, on the
# wrappers (Note [API: torch.compile'd code called inside the function]); before: dynamo's
# internal assertion ("you set no_dispatch() before calling into this function").
_COMPILED_MLP = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))


@torch.compile
def _compiled_sin(x):
    return x.sin() * 2


def _step_through_compiled_code(params, x, buf):
    out = torch.func.functional_call(_COMPILED_MLP, params, (x,))
    out.add_(1)
    loss = _compiled_sin(out).pow(2).mean()
    loss.backward()
    buf.add_(out.detach().mean(0))
    return loss.detach()


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_compiled_callables_called_inside_f_run_their_code(remove):
    from torch_functionalize.testing._internal.reference import assert_client_matches_eager

    def make_inputs():
        params = {k: v.detach().clone().requires_grad_()
                  for k, v in _COMPILED_MLP.named_parameters()}
        return params, torch.randn(3, 4), torch.zeros(4)

    # make_fx refuses to trace into a compiled callable (dynamo's "using FX to symbolically
    # trace a dynamo-optimized function", plain make_fx(f) too): the graph checked is capture's.
    assert_client_matches_eager(_step_through_compiled_code, make_inputs, remove=remove,
                                graphs=("capture",))
    for traced in (_step_through_compiled_code,
                   functionalize(_step_through_compiled_code, remove=remove)):
        with pytest.raises(RuntimeError, match="symbolically trace a dynamo-optimized function"):
            make_fx(traced)(*make_inputs())


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
