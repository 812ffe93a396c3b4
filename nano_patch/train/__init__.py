"""Training helpers built on Lightning: core topology, the multi-instance strategy, callbacks."""
