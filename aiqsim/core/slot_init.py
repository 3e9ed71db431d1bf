"""Cheaper construction and copying of frozen, slotted dataclasses built on every scheduler step.

``@dataclass(frozen=True)`` generates an ``__init__`` that sets each field with
``object.__setattr__(self, name, value)``: a global lookup, an attribute lookup and a call that
looks the name up in the class again, once per field. A task record (18 fields) then costs about
twice as much to build as a plain class, and the scheduler builds one or more per transition
(``TaskRecord``, ``ProviderRequest``, ``ProviderResponse``).

The remedy here is a *mutable twin*: a class with exactly the same ``__slots__`` (so the same
memory layout) and no frozen ``__setattr__``. An object is filled in as the twin with plain
attribute stores (which CPython specialises for slots) and then turned into the frozen class by
assigning ``__class__``, which CPython allows between classes of identical layout.
:func:`fast_frozen_init` gives a class an ``__init__`` built this way, with the same parameters,
defaults and default factories as the dataclass's own; :func:`compile_builder` a plain function that
builds one from the same arguments (calling a class on CPython 3.11 packs its arguments into a
tuple and a dict first: the scheduler's hot paths call builders); :func:`compile_copier` builds a
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


def _checked_fields(cls: type, *, frozen: bool = True) -> tuple[dataclasses.Field[Any], ...]:
    """The fields of ``cls``, after checking that its construction can be reproduced here
    (a frozen dataclass with slots; any dataclass with slots when ``frozen`` is False)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or (frozen and not params.frozen) or "__slots__" not in cls.__dict__:
        kind = "frozen dataclass" if frozen else "dataclass"
        raise UnsupportedDataclassError(f"{cls.__name__} is not a {kind} with slots")
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


def _filling_function(
    cls: type,
    fields: tuple[dataclasses.Field[Any], ...],
    name: str,
    leading: tuple[str, ...],
    first: str,
    last: tuple[str, ...],
) -> Callable[..., Any]:
    """A generated function ``name(*leading, <the fields as __init__ takes them>)``: the line
    ``first``, one plain slot store on ``self`` per field (defaults and default factories as the
    dataclass's own ``__init__``), then the lines ``last``. Built from the field names only."""
    namespace: dict[str, Any] = {
        "_NO_ARGUMENT": _NO_ARGUMENT,
        "_become": object.__setattr__,
        "_new": object.__new__,
        "_Twin": _mutable_twin(cls) if cls.__dataclass_params__.frozen else cls,  # type: ignore[attr-defined]
        "_Frozen": cls,
    }
    parameters: list[str] = []
    body = [f"    {first}"]
    for field in fields:
        field_name = field.name
        if field.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{field_name}"] = field.default_factory
            parameters.append(f"{field_name}=_NO_ARGUMENT")
            made = f"_factory_{field_name}()"
            body.append(f"    self.{field_name} = {made} if {field_name} is _NO_ARGUMENT else {field_name}")
        else:
            if field.default is not dataclasses.MISSING:
                namespace[f"_default_{field_name}"] = field.default
                parameters.append(f"{field_name}=_default_{field_name}")
            else:
                parameters.append(field_name)
            body.append(f"    self.{field_name} = {field_name}")
    body += [f"    {line}" for line in last]
    exec("\n".join([f"def {name}({', '.join([*leading, *parameters])}):", *body]), namespace)
    return namespace[name]  # type: ignore[no-any-return]


def fast_frozen_init(cls: C) -> C:
    """Give the frozen slotted dataclass ``cls`` an equivalent, cheaper ``__init__`` (see module docs)."""
    fields = _checked_fields(cls)
    # the frozen __setattr__ refuses even __class__: the object becomes the twin through object's
    init = _filling_function(
        cls, fields, "__init__", ("self",), "_become(self, '__class__', _Twin)", ("self.__class__ = _Frozen",)
    )
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    cls.__init__ = init  # type: ignore[misc]
    return cls


def compile_builder(cls: type) -> Callable[..., Any]:
    """A function that builds a ``cls`` from the arguments ``cls(...)`` takes (the same
    parameters, defaults and default factories), for the slotted dataclass ``cls``, frozen or not,
    or the ``NamedTuple`` ``cls``.

    For the scheduler's hot paths: on CPython 3.11 calling a class is not specialised, so each
    ``cls(...)`` builds an argument tuple (and a dict for keyword arguments) before ``__init__``
    even runs; a call of a plain function passes its arguments as they are. A frozen class is
    filled in as its mutable twin and then becomes itself, as in :func:`fast_frozen_init`. The
    result is an ordinary ``cls``: equal to, and indistinguishable from, one made by ``cls(...)``.
    """
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return _named_tuple_builder(cls)
    params = getattr(cls, "__dataclass_params__", None)
    frozen = params is not None and params.frozen
    fields = _checked_fields(cls, frozen=frozen)
    last = ("self.__class__ = _Frozen", "return self") if frozen else ("return self",)
    # a frozen class's twin has no __init__ of its own: calling it makes an empty object more cheaply
    # than object.__new__(twin), which parses its arguments (a non-frozen class's __init__ would run)
    first = "self = _Twin()" if frozen else "self = _new(_Twin)"
    build = _filling_function(cls, fields, f"new_{cls.__name__}", (), first, last)
    build.__qualname__ = build.__name__
    build.__module__ = cls.__module__
    build.__doc__ = f"A new :class:`{cls.__name__}`, as ``{cls.__name__}(...)`` (see aiqsim.core.slot_init)."
    return build


def _named_tuple_builder(cls: type) -> Callable[..., Any]:
    """:func:`compile_builder` for a ``NamedTuple``: its fields and defaults, then ``tuple.__new__``
    (what the class's own ``__new__`` does, after the class call it is reached through)."""
    names: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
    defaults: dict[str, Any] = cls._field_defaults  # type: ignore[attr-defined]
    namespace: dict[str, Any] = {"_tuple_new": tuple.__new__, "_Cls": cls}
    parameters = []
    for name in names:
        if name in defaults:
            namespace[f"_default_{name}"] = defaults[name]
            parameters.append(f"{name}=_default_{name}")
        else:
            parameters.append(name)
    function = f"new_{cls.__name__}"
    values = "".join(f"{name}, " for name in names)
    exec(f"def {function}({', '.join(parameters)}):\n    return _tuple_new(_Cls, ({values}))", namespace)
    build = namespace[function]
    build.__module__ = cls.__module__
    build.__doc__ = f"A new :class:`{cls.__name__}`, as ``{cls.__name__}(...)`` (see aiqsim.core.slot_init)."
    return build  # type: ignore[no-any-return]


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
        # the twin has no __init__: calling it is the cheap way to an empty object (see compile_builder)
        lines = ["def copy(obj, changes):", "    new = _Twin()"]
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


def compile_copier(cls: type, copiers: FieldCopiers | None = None) -> Callable[[Any, dict[str, Any]], Any]:
    """``copy(obj, changes)``: a new ``cls`` with the fields of ``obj``, except those in ``changes``.

    A name in ``changes`` that is not a field raises ``TypeError`` (``dataclasses.replace`` raises
    one too). Dispatches to :class:`FieldCopiers`' copier for the changed names (``copiers``, given
    when a hot path also reads their cache itself; else new ones for ``cls``).
    """
    if copiers is None:
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
