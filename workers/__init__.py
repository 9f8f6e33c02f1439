"""Workers: the per-job subprocess side of compile-orchestrator (model zoo, inputs, measurement)."""
