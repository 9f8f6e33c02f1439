"""Workflows: a run and the reports made from it, end to end (`nightly`: tonight's sweep, then its
comparison with the nights before). The floor above `fleet` and `tune`, whose runs they start,
and below `commands`; the only one of `orchestrator`'s subpackages besides `commands` that imports
`reports`."""
