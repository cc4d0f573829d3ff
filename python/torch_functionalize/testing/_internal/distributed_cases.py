"""Programs that call torch.distributed collectives, and the per-rank checks test_distributed.py
runs on them. This module runs inside each rank (``python -m
torch_functionalize.testing._internal.distributed_cases OUT_JSON``, with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set, as `launch_ranks` starts it); it starts a gloo group, runs every
case and writes ``{case_id: None | problem}`` to OUT_JSON. The parent imports it for the case
names and `launch_ranks` (test_dtensor.py launches dtensor_cases.py the same way).

Each program runs three ways against eager on copies of the same per-rank inputs (eager is the
oracle: outputs and the final state of every input): ``functionalize(f)`` called eagerly, and
the graph ``make_fx(functionalize(f))`` replayed on fresh inputs. The graph must also be
functional: no c10d op, no script object, a ``_c10d_functional`` collective and its wait_tensor.
"""
import json
import os
import socket
import subprocess
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.fx.experimental.proxy_tensor import make_fx

from torch_functionalize import functionalize
from torch_functionalize.testing import check_against_eager, clone_inputs

REMOVE_MODES = ("mutations", "mutations_and_views")
R = dist.ReduceOp


def _rank_tensor(*shape, offset=0.0):
    """Distinct values per rank (so every collective changes something), exact in float32."""
    n = 1
    for s in shape:
        n *= s
    rank = dist.get_rank() if dist.is_initialized() else 0
    return (torch.arange(n, dtype=torch.float32) + 10.0 * rank + 1.0 + offset).reshape(shape)


def _world():
    return dist.get_world_size()


# --- the programs: name -> (f, make_inputs) -----------------------------------------------------
# make_inputs() is called once per run (eager, functionalize, graph), on each rank.

def ar_input(x):
    dist.all_reduce(x)
    return x * 2


def ar_intermediate(x):
    y = x * 2
    dist.all_reduce(y)
    return y + 1


def ar_view_of_intermediate(x):
    y = x * 2
    dist.all_reduce(y[1:])
    return y


def ar_view_of_input(x):
    dist.all_reduce(x[0])
    return x.sum(0)


def ar_alias_sees_result(x):
    y = x.clone()
    a = y.view(-1)
    dist.all_reduce(y)
    return a * 1


def ar_read_before_and_after(x):
    y = x + 1
    before = y * 3
    dist.all_reduce(y)
    return before, y - before


def ar_max(x):
    y = x.clone()
    dist.all_reduce(y, op=R.MAX)
    return y


def ar_min_product(x):
    y = x.clone()
    z = x + 1
    dist.all_reduce(y, op=R.MIN)
    dist.all_reduce(z, op=R.PRODUCT)
    return y, z


def ar_twice(x):
    y = x * 1
    dist.all_reduce(y)
    dist.all_reduce(y)
    return y


def ar_int(x):
    y = (x * 2).to(torch.int64)
    dist.all_reduce(y)
    return y


def ar_async_wait(x):
    y = x * 2
    work = dist.all_reduce(y, async_op=True)
    z = x + 1
    work.wait()
    return y * z


def ar_async_on_input(x):
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    return x.sum()


def ar_subgroup(x):
    y = x * 2
    dist.all_reduce(y, group=_SUBGROUP[0])
    return y


def ar_coalesced(x, w):
    a = x * 2
    dist.all_reduce_coalesced([a, w])
    return a + 1


def bc_input(x):
    dist.broadcast(x, src=1)
    return x + 1


def bc_intermediate(x):
    y = x * 3
    dist.broadcast(y, src=0)
    return y


def bc_view(x):
    y = x * 3
    dist.broadcast(y[1], src=1)
    return y


def ag_intermediate(x):
    out = torch.empty(_world() * x.numel())
    dist.all_gather_into_tensor(out, x.reshape(-1))
    return out * 1


def ag_of_view(x):
    y = x * 2
    out = torch.zeros(_world() * (x.shape[0] - 1), x.shape[1])
    dist.all_gather_into_tensor(out, y[1:])
    y.add_(1)
    return out, y


def ag_into_input(x, out):
    dist.all_gather_into_tensor(out, x)
    return out.sum()


def ag_into_view(x):
    buf = torch.zeros(_world() * x.shape[0] + 1, x.shape[1])
    dist.all_gather_into_tensor(buf[1:], x)
    return buf


