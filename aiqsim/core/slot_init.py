"""Cheaper construction and copying of frozen, slotted dataclasses built on every scheduler step.

``@dataclass(frozen=True)`` generates an ``__init__`` that sets each field with
``object.__setattr__(self, name, value)``: a global lookup, an attribute lookup and a call that
looks the name up in the class again, once per field. A task record (18 fields) then costs about
twice as much to build as a plain class, and the scheduler builds one or more per transition
(``TaskRecord``, ``ProviderRequest``, ``ProviderResponse``; issue #19).

The remedy here is a *mutable twin*: a class with exactly the same ``__slots__`` (so the same
memory layout) and no frozen ``__setattr__``. An object is filled in as the twin with plain
attribute stores (which CPython specialises for slots) and then turned into the frozen class by
assigning ``__class__``, which CPython allows between classes of identical layout.
:func:`fast_frozen_init` gives a class an ``__init__`` built this way, with the same parameters,
defaults and default factories as the dataclass's own; :func:`compile_copier` builds a
``copy(obj, changes)`` (``dataclasses.replace`` without its per-call introspection), through
:class:`FieldCopiers`: one generated copier per set of changed names. The class
stays frozen for everyone else: assignment still raises ``FrozenInstanceError``; equality,
hashing, ``repr``, pickling and ``replace`` are untouched.

Only the plain shape is supported (a direct subclass of ``object``, every field in ``__init__``,
no keyword-only fields, no ``InitVar``, no ``__post_init__``); anything else is refused when the
class is defined, so a later change to such a class cannot silently lose behaviour.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from aiqsim.core.errors import ConfigurationError

C = TypeVar("C", bound=type)


class UnsupportedDataclassError(ConfigurationError, TypeError):
    """:func:`fast_frozen_init` was applied to a class whose ``__init__`` it cannot reproduce."""


_NO_ARGUMENT = object()  # the default of a field with a default factory: "not given"


def _checked_fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    """The fields of ``cls``, after checking that its construction can be reproduced here."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise UnsupportedDataclassError(f"{cls.__name__} is not a frozen dataclass with slots")
    if cls.__bases__ != (object,):
        raise UnsupportedDataclassError(f"{cls.__name__} must derive from object only (its twin's layout)")
    if hasattr(cls, "__post_init__"):
        raise UnsupportedDataclassError(f"{cls.__name__} has __post_init__, which this __init__ would skip")
    fields = dataclasses.fields(cls)
    every = getattr(cls, dataclasses._FIELDS)  # type: ignore[attr-defined]
    if len(every) != len(fields):  # an InitVar or ClassVar pseudo-field takes part in __init__
        raise UnsupportedDataclassError(f"{cls.__name__} has InitVar or ClassVar fields")
    for field in fields:
        if not field.init or field.kw_only:
            raise UnsupportedDataclassError(f"{cls.__name__}.{field.name}: init=False or kw_only fields")
    return fields


def _mutable_twin(cls: type) -> type:
    """A plain class with the slots of ``cls`` (same layout, so ``__class__`` may be swapped)."""
    twin = cls.__dict__.get("__mutable_twin__")
    if twin is None:
        twin = type(f"_Mutable{cls.__name__}", (), {"__slots__": cls.__slots__, "__module__": cls.__module__})
        type.__setattr__(cls, "__mutable_twin__", twin)
    return twin


def fast_frozen_init(cls: C) -> C:
    """Give the frozen slotted dataclass ``cls`` an equivalent, cheaper ``__init__`` (see module docs)."""
    fields = _checked_fields(cls)
    namespace: dict[str, Any] = {
        "_NO_ARGUMENT": _NO_ARGUMENT,
        "_become": object.__setattr__,
        "_Twin": _mutable_twin(cls),
        "_Frozen": cls,
    }
    parameters: list[str] = []
    body = ["    _become(self, '__class__', _Twin)"]  # the frozen __setattr__ refuses even __class__
    for field in fields:
        name = field.name
        if field.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{name}"] = field.default_factory
            parameters.append(f"{name}=_NO_ARGUMENT")
            body.append(f"    self.{name} = _factory_{name}() if {name} is _NO_ARGUMENT else {name}")
        else:
            if field.default is not dataclasses.MISSING:
                namespace[f"_default_{name}"] = field.default
                parameters.append(f"{name}=_default_{name}")
            else:
                parameters.append(name)
            body.append(f"    self.{name} = {name}")
    body.append("    self.__class__ = _Frozen")
    source = "\n".join([f"def __init__(self, {', '.join(parameters)}):", *body])
    exec(source, namespace)  # built from the dataclass's own field names only
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    cls.__init__ = init  # type: ignore[misc]
    return cls


class FieldCopiers:
    """``copy(obj, changes)`` functions for ``cls``, one per set of changed field names.

    Each one is generated for its names: plain slot stores from ``obj`` for the unchanged fields and
    from ``changes`` for the changed ones, then the frozen class; no loop over ``changes`` and no
    ``setattr`` call per changed field. The scheduler changes the same few fields at each step (a
    status change: 2-4 of a task record's 18), so a handful of copiers serve a whole run;
    :meth:`copier` builds one on first use and keeps up to :data:`MAX_SHAPES` of them.
    """

    MAX_SHAPES = 256
    """Copiers kept per class; a program that changes ever new combinations builds the rest anew."""

    def __init__(self, cls: type) -> None:
        fields = _checked_fields(cls)
        self.names = tuple(field.name for field in fields)
        self.known = frozenset(self.names)
        self.cache: dict[tuple[str, ...], Callable[[Any, dict[str, Any]], Any]] = {}
        """Built copiers by the changed names, in ``changes``' order (read it directly on a hot path)."""
        self._namespace: dict[str, Any] = {
            "_new": object.__new__,
            "_Twin": _mutable_twin(cls),
            "_Frozen": cls,
        }

    def copier(self, changed: tuple[str, ...]) -> Callable[[Any, dict[str, Any]], Any]:
        """The copier that takes the fields named in ``changed`` from ``changes``; ``TypeError`` for
        a name that is not a field of the class."""
        copy = self.cache.get(changed)
        if copy is not None:
            return copy
        unknown = [name for name in changed if name not in self.known]
        if unknown:
            raise TypeError(f"{self._namespace['_Frozen'].__name__} has no field(s) {sorted(unknown)}")
        taken = set(changed)
        lines = ["def copy(obj, changes):", "    new = _new(_Twin)"]
        lines += [
            f"    new.{name} = changes[{name!r}]" if name in taken else f"    new.{name} = obj.{name}"
            for name in self.names
        ]
        lines += ["    new.__class__ = _Frozen", "    return new"]
        namespace = dict(self._namespace)
        exec("\n".join(lines), namespace)  # built from the dataclass's own field names only
        copy = namespace["copy"]
        if len(self.cache) < self.MAX_SHAPES:
            self.cache[changed] = copy
        return copy  # type: ignore[no-any-return]


def compile_copier(cls: type) -> Callable[[Any, dict[str, Any]], Any]:
    """``copy(obj, changes)``: a new ``cls`` with the fields of ``obj``, except those in ``changes``.

    A name in ``changes`` that is not a field raises ``TypeError`` (``dataclasses.replace`` raises
    one too). Dispatches to :class:`FieldCopiers`' copier for the changed names.
    """
    copiers = FieldCopiers(cls)
    cache = copiers.cache
    build = copiers.copier

    def copy(obj: Any, changes: dict[str, Any]) -> Any:
        changed = tuple(changes)
        specialised = cache.get(changed)
        if specialised is None:
            specialised = build(changed)
        return specialised(obj, changes)

    return copy
