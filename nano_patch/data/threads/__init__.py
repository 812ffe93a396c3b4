"""The loader threads: ``num_workers=0`` batches on every core, the caller's torch state carried to them, the number of
threads, and the next batches made ahead while the step runs.
"""
