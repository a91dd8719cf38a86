"""The package version, also recorded as the processor version in checkpoint manifests."""

__version__ = "0.2.0"
