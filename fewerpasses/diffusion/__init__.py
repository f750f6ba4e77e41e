"""Masked block-diffusion decoding (LLaDA2.0) in MLX: the model and its block sampler."""
