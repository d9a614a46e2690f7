from agentrl.tasks.schema import Category, FunctionSpec, Provenance, Task, ToolCall, ToolSpec, Turn

__all__ = ["Category", "FunctionSpec", "Provenance", "Task", "ToolCall", "ToolSpec", "Turn"]
