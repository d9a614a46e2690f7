"""Supervised fine-tuning on teacher episodes: the warm start of ``agentrl make-model``.

Sequences are built through the real episode loop (``agent.episode.run_episode`` with a scripted
policy and a local environment session), so the training tokens are token-for-token what
generation produces; the loss covers policy tokens only (``response_mask``).
"""

from __future__ import annotations

import asyncio
import math
import random
import time

from agentrl.agent.chat import ChatFormatter
from agentrl.agent.episode import EpisodeLimits, run_episode
from agentrl.agent.gold import GoldPolicy, gold_messages
from agentrl.agent.teacher import Habits, demonstration
from agentrl.envs.session import LocalEnvSession
from agentrl.tasks.schema import Task


def conversation_text(task: Task, renderer, tool_format: str = "hermes") -> str:
    """The gold conversation as text (the tokenizer's training corpus), calls in ``tool_format``.
    (``sft_sequences`` needs no format: its formatter carries one.)"""
    tools = [t.model_dump() for t in task.visible_tools(0)]
    return renderer.apply_chat_template(gold_messages(task, tool_format), tools=tools, tokenize=False)


def sft_sequences(tasks: list[Task], formatter: ChatFormatter, max_tokens: int, habits: Habits | None = None,
                  seed: int = 0, log=print) -> list[tuple[list[int], list[int]]]:
    """Teacher episodes through the real episode loop: (token ids, response mask) per task.

    With no ``habits`` the teacher is gold and only episodes that pass every turn are kept; with
    habits, the teacher plays ``teacher.demonstration`` (the environment and checker still see
    the real task) and every episode that ends normally is kept."""
    limits = EpisodeLimits(max_new_tokens=10_000, max_assistant_messages_per_turn=16, max_episode_tokens=max_tokens)
    rng = random.Random(seed)
    fired: dict[str, int] = {}

    async def build():
        out = []
        for task in tasks:
            played = task
            if habits is not None:
                played, counts = demonstration(task, habits, rng)
                for k, v in counts.items():
                    fired[k] = fired.get(k, 0) + v
            ep = await run_episode(task, GoldPolicy(played, formatter), LocalEnvSession(task), formatter, limits)
            if ep.termination == "done" and (habits is not None or all(ep.turn_passed)):
                out.append((ep.token_ids, ep.response_mask))
        return out

    sequences = asyncio.run(build())
    if habits is not None:
        log(f"make-model: imperfect teacher: habits fired {fired} in {len(tasks)} demonstrations")
    return sequences


def lr_at(step: int, steps: int, peak: float, warmup: int, decay_fraction: float, floor: float) -> float:
    """Warmup-stable-decay: linear warm-up, peak held, cosine decay over the last ``decay_fraction``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    decay_start = int(steps * (1 - decay_fraction))
    if step < decay_start:
        return peak
    progress = (step - decay_start) / max(1, steps - decay_start)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def sft(model, sequences, steps: int, lr_at, batch_size: int, seed: int, pad_id: int, log=print) -> list[float]:
    """Masked next-token SFT; batches drawn by similar length to keep padding (and time) low."""
    import torch

    rng = random.Random(seed)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]))
    buckets = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    opt = torch.optim.AdamW(model.parameters(), lr=lr_at(0), weight_decay=0.0)
    model.train()
    losses = []
    t0 = time.time()
    # Every 20 steps, more often in short runs: a step of a pretrained ~100M model takes up to a
    # minute on a CPU (make-model --pretrained runs 40), so progress must show within a few.
    every = min(20, max(1, steps // 20))
    for step in range(steps):
        batch = [sequences[i] for i in rng.choice(buckets)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        for r, (seq, mask) in enumerate(batch):
            ids[r, : len(seq)] = torch.tensor(seq)
            attn[r, : len(seq)] = 1
            labels[r, : len(seq)] = torch.where(torch.tensor(mask) == 1, torch.tensor(seq), -100)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % every == 0 or step == steps - 1:
            log(f"  sft step {step + 1}/{steps}  loss {loss.item():.4f}  ({time.time() - t0:.0f}s)")
    model.eval()
    return losses