def ag_list(x):
    outs = [torch.empty_like(x) for _ in range(_world())]
    dist.all_gather(outs, x * 2)
    return torch.stack(outs)


def ag_coalesced(x):
    a, b = x * 2, x + 1
    out_a = torch.empty(_world() * a.shape[0], a.shape[1])
    out_b = torch.empty(_world() * b.shape[0], b.shape[1])
    group = dist.distributed_c10d._get_default_group()
    group.allgather_into_tensor_coalesced([out_a, out_b], [a, b]).wait()
    return out_a, out_b


def rs_intermediate(x):
    y = x * 2
    out = torch.empty(y.shape[0] // _world(), y.shape[1])
    dist.reduce_scatter_tensor(out, y)
    return out


def rs_into_input(x, out):
    dist.reduce_scatter_tensor(out, x, op=R.MAX)
    return out + 1


def rs_into_view(x):
    buf = torch.zeros(x.shape[0] // _world() + 1, x.shape[1])
    dist.reduce_scatter_tensor(buf[1:], x)
    return buf


def rs_coalesced(x):
    a, b = x * 2, x + 1
    out_a = torch.empty(a.shape[0] // _world(), a.shape[1])
    out_b = torch.empty(b.shape[0] // _world(), b.shape[1])
    opts = dist.ReduceScatterOptions()
    group = dist.distributed_c10d._get_default_group()
    group.reduce_scatter_tensor_coalesced([out_a, out_b], [a, b], opts).wait()
    return out_a, out_b


def a2a_even(x):
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x * 2)
    return out


def a2a_into_input(x, out):
    dist.all_to_all_single(out, x)
    return out.sum()


def a2a_splits(x):
    # Uneven splits: rank r sends r + 1 rows to every peer and receives p + 1 rows from peer p.
    world, rank = _world(), dist.get_rank()
    send = x[: (rank + 1) * world].clone()
    recv_rows = sum(p + 1 for p in range(world))
    out = torch.empty(recv_rows, x.shape[1])
    dist.all_to_all_single(out, send, [p + 1 for p in range(world)], [rank + 1] * world)
    return out


def _inputs(*shapes):
    def make():
        return tuple(_rank_tensor(*s, offset=i) for i, s in enumerate(shapes))
    return make


def _x_and_out(x_shape, out_shape):
    def make():
        return (_rank_tensor(*x_shape), torch.full(out_shape, -1.0))
    return make


def _programs(world):
    w = world
    return {
        "allreduce/input": (ar_input, _inputs((2, 3))),
        "allreduce/intermediate": (ar_intermediate, _inputs((2, 3))),
        "allreduce/view_of_intermediate": (ar_view_of_intermediate, _inputs((3, 2))),
        "allreduce/view_of_input": (ar_view_of_input, _inputs((2, 3))),
        "allreduce/alias_sees_result": (ar_alias_sees_result, _inputs((2, 3))),
        "allreduce/read_before_and_after": (ar_read_before_and_after, _inputs((4,))),
        "allreduce/max": (ar_max, _inputs((5,))),
        "allreduce/min_product": (ar_min_product, _inputs((3,))),
        "allreduce/twice": (ar_twice, _inputs((3,))),
        "allreduce/int64": (ar_int, _inputs((3,))),
        "allreduce/async_wait": (ar_async_wait, _inputs((2, 2))),
        "allreduce/async_on_input": (ar_async_on_input, _inputs((2, 2))),
        "allreduce/subgroup": (ar_subgroup, _inputs((3,))),
        "allreduce_coalesced/intermediate_and_input": (ar_coalesced, _inputs((2, 2), (3,))),
        "broadcast/input": (bc_input, _inputs((2, 3))),
        "broadcast/intermediate": (bc_intermediate, _inputs((4,))),
        "broadcast/view": (bc_view, _inputs((3, 2))),
        "allgather_base/intermediate": (ag_intermediate, _inputs((2, 3))),
        "allgather_base/of_view": (ag_of_view, _inputs((3, 2))),
        "allgather_base/into_input": (ag_into_input, _x_and_out((2, 3), (2 * w, 3))),
        "allgather_base/into_view": (ag_into_view, _inputs((2, 3))),
        "allgather/list": (ag_list, _inputs((2, 3))),
        "allgather_into_tensor_coalesced/intermediates": (ag_coalesced, _inputs((2, 3))),
        "reduce_scatter_base/intermediate": (rs_intermediate, _inputs((2 * w, 3))),
        "reduce_scatter_base/into_input": (rs_into_input, _x_and_out((2 * w, 3), (2, 3))),
        "reduce_scatter_base/into_view": (rs_into_view, _inputs((2 * w, 3))),
        "reduce_scatter_tensor_coalesced/intermediates": (rs_coalesced, _inputs((2 * w, 3))),
        "alltoall_base/even": (a2a_even, _inputs((2 * w, 3))),
        "alltoall_base/into_input": (a2a_into_input, _x_and_out((2 * w, 3), (2 * w, 3))),
        "alltoall_base/uneven_splits": (a2a_splits, _inputs((w * w, 2))),
    }


# --- programs that must raise -------------------------------------------------------------------

def err_reduce(x):
    y = x * 2
    dist.reduce(y, dst=0)
    return y


def err_gather(x):
    y = x * 2
    outs = [torch.empty_like(y) for _ in range(_world())] if dist.get_rank() == 0 else None
    dist.gather(y, outs, dst=0)
    return y


def err_scatter(x):
    y = torch.empty_like(x)
    ins = [x * i for i in range(_world())] if dist.get_rank() == 0 else None
    dist.scatter(y, ins, src=0)
    return y


def err_send_recv(x):
    y = x * 2
    if dist.get_rank() == 0:
        dist.send(y, dst=1)
    else:
        dist.recv(y, src=0)
    return y


def err_premul_sum(x):
    y = x * 2
    dist.all_reduce(y, op=dist._make_nccl_premul_sum(2.0))
    return y


def err_object_collective(x):
    # Pickles the object into a byte tensor built with set_ on a storage: refused there, loudly
    # (docs/distributed.md: call object collectives outside the function).
    objs = [None] * _world()
    dist.all_gather_object(objs, {"rank": dist.get_rank()})
    return x * 2


def err_allgather_output_size(x):
    out = torch.empty(_world() * x.numel() + 1)
    dist.all_gather_into_tensor(out, x.reshape(-1))
    return out


ERRORS = {
    # name: (f, exception type name, message fragment)
    "reduce": (err_reduce, "NotImplementedError", "c10d::reduce_: this collective has no functional form"),
    "gather": (err_gather, "NotImplementedError", "c10d::gather_: .*all_gather_into_tensor"),
    "scatter": (err_scatter, "NotImplementedError", "c10d::scatter_"),
    "send_recv": (err_send_recv, "NotImplementedError", "c10d::(send|recv_): .*point-to-point"),
    "premul_sum": (err_premul_sum, "NotImplementedError", "PREMUL_SUM"),
    "all_gather_object": (err_object_collective, "NotImplementedError", "aten::set_"),
    "allgather_output_size": (err_allgather_output_size, "RuntimeError",
                              "c10d::_allgather_base_: the output tensor has 13 elements"),
    "barrier": (lambda x: (dist.barrier(), x * 2)[1], "NotImplementedError",
                "c10d::barrier: .*outside the function"),
}

CHECKS = ("functionalize", "graph_replay", "graph_functional")

# What also runs on 4 ranks (one remove mode): one program per collective, no error cases.
FOUR_RANK_PROGRAMS = (
    "allreduce/view_of_intermediate", "allreduce/async_wait", "allreduce/subgroup",
    "allreduce_coalesced/intermediate_and_input", "broadcast/view", "allgather_base/into_view",
    "allgather/list", "reduce_scatter_base/into_input", "alltoall_base/uneven_splits",
)


def _selected(world):
    """(programs, remove modes, error cases) that run on `world` ranks."""
    programs = _programs(world)
    if world <= 2:
        return programs, REMOVE_MODES, ERRORS
    return {k: programs[k] for k in FOUR_RANK_PROGRAMS}, ("mutations",), {}


def _checks(world, mode):
    # Symbolic-shape tracing once per program (remove="mutations"), on 2 ranks.
    extra = ("graph_symbolic_replay",) if world <= 2 and mode == "mutations" else ()
    return CHECKS + extra


def case_ids(world):
    programs, modes, errors = _selected(world)
    ids = [f"{name}[{mode}]-{check}" for name in programs for mode in modes
           for check in _checks(world, mode)]
    ids += [f"error/{name}" for name in errors]
    if world <= 2:
        ids += ["speed/allreduce_in_place_no_copy", "export/non_strict", "export/strict",
                "error/captured_tensor"]
    return ids


# --- the checks ---------------------------------------------------------------------------------

def _graph_problem(gm, remove):
    seen = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr" and isinstance(getattr(gm, node.target, None), torch.ScriptObject):
            return f"graph holds a script object ({node.target})"
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        seen.add(node.target.namespace + "." + node.target._schema.name.split("::")[-1])
        if node.target.namespace == "c10d":
            return f"graph keeps the in-place collective {node.target}"
        if remove == "mutations_and_views" and any(  # a view: returns an alias, writes nothing
            r.alias_info is not None and not r.alias_info.is_write
            for r in node.target._schema.returns
        ):
            return f"graph keeps the view {node.target} with remove='mutations_and_views'"
    if not any(s.startswith("_c10d_functional.") and s != "_c10d_functional.wait_tensor"
               for s in seen):
        return f"graph has no functional collective: {sorted(seen)}"
    if "_c10d_functional.wait_tensor" not in seen:
        return "graph has no wait_tensor"
    return None


def _run_case(f, make_inputs, remove, checks):
    results = {}
    if "graph_symbolic_replay" in checks:
        try:
            gm = make_fx(functionalize(f, remove=remove), tracing_mode="symbolic")(
                *clone_inputs(make_inputs()))
            problem = _graph_problem(gm, remove) or check_against_eager(
                f, make_inputs(), [("symbolic graph", gm)])
        except Exception as error:  # noqa: BLE001 - reported to the parent, by name
            problem = f"symbolic make_fx raised {type(error).__name__}: {str(error).splitlines()[0]}"
        results["graph_symbolic_replay"] = problem
    results["functionalize"] = check_against_eager(
        f, make_inputs(), [("functionalize", functionalize(f, remove=remove))]
    )
    try:
        gm = make_fx(functionalize(f, remove=remove))(*clone_inputs(make_inputs()))
    except Exception as error:  # noqa: BLE001 - reported to the parent, by name
        problem = f"make_fx raised {type(error).__name__}: {str(error).splitlines()[0]}"
        results["graph_replay"] = results["graph_functional"] = problem
        return results
    results["graph_functional"] = _graph_problem(gm, remove)
    results["graph_replay"] = check_against_eager(f, make_inputs(), [("graph", gm)])
    return results


def _run_error(f, exc_name, fragment):
    import re

    x = _rank_tensor(2, 3)
    try:
        functionalize(f)(x)
    except Exception as error:  # noqa: BLE001 - compared by name below
        if type(error).__name__ != exc_name:
            return f"raised {type(error).__name__}: {error}"
        if not re.search(fragment, str(error)):
            return f"message {str(error)!r} does not match {fragment!r}"
        return None
    return "did not raise"


def _bytes_allocated(fn, *inputs):
    """Sum of the CPU allocations torch.profiler records during one call of fn."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn(*inputs)
    total, stack = 0, list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        fields = node.extra_fields
        if isinstance(fields, torch._C._profiler._ExtraFields_Allocation) and fields.alloc_size > 0:
            total += fields.alloc_size
        stack.extend(node.children)
    return total


def _grad_sync(x):
    g = x * 2  # a fresh gradient-like buffer, reduced in place as DDP does
    dist.all_reduce(g)
    return g


def _run_no_extra_copy():
    """Note [Collectives: in place when unobserved]: all_reduce of a fresh 1 MiB buffer inside
    functionalize(f), called eagerly, allocates what eager does (no clone of the buffer)."""
    x = _rank_tensor(256, 1024)
    eager = _bytes_allocated(_grad_sync, x.clone())
    ours = _bytes_allocated(functionalize(_grad_sync), x.clone())
    if ours > eager + 64 * 1024:
        return f"functionalize allocated {ours} bytes, eager {eager}"
    return None


class _CollectiveModule(torch.nn.Module):
    # all_reduce and all_gather_into_tensor: what torch.export (2.13) itself can export; it fails
    # on dist.broadcast in both modes before functionalize_graph sees anything.
    def forward(self, x):
        y = x * 2
        dist.all_reduce(y[1:])
        out = torch.empty(_world() * y.shape[0], y.shape[1])
        dist.all_gather_into_tensor(out, y)
        return y + 1, out


def _run_export(strict):
    """torch.export (which already rewrites dist.* calls into functional collectives plus copy_)
    followed by functionalize_graph: a functional graph that replays like eager."""
    from torch_functionalize import functionalize_graph

    make = _inputs((3, 2))
    module = _CollectiveModule()
    try:
        ep = torch.export.export(module, make(), strict=strict)
        gm = functionalize_graph(ep.module(), *make())
    except Exception as error:  # noqa: BLE001
        return f"export/functionalize_graph raised {type(error).__name__}: {error}"
    return _graph_problem(gm, "mutations") or check_against_eager(
        module, make(), [("export+functionalize_graph", gm)])


def _run_captured():
    """Note [Collectives: captured tensors]: a collective on a tensor the function captures runs
    in place as in eager when called eagerly, and raises under make_fx instead of tracing an
    in-place collective on a constant."""
    import re

    buf = _rank_tensor(3)

    def f(x):
        dist.all_reduce(buf)
        return x + buf

    expected_buf = buf.clone()
    dist.all_reduce(expected_buf)
    x = _rank_tensor(3)
    out = functionalize(f)(x)
    if not (torch.equal(buf, expected_buf) and torch.equal(out, x + expected_buf)):
        return f"eager call: buffer {buf} (expected {expected_buf}), output {out}"
    try:
        make_fx(functionalize(f))(x)
    except NotImplementedError as error:
        if not re.search("c10d::allreduce_: every tensor of this collective was created outside",
                         str(error)):
            return f"message {str(error)!r}"
        return None
    return "make_fx traced a collective on a captured tensor"


_SUBGROUP = [None]


def run_all():
    world = _world()
    _SUBGROUP[0] = dist.new_group(list(range(world)))
    programs, modes, errors = _selected(world)
    results = {}
    for name, (f, make_inputs) in programs.items():
        for mode in modes:
            try:
                checks = _run_case(f, make_inputs, mode, _checks(world, mode))
            except Exception as error:  # noqa: BLE001
                checks = {c: f"case raised {type(error).__name__}: {error}"
                          for c in _checks(world, mode)}
            for check, problem in checks.items():
                results[f"{name}[{mode}]-{check}"] = problem
            dist.barrier()  # a failed case must not leave a peer waiting in the next one
    for name, (f, exc_name, fragment) in errors.items():
        results[f"error/{name}"] = _run_error(f, exc_name, fragment)
        dist.barrier()
    if world <= 2:
        results["speed/allreduce_in_place_no_copy"] = _run_no_extra_copy()
        results["error/captured_tensor"] = _run_captured()
        dist.barrier()
        for strict in (False, True):
            results[f"export/{'strict' if strict else 'non_strict'}"] = _run_export(strict)
            dist.barrier()
    return results


LAUNCH_TIMEOUT_S = 240


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_ranks(cases, world, out_dir, timeout_s=LAUNCH_TIMEOUT_S):
    """Runs the module `cases` (this one or dtensor_cases, whose __main__ takes its JSON result
    path) on `world` gloo ranks over 127.0.0.1; returns [results of rank 0, rank 1, ...]. A rank
    that fails or outlives `timeout_s` fails the calling test with its log."""
    import pytest

    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        log = open(out_dir / f"rank{rank}.log", "w")
        procs.append((subprocess.Popen(
            [sys.executable, "-m", cases.__name__, str(out_dir / f"rank{rank}.json")],
            env=env, stdout=log, stderr=subprocess.STDOUT), log))
    failures = []
    for rank, (proc, log) in enumerate(procs):
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for p, _ in procs:
                p.kill()
            rc = "timeout"
        log.close()
        if rc != 0:
            text = (out_dir / f"rank{rank}.log").read_text()[-3000:]
            failures.append(f"rank {rank} exited with {rc}:\n{text}")
    if failures:
        pytest.fail("\n".join(failures))
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


def rank_main(run, out_path):
    """One rank's whole run: init gloo, run(), destroy, write the results as JSON, and leave."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        results = run()
    finally:
        dist.destroy_process_group()
    with open(out_path, "w") as fh:
        json.dump(results, fh)
    # Leave without interpreter finalization: torch's gloo backend can abort at exit ("terminate
    # called without an active exception") when its worker threads outlive the interpreter, even
    # after destroy_process_group (pytorch/pytorch#190489, #179291); the results are written.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    rank_main(run_all, sys.argv[1])
