"""Everything about one torch.compile: configs, validation, capture statistics and measurement."""
