"""Hugging Face GPT-2 and Llama built from small configs (no weights downloaded), parameters
captured by closure as `model(ids)` does: eager's logits in both remove modes, the traced graph
replays to eager's logits, and with remove="mutations_and_views" no view op is left alive in it
(torch.func leaves t/view/_unsafe_view on the captured parameters: 3 live views on GPT-2, 45 on
Llama). Needs `transformers` (the `test` extra in pyproject.toml).
"""

import warnings

import pytest
import torch
import transformers

from torch_functionalize.testing._internal.reference import (
    assert_functional_graph, assert_matches_eager, trace,
)


def _gpt2():
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=100,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(cfg)


def _llama():
    cfg = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=100,
        max_position_embeddings=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.LlamaForCausalLM(cfg)


@pytest.mark.parametrize("make_model", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_hf_model_from_config_matches_eager_and_traces_without_views(make_model, remove):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make_model().eval()
    ids = torch.randint(0, 100, (2, 8))

    def f(ids):
        return model(ids).logits

    assert_matches_eager(f, ids, remove=remove, check_graph=False)
    gm = trace(f, ids, remove=remove)
    torch.testing.assert_close(gm(ids), f(ids))
    # make_fx records detach nodes for outputs autograd saves (the parameters require grad);
    # plain make_fx(f) records them too, and nothing uses them.
    gm.graph.eliminate_dead_code()
    gm.recompile()
    assert_functional_graph(gm, remove)


@pytest.mark.parametrize("params_as", ["closure", "inputs"])
@pytest.mark.parametrize("make_model", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_hf_model_capture_has_no_dead_node_and_no_view(make_model, params_as, remove):
    # torch_functionalize.capture of the same models, parameters captured by closure or passed
    # in as a dict: replays to eager's logits, no view op with remove="mutations_and_views", and
    # no dead node at all (no unused detach, view or *_copy: issue #13 item 7, #14 item 4).
    from torch_functionalize import capture

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make_model().eval()
    ids = torch.randint(0, 100, (2, 8))
    params = dict(model.named_parameters()) | dict(model.named_buffers())
    if params_as == "closure":
        gm = capture(lambda i: model(i).logits, ids, remove=remove)
        got = gm(ids)
    else:
        def f(p, i):
            return torch.func.functional_call(model, p, (i,)).logits

        gm = capture(f, params, ids, remove=remove)
        got = gm(params, ids)
    torch.testing.assert_close(got, model(ids).logits)
    assert_functional_graph(gm, remove)
    # ATen nodes only (grad-mode switches are Python calls, Note [Capture: grad mode]); an op
    # without results (a guard) is there for its effect.
    dead = [n.format_node() for n in gm.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and not n.users and not n.target._schema.is_mutable and n.target._schema.returns
            and torch.Tag.nondeterministic_seeded not in n.target.tags]
    assert not dead, dead
