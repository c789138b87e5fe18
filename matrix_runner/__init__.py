"""matrix-run: compare flash-attn versions side by side (see README.md and DEVELOPERS.md)."""
__version__ = "0.1.0"
