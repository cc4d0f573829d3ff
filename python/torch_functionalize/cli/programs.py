"""The built-in programs of the `python -m torch_functionalize` demo: small functions that mutate.

They live in the package so the demo also runs from an installed wheel; examples/programs.py
re-exports them as the template of a programs file (PROGRAMS: name -> (function, input shapes)).
"""

import torch


def clone_add(x):
    y = x.clone()
    y.add_(1)
    return y


def view_of_mutated_intermediate(x):
    a = x + 1
    b = a.view(-1)
    a.add_(1)
    return b


def input_mutated_through_view(x):
    y = x.view(-1)
    y.add_(1)
    return x


def slice_mutation(x):
    y = x.clone()
    y[:, 1].add_(1)
    return y


def outstanding_aliases(x):
    a = x.clone()
    b = a[0]
    c = a[:, 0]
    d = a.view(-1)
    b.mul_(2)
    c.add_(1)
    return d + 1, b


def diagonal_add(x):
    y = torch.ones(3, 3)
    torch.diagonal(x).add_(y[0])
    return x


PROGRAMS = {
    "clone_add": (clone_add, [(3, 3)]),
    "view_of_mutated_intermediate": (view_of_mutated_intermediate, [(3, 3)]),
    "input_mutated_through_view": (input_mutated_through_view, [(3, 3)]),
    "slice_mutation": (slice_mutation, [(3, 3)]),
    "outstanding_aliases": (outstanding_aliases, [(3, 3)]),
    "diagonal_add": (diagonal_add, [(3, 3)]),
}
