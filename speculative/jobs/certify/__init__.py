"""The certificate job: is speculative decoding exact on these models with these settings
(`measure.certificate`)? `config.py` holds its gin settings, `run.py` its order of work."""
