"""Sweep files: parsing, validation, the job matrix."""
