"""What an output directory holds: the one list of its files and folders.

The modules that write them name them from here, and every check that must recognise an output
(a sweep's or a tune's), or keep a report page or an export out of one, reads the same lists."""

from __future__ import annotations

# A sweep's output
RESULTS_DIR = "results"
"""The result rows, one Parquet table partitioned by hardware class (store.schema)."""
TABLE_DIRS = (RESULTS_DIR, "kernel_choices", "triton_kernels")
"""The folders of the output's Parquet tables (store.schema.TABLES)."""
RUN_FILE = "run.json"
"""The run log: every run into the output, its argv, spec and counts (store.runlog)."""
LEDGER_DIR = "_ledger"
"""The commit ledger of the tables' part files (store.ledger)."""
LOCK_FILE = ".orchestrate.lock"
"""The lock a driver holds while it writes the output (store.lock)."""
QUARANTINE_DIR = "quarantine"
"""Damaged part files and run logs, set aside (store.integrity)."""
SNAPSHOT_FILE = "shared-cache.parquet"
"""The shared compile cache's autotune entries, kept for the next server (orchestrator.fleet.cache)."""
REPORT_FILE = "report.md"
"""`orchestrate report`'s speedup table (reports.speedup)."""

SWEEP_WRITTEN = (RUN_FILE, LEDGER_DIR)
"""What a sweep output holds once it has run (any one of them)."""
SWEEP_MARKS = (*SWEEP_WRITTEN, LOCK_FILE)
"""What makes a directory a sweep output (any one of them): also the lock of one being written."""
SWEEP_DATA = (*TABLE_DIRS, LEDGER_DIR, QUARANTINE_DIR, SNAPSHOT_FILE, *SWEEP_MARKS)
"""A sweep output's own files and folders: no report page or export goes there."""

# A tune's output: its rounds are sweep outputs one level down
ROUNDS = ("rung0", "knobs", "rung1", "confirm", "extend")
"""The tune's rounds, in order, each a sweep output (orchestrator.tune.search)."""
TUNE_FILE = "tune.json"
"""The tune's record: its options, budgets and every cell's log."""
DEPLOYED_FILE = "deployed.json"
"""Each cell's deployed preset against a stock PyTorch user, per accuracy budget."""
PRESETS_FILE = "presets.json"
"""The presets the tune decided (orchestrator.tune.presets; an export writes its own document)."""
PRESETS_TABLE_FILE = "presets.parquet"
"""The same presets as a table."""

TUNE_MARKS = (TUNE_FILE, *ROUNDS)
"""What makes a directory a tune's output (any one of them)."""
TUNE_DATA = (*ROUNDS, TUNE_FILE, DEPLOYED_FILE, PRESETS_FILE, PRESETS_TABLE_FILE, SNAPSHOT_FILE)
"""A tune output's own files and folders: no report page or export goes there."""

OUTPUT_MARKS = (RUN_FILE, LOCK_FILE, QUARANTINE_DIR, TUNE_FILE, ROUNDS[0])
"""Names that make a non-empty directory an orchestrate output that a sweep or tune may write into:
a sweep's run log, lock or quarantine, a tune's record or its first round (the later rounds come
after it); so does a table folder holding a `hardware=` partition. Not a bare `_ledger` or later
round: a stranger's folder that happens to hold one is refused, not taken over."""
