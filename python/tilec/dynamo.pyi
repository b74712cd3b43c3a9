from typing import Any, Callable, Optional, Sequence

stats: dict[str, int]

def tilec_backend(
    gm: Any, example_inputs: Sequence[Any], options: Optional[dict[str, Any]] = None, mode: Optional[str] = None, **_: Any
) -> Callable[..., Any]: ...
def register() -> None: ...
