"""The loop: a worker claims due instances, runs their attempts concurrently, and commits
their outcomes through the fault model (error budget, backoff, restarts). Never imports the
CLI, the console or the sensors."""
