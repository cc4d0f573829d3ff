"""Batch norm and instance norm in training mode (running statistics written by ops whose schema
hides the write; Note [Kernel: native_batch_norm]), compared with eager in both remove modes.
"""

import pytest
import torch
import torch.nn.functional as F

from torch_functionalize.testing._internal.reference import (
    assert_functional_graph,
    assert_matches_eager,
    call_targets,
    trace,
)


def _copy_targets(gm):
    """Names of the placeholders written by a copy_ node of the graph."""
    return {
        n.args[0].target
        for n in gm.graph.nodes
        if n.op == "call_function" and str(n.target) == "aten.copy_.default"
    }


def _bn_inputs(channels=3):
    return torch.zeros(channels), torch.ones(channels), torch.randn(channels), torch.randn(channels)


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_affine"])
@pytest.mark.parametrize("momentum", [0.1, 0.7])
def test_batch_norm_training_updates_running_stats(remove, affine, momentum):
    # F.batch_norm(training=True) updates the running-stat inputs like eager, with and without affine.
    def f(x, running_mean, running_var, weight, bias):
        if not affine:
            weight = bias = None
        return F.batch_norm(
            x, running_mean, running_var, weight, bias, training=True, momentum=momentum
        )

    assert_matches_eager(f, torch.randn(8, 3, 4, 4), *_bn_inputs(), remove=remove)


def test_batch_norm_training_graph_writes_stats_back_with_copy(remove):
    # The running stats reach the inputs through copy_ in the epilogue, computed by
    # _native_batch_norm_legit_functional; no in-place batch norm is left in the graph.
    def f(x, running_mean, running_var, weight, bias):
        return F.batch_norm(x, running_mean, running_var, weight, bias, training=True)

    gm = trace(f, torch.randn(8, 3, 4, 4), *_bn_inputs(), remove=remove)
    assert_functional_graph(gm, remove)
    ops = call_targets(gm)
    assert "aten._native_batch_norm_legit_functional.default" in ops
    assert "aten.native_batch_norm.default" not in ops
    assert not any(op.startswith("aten._native_batch_norm_legit.") for op in ops)
    assert ops.count("aten.copy_.default") == 2
    assert _copy_targets(gm) == {"running_mean_1", "running_var_1"}


def test_batch_norm_running_stats_as_views_of_one_input(remove):
    # Running mean and var are rows of one stacked input; the update is scattered back into it.
    def f(x, stats, weight, bias):
        return F.batch_norm(x, stats[0], stats[1], weight, bias, training=True, momentum=0.3)

    stats = torch.stack([torch.zeros(3), torch.ones(3)])
    assert_matches_eager(f, torch.randn(6, 3), stats, torch.randn(3), torch.randn(3), remove=remove)


def test_batch_norm_on_transposed_view_of_input(remove):
    # The normalized tensor is a transposed view of the input; stats still update like eager.
    def f(x, running_mean, running_var):
        return F.batch_norm(x.transpose(0, 1), running_mean, running_var, training=True)

    assert_matches_eager(f, torch.randn(3, 6), torch.zeros(3), torch.ones(3), remove=remove)


def test_batch_norm_running_stats_intermediates_chained(remove):
    # Two training-mode batch norms share intermediate running stats, which are returned.
    def f(x):
        running_mean, running_var = torch.zeros(3), torch.ones(3)
        y = F.batch_norm(x, running_mean, running_var, training=True)
        y = F.batch_norm(y * 2 + 1, running_mean, running_var, training=True)
        return y, running_mean, running_var

    assert_matches_eager(f, torch.randn(4, 3, 2), remove=remove)


def test_batch_norm_stats_read_and_mutated_after_update(remove):
    # Later reads and in-place writes of the running stats see the batch-norm update.
    def f(x, running_mean, running_var):
        y = F.batch_norm(x, running_mean, running_var, training=True)
        running_mean.mul_(2)
        x.add_(running_mean[0])
        return y, running_var + 0

    assert_matches_eager(f, torch.randn(4, 3), torch.zeros(3), torch.ones(3), remove=remove)


def test_batch_norm_eval_mode_leaves_running_stats_unwritten(remove):
    # In eval mode the stats are only read: the graph has no copy_ at all.
    def f(x, running_mean, running_var):
        return F.batch_norm(x, running_mean, running_var, training=False)

    inputs = (torch.randn(4, 3), torch.randn(3), torch.rand(3) + 0.5)
    assert_matches_eager(f, *inputs, remove=remove)
    assert "aten.copy_.default" not in call_targets(trace(f, *inputs, remove=remove))


