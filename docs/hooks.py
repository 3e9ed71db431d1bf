"""MkDocs hooks: the parts of the site that are generated from the code at build time, so they cannot drift.

A page asks for a generated block with a marker line ``<!-- aiqsim:NAME -->``:

* ``transitions``    the task (and job) transition table, from ``aiqsim.core.states.TRANSITIONS``
* ``cli``            every command and option, from ``aiqsim.cli.build_parser()``
* ``scenario-keys``  every scenario key with its type, bounds and default, from the JSON Schema
                     (``aiqsim.sim.scenario_schema``, itself generated from the loader's spec tables)
* ``schema-rules``   the rules only the loader checks (``RULES_NOT_IN_SCHEMA``)
* ``errors``         the exception tree, walked from the classes ``aiqsim.errors`` exports
* ``measured``       the README's measured table; ``results``: ``benchmarks/RESULTS.md``
* ``notebooks``      a link to every notebook's page, with its title
* ``api-lazy-ROOM`` the API reference of the names of a room's ``__all__`` mkdocstrings does not see
                     as its members (see :func:`lazy_names`)
* ``api-errors``     the API reference of the exceptions only ``aiqsim.errors`` exports
* ``api-top``        the API reference of the names ``aiqsim`` exports itself (the pure rules of
                     ``aiqsim.core``), and a link to the room section of each name it re-exports

An unknown marker fails the build. The home page's chart (``assets/retry_storm_timeline.png``) is
drawn when the site is built, from a run of ``scenarios/retry_storm_429.toml`` (about a second), and
added to the site's files: nothing is written into docs/.

Notebooks: before the build, every ``notebooks/*.ipynb`` is executed headless as shipped (full mode:
nothing injected after its ``parameters`` cell; ``aiqsim.lab.notebook_runs``) into ``docs/notebooks/``
(git-ignored; the ``notebooks`` folder of ``docs_dir``), which mkdocs-jupyter renders without executing
again, so the decisions on the site are the ones a user gets by running the notebook. The whole set
takes about four minutes on a 2-core machine. ``AIQSIM_DOCS_FAST=1`` (:data:`FAST_ENV`) asks for a quick
preview instead: ``FAST = True`` is injected (fewer seeds, a coarser grid, shorter runs) and every page
warns that its decision can differ. When the environment names a folder of copies to render instead
(``AIQSIM_DOCS_NOTEBOOKS``), nothing is executed: tests/test_docs.py passes copies that were never
executed (tests/test_notebooks.py executes them). A notebook that fails to execute fails the build.
Executed copies are kept by the hash of their source and the mode, so ``mkdocs serve`` does not
re-execute unchanged notebooks on every rebuild. ``AIQSIM_DOCS_REPO`` names the repository when docs/
is built from a copy elsewhere.

Each page says how its outputs were computed (:func:`with_mode_note`): as shipped (full mode), with the
date and commit of the run; or, in a FAST preview, that the sweeps were smaller and a printed decision
can differ from the notebook's. Absolute paths of the machine that built the site (the repository, the
Python environment) are written relative to them.
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

ROOT = Path(os.environ.get("AIQSIM_DOCS_REPO") or Path(__file__).resolve().parent.parent)
"""The repository (README, benchmarks, notebooks); tests/test_docs.py builds a copy of docs/ elsewhere."""
NOTEBOOKS = ROOT / "notebooks"
MARKER = re.compile(r"^<!-- aiqsim:([a-z-]+) -->$", re.M)
EXECUTED_ENV = "AIQSIM_DOCS_NOTEBOOKS"


# --------------------------------------------------------------------------- mkdocs events


def on_pre_build(config: Any) -> None:
    """Put an executed copy of every notebook in docs/notebooks/ (see the module docs)."""
    rendered = Path(config["docs_dir"]) / "notebooks"
    rendered.mkdir(exist_ok=True)
    given = os.environ.get(EXECUTED_ENV)
    try:
        fast = fast_build()
    except ValueError as error:  # mkdocs says a PluginError in one line; anything else as a traceback
        from mkdocs.exceptions import PluginError

        raise PluginError(str(error)) from None
    for source in sorted(NOTEBOOKS.glob("*.ipynb")):
        digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
        key = f"{digest} {'fast' if fast else 'full'}"
        target = rendered / source.name
        stamp = rendered / f".{source.stem}.sha256"
        if given:
            copy = Path(given) / source.name
            if not copy.is_file():
                raise FileNotFoundError(f"{EXECUTED_ENV}={given} has no executed copy of {source.name}")
            _write_if_changed(target, with_mode_note(copy.read_text(encoding="utf-8"), source.name))
            stamp.unlink(missing_ok=True)  # not our execution: a later plain build executes its own
            continue
        if not (target.is_file() and stamp.is_file() and stamp.read_text() == key):
            _write_if_changed(target, execute(source, fast=fast))
        _write_if_changed(stamp, key)


FAST_ENV = "AIQSIM_DOCS_FAST"
"""``AIQSIM_DOCS_FAST=1``: a quick preview build, notebooks executed with ``FAST = True``."""


def fast_build(environ: Any = None) -> bool:
    """Whether :data:`FAST_ENV` asks for a FAST preview (``1``, ``true``, ``yes``, ``on``); unset, empty,
    ``0``, ``false``, ``no`` or ``off`` is the default full build. Anything else is refused, rather than
    silently publishing the wrong mode."""
    value = (os.environ if environ is None else environ).get(FAST_ENV, "").strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"", "0", "false", "no", "off"}:
        return False
    raise ValueError(f"{FAST_ENV}={value!r}: use 1 for a FAST preview build, 0 or unset for full mode")


def execute(source: Path, *, fast: bool) -> str:
    """The notebook at ``source`` executed headless (as shipped, or with ``FAST = True`` injected), with
    its mode note (:func:`with_mode_note`), as notebook JSON."""
    import nbformat

    from aiqsim.lab.notebook_runs import FAST_PARAMETERS, run_notebook

    book = run_notebook(source, parameters=FAST_PARAMETERS if fast else "")
    # as shipped: the runner's injected cell is empty; it is left off the page
    book.cells = [c for c in book.cells if not (c.cell_type == "code" and not c.source.strip())]
    return with_mode_note(nbformat.writes(book), source.name, computed=computed_at())


def computed_at() -> str:
    """``on YYYY-MM-DD (UTC) at commit abc1234`` (``, with local changes`` when the code or notebooks
    differ from it); just the date when the repository is not a git checkout."""
    import datetime
    import subprocess

    day = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return f"on {day} (UTC)"
    dirty = git("status", "--porcelain", "--", "aiqsim", "notebooks", "scenarios")
    return f"on {day} (UTC) at commit {commit}" + (", with local changes" if dirty else "")


HOME_CHART = "assets/retry_storm_timeline.png"
"""The home page's chart, a file of the built site only."""
HOME_SCENARIO = "scenarios/retry_storm_429.toml"


