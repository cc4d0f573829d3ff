"""Higher-order control-flow operators inside the functionalized function (Note [Control flow:
higher-order operators]): torch.cond, while_loop, scan, map and associative_scan run eagerly on
the wrappers, whatever their branches mutate; make_fx keeps cond, while_loop, map, scan and
associative_scan with functional subgraphs, closures lifted into operands and cond's writes
returned; what is not supported under a tracer is refused by name. flex_attention runs its dense
kernel inside f, and graphs record that kernel's ops."""
import pytest
import torch
from torch._higher_order_ops import associative_scan, scan, while_loop
from torch._higher_order_ops.map import map as hop_map
from torch.fx.experimental.proxy_tensor import make_fx

from torch_functionalize.testing._internal.reference import (
    REMOVE_MODES, assert_functional_graph, assert_trees_match,
)
from torch_functionalize import capture, functionalize


def cond_writing_intermediates_closures_and_operands(x, y):
    buf = torch.zeros(3)

    def true_fn(a, b):
        buf.add_(a)          # a closure tensor
        c = a.clone()
        c.mul_(2)            # an intermediate
        b.add_(1)            # the operator's own operand (torch refuses this one)
        return c + b

    def false_fn(a, b):
        return a - b

    return torch.cond(x.sum() > 0, true_fn, false_fn, (x, y)), buf


def reference_branch(x, y):
    # What cond means, with a Python if: the oracle where eager's torch.cond refuses the program.
    buf = torch.zeros(3)
    if x.sum() > 0:
        buf.add_(x)
        c = x.clone()
        c.mul_(2)
        y.add_(1)
        return c + y, buf
    return x - y, buf


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_branches_that_write_match_the_branch_run_eagerly(sign, remove):
    make = lambda: (sign * torch.ones(3), torch.arange(3.0))  # noqa: E731
    e_in, a_in = make(), make()
    expected = reference_branch(*e_in)
    actual = functionalize(cond_writing_intermediates_closures_and_operands, remove=remove)(*a_in)
    assert_trees_match(actual, expected, "output")
    assert_trees_match(a_in, e_in, "inputs")


def cond_with_functional_branches(x, w):
    h = x @ w
    out = torch.cond(h.sum() > 0, lambda a: a.sin(), lambda a: a.cos(), (h,))
    return out, torch.autograd.grad(out.sum(), w)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_cond_of_functional_branches_matches_eager_with_gradients(remove):
    make = lambda: (torch.randn(4, 3), torch.randn(3, 2).requires_grad_())  # noqa: E731
    torch.manual_seed(0)
    e_in = make()
    torch.manual_seed(0)
    a_in = make()
    assert_trees_match(functionalize(cond_with_functional_branches, remove=remove)(*a_in),
                       cond_with_functional_branches(*e_in), "output")


def loop(x):
    def cond_fn(i, a):
        return i < 3

    def body_fn(i, a):
        b = a.clone()
        b.add_(i)            # an intermediate written in the body
        return i + 1, b

    return while_loop(cond_fn, body_fn, (torch.tensor(0), x))


def cumulative(xs):
    def combine(carry, x):
        nxt = carry + x
        out = nxt.clone()
        out.mul_(2)
        return nxt, out

    return scan(combine, torch.zeros(3), xs)


def mapped(xs, y):
    def body(x, y):
        z = x.clone()
        z.add_(y)
        return z

    return hop_map(body, xs, y)


def prefix_sums(xs):
    return associative_scan(lambda a, b: a + b, xs, dim=0, combine_mode="generic")


EAGER_PROGRAMS = {
    "while_loop": (loop, lambda: (torch.ones(3),)),
    "scan": (cumulative, lambda: (torch.randn(4, 3),)),
    "map": (mapped, lambda: (torch.randn(4, 3), torch.randn(3))),
    "associative_scan": (prefix_sums, lambda: (torch.randn(5, 3),)),
}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(EAGER_PROGRAMS))
def test_loop_operators_match_eager(name, remove):
    f, make = EAGER_PROGRAMS[name]
    torch.manual_seed(0)
    e_in = make()
    torch.manual_seed(0)
    a_in = make()
    assert_trees_match(functionalize(f, remove=remove)(*a_in), f(*e_in), "output")
    assert_trees_match(a_in, e_in, "inputs")


