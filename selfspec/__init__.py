"""Self-speculative decoding by layer skipping, measured on MLX."""

__version__ = "0.1.0"
