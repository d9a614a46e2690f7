"""The rollout side: the rollout worker actor that runs episodes on its vLLM engine and scores
them (``worker.py``), the tool actors and the LLM tool simulator's server (``tool_pool.py``,
``sgls_server.py``), and the actor that writes every episode to disk (``trajectory_writer.py``)."""
