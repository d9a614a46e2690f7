"""``python -m agentrl ...`` is the ``agentrl`` command, for when the script is not on PATH."""

import sys

from agentrl.cli import main

if __name__ == "__main__":
    sys.exit(main())
