"""Saving and resuming: atomic checkpoints and ``--resume`` (``checkpoint.py``), the storage they
live in, local or object store (``storage.py``), and preemption: the SIGTERM and node-drain
notices that end a run with a checkpoint and exit 75 (``preemption.py``, ``prestop.py``)."""
