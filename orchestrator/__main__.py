"""`python -m orchestrator` is the same as the `orchestrate` command."""

from orchestrator.cli import run

run()
