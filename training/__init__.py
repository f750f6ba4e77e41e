"""Training code for the embedded models in models/, kept outside the runtime package `fewerpasses`.

Run from the repository root (`pip install -e '.[train]'` first):
- ``python -m training.train --preset target --out models/stdlib-llama-12l`` (stdlib models);
- ``python -m training.train --preset smollm2-draft --teacher DIR --out models/smollm2-draft`` (the
  two-model draft distilled from SmolLM2-135M-Instruct; DIR is its converted MLX directory);
- ``python -m training.measure_draft --target DIR --draft models/smollm2-draft`` (the draft's
  measurements, with the package's protocol, and its card).

Imports go one way: train -> distill_train, diffusion_adapt -> common -> distill, and
measure_draft -> distill_train, common.
"""
