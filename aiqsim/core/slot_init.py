"""A cheaper ``__init__`` for frozen, slotted dataclasses that the scheduler builds on every step.

``@dataclass(frozen=True)`` generates an ``__init__`` that sets each field with
``object.__setattr__(self, name, value)``: a global lookup, an attribute lookup and a call that
looks the name up in the class again, once per field. A task record (18 fields) then costs about
twice as much to build as a plain class, and the scheduler builds one or more per transition
(``TaskRecord``, ``ProviderRequest``, ``ProviderResponse``; issue #19). :func:`fast_frozen_init`
replaces that ``__init__`` with one generated the same way ``dataclasses`` does it, with the same
parameters, defaults and default factories, but storing each value through the slot's own
descriptor (what ``object.__setattr__`` ends up calling). The class stays frozen: assignment
still raises ``FrozenInstanceError``; equality, hashing, ``repr``, pickling and ``replace`` are
untouched.

Only the plain shape is supported (every field in ``__init__``, no keyword-only fields, no
``InitVar``, no ``__post_init__``); anything else is refused when the class is defined, so a
later change to such a class cannot silently lose behaviour.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from aiqsim.core.errors import ConfigurationError

C = TypeVar("C", bound=type)


class UnsupportedDataclassError(ConfigurationError, TypeError):
    """:func:`fast_frozen_init` was applied to a class whose ``__init__`` it cannot reproduce."""


_NO_ARGUMENT = object()  # the default of a field with a default factory: "not given"


def fast_frozen_init(cls: C) -> C:
    """Give the frozen slotted dataclass ``cls`` an equivalent, cheaper ``__init__`` (see module docs)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise UnsupportedDataclassError(f"{cls.__name__} is not a frozen dataclass with slots")
    if hasattr(cls, "__post_init__"):
        raise UnsupportedDataclassError(f"{cls.__name__} has __post_init__, which this __init__ would skip")
    fields = dataclasses.fields(cls)
    every = getattr(cls, dataclasses._FIELDS)  # type: ignore[attr-defined]
    if len(every) != len(fields):  # an InitVar or ClassVar pseudo-field takes part in __init__
        raise UnsupportedDataclassError(f"{cls.__name__} has InitVar or ClassVar fields")
    namespace: dict[str, Any] = {"_NO_ARGUMENT": _NO_ARGUMENT}
    parameters: list[str] = []
    body: list[str] = []
    for field in fields:
        name = field.name
        if not field.init or field.kw_only:
            raise UnsupportedDataclassError(f"{cls.__name__}.{name}: init=False or kw_only fields")
        namespace[f"_set_{name}"] = cls.__dict__[name].__set__
        if field.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{name}"] = field.default_factory
            parameters.append(f"{name}=_NO_ARGUMENT")
            body.append(f"    _set_{name}(self, _factory_{name}() if {name} is _NO_ARGUMENT else {name})")
        else:
            if field.default is not dataclasses.MISSING:
                namespace[f"_default_{name}"] = field.default
                parameters.append(f"{name}=_default_{name}")
            else:
                parameters.append(name)
            body.append(f"    _set_{name}(self, {name})")
    source = "\n".join([f"def __init__(self, {', '.join(parameters)}):", *body, "    return None"])
    exec(source, namespace)  # built from the dataclass's own field names only
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    cls.__init__ = init  # type: ignore[misc]
    return cls