def on_files(files: Any, config: Any) -> Any:
    """Add the home page's chart (:data:`HOME_CHART`), drawn from a run of :data:`HOME_SCENARIO`."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, HOME_CHART, content=home_chart()))
    return files


def home_chart() -> bytes:
    """The retry-storm timeline of one seeded run of :data:`HOME_SCENARIO`, as a PNG."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from aiqsim.lab import charts
    from aiqsim.sim.simulate import simulate

    result = simulate(ROOT / HOME_SCENARIO)
    figure = charts.retry_storm_timeline(
        result.timeline,
        title=result.scenario.name,
        marks=charts.crash_marks(result),
        **charts.run_references(result),
    )
    buffer = io.BytesIO()
    # at the notebooks' inline dpi: scaled to the page's column its text shows as on the notebook pages
    # (aiqsim.lab.chart_style.PAGE_WIDTH_PX, tests/test_charts_page_width.py)
    figure.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    plt.close(figure)
    return buffer.getvalue()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each ``<!-- aiqsim:NAME -->`` line with the block generated for NAME."""

    def generate(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise KeyError(
                f"{page.file.src_uri}: unknown marker aiqsim:{name}; known: {', '.join(GENERATORS)}"
            )
        return GENERATORS[name]()

    return MARKER.sub(generate, markdown)


FAST_NOTE = (
    "> **Outputs computed in FAST mode.** The outputs on this page were computed with `FAST = True`\n"
    "> (the cell after the parameters): fewer seeds, a coarser grid and shorter runs than the notebook\n"
    "> as shipped, for a quick preview build (`AIQSIM_DOCS_FAST=1`). The charts and the decision below\n"
    "> can differ from what you get: run `jupyter nbconvert --to notebook --execute notebooks/{name}`\n"
    "> for the full-mode decision, or build the site without `AIQSIM_DOCS_FAST`."
)
FULL_NOTE = (
    "> **Outputs of the notebook as shipped (full mode)**{computed}. The charts and decisions below\n"
    "> are the ones `jupyter nbconvert --to notebook --execute notebooks/{name}` gives: the site's\n"
    "> build executes every notebook unchanged."
)
NOTE_STARTS = ("> **Outputs computed in FAST mode.**", "> **Outputs of the notebook as shipped")


def with_mode_note(text: str, name: str, computed: str = "") -> str:
    """The executed notebook ``text`` with a note above its outputs naming the mode they were computed
    in: :data:`FAST_NOTE` when the injected ``FAST = True`` cell is there, :data:`FULL_NOTE` (saying
    when: ``computed``, see :func:`computed_at`) otherwise; and the build machine's paths made relative."""
    import sys

    import nbformat

    book = nbformat.reads(text, as_version=4)
    fast = any(cell.cell_type == "code" and cell.source.strip() == "FAST = True" for cell in book.cells)
    if not any(cell.source.startswith(NOTE_STARTS) for cell in book.cells):
        note = FAST_NOTE if fast else FULL_NOTE
        when = f", computed by the site's build {computed}" if computed else ""
        book.cells.insert(1, nbformat.v4.new_markdown_cell(note.format(name=name, computed=when)))
    written = nbformat.writes(book)
    for root in sorted({str(ROOT), str(ROOT.resolve())}, key=len, reverse=True):
        written = written.replace(root + "/", "").replace(root, ".")
    for prefix in sorted({sys.prefix, sys.base_prefix, os.path.realpath(sys.prefix)}, key=len, reverse=True):
        if len(prefix) > 1:  # the Python environment's files (a warning's source): named from its root
            written = written.replace(prefix + "/", "")
    return written.replace(sys.prefix, "<python environment>") if len(sys.prefix) > 1 else written


