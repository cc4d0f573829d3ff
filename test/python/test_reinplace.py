"""torch_functionalize.reinplace: graphs that write in place give eager's outputs and inputs, and
each rule of Note [Reinplace: the rules] keeps the candidates it must keep, with the rule named.
Every expected value comes from running the program eagerly (or the un-rewritten graph, for
graphs built by hand). The fuzzer's rip_* / fxrip_* paths (test_fuzz.py, tools/fuzz.py) run the
same check on random programs.
"""
import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

import torch_functionalize as tfz
# Copies a pytree's tensors keeping strides, offsets and which of them share memory.
from torch_functionalize.graph import _clone_preserving_aliases as _clone_tree
from torch_functionalize.testing._internal import workloads
from torch_functionalize.testing._internal.reference import assert_trees_match

aten = torch.ops.aten


def _reinplaced_matches_eager(f, *args, graph="capture"):
    """Runs f eagerly and its graph (capture's or make_fx(torch.func.functionalize)'s) after
    reinplace, each on its own copy of args; compares outputs and inputs; returns the report."""
    eager_args, graph_args, trace_args = (_clone_tree(args) for _ in range(3))
    expected = f(*eager_args)
    if graph == "capture":
        gm = tfz.capture(f, *trace_args)
    else:
        gm = make_fx(torch.func.functionalize(f))(*trace_args)
    rewritten, report = tfz.reinplace(gm, explain=True)
    actual = rewritten(*graph_args)
    assert_trees_match(actual, expected, "outputs")
    assert_trees_match(graph_args, eager_args, "inputs after the call")
    return rewritten, report


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _decision(report, node):
    found = [d for d in report if d.node == node]
    assert found, f"no decision for {node}:\n{report}"
    return found[0]


# -- what it rewrites -------------------------------------------------------------------------

@pytest.mark.parametrize("graph", ["capture", "make_fx"])
def test_kv_cache_write_happens_in_the_cache(graph):
    def step(cache, pos, k):
        cache.index_copy_(2, pos, k)
        return cache.index_select(2, torch.tensor([0, 3])).sum()

    gm, report = _reinplaced_matches_eager(
        step, torch.randn(1, 2, 16, 4), torch.tensor([3]), torch.randn(1, 2, 1, 4), graph=graph)
    targets = _targets(gm)
    assert aten.index_copy_.default in targets and aten.index_copy.default not in targets
    assert aten.copy_.default not in targets, "the epilogue copy of the cache is gone"
    assert _decision(report, "index_copy").action == "in place"


@pytest.mark.parametrize("graph", ["capture", "make_fx"])
def test_slice_write_into_input_becomes_a_copy_through_the_view(graph):
    def f(x, y):
        x[:, 0:4] = y * 2
        x[:, 8:12].mul_(3)
        return x[:, 4:8].sum()

    gm, report = _reinplaced_matches_eager(f, torch.randn(4, 16), torch.randn(4, 4), graph=graph)
    targets = _targets(gm)
    assert aten.slice_scatter.default not in targets
    assert aten.mul_.Tensor in targets
    # No copy left: y * 2 is computed into its slice of x (mul.out), x[:, 8:12] multiplied there.
    assert aten.copy_.default not in targets
    outs = [n for n in gm.graph.nodes if n.target is aten.mul.out]
    assert len(outs) == 1 and outs[0].kwargs["out"].target is aten.slice.Tensor


def test_result_copied_into_an_input_is_computed_into_it_with_out():
    def f(x, a, b):
        torch.mm(a, b, out=x)
        return x.sum()

    gm, report = _reinplaced_matches_eager(f, torch.randn(3, 5), torch.randn(3, 4),
                                           torch.randn(4, 5))
    assert _decision(report, "mm").action == "out="
    assert aten.copy_.default not in _targets(gm)


def test_foreach_update_of_optimizer_state_happens_in_place():
    # The Adam step from the benchmarks (torch.optim's capturable _multi_tensor_adam): every
    # state list updated with _foreach_*_ ops is written in place.
    w = workloads.get("real/adam_foreach")
    gm, report = _reinplaced_matches_eager(w.fn, *w.make_inputs())
    assert any(d.op.startswith("aten._foreach") and d.action == "in place" for d in report)
    # 400 input writes before: exp_avgs, exp_avg_sqs and steps are now written where they are
    # computed; the 100 params stay copied, because the step returns them (the graph's output
    # would start sharing memory with its input: rule 4).
    assert sum(t is aten.copy_.default for t in _targets(gm)) == 100


