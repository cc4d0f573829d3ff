"""DTensor programs inside functionalize, run on every rank by test_dtensor.py (``python -m
torch_functionalize.testing._internal.dtensor_cases OUT_JSON`` with RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT set, as distributed_cases.launch_ranks starts it): starts a gloo group and a 1-D CPU
device mesh, runs every case, writes ``{case_id: None | problem}``. The parent imports it only
for the case names. See Note [API: wrapper subclasses].

Each program takes DTensors and runs eagerly and through ``functionalize(f)`` on copies of the
same inputs. Checked on every rank: f sees a DTensor with the input's placements; outputs are
DTensors with eager's placements and local values; every input's local tensor ends as eager's.
The traced cases check make_fx's graph of the local program (traced from the local tensor, and
with the DTensor itself as the graph input): functional, collectives as ``_c10d_functional``
ops, and its replay matches eager.
"""
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from torch_functionalize import functionalize, is_functional

REMOVE_MODES = ("mutations", "mutations_and_views")
MESH = [None]


def _local(*shape, offset=0.0):
    n = 1
    for s in shape:
        n *= s
    rank = dist.get_rank() if dist.is_initialized() else 0
    return (torch.arange(n, dtype=torch.float32) + 10.0 * rank + 1.0 + offset).reshape(shape)


def _dt(local, *placements):
    return DTensor.from_local(local, MESH[0], list(placements), run_check=False)


# --- the programs: name -> (f, make_inputs) -----------------------------------------------------

def pointwise_sharded(x):
    return (x * 2 + 1).relu()


def methods_and_placements(x):
    # DTensor's own methods and attributes inside f
    assert x.placements == (Shard(0),), x.placements
    assert x.device_mesh is MESH[0]
    y = x.redistribute(MESH[0], [Replicate()])  # all_gather in the local program
    return y * 2, x.to_local().sum()


def partial_to_replicate(x):
    return x.redistribute(MESH[0], [Replicate()]) + 1  # all_reduce


def mutate_input_sharded(x):
    x.add_(1)
    x.mul_(x)
    return x.sum()  # Shard(0).sum() -> Partial


def mutate_view_of_input(x):
    x[1:].mul_(3)  # a view of a replicated DTensor
    return x.t()


def matmul_tp(x, w):
    # column-parallel linear: x replicated, w sharded on its output dimension
    y = torch.mm(x, w)
    y.add_(1)
    return y.redistribute(MESH[0], [Replicate()])


def intermediate_mutation(x):
    y = x.clone()
    y.view(-1).add_(5)
    return y.full_tensor()


PROGRAMS = {
    "pointwise_sharded": (pointwise_sharded, lambda: (_dt(_local(2, 3), Shard(0)),)),
    "methods_and_placements": (methods_and_placements, lambda: (_dt(_local(2, 3), Shard(0)),)),
    "partial_to_replicate": (partial_to_replicate, lambda: (_dt(_local(4), Partial()),)),
    "mutate_input_sharded": (mutate_input_sharded, lambda: (_dt(_local(2, 2), Shard(0)),)),
    "mutate_view_of_input": (mutate_view_of_input, lambda: (_dt(_local(3, 2, offset=-5.0), Replicate()),)),
    "matmul_tp": (matmul_tp, lambda: (_dt(torch.arange(6.0).reshape(2, 3), Replicate()),
                                      _dt(_local(3, 2), Shard(1)))),
    "intermediate_mutation": (intermediate_mutation, lambda: (_dt(_local(2, 3), Shard(1)),)),
    # The same with the flattened dimension sharded first: valid on every supported torch.
    "intermediate_mutation_shard0": (intermediate_mutation,
                                     lambda: (_dt(_local(2, 3), Shard(0)),)),
}


def case_ids():
    ids = [f"{name}[{mode}]" for name in PROGRAMS for mode in REMOVE_MODES]
    return ids + [f"{kind}[{mode}]" for kind in ("traced", "traced_dtensor_input")
                  for mode in REMOVE_MODES]


def _compare(actual, expected, what):
    if isinstance(expected, DTensor):
        if type(actual) is not DTensor:
            return f"{what}: got {type(actual).__name__}, eager gave DTensor"
        if actual.placements != expected.placements:
            return f"{what}: placements {actual.placements}, eager {expected.placements}"
        if is_functional(actual.to_local()):
            return f"{what}: local tensor is still a functional wrapper"
        actual, expected = actual.to_local(), expected.to_local()
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape \
                or not torch.equal(actual, expected):
            return f"{what}: {actual} != eager {expected}"
    return None


def _run_case(f, make_inputs, mode):
    eager_in, ours_in = make_inputs(), make_inputs()
    try:
        expected = f(*eager_in)
    except RuntimeError as e:
        # Eager's own refusal (torch 2.11's DTensor cannot view(-1) a Shard(1) tensor): ours must
        # refuse the program the same way.
        try:
            functionalize(f, remove=mode)(*ours_in)
        except RuntimeError:
            return None
        return f"eager raised {type(e).__name__}: {e}; ours did not"
    seen = []

    def g(*args):
        seen.extend((type(a), a.placements) for a in args)
        return f(*args)

    actual = functionalize(g, remove=mode)(*ours_in)
    wanted = [(DTensor, a.placements) for a in make_inputs()]
    if seen != wanted:
        return f"f saw {seen}, expected {wanted}"
    flat_e, spec_e = pytree.tree_flatten(expected)
    flat_a, spec_a = pytree.tree_flatten(actual)
    if spec_e != spec_a:
        return f"output structure {spec_a} != eager {spec_e}"
    for i, (a, e) in enumerate(zip(flat_a, flat_e)):
        problem = _compare(a, e, f"output {i}")
        if problem:
            return problem
    for i, (a, e) in enumerate(zip(ours_in, eager_in)):
        problem = _compare(a, e, f"input {i} after the call")
        if problem:
            return problem
    return None


