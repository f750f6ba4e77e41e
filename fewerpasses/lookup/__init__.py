"""Prompt-lookup decoding: drafts copied from the context by n-gram match, verified by the full model."""
