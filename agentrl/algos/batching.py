"""Groups of episodes -> the learner's batch, for whichever advantage estimator ``algo.advantage`` names.

Pure python + the pure tensor functions of ``agentrl.algos`` (no Ray, no DeepSpeed), so the whole
mapping from rewards to per-token advantages is testable on its own. The estimator is looked up
in the registry (``algos.registry``; the built-ins are in ``algos/estimators.py``, docs/design.md
§4 and §9) and turns each group's episodes into one per-token tensor per episode; this module does
what every estimator shares:

* KL in the reward (``algo.kl_in = reward``): the caller passes per-token KL estimates of the
  rollout policy against the reference; each estimator gets every episode's KL charge
  (kl_coef * sum over its policy tokens) to subtract from its reward, and for an estimator that
  needs a critic (``ppo``) the per-token KL is subtracted from its per-token rewards here;
* flattening into the batch: ``advantages``, or ``token_rewards`` for a critic estimator (the
  learner's critic and GAE make the advantages), 0 off the policy tokens;
* statistics: ``groups_with_signal``, and ``episodes_with_summary`` for an estimator that reads
  the summary reward.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from agentrl.algos.registry import estimator_for
from agentrl.algos.slca import SEG_SUMMARY
from agentrl.api import POLICY, EpisodeGroup, TrainBatch


def _kl_sum(kl: list[float] | None, mask: list[int]) -> float:
    return 0.0 if kl is None else float(sum(k for k, m in zip(kl, mask) if m))


def shuffle_episode_rewards(groups: list[EpisodeGroup], rng) -> list[EpisodeGroup]:
    """The reward-destroying control (``algo.shuffle_rewards``): the step's reward records
    (``Episode.rewards``) permuted across all of its episodes, before any advantage is computed.

    Everything else (tokens, logprobs, groups) is untouched, so a run with this on differs from
    the real one only in whether rewards belong to the episodes that earned them. Returns new
    groups; the inputs are not modified."""
    records = [e.rewards for g in groups for e in g.episodes]
    order = list(range(len(records)))
    rng.shuffle(order)
    shuffled = iter(order)
    return [replace(g, episodes=[replace(e, rewards=dict(records[next(shuffled)])) for e in g.episodes]) for g in groups]


def build_batch(groups: list[EpisodeGroup], algo, kl_per_token: list[list[float]] | None = None) -> tuple[TrainBatch, dict]:
    """Flatten groups into the learner's batch. ``algo`` is an ``AlgoConfig``; ``kl_per_token``
    (one list per episode, in group order) is used only when ``algo.kl_in == "reward"``.
    Returns the batch and its statistics."""
    estimator = estimator_for(algo)
    input_ids, masks, logprobs, per_token_all, foreign, versions = [], [], [], [], [], []
    kl_coef = algo.kl_coef if (algo.kl_in == "reward" and kl_per_token is not None) else 0.0
    signal, n_ep, with_summary = 0, 0, 0
    for g in groups:
        eps = g.episodes
        kls = [kl_per_token[n_ep + i] for i in range(len(eps))] if kl_coef else None
        n_ep += len(eps)
        kl_penalty = [kl_coef * _kl_sum(k, e.response_mask) for e, k in zip(eps, kls)] if kls is not None else None
        per_token, has_signal = estimator.compute(eps, algo, kl_penalty)
        if len(per_token) != len(eps):
            raise ValueError(f"estimator {algo.advantage!r} returned {len(per_token)} token tensors for {len(eps)} episodes")
        if kls is not None and estimator.needs_critic:  # per-token rewards: the KL is charged per token
            per_token = [t - kl_coef * torch.tensor(k) * torch.tensor(e.response_mask, dtype=torch.float32)
                         for t, e, k in zip(per_token, eps, kls)]
        signal += int(has_signal)
        if estimator.needs_summary_reward:
            with_summary += sum(SEG_SUMMARY in e.segments for e in eps)
        for e, t in zip(eps, per_token):
            input_ids.append(e.token_ids)
            masks.append(e.response_mask)
            logprobs.append(e.logprobs)
            foreign.append(e.policy != POLICY)
            versions.append(e.policy_version)
            per_token_all.append([float(x) * m for x, m in zip(t.tolist(), e.response_mask)])
    target = "token_rewards" if estimator.needs_critic else "advantages"
    batch = TrainBatch(input_ids=input_ids, response_mask=masks, rollout_logprobs=logprobs,
                       foreign=foreign if any(foreign) else None, versions=versions, **{target: per_token_all})
    stats = {"groups_with_signal": signal / max(1, len(groups))}
    if estimator.needs_summary_reward:
        stats["episodes_with_summary"] = with_summary / max(1, n_ep)
    return batch, stats
