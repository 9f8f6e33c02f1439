"""Figures read from result rows, not rendered as pages: a cell's stock PyTorch user (`stock`) and
where a run's time went (`efficiency`). The floor between `store` and `reports`: the driver (a
sweep's end, the tuner) and the reports both compute these, and neither imports the other for them."""
