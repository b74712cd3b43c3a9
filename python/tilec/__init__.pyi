from ._model import CompiledModel as CompiledModel, compile as compile
from ._tilec import InvalidInputError as InvalidInputError, TilecError as TilecError

__version__: str
__all__: list[str]
