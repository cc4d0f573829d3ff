"""Values a captured program reads out of tensors (Note [Capture: guards on values read]): the
graph guards each read, so a replay on inputs that give another value raises, naming the read
and both values, instead of computing with the captured value."""
import pytest
import torch

from torch_functionalize.testing._internal.reference import (
    REMOVE_MODES, assert_functional_graph, assert_trees_match,
)
from torch_functionalize import capture


def branch_on_a_value(x):
    if x.sum() > 0:          # bool(tensor)
        return x * 2
    return x - 1


def shift_by_a_read_value(x):
    x.sub_(x.mean().item())  # .item()
    return x * 1


def count_from_int(x):
    n = int(x.max())         # int(tensor)
    return x.new_zeros(3) + n


def sizes_from_a_mask(x):
    return x[x > 0].sum() + torch.nonzero(x).shape[0]


def list_of_values(x):
    return torch.tensor(x[:2].tolist()) + x[2]


def equal_tensors(x, y):
    return x + 1 if torch.equal(x, y) else x - 1


def close_tensors(x):
    return x * 2 if torch.allclose(x, torch.ones(3), atol=0.1) else x * 3


def unique_values(x):
    return torch.unique(x) * 2


def counts_of_values(x):
    return torch.bincount(x) + 1


# Reads no tag of torch's announces (found by a capture probe in the twentieth session; each
# replayed the captured branch, split or count, silently, before).
def split_at_a_tensor_of_indices(x, idx):
    return torch.stack([part.sum() for part in torch.tensor_split(x, idx)])


def packed_by_lengths(x, lengths):
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True)
    return packed.data.sum(0) / packed.data.shape[0]


def quantized_scale(x):
    q = torch.quantize_per_tensor_dynamic(x, torch.quint8, False)
    return x * q.q_scale() + q.q_zero_point()


def sparse_count(x):
    return x * x.to_sparse()._nnz()


def negative_zero(x):
    return x * torch.tensor(0.0).atan2(torch.tensor(x.max().item()))


def checked_input(x):
    torch._assert_async((x > 0).all(), "x must be positive")
    return x * 2


def inverse(x):
    return torch.linalg.inv(x)


CASES = {
    "branch_on_a_value": (branch_on_a_value, lambda: (torch.ones(3),), lambda: (-torch.ones(3),)),
    "shift_by_a_read_value": (shift_by_a_read_value, lambda: (torch.arange(3.0),),
                              lambda: (torch.arange(3.0) + 5,)),
    "count_from_int": (count_from_int, lambda: (torch.tensor([1.0, 4.0]),),
                       lambda: (torch.tensor([1.0, 7.0]),)),
    "sizes_from_a_mask": (sizes_from_a_mask, lambda: (torch.tensor([1.0, -2.0, 3.0]),),
                          lambda: (torch.tensor([1.0, 2.0, 3.0]),)),
    "list_of_values": (list_of_values, lambda: (torch.arange(3.0),),
                       lambda: (torch.arange(3.0) * 2,)),
    "equal_tensors": (equal_tensors, lambda: (torch.ones(2), torch.ones(2)),
                      lambda: (torch.ones(2), torch.zeros(2))),
    "close_tensors": (close_tensors, lambda: (torch.ones(3),), lambda: (2 * torch.ones(3),)),
    "unique_values": (unique_values, lambda: (torch.tensor([1.0, 2.0, 2.0]),),
                      lambda: (torch.tensor([1.0, 1.0, 1.0]),)),
    "counts_of_values": (counts_of_values, lambda: (torch.tensor([0, 1, 1]),),
                         lambda: (torch.tensor([0, 1, 4]),)),
    "split_at_a_tensor_of_indices": (
        split_at_a_tensor_of_indices, lambda: (torch.arange(9.0), torch.tensor([2, 4])),
        lambda: (torch.arange(9.0), torch.tensor([1, 4]))),
    "packed_by_lengths": (packed_by_lengths,
                          lambda: (torch.arange(24.0).reshape(3, 4, 2), torch.tensor([4, 2, 1])),
                          lambda: (torch.arange(24.0).reshape(3, 4, 2), torch.tensor([4, 3, 1]))),
    "quantized_scale": (quantized_scale, lambda: (torch.tensor([0.0, 1.0, 2.0]),),
                        lambda: (torch.tensor([0.0, 2.0, 4.0]),)),
    "sparse_count": (sparse_count, lambda: (torch.tensor([0.0, 1.0, 2.0]),),
                     lambda: (torch.tensor([3.0, 1.0, 2.0]),)),
    "negative_zero": (negative_zero, lambda: (torch.tensor([0.0, -1.0]),),
                      lambda: (torch.tensor([-0.0, -1.0]),)),
    # CPU tensors on every device: on CUDA, _assert_async is a device-side assert that raises no
    # error in the call (eager's neither) and poisons the process's CUDA context.
    "checked_input": (checked_input, lambda: (torch.ones(2, device="cpu"),),
                      lambda: (-torch.ones(2, device="cpu"),)),
    "inverse": (inverse, lambda: (torch.eye(2),), lambda: (torch.zeros(2, 2),)),
}
# The graph keeps the ops that exist to raise (Note [Capture: dead nodes]): eager's own error.
_RAISES_AS_EAGER = {"checked_input": RuntimeError, "inverse": torch.linalg.LinAlgError}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_replay_on_the_captured_value_matches_eager_and_another_value_raises(name, remove):
    f, same, other = CASES[name]
    gm = capture(f, *same(), remove=remove)
    assert_functional_graph(gm, remove)
    # Inputs that give the captured values: eager's result, and inputs written as eager's.
    e_in, g_in = same(), same()
    assert_trees_match(gm(*g_in), f(*e_in), "replay output")
    assert_trees_match(g_in, e_in, "replay inputs")
    if name in _RAISES_AS_EAGER:
        with pytest.raises(_RAISES_AS_EAGER[name]):
            f(*other())
        with pytest.raises(_RAISES_AS_EAGER[name]):
            gm(*other())
        return
    with pytest.raises(RuntimeError, match="functionalize: the captured graph .*specialized"):
        gm(*other())


