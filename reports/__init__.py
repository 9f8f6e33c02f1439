"""Reports built from the Arrow result tables only."""
