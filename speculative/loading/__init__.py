"""From names to weights: the model, vocabulary and draft specs a job or notebook binds and their
loaders (`specs`), and the registry models fetched into the local cache (`fetch`)."""