def cond_of_branches_that_write_intermediates(x, y):
    def true_fn(a, b):
        c = a.clone()
        c.mul_(2)
        return c + b

    def false_fn(a, b):
        d = a.view(-1).clone()
        d.add_(1)
        return d.view(a.shape) - b

    return torch.cond(x.sum() > 0, true_fn, false_fn, (x, y))


TRACED_PROGRAMS = {
    "cond": (cond_of_branches_that_write_intermediates,
             lambda s: (s * torch.arange(3.0), torch.ones(3))),
    "while_loop": (loop, lambda s: (s * torch.ones(3),)),
    "map": (mapped, lambda s: (s * torch.ones(4, 3), torch.arange(3.0))),
    "associative_scan": (prefix_sums, lambda s: (s * torch.arange(15.0).view(5, 3),)),
    "scan": (cumulative, lambda s: (s * torch.arange(12.0).view(4, 3),)),
}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(TRACED_PROGRAMS))
def test_make_fx_keeps_the_operator_with_functional_subgraphs(name, remove):
    # The graph holds the operator itself (both branches of cond), each subgraph is functional
    # (no mutation; no view without views), and the graph replays eager on inputs that take
    # either branch.
    f, make = TRACED_PROGRAMS[name]
    gm = make_fx(functionalize(f, remove=remove))(*make(1.0))
    # associative_scan's generic mode is ops in Python, not the operator: the graph holds them.
    has_operator = any(isinstance(n.target, torch._ops.HigherOrderOperator)
                       for n in gm.graph.nodes)
    assert has_operator == (name != "associative_scan"), gm.code
    assert_functional_graph(gm, remove)
    for sub in gm.children():
        assert_functional_graph(sub, remove)
    for sign in (1.0, -1.0):
        assert_trees_match(gm(*make(sign)), f(*make(sign)), f"replay, sign {sign}")


# Closures and writes under make_fx (Note [Control flow: closures],
# Note [Control flow: branches that write]): each program with its oracle, eager's torch.cond where it accepts the program,
# a Python if where it refuses it (closure writes, operand writes, a closure returned).
def cond_closing_over_an_intermediate(x, y):
    z = y * 2
    z.add_(1)
    return torch.cond(x.sum() > 0, lambda a: a + z, lambda a: a - z.sum(), (x,))


def loop_closing_over_an_intermediate(x, y):
    w = y.clone()
    w.add_(1)

    def body_fn(i, a):
        b = a.clone()
        b.mul_(w)
        return i + 1, b

    return while_loop(lambda i, a: i < 3, body_fn, (torch.tensor(0), x))


def map_closing_over_an_intermediate(x, y):
    w = y.clone()
    w.add_(1)

    def body(row):
        z = row.clone()
        z.add_(w)
        return z

    return hop_map(body, x.view(3, 1).expand(3, 3).contiguous())


def scan_closing_over_an_intermediate(x, y):
    w = y.clone()
    w.add_(1)

    def combine(carry, row):
        nxt = carry * w + row
        out = nxt.clone()
        out.sub_(w)
        return nxt, out

    return scan(combine, torch.zeros(3), x.view(3, 1).expand(3, 3).contiguous())


def nested_conds_closing_over_the_outer_function(x, y):
    z = y * 2

    def true_fn(a):
        return torch.cond(a.sum() > 1, lambda b: b * z, lambda b: b + z, (a,))

    return torch.cond(x.sum() > 0, true_fn, lambda a: a - z, (x,))


def cond_returning_a_closure(x, y):
    z = y * 2
    return torch.cond(x.sum() > 0, lambda a: z, lambda a: a.clone(), (x,))


def if_returning_a_closure(x, y):
    z = y * 2
    return z if x.sum() > 0 else x.clone()


def cond_writing_a_closure_read_afterwards(x, y):
    z = y * 2

    def true_fn(a):
        z.add_(1)
        return a + z

    return torch.cond(x.sum() > 0, true_fn, lambda a: a - 1, (x,)), z * 3


