"""agentrl: reinforcement learning for multi-turn tool-using LLM agents on Ray."""

__version__ = "0.1.0"
