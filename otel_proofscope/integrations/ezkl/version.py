"""The EZKL instrumentation's version (the contrib layout's ``version.py``): it ships
with otel_proofscope, so it is that package's version."""

from otel_proofscope.version import __version__

__all__ = ["__version__"]
