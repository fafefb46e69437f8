"""The English-German corpus behind `python -m speculative.ende_data`: its public sources and
dictionary (`sources`) and the cleaning and splitting (`clean`)."""
