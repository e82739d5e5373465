"""The foundation every other package stands on.

errors      KgtraceError and its kinds: messages that name the input and the fix
config      TrainConfig: a training run's settings, validated on construction
specs       ModelSpec and the model registry: each model's traits, declared once beside it
io          atomic writes, locks, and reading user files with errors that name them
owned       what kgtrace wrote and may replace: ownership marks, retiring, indexed outputs
layout      the files of a run folder, by name
checkpoint  checkpoint files: writing, reading with weights_only=True, their index
"""
