"""Runs the client-code cases of the test suite (test_unseen_writes.py, test_client_training.py,
test_client_modules.py) eagerly through ours and through torch.func.functionalize, and prints
which match eager (outputs, inputs' final values, requires_grad, is_leaf and .grad): the
torch.func column of docs/composition.md's client-code table. Graph replays are the tests' job.

    python tools/client_compare.py [--verbose]
"""
import argparse
import collections
import importlib.util
import os

import torch
import torch.utils._pytree as pytree

from torch_functionalize import functionalize
from torch_functionalize.testing import compare

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "python")


def _test_module(name):
    """A test file of test/python loaded by path (as pytest does), for its case tables."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(TESTS, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


modules = _test_module("test_client_modules")
training = _test_module("test_client_training")
unseen = _test_module("test_unseen_writes")


def run_case(f, make_inputs, impl, remove):
    """"OK" when impl(f) matches eager on outputs and every input's value and autograd state,
    else what differs first."""
    def run(fn):
        torch.manual_seed(0)
        inputs = make_inputs()
        torch.manual_seed(1)
        return inputs, fn(*inputs)

    e_in, e_out = run(f)
    try:
        a_in, a_out = run(impl(f, remove=remove))
    except Exception as error:  # the point is to report it
        return f"{type(error).__name__}: {str(error).splitlines()[0][:90]}"
    problem = compare(a_out, e_out)
    if problem:
        return "wrong: " + problem[:90]
    for a, e in zip(pytree.tree_leaves(a_in), pytree.tree_leaves(e_in)):
        if not isinstance(e, torch.Tensor):
            continue
        problem = compare(a.detach(), e.detach(), "input")
        if problem:
            return "wrong: " + problem[:90]
        if (a.requires_grad, a.is_leaf) != (e.requires_grad, e.is_leaf):
            return "wrong autograd state of an input"
        a_grad = a.grad if a.is_leaf else None
        e_grad = e.grad if e.is_leaf else None
        if (a_grad is None) != (e_grad is None) or (e_grad is not None and compare(a_grad, e_grad)):
            return "wrong .grad of an input"
    return "OK"


def cases():
    out = [("unseen/" + name, f, make) for name, (f, make) in sorted(unseen.CASES.items())]
    for param in training._cases():
        name, options = param.values
        out.append((f"optim/{param.id}", training.training_loop(name, options),
                    training._make_inputs))
    for name, (make_module, make_x) in sorted(modules.MODULES.items()):
        f, make = modules.module_step(make_module, make_x)
        out.append(("module/" + name, f, make))
    f, make = modules.module_step(modules.observers, lambda: torch.randn(5, 4), backward=False)
    out.append(("module/observers", f, make))
    out.append(("util/clip_and_init", modules.clip_and_init,
                lambda: (torch.randn(3, 4).requires_grad_(), torch.randn(4, 4).requires_grad_(),
                         torch.randn(5, 3))))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="print every case")
    args = parser.parse_args()
    totals = collections.Counter()
    all_cases = cases()
    for remove in ("mutations", "mutations_and_views"):
        for name, f, make in all_cases:
            ours = run_case(f, make, functionalize, remove)
            theirs = run_case(f, make, torch.func.functionalize, remove)
            totals[remove, "ours"] += ours == "OK"
            totals[remove, "torch.func"] += theirs == "OK"
            if args.verbose or ours != "OK":
                print(f"{remove:20} {name:45} ours: {ours} | torch.func: {theirs}")
    for remove in ("mutations", "mutations_and_views"):
        print(f"{remove}: ours {totals[remove, 'ours']} of {len(all_cases)}, "
              f"torch.func {totals[remove, 'torch.func']} of {len(all_cases)}")


if __name__ == "__main__":
    main()