@pytest.mark.parametrize("name", ["real/gpt_kv_cache", "real/mlp_train", "real/resnet_block",
                                  "real/transformer_stack"])
def test_benchmark_workloads_give_eager_results_after_reinplace(name):
    w = workloads.get(name)
    gm, report = _reinplaced_matches_eager(w.fn, *w.make_inputs())
    assert report.changed(), str(report)


def test_training_step_of_an_nn_module_with_batch_norm():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU())
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def step(params, x):
        return torch.func.functional_call(model, params, (x,)).relu_().sum()

    _reinplaced_matches_eager(step, params, torch.randn(6, 8))


def test_capture_with_reinplace_keeps_the_input_guards():
    def f(x):
        x.add_(1)
        return x * 2

    gm = tfz.capture(f, torch.zeros(3), reinplace=True)
    assert aten.add_.Tensor in _targets(gm)
    x = torch.zeros(3)
    assert torch.equal(gm(x), torch.full((3,), 2.0)) and torch.equal(x, torch.ones(3))
    with pytest.raises(RuntimeError, match="captured"):
        gm(torch.zeros(4))


# -- what it keeps, and why -------------------------------------------------------------------

def test_operand_overlapping_the_written_region_keeps_the_op():
    # pytorch/pytorch#198031 and #197829: a clone dropped though another operand overlaps the
    # written region; in place, add would read elements it already wrote.
    def f(x):
        x[1:] = x[1:] + x[:-1]
        return x

    gm, report = _reinplaced_matches_eager(f, torch.arange(6.0))
    assert _decision(report, "add").action == "kept"
    assert "rule 3" in _decision(report, "add").rule


def test_transposed_operand_keeps_the_op():
    def f(x):
        x.copy_(x + x.t())

    gm, report = _reinplaced_matches_eager(f, torch.randn(4, 4))
    assert "rule 3" in _decision(report, "add").rule


def test_same_tensor_twice_in_a_pointwise_op_is_written_in_place():
    # pytorch/pytorch#196657: a tensor passed twice to a mutating kernel keeps its aliasing;
    # a pointwise op reading exactly the region it writes is safe.
    def f(x):
        x.add_(x)
        torch.addcmul(x, x, x, out=x)

    gm, report = _reinplaced_matches_eager(f, torch.randn(5))
    assert _decision(report, "add").action == "in place"


def test_result_read_after_the_epilogue_overwrote_its_buffer_stays_functional():
    # pytorch/pytorch#198094: a scatter reinplaced into an input that a later epilogue copy_
    # overwrites, while the scatter's result is still read. Built by hand (a program cannot
    # make this graph: its functional copy_ reads the input); the reference is the graph itself.
    graph = fx.Graph()
    x, src, other = (graph.placeholder(n) for n in ("x", "src", "other"))
    scattered = graph.call_function(aten.select_scatter.default, (x, src, 0, 0))
    graph.call_function(aten.copy_.default, (x, other))
    graph.output(graph.call_function(aten.sum.default, (scattered,)))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    args = (torch.randn(3, 4), torch.randn(4), torch.randn(3, 4))
    rewritten, report = tfz.reinplace(gm, *args, explain=True)
    assert "rule 4" in _decision(report, "select_scatter_default").rule
    a, b = _clone_tree(args), _clone_tree(args)
    assert_trees_match(rewritten(*b), gm(*a), "outputs")
    assert_trees_match(b, a, "inputs")


def test_write_only_op_on_an_input_keeps_no_copy():
    # pytorch/pytorch#189080: fill_ / zero_ / copy_ need no functional buffer at all.
    def f(x, y, z):
        x.fill_(2)
        y.zero_()
        z.copy_(x)

    gm, report = _reinplaced_matches_eager(f, torch.randn(8), torch.randn(8), torch.randn(8))
    targets = _targets(gm)
    assert aten.fill.Scalar not in targets and aten.zero.default not in targets
    assert targets.count(aten.copy_.default) == 1  # z.copy_(x) itself


