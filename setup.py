"""A shim for tools that still call ``setup.py``: the metadata lives in pyproject.toml alone."""

from setuptools import setup

setup()
