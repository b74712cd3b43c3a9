"""`tilec.compile` and `CompiledModel`: sessions over NumPy arrays and PyTorch tensors."""

import os

import numpy as np

from ._tilec import InvalidInputError, Session


def _model_arg(model):
    """A path or ONNX bytes from what `compile` accepts."""
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model)
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    if hasattr(model, "SerializeToString"):  # an onnx.ModelProto
        return model.SerializeToString()
    raise InvalidInputError(
        f"model: expected a path, ONNX bytes or an onnx.ModelProto, got {type(model).__name__}"
    )


def _torch():
    import sys

    return sys.modules.get("torch")


def _tensor_arg(x, dtype):
    """A dense tensor DLPack can export: NumPy arrays and PyTorch tensors as they are when
    already contiguous (no copy), anything else (lists, scalars) through `numpy.asarray` with
    the input's declared `dtype`."""
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous or not x.flags.writeable:
            # DLPack (legacy capsules) cannot export read-only arrays.
            x = np.array(x, order="C")
        return x
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        if x.requires_grad:
            x = x.detach()
        return x if x.is_contiguous() else x.contiguous()
    try:
        return np.ascontiguousarray(np.asarray(x, dtype=dtype))
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"cannot read {type(x).__name__} as a {dtype} tensor: {e}") from None


def _alloc_numpy(spec):
    try:
        return [np.empty(shape, dtype) for shape, dtype in spec]
    except TypeError as e:
        raise InvalidInputError(f"an output's dtype has no NumPy equivalent ({e}); give PyTorch tensors") from None


def _alloc_like(device):
    torch = _torch()

    def alloc(spec):
        return [torch.empty(shape, dtype=getattr(torch, dtype), device=device) for shape, dtype in spec]

    return alloc


class CompiledModel:
    """A model compiled by tilec. Run it with `run(inputs)`."""

    def __init__(self, session):
        self._s = session
        self.input_names = session.input_names
        self.output_names = session.output_names
        self._index = {n: i for i, n in enumerate(self.input_names)}
        # NumPy's name of each input's dtype (None where NumPy has none, e.g. bfloat16).
        self._dtypes = [d if d != "bfloat16" and not d.startswith("float8") else None for _, d, _ in session.input_types]

    @property
    def input_types(self):
        """`[(name, dtype, shape)]`; a symbolic dimension is its name (a string)."""
        return self._s.input_types

    @property
    def output_types(self):
        """`[(name, dtype, shape)]` as the model declares them."""
        return self._s.output_types

    @property
    def builds(self):
        """How many builds were compiled: one per binding of the symbolic dimensions."""
        return self._s.builds

    def _ordered(self, inputs):
        if isinstance(inputs, dict):
            unknown = [k for k in inputs if k not in self._index]
            if unknown:
                raise InvalidInputError(
                    f"the model has no input {unknown[0]!r} (its inputs: {', '.join(self.input_names)})"
                )
            missing = [n for n in self.input_names if n not in inputs]
            if missing:
                raise InvalidInputError(
                    f"input {missing[0]!r} is missing (the model's inputs: {', '.join(self.input_names)})"
                )
            return [_tensor_arg(inputs[n], d) for n, d in zip(self.input_names, self._dtypes)]
        if isinstance(inputs, (list, tuple)):
            return [_tensor_arg(x, d) for x, d in zip(inputs, self._dtypes + [None] * len(inputs))]
        if len(self.input_names) == 1:
            return [_tensor_arg(inputs, self._dtypes[0])]
        raise InvalidInputError(
            f"inputs: expected a dict by name or a list in input order ({', '.join(self.input_names)})"
        )

    def run(self, inputs):
        """Runs the model; `inputs` is a dict of arrays or tensors by input name or a list in input
        order. Returns the outputs in output order: NumPy arrays, or PyTorch tensors on the
        inputs' device when the first input is one."""
        args = self._ordered(inputs)
        torch = _torch()
        stream = None
        if args and torch is not None and isinstance(args[0], torch.Tensor):
            alloc = _alloc_like(args[0].device)
            if args[0].is_cuda:
                # The inputs may still be written by kernels queued on PyTorch's stream, and
                # the outputs' memory reused from tensors it has queued work on: tilec's
                # stream waits for it.
                stream = torch.cuda.current_stream(args[0].device).cuda_stream
        else:
            alloc = _alloc_numpy
        return self._s.run(args, alloc, stream)

    __call__ = run

    def explain(self, inputs=None):
        """The kernel partition and each kernel's family: for `inputs`' shapes, else the last
        run's (a model without symbolic dimensions needs neither)."""
        return self._s.explain(None if inputs is None else self._ordered(inputs))

    def profile(self, inputs=None, reps=5):
        """Runs `inputs` (else zeros shaped as the last run's inputs) `reps` times kernel by
        kernel and returns the per-kernel time table."""
        return self._s.profile(None if inputs is None else self._ordered(inputs), reps)

    def __repr__(self):
        return f"CompiledModel(inputs={self.input_names}, outputs={self.output_names})"


def compile(model, target="cpu", dims=None, dtype=None, **options):
    """Imports an ONNX model and prepares it for `target` ("cpu", "cuda" or "cuda:N").

    - `model`: a path, the bytes of an ONNX file, or an `onnx.ModelProto`.
    - `dims`: fixed sizes of named symbolic dimensions, e.g. ``{"batch": 1}``; the others are
      bound from each call's inputs.
    - `dtype`: ``"float16"`` or ``"bfloat16"`` runs the model in 16 bits (inputs and outputs stay
      as declared); None keeps the model's types.
    - `options`: ``opt_level`` (0 to 3, default 3), ``threads`` (CPU; default all cores),
      ``winograd`` (default True), ``tuning`` (use the tuning database, default True).

    Raises `TilecError` when the model cannot be imported (the message names the node and op),
    `InvalidInputError` for bad arguments.
    """
    known = {"opt_level", "threads", "winograd", "tuning"}
    bad = sorted(set(options) - known)
    if bad:
        raise InvalidInputError(f"unknown option {bad[0]!r} (known: {', '.join(sorted(known))})")
    if dims is not None and not isinstance(dims, dict):
        raise InvalidInputError("dims: expected a dict of dimension name to size")
    if dtype is not None and not isinstance(dtype, str):
        try:
            dtype = np.dtype(dtype).name  # numpy.float16
        except TypeError:
            dtype = str(dtype).replace("torch.", "")  # torch.bfloat16
    return CompiledModel(Session(_model_arg(model), target, dims, dtype, **options))
