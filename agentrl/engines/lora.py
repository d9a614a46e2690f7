"""LoRA for the policy learner (``model.lora``): wrap the HF model, merge for inference, adapter state.

Why it looks like this:

* Training: ``apply_lora`` wraps the HF causal LM with peft. Only the adapters (A: r x in,
  B: out x r per adapted linear layer) require grad, so the optimizer state is tiny; the base
  weights stay frozen. peft zero-initialises B, so the wrapped model starts exactly equal to the
  base model (the first rollouts are the base policy's).
* Inference: the engines (vLLM) load plain HF weights, so every sync sends the *merged* weights
  W + scaling * B @ A under the un-wrapped model's key names (``iter_merged_weights`` /
  ``merged_weights``). They are computed out of place, one module at a time: peft's in-place
  ``merge_adapter``/``unmerge_adapter`` would rewrite live parameters that DeepSpeed mirrors in
  its optimizer (fp32 master copies, ZeRO partitions), and a bf16 merge/unmerge round trip does
  not even give the same bits back. Under ZeRO-3 the caller passes a ``gather`` context-manager
  factory (``deepspeed.zero.GatheredParameters``) and each module is gathered on its own, so at
  most one layer's full weights exist at a time.
* Checkpoints: ``adapter_state_dict`` / ``load_adapter_state_dict`` hold only the adapter tensors
  (the base weights are always the run's ``model.path``); ``save_adapter`` writes them as a peft
  adapter folder.

The peft wrapper forwards ``config``, ``get_decoder`` and ``get_output_embeddings`` to the HF
model, so ``hf_policy.token_logprobs`` runs on it directly (with the adapters active).
``unwrap_base`` returns the HF model itself; note that peft injects the LoRA layers *into* it,
so it is not the plain base model: its forward applies the adapters too.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, ContextManager, Iterable, Iterator

import torch
from torch import Tensor, nn

log = logging.getLogger(__name__)

# ``gather(params)``: a context manager under which ``params`` hold their full data (ZeRO-3).
Gather = Callable[[list[nn.Parameter]], ContextManager[Any]]


def _no_gather(params: list[nn.Parameter]) -> ContextManager[Any]:
    return contextlib.nullcontext()


def _linear_types() -> tuple[type, ...]:
    """Layer types LoRA is applied to here: ``nn.Linear`` and GPT-2 style ``Conv1D`` (weight stored
    transposed; peft's ``fan_in_fan_out``)."""
    from transformers.pytorch_utils import Conv1D

    return (nn.Linear, Conv1D)


def lora_enabled(lora_cfg: Any) -> bool:
    """True when ``model.lora`` asks for adapters (rank > 0)."""
    return lora_cfg is not None and int(lora_cfg.rank) > 0


def is_peft_model(model: nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def unwrap_base(model: nn.Module) -> nn.Module:
    """The HF model inside a peft wrapper (``config``, ``get_decoder``, ``save_pretrained`` with an
    explicit ``state_dict``); a model that is not wrapped is returned as is. The LoRA layers live
    inside it, so its forward still applies the adapters."""
    return model.get_base_model() if is_peft_model(model) else model


# ---------------------------------------------------------------------------- wrapping
def _matches(module_name: str, target: str) -> bool:
    """peft's rule for a list of target names: the full name or a dotted suffix of it."""
    return module_name == target or module_name.endswith("." + target)


def _matched_linears(model: nn.Module, targets: list[str] | str) -> list[tuple[str, nn.Module]]:
    """The linear layers ``targets`` selects, after checking it: a located ValueError when a
    target names a layer LoRA cannot adapt here or when nothing matches; a warning for a target
    that matches nothing while others do (a typo would silently leave layers unadapted)."""
    linear = _linear_types()
    modules = [(n, m) for n, m in model.named_modules() if n]
    linear_names = sorted({n.rsplit(".", 1)[-1] for n, m in modules if isinstance(m, linear)})
    where = f"this model's linear modules are: {', '.join(linear_names) or 'none'}"
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if targets == "all-linear":  # peft's meaning: every linear layer but the output head
        hits = [(n, m) for n, m in modules if isinstance(m, linear) and m is not head]
        if not hits:
            raise ValueError(f"model.lora.target_modules='all-linear' matches no linear module; {where}")
        return hits
    if isinstance(targets, str) or not targets:
        raise ValueError(f"model.lora.target_modules must be 'all-linear' or a non-empty list of module names, got {targets!r}")
    hits: list[tuple[str, nn.Module]] = []
    unmatched = []
    for target in targets:
        found = [(n, m) for n, m in modules if _matches(n, target)]
        bad = [(n, m) for n, m in found if not isinstance(m, linear)]
        if bad:
            n, m = bad[0]
            raise ValueError(f"model.lora.target_modules: {target!r} matches {n} ({type(m).__name__}), which is not a linear "
                             f"layer; LoRA here adapts linear layers only; {where}")
        if not found:
            unmatched.append(target)
        hits += [(n, m) for n, m in found if all(m is not h for _, h in hits)]
    if not hits:
        raise ValueError(f"model.lora.target_modules={list(targets)} matches no module of this model; {where}")
    if unmatched:
        log.warning("model.lora.target_modules: %s match no module of this model (adapting %d others); %s",
                    unmatched, len(hits), where)
    return hits


def apply_lora(model: nn.Module, lora_cfg: Any) -> nn.Module:
    """Wrap the HF causal LM ``model`` with LoRA adapters per ``lora_cfg`` (``LoraConfig`` of the
    config schema: ``rank``, ``alpha``, ``target_modules``); returns the peft model.

    peft injects the adapters into ``model`` in place and freezes everything else, so only the
    adapters require grad. B starts at zero: the wrapped model computes exactly what ``model``
    did. No dropout (the learner runs in eval mode anyway, see deepspeed_learner) and no trained
    biases, so the merged weights are exactly W + (alpha / rank) * B @ A. The train/eval mode of
    ``model`` is kept (peft would switch it to train mode)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import TaskType, get_peft_model
    from transformers.pytorch_utils import Conv1D

    if not lora_enabled(lora_cfg):
        raise ValueError(f"model.lora.rank must be > 0 to apply LoRA, got {getattr(lora_cfg, 'rank', None)}")
    if is_peft_model(model):
        raise ValueError("apply_lora: the model is already a peft model")
    targets = lora_cfg.target_modules if isinstance(lora_cfg.target_modules, str) else list(lora_cfg.target_modules)
    hits = _matched_linears(model, targets)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    if tied and any(m is head for _, m in hits):
        raise ValueError("model.lora.target_modules adapts the LM head, but this model ties it to the input embedding "
                         "(tie_word_embeddings): the merged head would differ from the embedding, which inference engines "
                         "re-tie on load. Leave lm_head out of model.lora.target_modules.")
    peft_cfg = PeftLoraConfig(
        r=int(lora_cfg.rank),
        lora_alpha=float(lora_cfg.alpha),
        target_modules=targets,
        lora_dropout=0.0,
        bias="none",
        # GPT-2 style Conv1D stores W transposed; peft wants to be told (it would warn and switch).
        fan_in_fan_out=all(isinstance(m, Conv1D) for _, m in hits),
        task_type=TaskType.CAUSAL_LM,
    )
    was_training = model.training
    peft_model = get_peft_model(model, peft_cfg)
    peft_model.train(was_training)
    stray = [n for n, p in peft_model.named_parameters() if p.requires_grad and not _is_adapter_param(n)]
    if stray:  # peft's contract with bias="none" and no modules_to_save; checked because the optimizer relies on it
        raise RuntimeError(f"apply_lora: non-adapter parameters require grad: {stray[:5]}")
    return peft_model


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters to hand the optimizer: only those that require grad (the adapters under
    LoRA). Frozen ones must stay out: a mixed-precision optimizer would keep fp32 master copies
    (and Adam moments, under some wrappers) of the whole frozen base model."""
    return [p for p in model.parameters() if p.requires_grad]


# ---------------------------------------------------------------------------- merged weights
def _copy(t: Tensor, device: torch.device | str | None, dtype: torch.dtype | None = None) -> Tensor:
    """A fresh tensor (own storage, contiguous): valid after a ZeRO-3 gather ends, and writing to
    it never touches the live model."""
    return t.detach().to(device=device if device is not None else t.device, dtype=dtype or t.dtype, copy=True).contiguous()


def _merged_lora_layer(module: nn.Module, prefix: str, device: torch.device | str | None) -> Iterator[tuple[str, Tensor]]:
    """The base layer's tensors under ``prefix``, its weight replaced by W + sum over the active
    adapters of scaling * B @ A (transposed for ``fan_in_fan_out``), computed in fp32 and cast to
    W's dtype."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    name = prefix[:-1]
    base = module.get_base_layer()
    if type(module) is not LoraLinear or not isinstance(base, _linear_types()):
        raise ValueError(f"{name}: LoRA layer {type(module).__name__} over {type(base).__name__} is not supported; "
                         "merged weights are implemented for LoRA on linear layers only")
    if module.merged:
        raise ValueError(f"{name}: the adapter is merged into the base weight (peft merge_adapter); unmerge it first")
    weight = base.weight.detach()
    merged = weight.to(torch.float32, copy=True)
    if not module.disable_adapters:  # mirror the live forward: disabled adapters add nothing
        for adapter in module.active_adapters:
            if adapter not in module.lora_A:
                continue
            if adapter in getattr(module, "lora_variant", {}) or module.lora_bias.get(adapter, False):
                raise ValueError(f"{name}: adapter {adapter!r} is a LoRA variant (DoRA, lora_bias, ...); "
                                 "only plain LoRA merges here")
            a = module.lora_A[adapter].weight.detach().to(merged.device, torch.float32)
            b = module.lora_B[adapter].weight.detach().to(merged.device, torch.float32)
            delta = (b @ a) * module.scaling[adapter]
            merged += delta.T if module.fan_in_fan_out else delta
    for pname, p in base._parameters.items():
        if p is not None:
            if pname == "weight":  # merged is already a fresh tensor: move/cast it, no second copy
                yield prefix + pname, merged.to(device=device if device is not None else weight.device, dtype=weight.dtype)
            else:
                yield prefix + pname, _copy(p, device)
    for bname, buf in base._buffers.items():
        if buf is not None and bname not in base._non_persistent_buffers_set:
            yield prefix + bname, _copy(buf, device)


def _walk(module: nn.Module, prefix: str, gather: Gather, device) -> Iterator[tuple[str, Tensor]]:
    """``module.state_dict()``'s entries in its order (own parameters, persistent buffers, then
    children), LoRA layers replaced by their merged base layer; parameters gathered one module at
    a time."""
    from peft.tuners.lora.layer import LoraLayer

    if isinstance(module, LoraLayer):
        with gather(list(module.parameters())):  # base weight, bias and adapters of this layer
            yield from _merged_lora_layer(module, prefix, device)
        return
    own = [p for p in module._parameters.values() if p is not None]
    with gather(own) if own else contextlib.nullcontext():
        for name, p in module._parameters.items():
            if p is not None:
                yield prefix + name, _copy(p, device)
    for name, buf in module._buffers.items():
        if buf is not None and name not in module._non_persistent_buffers_set:
            yield prefix + name, _copy(buf, device)
    for name, child in module._modules.items():
        if child is not None:
            yield from _walk(child, prefix + name + ".", gather, device)


@torch.no_grad()
def iter_merged_weights(model: nn.Module, gather: Gather | None = None,
                        device: torch.device | str | None = None) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) pairs of the weights a plain HF model would need to compute what ``model``
    (peft-wrapped, or not) computes: the keys, order, shapes and dtypes of the un-wrapped model's
    ``state_dict()`` (tied ``lm_head.weight`` included, like HF's own state dict), every adapted
    weight merged. One tensor at a time, so a sender can stream them.

    The live model is not modified. Every tensor is a fresh copy, on ``device`` (default: where
    the parameter lives). ``gather``: ZeRO-3's ``lambda ps: deepspeed.zero.GatheredParameters(ps)``;
    each module's parameters are gathered while its tensors are produced."""
    yield from _walk(unwrap_base(model), "", gather or _no_gather, device)


def merged_weights(model: nn.Module, gather: Gather | None = None, device: torch.device | str | None = "cpu",
                   drop_keys: Iterable[str] = ()) -> dict[str, Tensor]:
    """``iter_merged_weights`` as a dict, on CPU by default. ``drop_keys`` are skipped (e.g.
    ``{"lm_head.weight"}`` with tied embeddings, as ``state_dict_for_inference`` drops it)."""
    drop = set(drop_keys)
    return {k: v for k, v in iter_merged_weights(model, gather, device) if k not in drop}


# ---------------------------------------------------------------------------- adapter state
def _is_adapter_param(name: str) -> bool:
    """peft's own test for LoRA tensors (lora_A, lora_B, lora_embedding_*, ...)."""
    return "lora_" in name


def _adapter_params(model: nn.Module) -> dict[str, nn.Parameter]:
    if not is_peft_model(model):
        raise ValueError("adapter state: the model is not a peft (LoRA) model")
    params = {n: p for n, p in model.named_parameters() if _is_adapter_param(n)}
    if not params:
        raise ValueError("adapter state: the peft model has no LoRA parameters")
    return params


@torch.no_grad()
def adapter_state_dict(model: nn.Module, gather: Gather | None = None) -> dict[str, Tensor]:
    """The adapter tensors only (CPU copies), keyed as in the peft model's ``state_dict()``
    (``base_model.model.<module>.lora_A.default.weight``): what a checkpoint needs besides the
    run's ``model.path``. Also accepted by ``peft_model.save_pretrained(dir, state_dict=...)``."""
    params = _adapter_params(model)
    with (gather or _no_gather)(list(params.values())):
        return {n: _copy(p, "cpu") for n, p in params.items()}


@torch.no_grad()
def load_adapter_state_dict(model: nn.Module, state: dict[str, Tensor], gather: Gather | None = None) -> None:
    """Copy ``adapter_state_dict`` output into ``model``'s adapters; the key sets and shapes must
    match exactly. Writes module parameters: do it before the DeepSpeed engine is built (the
    engine's optimizer keeps its own master copies; to resume a run use DeepSpeed's checkpoint).
    Under ZeRO-3 ``gather`` must write back: ``GatheredParameters(ps, modifier_rank=0)``."""
    params = _adapter_params(model)
    missing, unexpected = sorted(params.keys() - state.keys()), sorted(state.keys() - params.keys())
    if missing or unexpected:
        raise ValueError(f"adapter state does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    with (gather or _no_gather)(list(params.values())):
        for name, p in params.items():
            if tuple(state[name].shape) != tuple(p.shape):
                raise ValueError(f"adapter state: {name} has shape {tuple(state[name].shape)}, the model's is {tuple(p.shape)}")
            p.copy_(state[name].to(device=p.device, dtype=p.dtype))


def save_adapter(model: nn.Module, out_dir: str, gather: Gather | None = None) -> None:
    """A peft adapter folder (adapter_config.json + adapter_model.safetensors), loadable with
    ``PeftModel.from_pretrained(base_model, out_dir)``."""
    model.save_pretrained(str(out_dir), state_dict=adapter_state_dict(model, gather))


__all__ = ["adapter_state_dict", "apply_lora", "is_peft_model", "iter_merged_weights", "load_adapter_state_dict",
           "lora_enabled", "merged_weights", "save_adapter", "trainable_parameters", "unwrap_base"]
