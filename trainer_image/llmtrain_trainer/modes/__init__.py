"""Training code other than the built-in loop (spec.trainer): `huggingface` (a transformers.Trainer
over the platform's model and data) and `custom` (the user's function).

Every mode runs inside the same Ray Train worker group with the same run directory, so the pieces
around the training code are shared (`run.py`): progress records, checkpoints registered with Ray
Train, and the result file a finished run leaves.
"""
