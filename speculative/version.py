"""The package version (one place: setup.py reads it from here without importing the package)."""

__version__ = "0.2.0"
