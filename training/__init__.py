"""Training code for the embedded models in models/, kept outside the runtime package `selfspec`.

Run from the repository root (`pip install -e '.[train]'` first):
- ``python -m training.train --preset target --out models/stdlib-llama-12l`` (stdlib models);
- ``python -m training.train --preset smollm2-draft --teacher DIR --out models/smollm2-draft`` (the
  two-model draft distilled from SmolLM2-135M-Instruct; DIR is its converted MLX directory).
"""
