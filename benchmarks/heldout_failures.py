"""Greedy held-out success of a model folder, and where its episodes fail (no Ray, no vLLM).

Runs the real episode loop with HF ``generate`` (greedy) and a local backend session, then
counts, per category and turn count, successes and the first failing turn's reason (checker
reason, or the termination: max_messages, length, max_tokens). Used to study the warm start:

    .venv/bin/python benchmarks/heldout_failures.py agentrl/assets/tiny-agent [N_TASKS]
"""

from __future__ import annotations

import asyncio
import collections
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.agent.chat import ChatFormatter
from agentrl.agent.episode import EpisodeLimits, Generation, run_episode
from agentrl.envs.builtin.generator import builtin_split
from agentrl.envs.session import LocalEnvSession


class GreedyHF:
    def __init__(self, model, formatter: ChatFormatter):
        self.model, self.formatter = model, formatter

    async def generate(self, ids: list[int], max_tokens: int) -> Generation:
        eos = list(self.formatter.eos_token_ids)
        with torch.no_grad():
            out = self.model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False,
                                      eos_token_id=eos, pad_token_id=0)
        new = out[0, len(ids):].tolist()
        return Generation(new, [0.0] * len(new), "stop" if new and new[-1] in eos else "length")


def main(path: str, n: int = 200) -> None:
    tok = AutoTokenizer.from_pretrained(path)
    formatter = ChatFormatter(tok)
    policy = GreedyHF(AutoModelForCausalLM.from_pretrained(path).eval(), formatter)
    outcomes, reasons = collections.Counter(), collections.Counter()
    t0 = time.time()
    tasks = builtin_split("heldout")[:n]
    for task in tasks:
        env = LocalEnvSession(task)
        ep = asyncio.run(run_episode(task, policy, env, formatter, EpisodeLimits()))
        ok = len(ep.turn_passed) == ep.n_turns and all(ep.turn_passed)
        outcomes[(task.category, len(task.turns), ok)] += 1
        if not ok:
            turn = ep.turn_passed.index(False) if False in ep.turn_passed else len(ep.turn_passed)
            why = ep.termination if ep.termination != "done" else env.checks[-1].reason.split(":")[0]
            reasons[(task.category, turn, why)] += 1
    wins = sum(v for (_, _, ok), v in outcomes.items() if ok)
    print(f"held-out greedy success {wins}/{len(tasks)} = {wins / len(tasks):.3f} ({time.time() - t0:.0f}s)")
    print("category, turns, success: episodes")
    for key, v in sorted(outcomes.items(), key=str):
        print(f"  {key}: {v}")
    print("first failure (category, turn, reason): episodes")
    for key, v in reasons.most_common(15):
        print(f"  {key}: {v}")


if __name__ == "__main__":
    torch.set_num_threads(2)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 200)
