"""The bottom layer: what every other package may use and which imports nothing of agentrl.

* ``plugins.py``: the one routine that imports a run's plugins (``load_plugins``), and the
  plugin errors the CLI prints.
"""
