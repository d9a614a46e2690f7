"""``python -m agentrl.cli ...`` is the ``agentrl`` command (as is ``python -m agentrl``)."""

import sys

from agentrl.cli import main

if __name__ == "__main__":
    sys.exit(main())
