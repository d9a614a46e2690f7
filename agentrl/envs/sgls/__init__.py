"""SGLS — the schema-guided LLM simulator (docs/design.md §6): a tool backend for tools that have only
a JSON schema. Calls are validated deterministically, answered by an LLM acting as the API server
under JSON-constrained decoding, checked, retried, and cached per (task, history, call) so the
episodes of a group see the same answers. The cluster-wide server is
``agentrl.rollout.sgls_server.SGLSServer`` (kept out of this package: ``envs`` does not import Ray).
"""

from agentrl.envs.sgls.backend import (
    ERROR_RESPONSE_SCHEMA,
    SGLSBackend,
    ToolSimulator,
    build_messages,
    output_schema,
)
from agentrl.envs.sgls.cache import SimulationCache, cache_key, canonical_json, history_entry
from agentrl.envs.tool_schema import GENERIC_OUTPUT_SCHEMA, close_schema, validate_call, validate_output

__all__ = [
    "ERROR_RESPONSE_SCHEMA",
    "GENERIC_OUTPUT_SCHEMA",
    "SGLSBackend",
    "SimulationCache",
    "ToolSimulator",
    "build_messages",
    "cache_key",
    "canonical_json",
    "close_schema",
    "history_entry",
    "output_schema",
    "validate_call",
    "validate_output",
]