def if_writing_a_closure_read_afterwards(x, y):
    z = y * 2
    if x.sum() > 0:
        z.add_(1)
        return x + z, z * 3
    return x - 1, z * 3


def cond_writing_its_operands(x, y):
    def true_fn(a, b):
        b.add_(1)
        a[0] = 5
        return a + b

    return torch.cond(x.sum() > 0, true_fn, lambda a, b: a - 1, (x, y))


def if_writing_its_operands(x, y):
    if x.sum() > 0:
        y.add_(1)
        x[0] = 5
        return x + y
    return x - 1


CLOSURE_PROGRAMS = {
    "cond_reads_closure": (cond_closing_over_an_intermediate, cond_closing_over_an_intermediate),
    "while_loop_reads_closure": (loop_closing_over_an_intermediate,
                                 loop_closing_over_an_intermediate),
    "map_reads_closure": (map_closing_over_an_intermediate, map_closing_over_an_intermediate),
    "scan_reads_closure": (scan_closing_over_an_intermediate, scan_closing_over_an_intermediate),
    "nested_cond_reads_outer_closure": (nested_conds_closing_over_the_outer_function,
                                        nested_conds_closing_over_the_outer_function),
    "cond_returns_closure": (cond_returning_a_closure, if_returning_a_closure),
    "cond_writes_closure": (cond_writing_a_closure_read_afterwards,
                            if_writing_a_closure_read_afterwards),
    "cond_writes_operands": (cond_writing_its_operands, if_writing_its_operands),
}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(CLOSURE_PROGRAMS))
def test_closures_and_writes_under_make_fx_are_lifted_into_functional_subgraphs(name, remove):
    f, oracle = CLOSURE_PROGRAMS[name]
    make = lambda s: (s * torch.ones(3), torch.arange(3.0))  # noqa: E731
    gm = make_fx(functionalize(f, remove=remove))(*make(1.0))
    assert any(isinstance(n.target, torch._ops.HigherOrderOperator) for n in gm.graph.nodes)
    assert_functional_graph(gm, remove)
    for sub in gm.modules():
        assert_functional_graph(sub, remove)
    # 1.0 and 0.2 take the nested cond's two inner branches, -1.0 the outer false branch.
    for sign in (1.0, 0.2, -1.0):
        a_in, e_in = make(sign), make(sign)
        assert_trees_match(gm(*a_in), oracle(*e_in), f"replay, sign {sign}")
        assert_trees_match(a_in, e_in, f"inputs after replay, sign {sign}")
        a_in, e_in = make(sign), make(sign)
        assert_trees_match(functionalize(f, remove=remove)(*a_in), oracle(*e_in),
                           f"eager, sign {sign}")
        assert_trees_match(a_in, e_in, f"inputs after eager, sign {sign}")


def loop_writing_a_closure(x):
    w = x.clone()

    def body_fn(i, a):
        w.add_(1)
        return i + 1, a + w

    return while_loop(lambda i, a: i < 3, body_fn, (torch.tensor(0), x))


def test_loop_writing_what_it_is_given_is_refused_by_name_under_make_fx():
    with pytest.raises(NotImplementedError, match="while_loop under make_fx: its function writes"):
        make_fx(functionalize(loop_writing_a_closure))(torch.ones(3))


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", ["cond_writes_operands", "cond_writes_closure",
                                  "while_loop_reads_closure"])
def test_capture_keeps_the_operator_and_replays_either_branch(name, remove):
    # Note [Capture: control flow]: a graph of the branch taken would be wrong for the other.
    f, oracle = CLOSURE_PROGRAMS[name]
    make = lambda s: (s * torch.ones(3), torch.arange(3.0))  # noqa: E731
    a_in, e_in = make(1.0), make(1.0)
    gm = capture(f, *a_in, remove=remove)
    oracle(*e_in)
    assert_trees_match(a_in, e_in, "inputs written by capture")
    assert any(isinstance(n.target, torch._ops.HigherOrderOperator) for n in gm.graph.nodes)
    for sub in gm.modules():
        assert_functional_graph(sub, remove)
    for sign in (1.0, -1.0):
        a_in, e_in = make(sign), make(sign)
        assert_trees_match(gm(*a_in), oracle(*e_in), f"replay, sign {sign}")
        assert_trees_match(a_in, e_in, f"inputs after replay, sign {sign}")
    with pytest.raises(RuntimeError, match="captured for x_1 with sizes"):
        gm(torch.ones(4), torch.arange(4.0))