def test_input_the_program_does_not_write_is_never_written():
    def f(x):
        return (x + 1).relu()

    gm, report = _reinplaced_matches_eager(f, torch.randn(6))
    assert "rule 5" in _decision(report, "add").rule
    assert _decision(report, "relu").action == "in place"  # its input is the fresh x + 1


def test_returned_result_does_not_start_sharing_memory_with_an_input():
    # Found by the fuzzer (program 82): add's result is returned, and in place it would have
    # been the input itself, which eager's returned tensor is not.
    def f(x):
        v0 = x + x
        v1 = x.to(torch.float32)
        v1.copy_(v0)
        return v0, v1

    eager_x, graph_x = torch.randn(3), torch.randn(3)
    graph_x.copy_(eager_x)
    gm = tfz.reinplace(tfz.capture(f, eager_x.clone()))
    expected, actual = f(eager_x), gm(graph_x)
    assert_trees_match(actual, expected, "outputs")
    assert actual[0].untyped_storage().data_ptr() != graph_x.untyped_storage().data_ptr()


def test_random_op_keeps_its_functional_form():
    def f(x):
        x.uniform_()
        return x

    torch.manual_seed(0)
    gm, report = tfz.reinplace(tfz.capture(f, torch.zeros(4)), explain=True)
    assert "rule 1" in _decision(report, "uniform").rule


def test_op_recorded_by_autograd_stays_functional_and_gradients_match():
    def f(x, w):
        h = x * w
        h.add_(1)  # autograd records this add on h, which requires grad
        return h.exp().sum()

    x = torch.randn(4, requires_grad=True)
    w = torch.randn(4, requires_grad=True)
    gm, report = tfz.reinplace(tfz.capture(f, x, w), explain=True)
    assert "rule 1" in _decision(report, "add").rule
    xa, wa = (t.detach().clone().requires_grad_() for t in (x, w))
    xb, wb = (t.detach().clone().requires_grad_() for t in (x, w))
    f(xa, wa).backward()
    gm(xb, wb).backward()
    assert torch.allclose(xa.grad, xb.grad) and torch.allclose(wa.grad, wb.grad)


def test_aliased_inputs():
    base = torch.randn(8)

    def f(a, b):
        a.mul_(2)
        return b.sum()

    args = (base, base[2:6])
    gm, report = _reinplaced_matches_eager(f, *args)
    # b is read after the write: in place, the read would see the new value too, as eager's does
    # (b is a view of a); the analysis knows they share memory, so nothing it keeps is wrong.
    assert report


def test_explain_lists_each_candidate_with_its_rule():
    def f(x, y):
        y.add_(1)
        return (x * 2).relu()

    _, report = tfz.reinplace(tfz.capture(f, torch.randn(3), torch.randn(3)), explain=True)
    text = str(report)
    assert text.splitlines()[0].split() == ["node", "op", "action", "rule"]
    for d in report:
        assert d.rule and d.action in ("in place", "out=", "scatter in place", "copy removed",
                                       "kept")
    assert {d.node for d in report} >= {"add", "mul", "relu"}


def test_graph_without_recorded_inputs_asks_for_them():
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(aten.add.Tensor, (x, 1)))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    with pytest.raises(ValueError, match=r"reinplace\(gm, \*inputs\)"):
        tfz.reinplace(gm)


def test_reinplace_leaves_the_given_graph_unchanged():
    gm = tfz.capture(lambda x: x.add_(1), torch.zeros(2))
    before = gm.code
    tfz.reinplace(gm)
    assert gm.code == before


def test_getitem_of_foreach_result_after_in_place_is_the_written_tensor():
    def f(xs, ys):
        torch._foreach_mul_(xs, ys)
        return [x.sum() for x in xs]

    gm, report = _reinplaced_matches_eager(f, [torch.randn(3), torch.randn(2)],
                                           [torch.randn(3), torch.randn(2)])
    foreach = [n for n in gm.graph.nodes if n.target is aten._foreach_mul_.List]
    assert len(foreach) == 1 and not foreach[0].users  # its getitems became the inputs
    assert _decision(report, "_foreach_mul").action == "in place"


