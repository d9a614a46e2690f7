"""The bottom layer: what every other package may use and which imports nothing of agentrl.

* ``plugins.py``: the one routine that imports a run's plugins (``load_plugins``), and the
  plugin errors the CLI prints;
* ``log.py``: the ``agentrl`` logger tree (``get_logger``) and its threshold (``set_level``);
* ``registry.py``: ``Registry``, the name table behind every ``register_*`` (a name is held by one
  definition; an unknown name is reported with the close match).
* ``files.py``: the one routine that replaces a file's content atomically and durably
  (``atomic_write``: the file holds the new data or the old, never a part) and ``fsync_path``.
"""
