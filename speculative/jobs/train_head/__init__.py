"""The head-training job (`python -m speculative.train_head`): data.py (corpus windows and the
target's hidden states), train.py (objective, optimizer, held-out alpha), run.py (the job)."""