def _write_if_changed(path: Path, text: str) -> None:
    """Write only on change: ``mkdocs serve`` watches docs/ and would rebuild forever otherwise."""
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


# --------------------------------------------------------------------------- generated blocks


def transitions() -> str:
    """The transition table as a matrix: a row per current status, a column per next status."""
    from aiqsim.core.states import TRANSITIONS
    from aiqsim.core.task import TaskStatus

    statuses = list(TaskStatus)
    lines = [
        "| from \\ to | " + " | ".join(f"`{s.value}`" for s in statuses) + " | terminal |",
        "|---" * (len(statuses) + 2) + "|",
    ]
    for current in statuses:
        cells = ["✓" if nxt in TRANSITIONS[current] else "" for nxt in statuses]
        terminal = "yes" if current.is_terminal else ""
        lines.append(f"| `{current.value}` | " + " | ".join(cells) + f" | {terminal} |")
    from aiqsim.core.job import JOB_TRANSITIONS

    if JOB_TRANSITIONS is TRANSITIONS:  # said only while it is true
        lines.append(
            "\nJobs move by this very table: `aiqsim.core.job.JOB_TRANSITIONS` is the same object as "
            "`aiqsim.core.states.TRANSITIONS`."
        )
    return "\n".join(lines) + "\n"


