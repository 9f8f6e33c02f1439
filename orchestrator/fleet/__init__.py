"""The Ray side: cluster inventory, the driver, the scheduler, job submission."""
