"""Griffe extension for the API reference: the docstrings' Sphinx roles become links.

The code's docstrings are reStructuredText-flavoured: they cross-reference with Sphinx roles
(``:class:`~aiqsim.x.Y```, ``:func:``, ``:meth:``, ``:mod:``, ``:attr:``, ``:data:``, ``:exc:``,
``:obj:``, ``:const:``), which Markdown shows literally. Once a package is loaded, every docstring in
it is rewritten: each role becomes an mkdocs-autorefs reference whose title is the name in inline
code (``~`` keeps only its last part, an explicit ``title <target>`` keeps the title). A
literal-block marker (``Example::`` before an indented block) becomes a colon: the indented block is
code in Markdown as it is.

A target is qualified before it is linked: a dotted ``aiqsim.`` path is used as written; a short
name (``Scheduler.submit``, ``submit``) is resolved in the scope of the object whose docstring it is,
as Python would resolve it there (its module's imports, its class's members). Each reference is
*optional*: mkdocs-autorefs links it when the site documents its target, and otherwise leaves the
inline code unlinked (a builtin such as ``ValueError``, a private helper), so a role never becomes a
broken link in the strict build. tests/test_docs.py checks that no role is left anywhere on the site.
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Callable
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`(?P<body>[^`]+)`")
"""A Sphinx cross-reference role with its target (``:class:`~aiqsim.x.Y```)."""
LITERAL_BLOCK = re.compile(r"(?:(?<=\S)|[ \t]+):(:)[ \t]*$(?=\n[ \t]*\n)", re.M)
"""reST's ``text::`` before an indented block: the block is code in Markdown too; the ``::`` goes."""
EXPLICIT = re.compile(r"^(?P<title>.*?)\s*<(?P<target>[^<>]+)>$", re.S)


def canonical(path: str) -> str:
    """``path`` through the module that defines it (``aiqsim.fleet.RedisQuota``, which the room imports
    lazily, is documented as ``aiqsim.fleet.redis_quota.RedisQuota``); as given when it cannot be imported."""
    import importlib

    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for index, name in enumerate(parts[cut:], start=cut):
            try:
                obj = getattr(obj, name)
            except AttributeError:
                return path
            module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
            if isinstance(obj, type) and isinstance(module, str) and module.startswith("aiqsim"):
                rest = parts[index + 1 :]
                return ".".join([module, qualname, *rest]) if isinstance(qualname, str) else path
            if isinstance(obj, type) and index == len(parts) - 1:
                return _room_path(parts[:2], name, obj) or path
        return path
    return path


def _room_path(room_parts: list[str], name: str, obj: object) -> str | None:
    """``aiqsim.room.name`` when that room exports ``obj`` under ``name`` (a class defined outside
    aiqsim, such as ``aiqsim.runtime.Cancelled``, is documented under the room that exports it)."""
    import importlib

    try:
        room = importlib.import_module(".".join(room_parts))
    except ImportError:
        return None
    exported = name in getattr(room, "__all__", ()) and getattr(room, name, None) is obj
    return f"{room.__name__}.{name}" if exported else None


def qualify(target: str, scope: griffe.Object) -> str | None:
    """The full dotted path of ``target`` as seen from ``scope``, or None when it cannot be resolved."""
    target = target.strip().rstrip("()")
    if target.startswith("aiqsim.") or target == "aiqsim":
        return canonical(target)
    first, dot, rest = target.partition(".")
    node: griffe.Object | None = scope
    while node is not None:
        try:
            path = node.resolve(first)
        except (griffe.NameResolutionError, AttributeError, KeyError):
            node = node.parent
            continue
        return canonical(f"{path}{dot}{rest}") if path.startswith("aiqsim") else None
    return None


def _qualify_in(scope: griffe.Object, target: str) -> str | None:
    return qualify(target, scope)


def convert(text: str, resolve: Callable[[str], str | None]) -> str:
    """``text`` with every Sphinx role replaced by an optional autorefs reference in inline code.

    ``resolve`` gives a role's target its full dotted path (None: inline code, no link)."""

    def replace(match: re.Match[str]) -> str:
        body = match.group("body").strip()
        explicit = EXPLICIT.match(body)
        if explicit:
            title, target = explicit.group("title"), explicit.group("target")
        else:
            target = body
            title = body.lstrip("~").rsplit(".", 1)[-1] if body.startswith("~") else body
        target = target.lstrip("~.")
        code = f"<code>{html.escape(title)}</code>"
        path = resolve(target)
        if path is None:
            return code
        return f'<autoref identifier="{html.escape(path)}" optional>{code}</autoref>'

    text = LITERAL_BLOCK.sub(lambda match: ":" if not match.group(0).startswith((" ", "\t")) else "", text)
    return ROLE.sub(replace, text)


class SphinxRoles(griffe.Extension):
    """Rewrite the Sphinx roles of every docstring of a loaded package (see the module docs)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        seen: set[int] = set()
        stack: list[griffe.Object] = [pkg]
        while stack:
            obj = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = convert(obj.docstring.value, functools.partial(_qualify_in, obj))
            stack.extend(member for member in obj.members.values() if not member.is_alias)
