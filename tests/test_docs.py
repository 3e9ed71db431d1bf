"""The documentation site builds in strict mode, and what it generates from the code is complete.

The site is built from a copy of docs/ in a temporary folder (nothing is written into the
repository) by a real ``mkdocs build --strict`` subprocess, once per test run (xdist's workers
share it). Its notebook pages are rendered without executing anything: tests/test_notebooks.py
executes every notebook and checks its charts, so executing them again here would double the
suite's largest cost. Each rendered copy carries one marker chart, which checks that a notebook's
outputs reach its page. Strict mode turns a broken link or an unresolved API reference into a
failed build; the last tests check that it does.
"""

from __future__ import annotations

import base64
import fcntl
import html
import importlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
import yaml

from aiqsim.cli import build_parser
from aiqsim.core.states import TRANSITIONS
from aiqsim.core.task import TaskStatus
from aiqsim.sim.scenario import SECTION_FIELDS

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocs_jupyter")
pytest.importorskip("mkdocstrings")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
NOTEBOOK_PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
MARKER_PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360f8cff00f0004ff01ff5ca3d3a60000000049454e44ae426082"
    )
).decode()
"""A 1x1 PNG, the output each rendered notebook copy carries (see the module docs)."""
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):(?:`|<code>)")
"""A Sphinx role left as text (in Markdown source, or after Markdown made its target inline code)."""


def hooks() -> Any:
    """docs/hooks.py, which names the rooms the API reference documents."""
    spec = importlib.util.spec_from_file_location("aiqsim_docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(
    tmp: Path, notebooks: Path, *, nav: list[Any] | None = None, pages: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of a copy of docs/ in ``tmp``, notebooks taken from ``notebooks``.

    ``nav`` replaces the navigation (and leaves the notebook pages out); ``pages`` replaces or adds
    pages (``{"x.md": text}``)."""
    docs = tmp / "docs"
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("notebooks", "__pycache__"))
    for name, text in (pages or {}).items():
        (docs / name).write_text(text, encoding="utf-8")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    config.update(docs_dir=str(docs), site_dir=str(tmp / "site"), hooks=[str(docs / "hooks.py")])
    if nav is not None:  # a trimmed site: the notebook pages are left out too (fast)
        config["nav"] = nav
        config["exclude_docs"] += "notebooks/\n"
    (tmp / "mkdocs.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    env = {**os.environ, "AIQSIM_DOCS_REPO": str(ROOT), "AIQSIM_DOCS_NOTEBOOKS": str(notebooks)}
    env["NO_MKDOCS_2_WARNING"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp / "mkdocs.yml")],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def with_marker_chart(source: Path) -> str:
    """The notebook at ``source``, not executed, with :data:`MARKER_PNG` as its first code cell's output:
    as a default build's executed copy is, the notebook as shipped (nothing injected)."""
    book = json.loads(source.read_text(encoding="utf-8"))
    cell = next(cell for cell in book["cells"] if cell["cell_type"] == "code")
    cell["outputs"] = [{"output_type": "display_data", "metadata": {}, "data": {"image/png": MARKER_PNG}}]
    return json.dumps(book)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once per test run: under xdist the workers share one build (the first to ask
    builds it while the others wait), in the run's own folder (the base temp's parent); without
    xdist, under this run's base temp."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    tmp = shared / "aiqsim-docs"
    with open(shared / "aiqsim-docs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        outcome = shared / "aiqsim-docs.outcome"
        if not outcome.exists():
            shutil.rmtree(tmp, ignore_errors=True)
            copies = tmp / "rendered"
            copies.mkdir(parents=True)
            for path in NOTEBOOK_PATHS:
                (copies / path.name).write_text(with_marker_chart(path), encoding="utf-8")
            done = build(tmp, copies)
            failure = "" if done.returncode == 0 else done.stdout[-3000:] + done.stderr[-5000:]
            outcome.write_text(failure, encoding="utf-8")
        failure = outcome.read_text(encoding="utf-8")
    assert failure == "", failure
    return tmp / "site"


def text_of(site: Path, page: str) -> str:
    """The page's HTML with tags removed and entities decoded, whitespace collapsed."""
    raw = (site / page / "index.html").read_text(encoding="utf-8")
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", raw)).split())


def test_the_transition_table_is_rendered_from_the_code(site: Path) -> None:
    raw = (site / "concepts" / "index.html").read_text(encoding="utf-8")
    table = raw[raw.index('id="states"') :]
    table = table[table.index("<table") : table.index("</table>")]
    rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]
    rendered = {}
    for row in rows:
        cells = [
            html.unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in re.findall(r"<td.*?</td>", row)
        ]
        rendered[TaskStatus(cells[0])] = {
            status for status, mark in zip(TaskStatus, cells[1 : 1 + len(TaskStatus)], strict=True) if mark
        }
    assert rendered == {status: set(allowed) for status, allowed in TRANSITIONS.items()}


def test_the_cli_reference_has_every_command_and_option(site: Path) -> None:
    page = text_of(site, "reference/cli")
    parser = build_parser()
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, sub in commands.choices.items():
        assert f"aiqsim {name}" in page
        for action in sub._actions:
            if action.__class__.__name__ == "_HelpAction":
                continue
            for flag in action.option_strings:
                assert flag in page, (name, flag)


def test_the_scenario_reference_has_every_key(site: Path) -> None:
    page = text_of(site, "reference/scenario")
    for table in SECTION_FIELDS.values():
        for key in table.fields:
            assert re.search(rf"\b{re.escape(key)}\b", page), key
    for header in (
        "[[providers]]",
        "[quotas.NAME]",
        "[workloads.cost]",
        "[[jobs.stages]]",
        "[jobs.stages.size]",
    ):
        assert header in page


def test_the_error_page_lists_every_exported_exception(site: Path) -> None:
    import aiqsim.errors

    page = text_of(site, "reference/errors")
    raw = (site / "reference/errors/index.html").read_text(encoding="utf-8")
    linked = set(re.findall(r'<a class="autorefs autorefs-internal"[^>]*><code>(\w+)</code></a>', raw))
    for name in aiqsim.errors.__all__:
        if isinstance(getattr(aiqsim.errors, name), type):
            assert name in page, name
            assert name in linked, f"{name} in the error tree does not link to its API section"


@pytest.mark.parametrize("path", NOTEBOOK_PATHS, ids=lambda p: p.stem)
def test_every_notebook_has_a_page_with_its_code_and_outputs(site: Path, path: Path) -> None:
    raw = (site / "notebooks" / path.stem / "index.html").read_text(encoding="utf-8")
    assert f"data:image/png;base64,{MARKER_PNG}" in raw, f"{path.name}: its outputs are not on its page"
    book = json.loads(path.read_text(encoding="utf-8"))
    code = next("".join(cell["source"]) for cell in book["cells"] if cell["cell_type"] == "code")
    first_line = next(line for line in code.splitlines() if line.strip() and not line.startswith("#"))
    page = " ".join(html.unescape(re.sub(r"<[^>]+>", "", raw)).split())
    assert " ".join(first_line.split()) in page, f"{path.name}: its code is not on its page"


def test_the_home_page_links_every_notebook_and_shows_a_chart(site: Path) -> None:
    raw = (site / "index.html").read_text(encoding="utf-8")
    for path in NOTEBOOK_PATHS:
        assert f'href="notebooks/{path.stem}/"' in raw, path.name
    chart = re.search(r'<img [^>]*src="(assets/[^"]+\.png)"', raw)
    assert chart is not None, "the home page shows no chart"
    png = (site / chart.group(1)).read_bytes()
    assert png.startswith(b"\x89PNG") and 10_000 < len(png) < 300_000, len(png)


def test_the_site_holds_no_absolute_build_path(site: Path) -> None:
    roots = {str(ROOT), str(site.parent), str(Path(sys.executable).parent.parent)}
    found = [
        (path.relative_to(site), root)
        for path in site.rglob("*")
        if path.suffix in {".html", ".json", ".xml", ".js"}
        for root in roots
        if root in path.read_text(encoding="utf-8", errors="replace")
    ]
    assert found == []


def test_no_sphinx_role_is_left_as_text_anywhere_on_the_site(site: Path) -> None:
    left = {
        str(path.relative_to(site)): ROLE.findall(path.read_text(encoding="utf-8"))
        for path in site.rglob("*")
        if path.suffix in {".html", ".json"}
    }
    assert {page: found for page, found in left.items() if found} == {}


def test_sphinx_roles_became_links(site: Path) -> None:
    """The roles of the docstrings are links where the site documents their target: at least the
    ones from the scheduler's docstring to the classes it names."""
    raw = (site / "reference/scheduler/index.html").read_text(encoding="utf-8")
    start = raw.index('id="aiqsim.scheduler.Scheduler"')
    links = re.findall(r'<a class="autorefs autorefs-internal"[^>]*href="([^"]+)"', raw[start:])
    assert len(links) >= 20
    anchors = set(re.findall(r'id="([^"]+)"', raw))
    local = [link.split("#", 1)[1] for link in links if link.startswith("#")]
    assert local and set(local) <= anchors


def public_names(module_name: str) -> list[str]:
    """``__all__``, or (a lab module without one) the names it defines that do not start with ``_``."""
    module = importlib.import_module(module_name)
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        name
        for name, obj in vars(module).items()
        if not name.startswith("_") and getattr(obj, "__module__", None) == module_name
    ]


def api_anchors(site: Path) -> set[str]:
    return {
        anchor
        for page in (site / "reference").glob("*/index.html")
        for anchor in re.findall(r'id="(aiqsim[^"]*)"', page.read_text(encoding="utf-8"))
    }


def sections_for(module_name: str, name: str, owner: dict[str, str]) -> set[str]:
    """The anchors any of which documents ``module_name.name``: under the module's path, the defining
    module's path, or (for a name ``aiqsim`` re-exports) the path of the room that exports it."""
    module = importlib.import_module(module_name)
    obj = getattr(module, name)
    ids = {f"{module_name}.{name}"}
    if module_name == "aiqsim" and name in owner:
        ids.add(f"{owner[name]}.{name}")
    defined_in = getattr(obj, "__module__", None)
    if (inspect.isclass(obj) or inspect.isfunction(obj)) and isinstance(defined_in, str):
        ids.add(f"{defined_in}.{obj.__qualname__}")
    return ids


def test_every_exported_name_has_a_section_in_the_api_reference(site: Path) -> None:
    """Each name of ``aiqsim.__all__``, ``aiqsim.errors.__all__`` and each room's ``__all__`` has an
    anchored section: its own, or (a class or function exported from several places) the section of
    the same object under another of those names."""
    docs = hooks()
    anchors = api_anchors(site)
    owner = docs.room_exports()
    modules = ["aiqsim", "aiqsim.errors", *docs.ROOMS, *docs.LAB_MODULES]
    exported = [(module, name) for module in modules for name in public_names(module)]

    def shared(module: str, name: str) -> int | None:
        obj = getattr(importlib.import_module(module), name)
        return id(obj) if inspect.isclass(obj) or inspect.isfunction(obj) else None

    documented = {shared(m, n) for m, n in exported if sections_for(m, n, owner) & anchors} - {None}
    missing = [
        f"{module}.{name}"
        for module, name in exported
        if not sections_for(module, name, owner) & anchors and shared(module, name) not in documented
    ]
    assert missing == []
    for required in ("QuotaLimits", "RetryPolicy", "HttpProvider", "AsyncioRuntime", "SimPyRuntime"):
        assert any(anchor.endswith(f".{required}") for anchor in anchors), required
    for required in ("JobSpec", "Stage", "SqliteStore", "PostgresStore", "TuningPanel", "tune", "calibrate"):
        assert any(anchor.endswith(f".{required}") for anchor in anchors), required


def test_signatures_are_annotated_and_attributes_show_no_code(site: Path) -> None:
    page = text_of(site, "reference/scheduler")
    assert re.search(r"max_attempts\s*:\s*int\s*=\s*5", page), "RetryPolicy's signature has no annotations"
    raw = (site / "reference/scheduler/index.html").read_text(encoding="utf-8")
    attribute = raw[raw.index('id="aiqsim.scheduler.RetryPolicy.max_attempts"') :][:3000]
    assert "= 5" not in html.unescape(re.sub(r"<[^>]+>", "", attribute)), "an attribute shows its value"
    start = raw.index('id="aiqsim.scheduler.Scheduler"')
    signature = re.search(r'<div class="doc-signature highlight">(.*?)</div>', raw[start:], re.S)
    assert signature is not None
    assert signature.group(1).count("autorefs-internal") >= 5, "the signature's types are not links"


def test_the_api_reference_and_measured_figures_are_on_the_site(site: Path) -> None:
    assert "submit_job" in text_of(site, "reference/scheduler")
    assert "scenario_json_schema" in text_of(site, "reference/sim")
    assert "Measured (" in text_of(site, "validation")


def test_every_public_member_of_the_scheduler_is_in_the_api_reference(site: Path) -> None:
    """``Scheduler`` is assembled from parts in modules of their own (``recover`` comes from
    :mod:`aiqsim.scheduler.recovery`): the reference lists what they give it, too."""
    from aiqsim.scheduler.scheduler import Scheduler

    raw = (site / "reference/scheduler/index.html").read_text(encoding="utf-8")
    public = [name for name in dir(Scheduler) if not name.startswith("_")]
    assert "recover" in public
    missing = [name for name in public if f'id="aiqsim.scheduler.Scheduler.{name}"' not in raw]
    assert missing == []


def test_a_broken_link_or_an_unresolved_api_reference_fails_the_strict_build(tmp_path: Path) -> None:
    pages = {
        "index.md": "# Home\n",
        "broken.md": "Read [the missing page](nowhere.md).\n",
        "reference/api.md": "# API\n\n::: aiqsim.no_such_module\n",
    }
    done = build(tmp_path, NOTEBOOKS, nav=["index.md", "broken.md", "reference/api.md"], pages=pages)
    assert done.returncode != 0
    assert "nowhere.md" in done.stdout + done.stderr
    assert "no_such_module" in done.stdout + done.stderr


def test_a_mistyped_fast_setting_fails_the_build_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``AIQSIM_DOCS_FAST=maybe`` stops the build before anything runs, with mkdocs' own one-line error
    naming the variable and the values it takes, not a Python traceback out of the hook."""
    monkeypatch.setenv("AIQSIM_DOCS_FAST", "maybe")
    done = build(tmp_path, NOTEBOOKS, nav=["index.md"], pages={"index.md": "# Home\n"})
    assert done.returncode == 1
    assert "AIQSIM_DOCS_FAST='maybe': use 1 for a FAST preview build" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_every_room_with_public_names_is_in_the_api_reference() -> None:
    """A new room (a package of aiqsim with an ``__all__``) needs a page: docs/reference/ROOM.md with
    ``::: aiqsim.ROOM`` and ``<!-- aiqsim:api-lazy-ROOM -->``, and its name in ``ROOMS`` of docs/hooks.py."""
    rooms = {
        f"aiqsim.{init.parent.name}"
        for init in (ROOT / "aiqsim").glob("*/__init__.py")
        if re.search(r"^__all__\b", init.read_text(encoding="utf-8"), re.M)
    }
    assert rooms - set(hooks().ROOMS) == set()
    pages = "\n".join(path.read_text(encoding="utf-8") for path in (ROOT / "docs" / "reference").glob("*.md"))
    for room in hooks().ROOMS:
        assert re.search(rf"^::: {re.escape(room)}$", pages, re.M), room
        assert f"<!-- aiqsim:api-lazy-{room.rsplit('.', 1)[1]} -->" in pages, room


def test_results_are_short_and_no_page_cites_working_notes_or_issue_numbers() -> None:
    results = ROOT / "benchmarks" / "RESULTS.md"
    assert results.stat().st_size <= 40_000
    for path in [results, *(ROOT / "docs").rglob("*.md")]:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\bsessions?\b", text, re.I), path
        assert not re.search(r"(?<![\w&])#\d+\b", text), path


def test_a_notebook_page_says_which_mode_its_outputs_were_computed_in(tmp_path: Path) -> None:
    """A copy with the injected ``FAST = True`` cell gets the FAST warning; any other copy says it is
    the notebook as shipped; neither shows the paths of the machine that built it."""
    docs = hooks()
    book = nbformat.v4.new_notebook()
    book.cells = [
        nbformat.v4.new_markdown_cell("# Title"),
        nbformat.v4.new_code_cell("FAST = False"),
        nbformat.v4.new_code_cell("FAST = True"),
        nbformat.v4.new_code_cell("print(1)"),
    ]
    book.cells[3].outputs = [
        nbformat.v4.new_output("stream", text=f"read {docs.ROOT}/scenarios/x.toml\n"),
        nbformat.v4.new_output("stream", text=f"{sys.prefix}/lib/x.py:1: FutureWarning\n"),
    ]
    noted = nbformat.reads(docs.with_mode_note(nbformat.writes(book), "x.ipynb"), as_version=4)
    assert noted.cells[1].cell_type == "markdown" and "computed in FAST mode" in noted.cells[1].source
    assert "notebooks/x.ipynb" in noted.cells[1].source and "AIQSIM_DOCS_FAST" in noted.cells[1].source
    assert noted.cells[-1].outputs[0]["text"] == "read scenarios/x.toml\n"
    assert noted.cells[-1].outputs[1]["text"] == "lib/x.py:1: FutureWarning\n"
    full = nbformat.v4.new_notebook()
    full.cells = [nbformat.v4.new_markdown_cell("# Title"), nbformat.v4.new_code_cell("FAST = False")]
    when = "on 2026-01-02 (UTC) at commit abc1234"
    noted = nbformat.reads(docs.with_mode_note(nbformat.writes(full), "x.ipynb", when), as_version=4)
    assert len(noted.cells) == 3
    assert "as shipped (full mode)" in noted.cells[1].source and when in noted.cells[1].source
    assert "FAST" not in noted.cells[1].source
    again = docs.with_mode_note(nbformat.writes(noted), "x.ipynb", when)
    assert len(nbformat.reads(again, as_version=4).cells) == 3, "a second note was added"


def test_only_the_opt_in_asks_for_a_fast_build() -> None:
    docs = hooks()
    assert docs.FAST_ENV == "AIQSIM_DOCS_FAST"
    assert docs.fast_build({}) is False
    for value in ("", "0", "false", "No", "off"):
        assert docs.fast_build({docs.FAST_ENV: value}) is False, value
    for value in ("1", "true", "YES", "on"):
        assert docs.fast_build({docs.FAST_ENV: value}) is True, value
    with pytest.raises(ValueError, match="AIQSIM_DOCS_FAST='maybe'"):
        docs.fast_build({docs.FAST_ENV: "maybe"})


PROBE = """import os, sys
print("FAST is", FAST)
print("ran in", os.getcwd())
print("python in", sys.prefix)"""
"""A notebook's code cell that shows the mode it ran in and the paths a page must not show."""


def test_the_default_build_executes_notebooks_as_shipped_and_fast_needs_the_opt_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build's own pre-build step on a repository of one small notebook: by default the notebook
    runs as shipped (``FAST = False``), its page says so and shows no absolute path, and an unchanged
    notebook is not executed again; ``AIQSIM_DOCS_FAST=1`` runs it with ``FAST = True`` under the
    FAST warning."""
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    book = nbformat.v4.new_notebook()
    parameters = nbformat.v4.new_code_cell("FAST = False")
    parameters.metadata["tags"] = ["parameters"]
    book.cells = [nbformat.v4.new_markdown_cell("# Probe"), parameters, nbformat.v4.new_code_cell(PROBE)]
    nbformat.write(book, repo / "notebooks" / "probe.ipynb")
    monkeypatch.setenv("AIQSIM_DOCS_REPO", str(repo))
    monkeypatch.delenv("AIQSIM_DOCS_NOTEBOOKS", raising=False)
    monkeypatch.delenv("AIQSIM_DOCS_FAST", raising=False)
    docs = hooks()
    config = {"docs_dir": str(tmp_path / "docs")}
    (tmp_path / "docs").mkdir()
    rendered = tmp_path / "docs" / "notebooks" / "probe.ipynb"

    docs.on_pre_build(config)
    text = rendered.read_text(encoding="utf-8")
    page = nbformat.reads(text, as_version=4)
    printed = "".join(o.get("text", "") for c in page.cells if c.cell_type == "code" for o in c.outputs)
    assert "FAST is False" in printed
    assert [c.source for c in page.cells if c.cell_type == "code"] == ["FAST = False", PROBE]
    assert "as shipped (full mode)" in page.cells[1].source and "FAST mode" not in text
    assert re.search(r"computed by the site's build on \d{4}-\d\d-\d\d \(UTC\)", page.cells[1].source)
    assert "ran in notebooks" in printed
    for absolute in {str(repo), str(repo.resolve()), sys.prefix}:
        assert absolute not in text, absolute

    import aiqsim.lab.notebook_runs

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an unchanged notebook was executed again")

    with monkeypatch.context() as patch:
        patch.setattr(aiqsim.lab.notebook_runs, "run_notebook", refuse)
        docs.on_pre_build(config)  # the cached copy is kept
    assert rendered.read_text(encoding="utf-8") == text

    monkeypatch.setenv("AIQSIM_DOCS_FAST", "1")
    docs.on_pre_build(config)
    fast = nbformat.read(rendered, as_version=4)
    printed = "".join(o.get("text", "") for c in fast.cells if c.cell_type == "code" for o in c.outputs)
    assert "FAST is True" in printed
    assert "Outputs computed in FAST mode." in fast.cells[1].source


def site_rules(site: Path) -> dict[str, dict[str, str]]:
    """The rules of the site's extra.css, after checking a notebook page links it: ``{selector:
    {property: value}}``, one entry per selector of a comma-separated list."""
    raw = (site / "notebooks" / NOTEBOOK_PATHS[0].stem / "index.html").read_text(encoding="utf-8")
    assert re.search(r'<link[^>]+href="[./]*stylesheets/extra\.css"', raw), "extra.css is not on the page"
    css = (site / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    rules: dict[str, dict[str, str]] = {}
    for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", css):
        declarations = dict(
            (k.strip(), v.strip()) for k, v in (d.split(":", 1) for d in body.split(";") if ":" in d)
        )
        for selector in selectors.split(","):
            rules[" ".join(selector.split())] = declarations
    return rules


def test_printed_outputs_are_not_broken_mid_word(site: Path) -> None:
    """mkdocs-jupyter's output blocks break long lines at any character (JupyterLab's ``word-break:
    break-all``): the site's stylesheet keeps printed lines whole, by a rule that outranks it."""
    rules = site_rules(site)
    ours = [(sel, rule) for sel, rule in rules.items() if sel.endswith(".jp-OutputArea-output pre")]
    assert ours, rules
    selector, rule = ours[0]
    assert rule.get("white-space") == "pre" and rule.get("word-break") == "normal", rule
    assert rule.get("overflow-x") == "auto" and rule.get("overflow-wrap") == "normal", rule
    # JupyterLab's rule is ".jupyter-wrapper .jp-OutputArea-output pre": two classes and a type
    assert selector.count(".") > 2, f"{selector} does not outrank JupyterLab's rule"


def test_a_chart_takes_the_outputs_whole_width(site: Path) -> None:
    """The output prompt column beside an image is hidden, so a chart is scaled to the page's width less
    the notebook's padding only (aiqsim.lab.chart_style.PAGE_WIDTH_PX, tests/test_charts_page_width.py)."""
    rules = site_rules(site)
    beside_image = [
        rule
        for sel, rule in rules.items()
        if ":has(> .jp-RenderedImage)" in sel and sel.endswith(".jp-OutputPrompt")
    ]
    assert beside_image and beside_image[0].get("display") == "none", rules
    raw = (site / "notebooks" / NOTEBOOK_PATHS[0].stem / "index.html").read_text(encoding="utf-8")
    # the markup the selector expects: the prompt and the image output are children of one output child
    assert re.search(
        r'<div class="jp-OutputArea-child[^"]*">\s*<div class="jp-OutputPrompt[^"]*">[^<]*</div>\s*'
        r'<div class="jp-RenderedImage',
        raw,
    ), "the notebook page's image output is not where the rule looks for it"


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOK_PATHS, ids=lambda p: p.stem)
def test_every_notebook_page_names_the_mode_of_its_outputs(site: Path, path: Path) -> None:
    page = text_of(site, f"notebooks/{path.stem}")
    assert "Outputs of the notebook as shipped (full mode)" in page
    assert "Outputs computed in FAST mode" not in page
    assert str(ROOT) not in page
