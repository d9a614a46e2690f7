"""Research methods plugged into the generic trainer through hooks (``base.py``), by name
(``registry.py``); one package per built-in method (``rspo/``). docs/design.md §1, "Packages"."""
