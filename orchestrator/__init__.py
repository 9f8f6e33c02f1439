"""The Ray driver side: sweep specs, job matrix, scheduling, result sink, presets and the CLI."""