def cli() -> str:
    """One section per command: its help, usage and every option, from the argparse parser."""
    from aiqsim.cli import build_parser

    parser = build_parser()
    sections = [f"```text\n{parser.format_usage().strip()}\n```\n", parser.description or ""]
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in commands._choices_actions}
    for name, sub in commands.choices.items():
        sections.append(f"\n## `aiqsim {name}`\n\n{helps.get(name, '')}\n")
        if sub.description:
            sections.append(f"{sub.description}\n")
        sections.append(f"```text\n{sub.format_usage().strip()}\n```\n")
        rows = ["| argument | default | meaning |", "|---|---|---|"]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flag = ", ".join(action.option_strings) or action.dest
            if action.choices:
                flag += " {" + ",".join(map(str, action.choices)) + "}"
            default = "" if action.default in (None, [], False, argparse.SUPPRESS) else f"`{action.default}`"
            meaning = _cell(action.help or "")
            rows.append(f"| `{flag}` | {default} | {meaning} |")
        sections.append("\n".join(rows) + "\n")
    return "\n".join(sections)


def scenario_keys() -> str:
    """A table per scenario table, walked from the JSON Schema: key, expectation, default."""
    from aiqsim.sim.scenario_schema import scenario_json_schema

    schema = scenario_json_schema()
    out: list[str] = []

    def table(node: dict[str, Any], dotted: str, heading: str) -> None:
        required = set(node.get("required", ()))
        rows = ["| key | expected | default |", "|---|---|---|"]
        nested: list[tuple[dict[str, Any], str, str]] = []
        for key, child in node["properties"].items():
            path = f"{dotted}.{key}" if dotted else key
            items, values = child.get("items"), child.get("additionalProperties")
            if child.get("type") == "object" and "properties" in child:
                nested.append((child, path, f"[{path}]"))
                expected = f"a table: see `[{path}]`"
            elif child.get("type") == "array" and isinstance(items, dict) and "properties" in items:
                nested.append((items, path, f"[[{path}]]"))
                expected = f"{child['description']}: see `[[{path}]]`"
            elif isinstance(values, dict) and "properties" in values:
                nested.append((values, f"{path}.NAME", f"[{path}.NAME]"))
                expected = f"{child['description']}"
            else:
                expected = child.get("description", "").removeprefix("expected ")
            default = "required" if key in required else _default(child)
            rows.append(f"| `{key}` | {_cell(expected)} | {default} |")
        if heading:
            out.append(f"\n## `{heading}`\n\n{node.get('title', '')}\n")
        out.append("\n".join(rows) + "\n")
        for child, path, name in nested:
            table(child, path, name)

    table(schema, "", "")
    return "\n".join(out)


def notebooks() -> str:
    """A list item per notebook: its title (the first heading), linked to its page."""
    items = []
    for source in sorted(NOTEBOOKS.glob("*.ipynb")):
        book = json.loads(source.read_text(encoding="utf-8"))
        text = "\n".join("".join(cell["source"]) for cell in book["cells"] if cell["cell_type"] == "markdown")
        heading = re.search(r"^# (.+)$", text, re.M)
        title = heading.group(1).strip() if heading else source.stem
        items.append(f"- [{title}](notebooks/{source.name}) (`notebooks/{source.name}`)")
    return "\n".join(items) + "\n"


def schema_rules() -> str:
    from aiqsim.sim.scenario_schema import RULES_NOT_IN_SCHEMA

    return "\n".join(f"- {rule}" for rule in RULES_NOT_IN_SCHEMA) + "\n"


def errors() -> str:
    """The exception tree of everything ``aiqsim.errors`` exports, with builtin bases and summaries."""
    import aiqsim.errors as module

    classes = [getattr(module, name) for name in module.__all__]
    classes = [c for c in classes if isinstance(c, type) and issubclass(c, BaseException)]
    ours = set(classes)

    def parent(cls: type) -> type | None:
        return next((base for base in cls.__mro__[1:] if base in ours), None)

    lines: list[str] = []

    def walk(node: type | None, depth: int) -> None:
        for cls in sorted((c for c in classes if parent(c) is node), key=lambda c: c.__name__):
            builtins = [
                b.__name__
                for b in cls.__mro__[1:]
                if b.__module__ == "builtins" and b not in (Exception, BaseException, object)
            ]
            extra = f" ({', '.join(dict.fromkeys(builtins))})" if builtins else ""
            doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
            doc = _roles().convert(doc, lambda target, cls=cls: _qualify(target, cls))
            path, code = f"{cls.__module__}.{cls.__qualname__}", f"<code>{cls.__name__}</code>"
            name = f'<autoref identifier="{path}" optional>{code}</autoref>'  # its API section
            lines.append(f"{'    ' * depth}- {name}{extra}: {_cell(doc)}")
            walk(cls, depth + 1)

    walk(None, 0)
    return "\n".join(lines) + "\n"