def _traced_program(x):
    x.add_(1)
    y = x.redistribute(MESH[0], [Replicate()])
    y.mul_(2)
    return y + x.redistribute(MESH[0], [Replicate()])


def _check_local_program(gm, views_removed, only_ops):
    """The graph is functional (copy_ only as the epilogue), collectives are _c10d_functional
    with their wait, and (views removed) no aten view op is left. `only_ops`: every call is an
    op (else the getattr of a DTensor input's local tensor and its output's rebuild may be)."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    for n in calls:
        schema = getattr(n.target, "_schema", None)
        if schema is None:
            if only_ops:
                return f"graph calls {n.target}, not an aten op:\n{gm.code}"
            continue
        if schema.is_mutable and n.target is not torch.ops.aten.copy_.default:
            return f"graph holds the mutable op {n.target}:\n{gm.code}"
        if n.target.namespace == "c10d":
            return f"graph holds the c10d op {n.target}:\n{gm.code}"
        if views_removed and n.target.namespace == "aten" and n.target.is_view:
            return f"graph holds the view op {n.target}:\n{gm.code}"
    names = {str(n.target) for n in calls}
    if not any(t.startswith("_c10d_functional.all_gather_into_tensor") for t in names):
        return f"no _c10d_functional.all_gather_into_tensor in the graph:\n{gm.code}"
    if not any(t.startswith("_c10d_functional.wait_tensor") for t in names):
        return f"no _c10d_functional.wait_tensor in the graph:\n{gm.code}"
    return None


def _run_traced_dtensor_input(mode):
    """make_fx(functionalize(f))(dtensor): the DTensor itself is the graph input; the graph reads
    its local tensor, holds the functional local program and returns a DTensor with eager's
    placements; replayed on another DTensor of the same layout it matches eager on every rank.
    See Note [API: subclasses as graph inputs]."""
    gm = make_fx(functionalize(_traced_program, remove=mode))(_dt(_local(2, 3), Shard(0)))
    problem = _check_local_program(gm, mode == "mutations_and_views", only_ops=False)
    if problem:
        return problem
    x_eager = _dt(_local(2, 3, offset=5.0), Shard(0))
    expected = _traced_program(x_eager)
    x_graph = _dt(_local(2, 3, offset=5.0), Shard(0))
    got = gm(x_graph)
    problem = _compare(got, expected, "graph output")
    if problem:
        return problem
    return _compare(x_graph, x_eager, "graph input after the replay")


def _run_traced(mode):
    """make_fx over a function of the local tensor that builds the DTensor and calls the
    functionalized function: the graph is the local program, functional, with
    _c10d_functional collectives, and replays as eager on every rank."""

    def outer(local):
        out = functionalize(_traced_program, remove=mode)(_dt(local, Shard(0)))
        return out.to_local()

    gm = make_fx(outer)(_local(2, 3))
    # No view check: DTensor.from_local in `outer`, outside functionalize, records a view.
    problem = _check_local_program(gm, views_removed=False, only_ops=True)
    if problem:
        return problem
    if "DTensor" in gm.code:
        return f"graph mentions DTensor:\n{gm.code}"
    x_eager = _dt(_local(2, 3), Shard(0))
    expected = _traced_program(x_eager)
    local = _local(2, 3)
    got = gm(local)
    if not torch.equal(got, expected.to_local()):
        return f"graph replay {got} != eager {expected.to_local()}"
    if not torch.equal(local, x_eager.to_local()):
        return f"graph replay left the input at {local}, eager at {x_eager.to_local()}"
    return None


def run_all():
    MESH[0] = init_device_mesh("cpu", (dist.get_world_size(),))
    results = {}
    for name, (f, make_inputs) in PROGRAMS.items():
        for mode in REMOVE_MODES:
            try:
                results[f"{name}[{mode}]"] = _run_case(f, make_inputs, mode)
            except Exception as error:  # noqa: BLE001
                results[f"{name}[{mode}]"] = f"case raised {type(error).__name__}: {error}"
            dist.barrier()  # a failed case must not leave a peer waiting in the next one
    for kind, run in (("traced", _run_traced), ("traced_dtensor_input", _run_traced_dtensor_input)):
        for mode in REMOVE_MODES:
            try:
                results[f"{kind}[{mode}]"] = run(mode)
            except Exception as error:  # noqa: BLE001
                results[f"{kind}[{mode}]"] = f"case raised {type(error).__name__}: {error}"
            dist.barrier()
    return results


if __name__ == "__main__":
    from .distributed_cases import rank_main

    rank_main(run_all, sys.argv[1])
