import os
from typing import Any, Mapping, Optional, Sequence, Union

from ._tilec import IoType

Tensor = Any  # a NumPy array, a PyTorch tensor, or anything numpy.asarray reads
Inputs = Union[Mapping[str, Tensor], Sequence[Tensor], Tensor]

class CompiledModel:
    input_names: list[str]
    output_names: list[str]
    @property
    def input_types(self) -> list[IoType]: ...
    @property
    def output_types(self) -> list[IoType]: ...
    @property
    def builds(self) -> int: ...
    def run(self, inputs: Inputs) -> list[Any]: ...
    def __call__(self, inputs: Inputs) -> list[Any]: ...
    def explain(self, inputs: Optional[Inputs] = None) -> str: ...
    def profile(self, inputs: Optional[Inputs] = None, reps: int = 5) -> str: ...

def compile(
    model: Union[str, os.PathLike[str], bytes, Any],
    target: str = "cpu",
    dims: Optional[Mapping[str, int]] = None,
    dtype: Optional[str] = None,
    *,
    opt_level: int = 3,
    threads: Optional[int] = None,
    winograd: bool = True,
    tuning: bool = True,
) -> CompiledModel: ...
