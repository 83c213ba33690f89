"""The package version, importable by every layer without importing the package."""

__version__ = "0.2.0"