def test_graph_recorded_in_cpp_is_reinplaced_with_example_inputs():
    # tfz::capture's graph (here through the binding) as FX: graph_module_of records no input
    # layout, so reinplace asks for the inputs, then rewrites as for capture's graphs.
    from torch_functionalize import _C
    from torch_functionalize.capture import graph_module_of

    def run(tensors):
        cache, pos, k = tensors
        cache.index_copy_(2, pos, k)
        return [cache.sum()]

    args = (torch.randn(1, 2, 8, 4), torch.tensor([3]), torch.randn(1, 2, 1, 4))
    gm = graph_module_of(_C._capture(list(_clone_tree(args)), "mutations", run))
    with pytest.raises(ValueError, match="pass them"):
        tfz.reinplace(gm)
    rewritten, report = tfz.reinplace(gm, *_clone_tree(args), explain=True)
    assert _decision(report, "index_copy").action == "in place"
    a, b = _clone_tree(args), _clone_tree(args)
    assert_trees_match(rewritten(*b), gm(*a), "outputs")
    assert_trees_match(b, a, "inputs")


def test_op_with_an_in_place_twin_refused_there_still_writes_its_copy_target_with_out():
    # add's in-place twin would write a (an input the program does not write: rule 5); its
    # out= form writes x, which the program did write.
    def f(x, a, b):
        torch.add(a, b, out=x)
        return x.sum()

    gm, report = _reinplaced_matches_eager(f, torch.zeros(3), torch.randn(3), torch.randn(3))
    assert _decision(report, "add").action == "out="
    assert aten.copy_.default not in _targets(gm)


def test_operand_with_the_same_elements_but_other_size_one_strides_keeps_the_op():
    # Found by the fuzzer (program 31010): v1 - v1[:, 0::2] on a (2, 1) tensor reads exactly the
    # written elements, but through other strides of the size-1 dimension, which eager's sub_
    # refuses as a partial overlap.
    def f(x0):
        v1 = x0.clone()
        v1 - v1[:, 0::2]
        return x0.unfold(0, 2, 2)

    gm = make_fx(torch.func.functionalize(f))(torch.randn(1, 2).t())
    rewritten, report = tfz.reinplace(gm, explain=True)
    assert "rule 3" in _decision(report, "sub").rule


def test_value_made_on_another_device_is_not_computed_into_the_written_tensor(device):
    # A Python scalar written into a tensor is a CPU constant in the graph; on CUDA its
    # lift_fresh_copy cannot take the input as out= (fuzzer programs 23 and 38, first GPU run of
    # reinplace). Note [Reinplace: devices on meta tensors]. Without a GPU, a meta input stands
    # for the other device.
    def f(x):
        x[...] = 4
        return x + 1

    gm = tfz.capture(f, torch.zeros((), dtype=torch.int64, device="cpu"))
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    if torch.ops.aten.lift_fresh_copy.default in targets:
        _, report = tfz.reinplace(gm, torch.zeros((), dtype=torch.int64, device="meta"),
                                  explain=True)
        kept = _decision(report, "lift_fresh_copy")
        assert kept.action == "kept" and "result on cpu, the written tensor on meta" in kept.rule
    else:  # torch 2.15 records the assignment as fill.Scalar: no constant tensor is made
        assert torch.ops.aten.fill.Scalar in targets, gm.code
    if torch.device(device).type != "cpu":
        _reinplaced_matches_eager(f, torch.zeros((), dtype=torch.int64, device=device))


@pytest.mark.parametrize("foreach", [False, True])
def test_torch_optim_sgd_step_after_reinplace(foreach):
    # torch.optim's own functional SGD with momentum and weight decay (its Adam reads the step
    # with .item() on the CPU, which a graph cannot replay), not a copy of it.
    from torch.optim.sgd import sgd

    def step(params, grads, buffers):
        sgd(params, grads, buffers, foreach=foreach, weight_decay=1e-2, momentum=0.9, lr=1e-1,
            dampening=0.0, nesterov=True, maximize=False)

    def state():
        return [torch.randn(4, 3) for _ in range(3)]

    gm, report = _reinplaced_matches_eager(step, state(), state(), state())
    assert report.changed(), str(report)


