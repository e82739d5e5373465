"""Whole paths through kgtrace, each one call.

any_run    load any run folder: an embedding run or a prover run (kgtrace.load_run)
pipelines  train, then rank the test split, from a notebook (kgtrace.pipeline)
job        the main job, kgtrace run: train, evaluate, explain, report, resumable
doctor     kgtrace doctor: what this machine runs and how fast
"""