def measured() -> str:
    """The README's measured table (the section that starts with ``## Measured``)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^## (Measured.*?)$\n(.*?)(?=^## )", readme, re.S | re.M)
    if match is None:
        raise ValueError("README.md has no '## Measured' section")
    return f"### {match.group(1)}\n{match.group(2)}"


def results() -> str:
    """benchmarks/RESULTS.md, its headings moved two levels down to sit under this page's."""
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    text = re.sub(r"^(#+) ", lambda m: "#" * min(len(m.group(1)) + 2, 6) + " ", text, flags=re.M)
    return text.split("\n", 1)[1] if text.startswith("###") else text


ROOMS = (
    "aiqsim.scheduler",
    "aiqsim.runtime",
    "aiqsim.stores",
    "aiqsim.fleet",
    "aiqsim.overload",
    "aiqsim.observability",
    "aiqsim.http",
    "aiqsim.sim",
    "aiqsim.testing",
    "aiqsim.validation",
)
"""The rooms whose ``__all__`` the API reference documents (docs/reference/*.md, one ``:::`` each)."""
LAB_MODULES = (
    "aiqsim.lab.charts",
    "aiqsim.lab.widgets",
    "aiqsim.lab.tune",
    "aiqsim.lab.calibrate",
    "aiqsim.lab.calibration_report",
    "aiqsim.lab.decisions",
    "aiqsim.lab.notebook_runs",
)
"""The lab has no ``__all__`` of its own (importing it must stay cheap): its modules, each documented."""


def room_exports() -> dict[str, str]:
    """Each name a room exports, with the first room (of :data:`ROOMS`) that exports it."""
    import importlib

    owner: dict[str, str] = {}
    for room in ROOMS:
        for name in importlib.import_module(room).__all__:
            owner.setdefault(name, room)
    return owner


def lazy_names(room: str) -> list[str]:
    """The names of ``room.__all__`` mkdocstrings does not see as members of ``room``, which the room's
    page documents from the module that defines each: a name its ``__init__.py`` binds by no
    statement (a PEP 562 ``__getattr__`` imports it on first use, for an optional extra), and a
    function named as its own submodule (``aiqsim.sim.simulate``: mkdocstrings sees the module)."""
    import importlib

    module = importlib.import_module(room)
    tree = ast.parse(Path(module.__file__ or "").read_text(encoding="utf-8"))
    statements = list(tree.body)  # the module's own, and those under a top-level ``if TYPE_CHECKING:``
    statements += [inner for node in tree.body if isinstance(node, ast.If) for inner in node.body]
    bound = {
        alias.asname or alias.name
        for node in statements
        if isinstance(node, ast.ImportFrom | ast.Import)
        for alias in node.names
    }
    for node in statements:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        bound.update(target.id for target in targets if isinstance(target, ast.Name))
    folder = Path(module.__file__ or "").parent
    return [name for name in module.__all__ if name not in bound or (folder / f"{name}.py").is_file()]


def api_lazy(room: str) -> str:
    """``::: module.Name`` for each of :func:`lazy_names` of ``room`` (nothing when there are none)."""
    import importlib

    module = importlib.import_module(room)
    blocks = []
    for name in lazy_names(room):
        obj = getattr(module, name)
        blocks.append(f"::: {_defined_at(room, name, obj)}\n    options:\n      heading_level: 3\n")
    if not blocks:
        return ""
    names = ", ".join(f"`{name}`" for name in lazy_names(room))
    intro = f"Also exported by `{room}`, documented from the module that defines each: {names}.\n\n"
    return intro + "\n".join(blocks)


