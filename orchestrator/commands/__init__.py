"""The `orchestrate` commands, one module per command group: each registers its subparsers
(`add_parsers`) and owns their `cmd_*` run functions; `orchestrator.cli` puts them together."""
