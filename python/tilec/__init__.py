"""tilec: an AI compiler for ONNX models, from Python.

    import numpy as np, tilec
    m = tilec.compile("model.onnx")                  # a path, ONNX bytes or an onnx.ModelProto
    (y,) = m.run({"x": np.ones((1, 3, 224, 224), np.float32)})

and, with PyTorch installed, ``torch.compile(model, backend="tilec")``.

A model is imported once; it is compiled for the input shapes of the first call, and again for
each new binding of its symbolic dimensions (one build per binding, kept). Inputs and outputs
are NumPy arrays or PyTorch tensors, read and written in place through DLPack.
"""

import sys as _sys

from ._tilec import InvalidInputError, TilecError, __version__
from ._model import CompiledModel, compile

__all__ = ["compile", "CompiledModel", "TilecError", "InvalidInputError", "__version__"]

# torch.compile finds the backend through the package's entry point; when torch is already
# loaded, register it now too (importing tilec never imports torch).
if "torch" in _sys.modules:
    from . import dynamo as _dynamo

    _dynamo.register()