def _defined_at(room: str, name: str, obj: object) -> str:
    """The dotted path mkdocstrings documents ``obj`` from: a class's or function's own module, or
    for a constant (an ``int`` has no ``__module__`` of its own) the module of ``room`` that assigns it."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if module and qualname and not isinstance(obj, int | float | str | tuple | frozenset):
        return f"{module}.{qualname}"
    import importlib
    import pkgutil

    package = importlib.import_module(room)
    for info in pkgutil.iter_modules(package.__path__, f"{room}."):
        source = Path(importlib.import_module(info.name).__file__ or "").read_text(encoding="utf-8")
        tree = ast.parse(source)
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if any(isinstance(target, ast.Name) and target.id == name for target in targets):
                return f"{info.name}.{name}"
    raise LookupError(f"{room}.{name}: no module of {room} assigns it")


def api_errors() -> str:
    """``::: aiqsim.errors`` for the exceptions it exports that no other section documents (those
    ``aiqsim`` or a room exports are documented there), so that every exception has a section."""
    import importlib

    import aiqsim
    import aiqsim.errors

    documented = {id(getattr(aiqsim, name)) for name in aiqsim.__all__}
    for module in (*ROOMS, *LAB_MODULES):
        imported = importlib.import_module(module)
        names = getattr(imported, "__all__", None) or [n for n in vars(imported) if not n.startswith("_")]
        documented.update(id(getattr(imported, name)) for name in names)
    rest = [name for name in aiqsim.errors.__all__ if id(getattr(aiqsim.errors, name)) not in documented]
    members = "\n".join(f"        - {name}" for name in rest)
    return f"::: aiqsim.errors\n    options:\n      members:\n{members}\n"


def api_top() -> str:
    """``::: aiqsim`` for the names no room exports (the core rules), and a table for the others."""
    import aiqsim

    owner = room_exports()
    own = [name for name in aiqsim.__all__ if name not in owner]
    members = "\n".join(f"        - {name}" for name in own)
    block = f"::: aiqsim\n    options:\n      filters: []\n      members:\n{members}\n"
    rows = ["| name | documented in |", "|---|---|"]
    for name in sorted((n for n in aiqsim.__all__ if n in owner), key=str.lower):
        room, obj = owner[name], getattr(aiqsim, name)
        module = getattr(obj, "__module__", None) or ""
        # the defining module's path: a section of the room page (an alias there, or a name the
        # room imports lazily and documents from its module); else the room's own section
        target = f"{module}.{obj.__qualname__}" if module.startswith("aiqsim.") else f"{room}.{name}"
        rows.append(f"| [`{name}`][{target}] | `{room}` |")
    table = "\n".join(rows)
    return (
        "## Re-exported from the rooms\n\n"
        "`aiqsim` also exports these names, documented in the room they come from:\n\n"
        f"{table}\n\n## Defined by the core\n\n{block}"
    )


GENERATORS = {
    "transitions": transitions,
    "cli": cli,
    "scenario-keys": scenario_keys,
    "schema-rules": schema_rules,
    "errors": errors,
    "measured": measured,
    "results": results,
    "api-top": api_top,
    "api-errors": api_errors,
    "notebooks": notebooks,
    **{f"api-lazy-{room.rsplit('.', 1)[1]}": functools.partial(api_lazy, room) for room in ROOMS},
}


# --------------------------------------------------------------------------- helpers


def _roles() -> Any:
    """docs/griffe_roles.py (it is beside this file, not on the import path)."""
    import importlib.util

    path = Path(__file__).with_name("griffe_roles.py")
    spec = importlib.util.spec_from_file_location("aiqsim_docs_griffe_roles", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _qualify(target: str, cls: type) -> str | None:
    """A role's target in ``cls``'s docstring as a dotted path: resolved in its module, as Python would."""
    import sys

    target = target.strip().lstrip("~.").rstrip("()")
    if target.startswith("aiqsim."):
        return _roles().canonical(target)
    first, dot, rest = target.partition(".")
    obj = getattr(cls, first, None) if first != cls.__name__ else cls
    obj = obj if obj is not None else vars(sys.modules[cls.__module__]).get(first)
    module = getattr(obj, "__module__", None)
    if obj is None or not isinstance(module, str) or not module.startswith("aiqsim"):
        return None
    if isinstance(obj, type) or callable(obj):
        return f"{module}.{obj.__qualname__}{dot}{rest}"
    return None


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(node: dict[str, Any]) -> str:
    if "default" not in node:
        return ""
    return f"`{json.dumps(node['default'], ensure_ascii=False)}`"
