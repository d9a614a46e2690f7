"""RODS: online data synthesis around the model's competence boundary (docs/design.md §5).

Ray-free: the boundary detector and seed selection (``boundary``), the skill signature a variant
keeps (``signature``), the synthesizer interface and the gates every variant passes
(``synthesizer``), the synthesizers (``resample`` for builtin tasks, ``resample_bfcl`` for BFCL,
``llm_synth`` with ``llm_prompts`` / ``llm_checks``), and the active pool (``pool``). The Ray
shell holding a pool and a synthesizer is ``agentrl.driver.synthesis_actor``.
"""

from agentrl.rods.boundary import REGIONS, GroupStat, group_stat, phi, region, select_seeds
from agentrl.rods.signature import SkillSignature, skill_signature, tool_classes

__all__ = [
    "REGIONS",
    "GroupStat",
    "SkillSignature",
    "group_stat",
    "phi",
    "region",
    "select_seeds",
    "skill_signature",
    "tool_classes",
]
