"""The module the learner hands DeepSpeed: a causal LM whose forward returns token log-probs, under
the learner's precision (``learner.autocast``).

DeepSpeed only runs its backward bookkeeping (ZeRO hooks, boundary flags) for outputs of
``engine(...)``, so the policy's forward must itself answer in log-probs; the LM head runs on the
scored positions only (``hf_policy.token_logprobs``, ``engines/logprob_head.py``).
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn

from agentrl.engines.hf_policy import micro_batch_logprobs

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class PolicyLogprobs(nn.Module):
    """nn.Module handed to DeepSpeed: forward(*MicroBatch.forward_args(), score_mask=...,
    with_entropy=...) -> (logprobs, entropy or None), in the padded [B, T] layout whether the
    micro-batch is padded or packed.

    ``score_mask`` (``MicroBatch.score_mask()``): the positions the LM head runs on (None: all).
    The entropy is computed only when asked for (a metric) or when an entropy bonus is configured,
    and carries a gradient only then. Logprobs are of the tempered policy softmax(logits /
    temperature) the rollouts sampled from. ``autocast``: the dtype of ``learner.autocast``."""

    def __init__(self, model: nn.Module, entropy_grad: bool = False, temperature: float = 1.0,
                 autocast: str | None = None):
        super().__init__()
        self.model = model
        self.entropy_grad = entropy_grad
        self.temperature = temperature
        self.autocast = autocast

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                unpack_index: Tensor | None = None, score_mask: Tensor | None = None,
                with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        with autocast_context(input_ids.device, self.autocast):
            out = micro_batch_logprobs(self.model, input_ids, attention_mask, position_ids, unpack_index,
                                       score_mask=score_mask, with_entropy=with_entropy or self.entropy_grad,
                                       entropy_grad=self.entropy_grad, temperature=self.temperature)
        return out if isinstance(out, tuple) else (out, None)


def autocast_context(device: torch.device, dtype: str | None):
    """``torch.autocast`` in ``dtype`` on ``device``'s type (``learner.autocast``), or nothing."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=TORCH_DTYPES[dtype])


def check_autocast_supported(dtype: str | None, device: torch.device) -> None:
    """Refuse ``learner.autocast`` where the hardware lacks the units it needs (checked where the
    learner runs, not where the config is read): bf16 needs a GPU, or a CPU with AMX or AVX512-BF16."""
    if dtype != "bfloat16":
        return
    if device.type == "cuda":
        if not torch.cuda.is_bf16_supported():
            raise ValueError(f"learner.autocast=bfloat16: GPU {torch.cuda.get_device_name(device)} has no bf16 support; "
                             "set learner.autocast=null")
        return
    if device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        raise ValueError("learner.autocast=bfloat16: this CPU has no bf16 units (AMX or AVX512-BF16; see lscpu's flags), "
                         "so bf16 matmuls would be emulated and slower than float32; set learner.autocast=null")
