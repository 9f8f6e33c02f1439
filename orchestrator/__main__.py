"""`python -m orchestrator` is the same as the `orchestrate` command."""

import sys

from orchestrator.cli import main

sys.exit(main())
