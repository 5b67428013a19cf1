"""The package version, read by pyproject.toml (setuptools' dynamic version) and recorded in saved results."""

__version__ = "0.1.0"