def test_batch_norm_without_running_stats(remove):
    # training=True with no running stats mutates nothing.
    def f(x):
        return F.batch_norm(x, None, None, training=True)

    assert_matches_eager(f, torch.randn(4, 3), remove=remove)


def test_batch_norm_bfloat16_input_with_float_stats(remove):
    # Mixed precision: a bfloat16 input updates float32 running stats like eager.
    def f(x, running_mean, running_var):
        return F.batch_norm(x, running_mean, running_var, training=True)

    assert_matches_eager(
        f, torch.randn(4, 3).bfloat16(), torch.zeros(3), torch.ones(3), remove=remove
    )


def test_native_batch_norm_called_directly(remove):
    # aten.native_batch_norm in training mode, called directly, updates its stat arguments.
    def f(x, running_mean, running_var):
        return torch.native_batch_norm(x, None, None, running_mean, running_var, True, 0.1, 1e-5)

    assert_matches_eager(f, torch.randn(4, 3), torch.zeros(3), torch.ones(3), remove=remove)


def test_native_batch_norm_legit_called_directly(remove):
    # aten._native_batch_norm_legit (the mutating overload) updates its stat arguments.
    def f(x, running_mean, running_var):
        return torch.ops.aten._native_batch_norm_legit(
            x, None, None, running_mean, running_var, True, 0.1, 1e-5
        )

    assert_matches_eager(f, torch.randn(4, 3), torch.zeros(3), torch.ones(3), remove=remove)


def test_batch_norm_module_momentum_none_cumulative_average(remove):
    # BatchNorm1d(momentum=None) uses num_batches_tracked for a cumulative average over two calls.
    # No graph check: the module reads num_batches_tracked with .item(), which make_fx cannot trace.
    bn = torch.nn.BatchNorm1d(3, momentum=None)

    def f(state, x):
        y1 = torch.func.functional_call(bn, state, (x,))
        y2 = torch.func.functional_call(bn, state, (x * 2,))
        return y1, y2

    state = {k: v.clone() for k, v in bn.state_dict().items()}
    assert_matches_eager(f, state, torch.randn(5, 3), remove=remove, check_graph=False)


def test_instance_norm_use_input_stats_updates_running_stats(remove):
    # F.instance_norm with running stats and use_input_stats averages the per-instance stats into
    # the running-stat inputs.
    def f(x, running_mean, running_var, weight, bias):
        return F.instance_norm(
            x, running_mean, running_var, weight, bias, use_input_stats=True, momentum=0.2
        )

    inputs = (torch.randn(4, 3, 5, 5), *_bn_inputs())
    assert_matches_eager(f, *inputs, remove=remove)
    gm = trace(f, *inputs, remove=remove)
    assert "aten.native_batch_norm.default" not in call_targets(gm)
    assert _copy_targets(gm) == {"running_mean_1", "running_var_1"}


def test_instance_norm_module_tracking_running_stats(remove):
    # InstanceNorm2d(track_running_stats=True) run with functional_call updates its buffers.
    norm = torch.nn.InstanceNorm2d(3, affine=True, track_running_stats=True)

    def f(state, x):
        return torch.func.functional_call(norm, state, (x,))

    state = {k: v.clone() for k, v in norm.state_dict().items()}
    assert_matches_eager(f, state, torch.randn(2, 3, 4, 4), remove=remove)


def test_plain_running_stats_under_a_tracer_are_refused_by_name():
    # A module's own buffers (created outside f) in a traced call: the graph cannot write them.
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_functionalize import functionalize

    bn = torch.nn.BatchNorm1d(3)
    with pytest.raises(RuntimeError, match="native_batch_norm: .* they are plain tensors .* "
                                           "traced or captured graph cannot write"):
        make_fx(functionalize(bn))(torch.randn(4, 3))


def test_one_plain_and_one_own_running_stat_are_refused_by_name():
    # Eagerly, plain stats are written in place when both are plain; one of each cannot be.
    from torch_functionalize import functionalize

    bn = torch.nn.BatchNorm1d(3)

    def f(x, mean):
        bn.running_mean = mean
        return bn(x)

    with pytest.raises(RuntimeError, match="native_batch_norm: .* one is a plain tensor .* "
                                           "the other the function's own"):
        functionalize(f)(torch.randn(4, 3), torch.zeros(3))
