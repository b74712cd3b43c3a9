"""`torch.compile(model, backend="tilec")`: the backend Dynamo calls with each FX graph.

Each graph Dynamo hands over (one per guard set; a graph break gives several) is exported to
ONNX with PyTorch's dynamo exporter and compiled by tilec once; the returned function runs it
on the call's tensors. Dimensions Dynamo made dynamic become symbolic dimensions of the ONNX
model, which tilec binds per call (one build per distinct size, kept).

Parameters and buffers are compiled in as constants (an inference compile, as Inductor's
freezing): ``options={"freeze": False}`` keeps them as inputs. A graph tilec cannot compile
(an unsupported op, a graph that needs autograd, an export failure) runs eagerly, with one
warning naming the op or the reason; the backend never raises for it.

Options, as for Inductor: ``torch.compile(m, backend="tilec", options={...})`` with
``target`` ("cpu", "cuda"), ``dtype`` ("float16", "bfloat16"), ``freeze``, and any option of
`tilec.compile` (``opt_level``, ``threads``, ...).
"""

import logging
import re
import warnings

import torch

from ._model import _alloc_like, compile as _compile
from ._tilec import TilecError

_warned = set()

# Graphs compiled by tilec and graphs left to run eagerly, since the process started.
stats = {"compiled": 0, "eager": 0}


def _warn_once(reason):
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"tilec: {reason}; this graph runs eagerly", stacklevel=3)


def _op_of(err):
    """The ONNX op type an import error names (`node 'x' (OpType, opset N): ...`)."""
    m = re.search(r"node '[^']*' \(([A-Za-z0-9_.]+)", str(err))
    return m.group(1) if m else None


def _export_cause(err):
    """The cause of an ONNX export failure in one line: the exporter's "Exception summary"
    (`<class 'X'>: message`) when it has one, else the first line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err))
    m = re.search(r"<class '([\w.]+)'>: (.+)", text)
    line = f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2)}" if m else (text.strip().splitlines() or [type(err).__name__])[0]
    return line[:240]


def _is_state(node, x):
    """Whether a placeholder is a module's parameter or buffer, which Dynamo lifts to graph
    inputs named after their source (`L_self_modules_bn_buffers_running_mean_`)."""
    return isinstance(x, torch.nn.Parameter) or re.search(r"_(parameters|buffers)_", str(node.target)) is not None


class _Exported(torch.nn.Module):
    """The graph with its tensor inputs only: SymInt inputs are computed from the tensors'
    sizes, constant inputs (frozen state) are attributes."""

    def __init__(self, gm, plan, consts):
        super().__init__()
        self.gm = gm
        self.plan = plan  # per graph input: ("arg", i) | ("const", name) | ("size", i, dim)
        for name, t in consts.items():
            self.register_buffer(name, t, persistent=False)

    def forward(self, *args):
        full = []
        for p in self.plan:
            if p[0] == "arg":
                full.append(args[p[1]])
            elif p[0] == "const":
                full.append(getattr(self, p[1]))
            else:
                full.append(args[p[1]].shape[p[2]])
        return self.gm(*full)


def _plan(gm, example_inputs, freeze):
    """How each graph input is fed (see `_Exported`), the constants, the example tensor inputs,
    their positions among the graph's inputs, and which of their dimensions are dynamic."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise _Fallback("the graph's inputs do not match its example inputs")
    plan, consts, args, dynamic, positions = [], {}, [], [], []
    sym_at = {}  # symbol text -> (arg index, dim)
    for pos, (node, x) in enumerate(zip(placeholders, example_inputs)):
        val = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(x, torch.Tensor):
            if freeze and _is_state(node, x):
                name = f"c{len(consts)}"
                consts[name] = x.detach()
                plan.append(("const", name))
                continue
            i = len(args)
            args.append(x)
            positions.append(pos)
            dims = {}
            shape = getattr(val, "shape", x.shape)
            for d, s in enumerate(shape):
                if isinstance(s, torch.SymInt):
                    key = str(s.node.expr)
                    sym_at.setdefault(key, (i, d))
                    dims[d] = key
            dynamic.append(dims)
            plan.append(("arg", i))
        elif isinstance(x, (int, torch.SymInt)):
            key = str(val.node.expr) if isinstance(val, torch.SymInt) else None
            plan.append(("size", key))
        else:
            raise _Fallback(f"a graph input of type {type(x).__name__}")
    for k, p in enumerate(plan):
        if p[0] == "size":
            if p[1] not in sym_at:
                raise _Fallback("an integer input that no tensor dimension carries")
            plan[k] = ("size",) + sym_at[p[1]]
    return plan, consts, args, positions, dynamic


