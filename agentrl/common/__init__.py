"""The bottom layer: what every other package may use and which imports nothing of agentrl.

* ``plugins.py``: the one routine that imports a run's plugins (``load_plugins``), and the
  plugin errors the CLI prints;
* ``registry.py``: ``Registry``, the name table behind every ``register_*`` (a name is held by one
  definition; an unknown name is reported with the close match).
"""
