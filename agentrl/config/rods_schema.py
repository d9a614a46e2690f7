"""Config sections of RODS: ``rods`` (boundary, pool, synthesis) and ``rods.llm`` (the LLM
synthesizer). Part of the tree in ``config/schema.py``; field comments here are the configuration
reference too.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from agentrl.config.engine_schema import EndpointConfig, EngineConfig, require_one_llm
from agentrl.config.types import Bool, Fraction, NonEmptyStr, NonNegFloat, NonNegInt, PosInt, Section, Unit


class RodsLLMConfig(Section):
    # OpenAI-compatible endpoint of the synthesis LLM; null = an in-cluster vLLM engine on
    # model_path, inside the synthesis actor.
    endpoint: EndpointConfig | None = None
    # Model folder of the synthesis LLM (used when endpoint is null).
    model_path: NonEmptyStr | None = None
    # Engine settings of the in-cluster synthesis LLM (model_path).
    engine: EngineConfig = Field(default_factory=EngineConfig)
    # Sampling temperature of the planner and rewriter (the judge decodes greedily).
    temperature: NonNegFloat = 0.7
    # Token budget of one LLM response (a plan, a rewrite, a verdict).
    max_tokens: PosInt = 1024
    # Plan + execute attempts per variant (re-plan after a failed execution); RODS paper: 3.
    max_attempts: PosInt = 3
    # Query repairs after an LLM-judge rejection; RODS paper: 1.
    max_repairs: NonNegInt = 1
    # Deterministic gates (RODS paper): longest string argument, in characters.
    max_string_chars: PosInt = 200
    # Deterministic gates (RODS paper): most items in a list argument.
    max_list_items: PosInt = 5
    # Augmented variants made from each accepted task (RODS paper stage 5); [] = none.
    augment: list[Literal["miss_func", "miss_param", "long_context"]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_llm(self) -> "RodsLLMConfig":
        require_one_llm("rods.llm", self.model_path, self.endpoint)
        return self


class RodsConfig(Section):
    # Grow a co-evolving task pool from the train seeds (RODS, docs/design.md §5). Needs
    # tasks.fresh_train=false: the seeds are tasks.train.
    enabled: Bool = False
    # How variants are made: "resample" (same skill signature, fresh values; no LLM) or "llm"
    # (five-stage LLM pipeline, configured in rods.llm).
    synthesizer: Literal["resample", "llm"] = "resample"
    # Boundary region on the group mean progress reward: too hard below low (RODS paper 0.20)...
    low: Unit = 0.20
    # ...mastered above high (RODS paper 0.85); boundary in between.
    high: Unit = 0.85
    # Seeds taken per category each time seeds are selected (top phi = 4 r(1 - r) first).
    quota_per_category: PosInt = 4
    # Seeds are selected every this many steps, from the groups seen since the last selection.
    select_every: PosInt = 1
    # A task used as seed is not used again for this many steps.
    cooldown_steps: NonNegInt = 20
    # Variants requested per seed.
    variants_per_seed: PosInt = 2
    # Cap on synthesized tasks in the pool (P_max); null = the number of seeds (RODS paper).
    max_synthesized: PosInt | None = None
    # Steps between staged injections (an "epoch"); null = one pass over the active pool.
    epoch_steps: PosInt | None = None
    # At most this fraction of the pool is injected per epoch (RODS paper beta = 0.20).
    inject_fraction: Fraction = 0.20
    # A new variant whose first group mean is below this is retired (RODS paper 0.20).
    retire_new_below: Unit = 0.20
    # A synthesized task whose group mean drifts above this is retired as mastered (RODS paper 0.95).
    retire_above: Unit = 0.95
    # A synthesized task whose group mean drifts below this is retired as too hard (RODS paper 0.20).
    retire_below: Unit = 0.20
    # Keep seed tasks in the pool whatever their statistics (RODS paper default).
    keep_seeds: Bool = True
    # Accepted variants waiting for injection; beyond this, synthesis pauses (back-pressure).
    max_backlog: PosInt = 256
    # Seed of the synthesizers' random draws (combined with run.seed).
    seed: NonNegInt = 0
    # rods_pool.json of a checkpoint to seed a new run's pool from (its steps count from 1 again);
    # to continue the same run, use `agentrl train --resume RUN` instead. null = a new pool from
    # the tasks.train seeds.
    resume_from: NonEmptyStr | None = None
    # CPUs reserved for the synthesis actor (its synthesis thread shares them with the RPCs).
    num_cpus: NonNegFloat = 0.0
    # GPUs for the synthesis actor (the in-cluster vLLM engine of rods.llm); 0 on CPU machines.
    num_gpus: NonNegFloat = 0.0
    # LLM synthesizer settings; required when synthesizer is "llm".
    llm: RodsLLMConfig | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "RodsConfig":
        if self.low > self.high:
            raise ValueError(f"rods.low={self.low}: must be <= rods.high={self.high}")
        if self.retire_below > self.retire_above:
            raise ValueError(f"rods.retire_below={self.retire_below}: must be <= rods.retire_above={self.retire_above}")
        if self.resume_from and not self.enabled:
            raise ValueError(f"rods.resume_from={self.resume_from!r}: set rods.enabled=true to continue a pool")
        if self.synthesizer == "llm" and self.llm is None:
            raise ValueError("rods.synthesizer=llm needs rods.llm (model_path or endpoint of the synthesis LLM)")
        return self