def test_torch_cond_outside_functionalize_is_torch_s_own():
    # The eager entry is ours only while a layer runs user code on the thread.
    out = torch.cond(torch.tensor(True), lambda a: a + 1, lambda a: a - 1, (torch.ones(2),))
    assert_trees_match(out, torch.full((2,), 2.0), "output")


# flex_attention outside torch.compile compiles its operator call through its own import of
# setup_compilation_env: inside f dynamo met the wrappers and stopped with its internal assertion
# (Note [Control flow: flex_attention's eager entry]). It now runs its dense kernel on the
# wrappers, and graphs record that kernel's ops (no operator left for a backend to implement).
def _flex_with_score_and_block_mask(q, k, v, bias):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def add_head_bias(score, b, h, q_idx, kv_idx):
        return score + bias[h]

    mask = create_block_mask(causal, None, None, q.shape[2], k.shape[2], device=q.device)
    out = flex_attention(q, k, v, score_mod=add_head_bias, block_mask=mask)
    v.add_(1)
    return out


def _flex_gqa_with_lse(q, k, v):
    from torch.nn.attention.flex_attention import flex_attention

    out, lse = flex_attention(q, k, v, return_lse=True, enable_gqa=True)
    k.mul_(0.5)
    return out, lse


FLEX_PROGRAMS = {
    "score_and_block_mask": (_flex_with_score_and_block_mask, lambda: (
        torch.randn(1, 2, 128, 8), torch.randn(1, 2, 128, 8), torch.randn(1, 2, 128, 8),
        torch.randn(2))),
    "gqa_with_lse": (_flex_gqa_with_lse, lambda: (
        torch.randn(1, 4, 16, 8), torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8))),
}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(FLEX_PROGRAMS))
def test_flex_attention_runs_inside_f_and_graphs_record_its_ops(name, remove):
    from torch_functionalize.testing._internal.reference import assert_client_matches_eager

    f, make_inputs = FLEX_PROGRAMS[name]
    assert_client_matches_eager(f, make_inputs, remove=remove)
    gm = make_fx(functionalize(f, remove=remove))(*make_inputs())
    assert "flex_attention" not in gm.code


# Operators whose dense kernel is a fixed program of ops were refused by name under make_fx and
# capture; like flex_attention, graphs now hold those ops.
def _foreach_map(x, y):
    from torch._higher_order_ops import foreach_map

    a, b = foreach_map(lambda u, v: u * 2 + v, [x, x.clone()], [y, y])
    x.add_(1)
    return a, b


def _hints_wrapper(x, y):
    from torch._higher_order_ops import hints_wrapper

    def body(u, v):
        z = u.clone()
        z.add_(v)
        return z

    return hints_wrapper(body, (x, y), {}, hints={"outer_body": True})


def _out_dtype(x, y):
    from torch._higher_order_ops import out_dtype

    a = (x * 3).round().clamp(-3, 3).to(torch.int8)
    y.mul_(2)
    return out_dtype(torch.ops.aten.mm.default, torch.int32, a, a.t().contiguous()), y


FIXED_PROGRAMS = {"foreach_map": _foreach_map, "hints_wrapper": _hints_wrapper,
                  "out_dtype": _out_dtype}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(FIXED_PROGRAMS))
def test_operators_of_fixed_programs_run_inside_f_and_graphs_record_their_ops(name, remove):
    from torch_functionalize.testing._internal.reference import assert_client_matches_eager

    f = FIXED_PROGRAMS[name]
    assert_client_matches_eager(f, lambda: (torch.randn(4, 4), torch.randn(4, 4)), remove=remove)
    gm = make_fx(functionalize(f, remove=remove))(torch.randn(4, 4), torch.randn(4, 4))
    assert not any(isinstance(n.target, torch._ops.HigherOrderOperator) for n in gm.graph.nodes)


