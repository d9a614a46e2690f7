"""RODS: online data synthesis around the model's competence boundary (DESIGN.md §5).

Pure, Ray-free building blocks: the boundary detector and seed selection (``boundary``) and the
skill signature a synthesized variant must preserve (``signature``). The synthesis actor and the
active pool build on these.
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
