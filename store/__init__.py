"""Output directories: the Arrow tables, the crash-safe sink, storage locations, the run log."""
