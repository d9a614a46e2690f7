"""Groups of episodes -> the learner's batch, for every advantage estimator in ``algos``.

Pure python + the pure tensor functions of ``agentrl.algos`` (no Ray, no DeepSpeed), so the whole
mapping from rewards to per-token advantages is testable on its own:

* ``grpo`` / ``dr_grpo`` / ``rloo`` / ``raft``: one scalar per episode from its group, broadcast to every
  policy token;
* ``gigpo``: episode advantage + omega * step advantage (steps grouped by the environment state
  they started from), each step's value on that step's tokens;
* ``turn_grpo``: each user turn's own group-relative pass/fail advantage, among the episodes that
  passed every earlier turn, on that turn's tokens (``algo.reward`` is not used: the turn verdicts
  are the reward);
* ``slca``: A_tool from R_tool (HierR process) on tool-segment tokens, A_sum from R_sum on
  summary-segment tokens;
* ``ppo``: no advantages here — per-token rewards (each step's reward on its last token) for the
  learner's critic and GAE.

With ``algo.kl_in = reward`` the caller passes per-token KL estimates of the rollout policy against
the reference; they are subtracted from the reward (per token for ppo, summed per episode else).
"""

from __future__ import annotations

import torch

from agentrl.algos.advantages import get_advantage
from agentrl.algos.gigpo import gigpo, steps_to_tokens
from agentrl.algos.slca import route_segments
from agentrl.algos.slca import slca as slca_advantages
from agentrl.algos.turn_grpo import turn_grpo, turns_reached, turns_to_steps
from agentrl.rewards.scoring import step_rewards

EPISODE_LEVEL = ("grpo", "dr_grpo", "rloo", "raft")


def _state_ids(groups_states: list[list[str]]) -> list[torch.Tensor]:
    """Hash strings -> small ints shared across the group (torch.unique needs numbers)."""
    index: dict[str, int] = {}
    return [torch.tensor([index.setdefault(s, len(index)) for s in states], dtype=torch.long) for states in groups_states]


def _kl_sum(kl: list[float] | None, mask: list[int]) -> float:
    return 0.0 if kl is None else float(sum(k for k, m in zip(kl, mask) if m))


def shuffle_episode_rewards(groups: list[dict], rng) -> list[dict]:
    """The reward-destroying control (``algo.shuffle_rewards``): the step's reward records
    (``rewards`` dicts) permuted across all of its episodes, before any advantage is computed.

    Everything else (tokens, logprobs, groups) is untouched, so a run with this on differs from
    the real one only in whether rewards belong to the episodes that earned them. Returns new
    group dicts; the inputs are not modified."""
    records = [e["rewards"] for g in groups for e in g["episodes"]]
    order = list(range(len(records)))
    rng.shuffle(order)
    out, i = [], 0
    for g in groups:
        eps = []
        for e in g["episodes"]:
            eps.append({**e, "rewards": dict(records[order[i]])})
            i += 1
        out.append({**g, "episodes": eps})
    return out


