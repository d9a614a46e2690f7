"""Memory levers change memory, not the math (the math side for the whole learner, over ranks:
tests/test_learner_group.py and benchmarks/gpu_learner_check.py). Here, on a tiny real model:
gradient checkpointing in the learner's eval-mode set-up keeps fewer activations for backward
(bytes autograd saves, counted with saved_tensors_hooks) and gives the same gradients; packing
leaves no padding to compute on."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl.engines.deepspeed_setup import enable_layer_checkpointing
from agentrl.engines.hf_policy import token_logprobs
from agentrl.engines.micro_batch import padding_fraction, split_micro_batches


def _saved_bytes_and_grads(checkpointing: bool):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                                         num_key_value_heads=2, vocab_size=100)).eval()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        enable_layer_checkpointing(model)
    ids = torch.randint(0, 100, (4, 48), generator=torch.Generator().manual_seed(1))
    seen: dict[int, int] = {}

    def pack(t):
        if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter):
            seen[id(t.untyped_storage())] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = token_logprobs(model, ids).sum()
    loss.backward()
    return sum(seen.values()), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_gradient_checkpointing_keeps_fewer_activations_and_the_same_gradients():
    plain_bytes, plain_grads = _saved_bytes_and_grads(False)
    ckpt_bytes, ckpt_grads = _saved_bytes_and_grads(True)
    assert ckpt_bytes < 0.5 * plain_bytes, (ckpt_bytes, plain_bytes)
    for name, g in plain_grads.items():
        torch.testing.assert_close(ckpt_grads[name], g, rtol=1e-5, atol=1e-7, msg=name)


def test_packing_removes_the_padding_that_a_token_budget_cannot():
    lengths = [30, 200, 35, 190, 40, 210, 20, 180]
    rows = sorted(range(len(lengths)), key=lambda i: lengths[i])
    padded = split_micro_batches(rows, lengths, 4, None, packed=False)
    packed = split_micro_batches(rows, lengths, 4, None, packed=True)
    assert padding_fraction(padded, lengths, packed=False) > 0.05
    assert padding_fraction(packed, lengths, packed=True) == 0.0
