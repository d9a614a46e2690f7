"""Research methods plugged into the generic trainer through hooks (``base.py``), by name
(``registry.py``); each subpackage is a built-in method. docs/design.md §1, "Packages"."""