def _reinplaced_slice_graph(f, make):
    """make_fx(functionalize(f)) traced on make()'s input (a slice of a buffer make() returns
    beside it), reinplaced, and replayed on a fresh one: eager's outputs and the whole buffer.
    Returns the traced graph and the reinplace report."""
    gm = make_fx(tfz.functionalize(f))(make()[0])
    rewritten, report = tfz.reinplace(gm, explain=True)
    (e_in, e_base), (g_in, g_base) = make(), make()
    assert_trees_match(rewritten(g_in), f(e_in), "outputs")
    assert torch.equal(g_base, e_base), "the input's storage"
    return gm, report


def test_foreach_result_read_through_as_strided_is_not_written_into_an_input_at_an_offset():
    # Fuzzer program 698889, rule 2: make_fx's graph of x = b[1:, ::2] (its own base, at storage
    # offset 2) reads _foreach_mul's result for x through as_strided(.., offset 0) via a getitem;
    # written into x, the as_strided read the input's storage from its start, and the write
    # landed on b[0], silently.
    def f(x):
        v = torch.ones(1, 1, 4)
        torch._foreach_mul_([x, v], 2)
        x[:, :, 0] = 0.5
        return v

    def make():
        base = torch.arange(4.0).view(2, 1, 2) + 1
        return base[1:, ::2], base

    gm, report = _reinplaced_slice_graph(f, make)
    assert aten.as_strided.default in _targets(gm)  # what the rule is about
    assert any("storage coordinates" in line for line in str(report).splitlines()), report


def test_result_read_through_as_strided_after_a_scatter_is_not_written_into_an_input():
    # Rule 2 follows every path from the result to an as_strided, not only direct readers: make_fx
    # graph of x = b[1:, ::2] (own base, storage offset 1) has fill -> view -> select_scatter ->
    # view -> as_strided(.., offset 0). With fill written into x, CPU's select_scatter of a view at
    # offset 1 returns a tensor at offset 1 (its meta function says 0), and the as_strided read
    # element 0 of that storage, never written: outputs and the input got garbage, silently.
    def f(x):
        x.fill_(0.5)
        v0 = x.view(-1)
        v1 = v0.unbind(0)[0]
        v1.cumprod_(0)
        return v0, v1

    def make():
        base = torch.arange(2.0).view(2, 1) + 3
        return base[1:, ::2], base

    gm, report = _reinplaced_slice_graph(f, make)
    assert aten.as_strided.default in _targets(gm)  # what the rule is about
    assert "storage coordinates" in _decision(report, "fill").rule, report


def test_result_written_into_a_scatter_of_an_input_keeps_its_offset():
    # A select_scatter of x = b[1:, ::2] is a copy of b's storage with x at offset 2 (torch's
    # clone_preserve_strides; its meta function says offset 0). make_fx's graph reads add's result
    # through as_strided(.., offset 0): written into the scatter's result in place, the as_strided
    # read the copy's element 0 (b[0, 0]) and the input got it, silently.
    # Note [Reinplace: results laid out as eager's kernels lay them out].
    def f(x):
        v = x.prod(1)
        x[:, 0] = 3
        x.add_(v.unsafe_chunk(3, 0)[0], alpha=2)
        return v

    def make():
        base = torch.arange(4.0).view(2, 2) + 2
        return base[1:, ::2], base

    _, report = _reinplaced_slice_graph(f, make)
    assert "storage coordinates" in _decision(report, "add").rule, report


def test_empty_tensor_passed_as_self_and_as_source_stays_functional():
    # index_copy_(t, 0, i, t) raises eager's overlap assert even for an empty t, so writing
    # index_copy's result into its self, which is also its source, turned a working graph into
    # one that raises (fuzzer program 780030, rule 3).
    def f(x):
        torch.neg(x, out=x.view(-1))
        v = x * x.unsafe_split(1, 0)[0]  # in place into x's written value
        v.index_copy_(0, torch.tensor([0]), x)  # whose self would then be its source
        return v

    def make():
        return torch.zeros((1, 4, 0), dtype=torch.int32)

    gm = make_fx(tfz.functionalize(f))(make())
    rewritten, report = tfz.reinplace(gm, explain=True)
    assert_trees_match(rewritten(make()), f(make()), "outputs")
    assert "rule 3" in _decision(report, "index_copy").rule, report
