"""Data recipes: the scripted preparation of a corpus, one package each (`ende`)."""
