"""``agentrl make-model --pretrained DIR``: the imperfect-teacher warm start for any pretrained HF model.

Stage 2 of the tiny model's recipe (``tiny_model.stage2``, docs/design.md §7) on a model that
brings its own tokenizer and chat template: the teacher's demonstrations are rendered with them
through ``agent.chat.formatter_for``, so a config's ``agent:`` section (tool format, chat
template, system prompt) applies as in training. Stage 1 (a tokenizer and gold SFT from scratch)
does not run. The output folder gets the model, its tokenizer and chat template, and a stamp of
the recipe; a folder whose stamp matches is reused unless ``force``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from agentrl.agent.chat import formatter_for
from agentrl.config.schema import AgentConfig
from agentrl.models.tiny_model import STAGE1_FIELDS, STAMP, TinyModelRecipe, _recipe_of, stage2

# Stage-2 settings for a pretrained model (~100M parameters, trained on a CPU), used where the
# user sets none. The tiny recipe's (peak lr 5e-4, 400 steps of 16) trains a 2M model that learnt
# everything in stage 1; a pretrained model already writes ChatML (SmolLM2-135M made no tool call
# zero-shot, though), so the usual full-fine-tuning rate at this size (2e-5) is meant to teach the
# format and the habits without wiping what it knows. Steps are costly on a CPU: steps of 4
# SmolLM2-135M demonstrations took 19, 72 and 11 s on 2 quiet cores (batches are drawn by length,
# so their cost varies), so 40 steps of 4 take roughly 20-50 minutes there. They draw at most 160
# demonstrations: 400 are plenty, 4,000 would only cost time to render. Warm-up 4 steps: the
# tiny recipe's 20 would be half the run. (Whether 40 steps plant the habits as firmly as the
# tiny recipe's 400 is not measured yet.)
PRETRAINED_DEFAULTS = {"habit_steps": 40, "habit_lr": 2e-5, "sft_batch": 4, "habit_tasks": 400, "habit_warmup": 4}
# Longest demonstration trained on (longer ones are dropped): the model's max_position_embeddings,
# capped at the tiny model's context, which is also the engine's default max_model_len. The imperfect
# teacher's bank-suite demonstrations in SmolLM2's template are up to ~1,250 tokens (40 sampled;
# the gold held-out episodes: 420 at the median, 1005 at most), so the cap drops none; it keeps an
# 8k- or 128k-context model from training on episodes no rollout would produce.
MAX_TOKENS = 2048


def max_tokens_of(source: Path) -> int:
    """``MAX_TOKENS``, or the model's own context when that is shorter (read from config.json)."""
    config = json.loads((source / "config.json").read_text())
    own = config.get("max_position_embeddings") or config.get("text_config", {}).get("max_position_embeddings")
    return min(own, MAX_TOKENS) if own else MAX_TOKENS


def make_pretrained(source: str | Path, out_dir: str | Path, recipe: TinyModelRecipe, agent_cfg=None,
                    force: bool = False, log=print) -> Path:
    """Stage 2 on the pretrained model in ``source`` (an HF folder), saved to ``out_dir``; returns it.

    ``recipe``: its stage-2 fields, ``sft_batch`` and ``seed`` apply (the rest are stage 1's);
    ``agent_cfg``: a config's ``agent:`` section (``AgentConfig``; None = its defaults)."""
    source, out = Path(source).resolve(), Path(out_dir)
    used = {k: v for k, v in asdict(recipe).items() if k not in STAGE1_FIELDS or k in ("seed", "sft_batch")}
    used.update(pretrained=str(source), max_tokens=max_tokens_of(source),
                agent=(agent_cfg or AgentConfig()).model_dump())  # no config and defaults: one stamp
    if not force and _recipe_of(out) == used:
        log(f"make-model: reusing {out} (same pretrained model and recipe; --force rebuilds)")
        return out

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    tokenizer = AutoTokenizer.from_pretrained(source)
    try:  # before the model loads: a tokenizer without a chat template fails here
        formatter = formatter_for(tokenizer, agent_cfg)
    except ValueError as err:
        raise ValueError(f"--pretrained {source}: {err}") from None
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    log(f"make-model: {source}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
        f"vocab {len(tokenizer)}, demonstrations up to {used['max_tokens']} tokens; stage 2 {recipe.habit_steps} "
        f"steps of {recipe.sft_batch} at peak lr {recipe.habit_lr:g}")
    final_loss = stage2(model, formatter, used["max_tokens"], recipe, log)

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    formatter.tokenizer.save_pretrained(out)  # with the chat template the demonstrations were rendered with
    seconds = round(time.time() - t0, 1)
    (out / STAMP).write_text(json.dumps({"recipe": used, "final_sft_loss": final_loss, "seconds": seconds}, indent=2))
    log(f"make-model: saved to {out} in {seconds:.0f}s (final SFT loss {final_loss})")
    return out