def cumulative_into_a_buffer(xs, buf):
    # scan's results meet the function's own tensors (a real tensor under make_fx's real mode).
    final, ys = cumulative(xs)
    buf.add_(ys.sum(0))
    return final + buf, ys


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("graph", ["make_fx", "capture"])
def test_scan_results_used_with_real_tensors_trace_and_replay(graph, remove):
    # Note [Control flow: scan's outputs under a real tracer]: make_fx recorded scan with fake
    # outputs, and the next op on a real tensor failed (plain make_fx's too), so capture refused.
    make = lambda s: (s * torch.randn(4, 3), torch.zeros(3))  # noqa: E731
    torch.manual_seed(0)
    traced_on = make(1.0)
    torch.manual_seed(0)
    e_in = make(1.0)
    cumulative_into_a_buffer(*e_in)  # eager writes its inputs as the traced call does
    if graph == "make_fx":
        gm = make_fx(functionalize(cumulative_into_a_buffer, remove=remove))(*traced_on)
    else:
        gm = capture(cumulative_into_a_buffer, *traced_on, remove=remove)
    assert_trees_match(traced_on, e_in, "inputs written by the traced call")
    for sub in gm.modules():
        if isinstance(sub, torch.fx.GraphModule):
            assert_functional_graph(sub, remove)
    for sign in (1.0, -1.0):
        torch.manual_seed(1)
        a_in = make(sign)
        torch.manual_seed(1)
        e_in = make(sign)
        assert_trees_match(gm(*a_in), cumulative_into_a_buffer(*e_in), f"replay, sign {sign}")
        assert_trees_match(a_in, e_in, f"inputs after replay, sign {sign}")


# Operators that fall through autograd (Note [Control flow: higher-order operators], last
# paragraph): once torch_functionalize was imported, torch's own uses of them raised "could not
# find kernel ... at dispatch key AutogradCPU", outside any functionalized function.
@torch.library.custom_op("tfz_test_control_flow::add_one_", mutates_args=("x",))
def _add_one_(x: torch.Tensor) -> None:
    x.add_(1)


@_add_one_.register_fake
def _(x):
    return None


def _doubled_then_written_by_a_custom_op(x):
    y = x * 2
    _add_one_(y)
    return y + 1


class _WrittenByACustomOp(torch.nn.Module):
    def forward(self, x):
        return _doubled_then_written_by_a_custom_op(x)


def test_torch_print_runs_eagerly_after_import(capsys):
    x = torch.tensor([1.0, 2.0])
    torch._higher_order_ops.print("x is {x}", x=x)
    assert capsys.readouterr().out == f"x is {x}\n"


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_torch_print_inside_f_prints_the_written_value_as_eager(remove, capsys):
    def f(x):
        x.add_(1)
        torch._higher_order_ops.print("x is {x}", x=x)
        return x * 2

    x = torch.tensor([1.0, 2.0], requires_grad=True).clone()
    expected = f(x.detach().clone())
    eager_out = capsys.readouterr().out
    assert_trees_match(functionalize(f, remove=remove)(x.detach().clone()), expected, "output")
    assert capsys.readouterr().out == eager_out


def test_auto_functionalized_runs_under_torch_compile_aot_eager_after_import():
    # AOTAutograd's runtime runs auto_functionalized_v2 on plain tensors.
    x = torch.randn(3)
    compiled = torch.compile(_doubled_then_written_by_a_custom_op, backend="aot_eager")
    assert_trees_match(compiled(x.clone()), _doubled_then_written_by_a_custom_op(x.clone()),
                       "aot_eager")


def test_export_run_decompositions_of_a_mutating_custom_op_after_import():
    x = torch.randn(3)
    ep = torch.export.export(_WrittenByACustomOp(), (x.clone(),)).run_decompositions()
    assert_trees_match(ep.module()(x.clone()), _doubled_then_written_by_a_custom_op(x.clone()),
                       "exported")
