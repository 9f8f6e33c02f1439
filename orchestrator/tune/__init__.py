"""From results to shipped settings: presets, the tuner, export."""
