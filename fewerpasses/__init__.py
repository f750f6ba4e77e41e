"""Fewer passes: ways for a model to read its weights less often per token, on MLX.

Five techniques, each an entry of the registry (fewerpasses/techniques.py) in its own
subpackage: layer skipping (`layerskip`, the model drafts with some sublayers skipped),
two-model speculative decoding (`twomodel`), prompt lookup (`lookup`), suffix drafting
(`suffix`) and diffusion generation (`diffusion`); beside them a bound, the perfect-draft
ceiling (`ceiling`). `measure` times each against plain greedy decoding with one paired protocol,
`quality` scores answers on question sets, and `report` builds the tables and figures.
"""

__version__ = "0.1.0"