def build_batch(groups: list[dict], algo, kl_per_token: list[list[float]] | None = None) -> tuple[dict, dict]:
    """Flatten groups into the learner's batch. ``algo`` is an ``AlgoConfig``; ``kl_per_token``
    (one list per episode, in group order) is used only when ``algo.kl_in == "reward"``."""
    name, reward_key = algo.advantage, algo.reward
    batch: dict[str, list] = {"input_ids": [], "response_mask": [], "rollout_logprobs": []}
    target = "token_rewards" if name == "ppo" else "advantages"
    batch[target] = []
    kl_coef = algo.kl_coef if (algo.kl_in == "reward" and kl_per_token is not None) else 0.0
    signal, n_ep, has_sum_total = 0, 0, 0
    for g in groups:
        eps = g["episodes"]
        kls = [kl_per_token[n_ep + i] if kl_coef else None for i in range(len(eps))]
        n_ep += len(eps)
        rewards = torch.tensor([e["rewards"][reward_key] - kl_coef * _kl_sum(k, e["response_mask"]) for e, k in zip(eps, kls)],
                               dtype=torch.float32)
        if name == "slca":
            segs = [torch.tensor(e["segments"]) for e in eps]
            has_tool = torch.tensor([bool((s == 1).any()) for s in segs])
            has_sum = torch.tensor([bool((s == 2).any()) for s in segs])
            r_tool = torch.tensor([e["rewards"]["process"] for e in eps], dtype=torch.float32)
            r_sum = torch.tensor([e["rewards"]["summary"] for e in eps], dtype=torch.float32)
            a_tool, a_sum = slca_advantages(r_tool, r_sum, has_tool, has_sum, algo.slca.lam_tool, algo.slca.lam_sum, algo.eps)
            per_token = [route_segments(a_tool[i : i + 1], a_sum[i : i + 1], s.unsqueeze(0))[0] for i, s in enumerate(segs)]
            signal += int(bool((a_tool != 0).any() or (a_sum != 0).any()))
            has_sum_total += int(has_sum.sum())
        elif name == "gigpo":
            srs = [torch.tensor(step_rewards(e["turn_passed"], e["n_turns"], e["step_turns"], reward_key), dtype=torch.float32)
                   for e in eps]
            for sr, e, k in zip(srs, eps, kls):  # KL-in-reward: charged at the episode's last step
                if kl_coef and sr.numel():
                    sr[-1] -= kl_coef * _kl_sum(k, e["response_mask"])
            state_ids = _state_ids([e["step_states"] for e in eps])
            step_adv = gigpo(rewards, srs, state_ids, algo.gigpo.omega, algo.gigpo.gamma, algo.eps)
            per_token = [steps_to_tokens(a, [tuple(sp) for sp in e["step_spans"]], len(e["token_ids"]))
                         for a, e in zip(step_adv, eps)]
            signal += int(bool((rewards != rewards[0]).any()))
        elif name == "turn_grpo":  # (kl_in=reward is rejected by the config: the verdicts are the reward)
            reached = [turns_reached(e["turn_passed"], e["step_turns"]) for e in eps]
            turn_adv = turn_grpo([e["turn_passed"] for e in eps], reached, algo.eps)
            per_token = [steps_to_tokens(turns_to_steps(a, e["step_turns"]), [tuple(sp) for sp in e["step_spans"]],
                                         len(e["token_ids"]))
                         for a, e in zip(turn_adv, eps)]
            signal += int(any(bool((a != 0).any()) for a in turn_adv))
        elif name == "ppo":
            per_token = []
            for e, k in zip(eps, kls):
                tr = torch.zeros(len(e["token_ids"]))
                srs = step_rewards(e["turn_passed"], e["n_turns"], e["step_turns"], reward_key)
                for (start, end), r in zip(e["step_spans"], srs):
                    if end > start:
                        tr[end - 1] += r
                if k is not None:
                    tr -= kl_coef * torch.tensor(k) * torch.tensor(e["response_mask"], dtype=torch.float32)
                per_token.append(tr)
            signal += int(bool((rewards != rewards[0]).any()))
        elif name in EPISODE_LEVEL:
            fn = get_advantage(name)
            adv = fn(rewards, eps=algo.eps) if name == "grpo" else fn(rewards)
            per_token = [a * torch.tensor(e["response_mask"], dtype=torch.float32) for a, e in zip(adv, eps)]
            signal += int(bool((adv != 0).any()))
        else:
            raise ValueError(f"algo.advantage={name!r} has no batch builder; "
                             f"known: {', '.join(EPISODE_LEVEL)}, gigpo, turn_grpo, slca, ppo")
        for e, t in zip(eps, per_token):
            batch["input_ids"].append(e["token_ids"])
            batch["response_mask"].append(e["response_mask"])
            batch["rollout_logprobs"].append(e["logprobs"])
            batch[target].append([float(x) * m for x, m in zip(t.tolist(), e["response_mask"])])
    stats = {"groups_with_signal": signal / max(1, len(groups))}
    if name == "slca":
        stats["episodes_with_summary"] = has_sum_total / max(1, n_ep)
    return batch, stats
