"""Clients for OpenAI-compatible LLM endpoints (the judge, the SGLS tool simulator)."""

from agentrl.llm.client import ChatClient, LLMEndpoint, LLMEndpointError

__all__ = ["ChatClient", "LLMEndpoint", "LLMEndpointError"]
