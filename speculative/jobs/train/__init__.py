"""The T5 trainer (`python -m speculative.train`): `run` (batches, losses, the training loop,
checkpoints, what OUTPUT_DIR holds) and its guards (settings checked before anything is read, the
job's fingerprint, the vocabulary against the model, numeric health), objective, resumption and
checkpoint retention."""
