"""``num_workers=N``: virtual workers (their eligibility, iterator, streams, seeds and frozen state), their stand-in
processes, and the step the patch adds to stock's worker processes.
"""