class _Fallback(Exception):
    pass


def _to_onnx(gm, example_inputs, freeze):
    plan, consts, args, positions, dynamic = _plan(gm, example_inputs, freeze)
    module = _Exported(gm, plan, consts)
    names = {}
    shapes = []
    for dims in dynamic:
        spec = {}
        for d, key in dims.items():
            if key not in names:
                names[key] = torch.export.Dim(f"s{len(names)}", min=1)
            spec[d] = names[key]
        shapes.append(spec or None)
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the exporter's notes (optional torchvision ops, ...)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prog = torch.onnx.export(
                module,
                tuple(args),
                dynamo=True,
                dynamic_shapes=(tuple(shapes),) if names else None,  # forward(*args)
                verbose=False,
            )
    finally:
        quiet.setLevel(level)
    return prog.model_proto.SerializeToString(), positions


def _compile_graph(gm, example_inputs, options):
    opts = dict(options or {})
    freeze = bool(opts.pop("freeze", True))
    target = opts.pop("target", "cpu")
    dtype = opts.pop("dtype", None)
    if dtype is not None and not isinstance(dtype, str):
        dtype = str(dtype).replace("torch.", "")
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
        # The compiled graph has no backward: gradients need eager (or Inductor).
        raise _Fallback("the graph needs autograd; tilec compiles inference graphs (run under torch.no_grad())")
    outs = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    if not isinstance(outs, (tuple, list)) or not all(isinstance(o, torch.fx.Node) for o in outs):
        raise _Fallback("the graph returns values other than tensors")
    try:
        onnx_bytes, keep = _to_onnx(gm, example_inputs, freeze)
    except _Fallback:
        raise
    except Exception as e:  # the exporter's errors are many and long: keep the cause
        raise _Fallback(f"the ONNX export failed: {_export_cause(e)}") from None
    try:
        model = _compile(onnx_bytes, target=target, dtype=dtype, **opts)
    except TilecError as e:
        op = _op_of(e)
        raise _Fallback(f"op {op} is not supported" if op and "unsupported" in str(e) else f"{str(e)[:300]}") from None
    if len(model.output_names) != len(outs):
        raise _Fallback("the exported model's outputs do not match the graph's")
    if len(model.input_names) != len(keep):
        raise _Fallback("the exported model's inputs do not match the graph's")
    return model, keep, isinstance(outs, list)


def tilec_backend(gm, example_inputs, options=None, mode=None, **_):
    """The Dynamo backend. Compiling happens on the first call, outside Dynamo's tracing (the
    exporter traces the graph again with its own shape environment), with the call's real
    tensors; that build serves every later call of this guard set, or the graph runs eagerly
    if tilec cannot take it."""
    state = {}

    def first(args):
        try:
            model, keep, as_list = _compile_graph(gm, list(args), options)
        except _Fallback as e:
            _warn_once(str(e))
            state["eager"] = True
            stats["eager"] += 1
            return
        stats["compiled"] += 1
        state.update(session=model._s, keep=keep, as_list=as_list, model=model)

    def run(*args):
        if not state:
            first(args)
        if "eager" in state:
            return gm.forward(*args)
        xs = []
        for k in state["keep"]:
            x = args[k]
            if x.requires_grad:
                x = x.detach()
            xs.append(x if x.is_contiguous() else x.contiguous())
        device = xs[0].device if xs else torch.device("cpu")
        try:
            outs = state["session"].run(xs, _alloc_like(device))
        except TilecError as e:
            _warn_once(f"running the compiled graph failed ({str(e)[:200]})")
            return gm.forward(*args)
        return outs if state["as_list"] else tuple(outs)

    run.tilec_state = state
    return run


def register():
    """Registers the backend under the name "tilec" (idempotent)."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "tilec" not in _BACKENDS:
        register_backend(tilec_backend, name="tilec")
