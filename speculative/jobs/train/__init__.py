"""The T5 trainer's guards (`python -m speculative.train`): settings checked before anything is
read, the job's fingerprint, the vocabulary against the model, numeric health."""
