"""Typed run configuration: YAML file + dotted overrides -> validated ``Config`` (no torch/Ray)."""

from agentrl.config.loader import ConfigError, InputError, dump_config, load_config
from agentrl.config.schema import KNOWN_ADVANTAGES, Config

__all__ = ["Config", "ConfigError", "InputError", "KNOWN_ADVANTAGES", "dump_config", "load_config"]
