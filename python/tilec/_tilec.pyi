"""The native module (crates/tilec-py)."""

from typing import Any, Callable, Optional, Sequence, Union

class TilecError(Exception):
    """A model that tilec cannot import, compile or run; the message says why."""

class InvalidInputError(TilecError):
    """Inputs that do not fit the model: a wrong name, count, dtype, rank or size."""

__version__: str

Dim = Union[int, str]
IoType = tuple[str, str, tuple[Dim, ...]]

class Session:
    def __init__(
        self,
        model: Union[str, bytes],
        target: str = "cpu",
        dims: Optional[dict[str, int]] = None,
        dtype: Optional[str] = None,
        opt_level: int = 3,
        threads: Optional[int] = None,
        winograd: bool = True,
        tuning: bool = True,
    ) -> None: ...
    @property
    def input_names(self) -> list[str]: ...
    @property
    def output_names(self) -> list[str]: ...
    @property
    def input_types(self) -> list[IoType]: ...
    @property
    def output_types(self) -> list[IoType]: ...
    @property
    def builds(self) -> int: ...
    def run(self, inputs: list[Any], alloc: Callable[[list[tuple[list[int], str]]], list[Any]], stream: Optional[int] = None) -> list[Any]: ...
    def explain(self, inputs: Optional[list[Any]] = None) -> str: ...
    def profile(self, inputs: Optional[list[Any]] = None, reps: int = 5) -> str: ...
