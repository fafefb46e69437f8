"""The demo (`python -m speculative.demo`): loading the pair, decoding every batch by plain then
speculative decoding, and the result beside Thm 3.8 (`run`)."""
