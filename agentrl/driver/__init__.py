"""Driving a run: the training loop (``trainer.py``: ``Trainer.step`` in five phases), the
scheduler that owns in-flight rollouts (``scheduler.py``), Ray start-up and the rollout side shared
by ``agentrl train`` and ``agentrl eval`` (``cluster.py``), where each step's tasks come from
(``task_sources.py``, with RODS's synthesis actor in ``synthesis_actor.py``), the replay buffer
(``replay_buffer.py``) and ``agentrl eval`` (``evaluate.py``)."""
