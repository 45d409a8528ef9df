"""Quantization robustness (docs/quantization.md): outlier statistics of the blocks' linear-layer inputs, the
simulated W8A8 quantization as a post-hoc edit (registered on import) and its typed result (`results/quant.json`)."""

from vitsinks.quant.outliers import block_layers, input_maxima, layer_paths, linear_input_stats, pearson_kurtosis
from vitsinks.quant.quant_results import QuantResult
from vitsinks.quant.w8a8 import W8A8, fake_quant, qmax, scale_of

__all__ = ["W8A8", "QuantResult", "block_layers", "fake_quant", "input_maxima", "layer_paths",
           "linear_input_stats", "pearson_kurtosis", "qmax", "scale_of"]