def test_guard_message_names_the_read_and_both_values():
    gm = capture(shift_by_a_read_value, torch.arange(3.0))
    with pytest.raises(RuntimeError, match=r"_local_scalar_dense.*it was 1(\.0)? when captured "
                                           r"and is 6(\.0)? now"):
        gm(torch.arange(3.0) + 5)


def test_guards_check_sizes_only_on_meta():
    # A replay on meta tensors has no values to compare; sizes still are.
    gm = capture(branch_on_a_value, torch.ones(3))
    out = gm(torch.empty(3, device="meta"))
    assert out.shape == (3,) and out.device.type == "meta"


def test_values_read_from_constants_made_inside_f_are_guarded_and_hold():
    # An optimizer's step count made inside f reads the same value on every call: the guard
    # holds on any input.
    def f(w, x):
        opt = torch.optim.Adam([w], lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            (x @ w).square().sum().backward()
            opt.step()
        return w * 1

    make = lambda: (torch.randn(3, 2).requires_grad_(), torch.randn(4, 3))  # noqa: E731
    torch.manual_seed(0)
    gm = capture(f, *make())
    torch.manual_seed(5)
    e_in = make()
    torch.manual_seed(5)
    g_in = make()
    assert_trees_match(gm(*g_in), f(*e_in), "replay on other inputs")


def test_a_guard_that_raises_under_no_grad_gives_grad_mode_back():
    # The read happens in a no_grad block of f: the graph switches grad mode off around it, and a
    # failing guard there must not leave the caller's thread in no_grad.
    def f(x):
        with torch.no_grad():
            scale = x.sum().item()
        return x * scale

    gm = capture(f, torch.ones(3))
    with pytest.raises(RuntimeError, match="specialized on it"):
        gm(torch.zeros(3))
    assert torch.is_grad_enabled()


def test_functionalize_graph_guards_a_value_its_graph_reads():
    # An FX graph that reads a value (symbolic_trace keeps x.sum().item() as a node) goes through
    # capture in functionalize_graph (Note [Graph: capture first]), so its read is guarded too.
    from torch_functionalize import functionalize_graph

    class ShiftBySum(torch.nn.Module):
        def forward(self, x):
            x.add_(x.sum().item())
            return x * 2

    gm = functionalize_graph(torch.fx.symbolic_trace(ShiftBySum()), torch.ones(3))
    assert gm.meta["tfz_traced_by"] == "capture"
    e_in, g_in = torch.ones(3), torch.ones(3)
    assert_trees_match(gm(g_in), ShiftBySum()(e_in), "replay output")
    assert_trees_match(g_in, e_in, "replay input")
    with pytest.raises(RuntimeError, match="specialized on it"):
        gm(torch.zeros(3))


def _scale_by_numpy(x):
    return x * float(x.numpy()[0])


def test_numpy_of_a_wrapper_is_a_read_only_copy_of_its_value(device):
    # Eager's values (the array used to read unrelated memory), eager's refusal for a tensor that
    # requires grad, and a write through the array fails instead of being lost
    # (Note [API: Tensor.numpy on wrappers]). Tensor.numpy() takes CPU tensors only: the values
    # are checked on CPU tensors, and on another device ours refuses as eager does.
    from torch_functionalize import functionalize

    x = torch.arange(1.0, 4.0, device="cpu")
    assert_trees_match(functionalize(_scale_by_numpy)(x.clone()), _scale_by_numpy(x.clone()),
                       "output")

    def write_through_array(t):
        t.numpy()[0] = 5.0
        return t

    with pytest.raises(ValueError, match="read-only"):
        functionalize(write_through_array)(torch.ones(3, device="cpu"))
    with pytest.raises(RuntimeError, match="requires grad"):
        functionalize(lambda t: t.numpy())(torch.ones(2, requires_grad=True, device="cpu"))
    if torch.device(device).type != "cpu":
        on_device = torch.arange(1.0, 4.0, device=device)
        with pytest.raises(TypeError) as eager:
            _scale_by_numpy(on_device.clone())
        with pytest.raises(TypeError, match=str(eager.value).split(".")[0]):
            functionalize(_scale_by_numpy)(on_device.clone())


def test_numpy_of_a_wrapper_is_refused_by_name_when_captured():
    with pytest.raises(NotImplementedError, match="Tensor.numpy\\(\\) inside a traced"):
        capture(_scale_by_numpy, torch.ones(3))
