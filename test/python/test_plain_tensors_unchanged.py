"""Importing torch_functionalize (and using it once) leaves ordinary PyTorch programs unchanged.

The same script runs in two fresh interpreters, one without the import and one with it plus
one functionalize call first; their printed results, graph code and dispatch keys must match.
"""

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    r'''
    import sys
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    torch.set_printoptions(precision=6)

    if sys.argv[1] == "with":
        import torch_functionalize as tfz

        def warmup(x):
            x.view(-1).add_(torch.ones(4))
            return x.t()

        tfz.functionalize(warmup)(torch.zeros(2, 2))
        tfz.functionalize(warmup, remove="mutations_and_views")(torch.zeros(2, 2))

    def show(name, value):
        print(f"== {name}")
        print(value)

    def keys(t):
        return torch._C._dispatch_keys(t).raw_repr()

    # 1. In-place ops through a chain of views.
    x = torch.arange(12.0).view(3, 4)
    x.t()[1:3].mul_(10)
    x[0].add_(x[2])
    show("inplace_views", x)

    # 2. View metadata and aliasing.
    base = torch.arange(24.0).view(2, 3, 4)
    v = base.permute(2, 0, 1)[1:, 1].diagonal(0, 0, 1)
    v.fill_(-1)
    show("view_meta", (v.shape, v.stride(), v.storage_offset(), v._base is base,
                       v.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()))
    show("view_base", base)

    # 3. Factories and their dispatch keys.
    torch.manual_seed(0)
    fs = [torch.zeros(2), torch.ones(2, dtype=torch.int32), torch.full((2,), 3.0),
          torch.arange(3), torch.tensor([1.5, 2.5]), torch.rand(2), torch.randn(2),
          torch.empty(2, 3).shape, torch.zeros_like(x).sum(), x.new_ones(2)]
    show("factories", fs)
    show("factory_keys", [keys(t) for t in fs if isinstance(t, torch.Tensor)])

    # 4. Autograd backward through views and in-place ops.
    w = torch.randn(3, 4, requires_grad=True)
    h = w * 2
    h[0].sin_()
    loss = (h.t() @ torch.ones(3)).pow(2).sum()
    loss.backward()
    show("grad", (w.grad, loss.grad_fn.name(), h.grad_fn.name()))

    # 5. make_fx graph of a mutating program (real and fake).
    def prog(a, b):
        c = a.clone()
        c[1].add_(b)
        a.mul_(2)
        return c.view(-1), torch.zeros(2) + 1

    for mode in ("real", "fake"):
        show(f"make_fx_{mode}", make_fx(prog, tracing_mode=mode)(torch.randn(2, 3), torch.randn(3)).code)

    # 6. torch.func.functionalize still behaves and traces the same.
    for remove in ("mutations", "mutations_and_views"):
        gm = make_fx(torch.func.functionalize(prog, remove=remove))(torch.randn(2, 3), torch.randn(3))
        show(f"torch_func_{remove}", gm.code)

    # 7. out= ops, resizing and multi-output ops.
    o = torch.empty(0)
    torch.add(torch.ones(2, 2), 1, out=o)
    vals, idx = torch.empty(1), torch.empty(1, dtype=torch.long)
    torch.max(torch.tensor([[1.0, 5.0], [7.0, 2.0]]), 1, out=(vals, idx))
    show("out_ops", (o, o.stride(), vals, idx, torch.aminmax(torch.arange(5.0))))

    # 8. Grad modes.
    with torch.no_grad():
        a = w * 3
    with torch.inference_mode():
        b = torch.ones(2)
        b.add_(1)
    show("grad_modes", (a.requires_grad, b.is_inference(), b, keys(b)))

    # 9. Integer, bool and complex dtypes with index_put_ / masked_fill_.
    i = torch.arange(6)
    i.index_put_((torch.tensor([0, 0, 5]),), torch.tensor([1, 2, 3]), accumulate=True)
    m = i > 2
    m.logical_not_()
    z = torch.randn(3, dtype=torch.cfloat)
    z.real.zero_()
    show("dtypes", (i, m, z, torch.view_as_real(z).stride()))

    # 10. A module forward and an optimizer step.
    torch.manual_seed(1)
    lin = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9, foreach=False)
    lin(torch.randn(4, 3)).sum().backward()
    opt.step()
    show("module_step", (lin.weight, lin.bias, keys(lin.weight)))

    # Thread-local dispatch state at the end.
    show("tls", (torch._C._dispatch_tls_local_include_set().raw_repr(),
                 torch._C._dispatch_tls_local_exclude_set().raw_repr(),
                 torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack()))
    '''
)


def _run(mode):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, f"{mode} import failed:\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def outputs():
    return {"without": _run("without"), "with": _run("with")}


def _sections(text):
    sections, name = {}, None
    for line in text.splitlines():
        if line.startswith("== "):
            name = line[3:]
            sections[name] = []
        else:
            sections[name].append(line)
    return {k: "\n".join(v) for k, v in sections.items()}


def test_plain_programs_print_identically_with_and_without_import(outputs):
    # Every section (values, metadata, graph code, dispatch keys, TLS) is identical.
    without, with_ = _sections(outputs["without"]), _sections(outputs["with"])
    assert list(with_) == list(without)
    for name in without:
        assert with_[name] == without[name], f"section {name} differs"


def test_plain_programs_ran_every_section(outputs):
    # The script ran to its end, so the comparison above covered every program.
    assert len(_sections(outputs["without"])) == 15
