"""The documentation site builds in strict mode, and what it generates from the code is complete.

The site is built from a copy of docs/ in a temporary folder (nothing is written into the
repository) by a real ``mkdocs build --strict`` subprocess. Its notebook pages are the notebooks
the suite executes anyway (tests/executed_notebooks.py: once per session, shared with
tests/test_notebooks.py), so a notebook that fails to execute fails here too. Strict mode turns a
broken link or an unresolved API reference into a failed build; the last test checks that it does.
"""

from __future__ import annotations

import html
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
from executed_notebooks import NOTEBOOKS, executed

from aiqsim.cli import build_parser
from aiqsim.core.states import TRANSITIONS
from aiqsim.core.task import TaskStatus
from aiqsim.sim.scenario import SECTION_FIELDS

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocs_jupyter")
pytest.importorskip("mkdocstrings")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))


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


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("docs")
    copies = tmp / "executed"
    copies.mkdir()
    for path in NOTEBOOK_PATHS:
        nbformat.write(executed(path), copies / path.name)
    done = build(tmp, copies)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return tmp / "site"


def text_of(site: Path, page: str) -> str:
    """The page's HTML with tags removed and entities decoded, whitespace collapsed."""
    raw = (site / page / "index.html").read_text(encoding="utf-8")
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", raw)).split())


@pytest.mark.notebook
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


@pytest.mark.notebook
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


@pytest.mark.notebook
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


@pytest.mark.notebook
def test_the_error_page_lists_every_exported_exception(site: Path) -> None:
    import aiqsim.errors

    page = text_of(site, "reference/errors")
    for name in aiqsim.errors.__all__:
        if isinstance(getattr(aiqsim.errors, name), type):
            assert name in page, name


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOK_PATHS, ids=lambda p: p.stem)
def test_every_notebook_has_a_page_with_its_charts(site: Path, path: Path) -> None:
    raw = (site / "notebooks" / path.stem / "index.html").read_text(encoding="utf-8")
    assert "data:image/png;base64," in raw, f"{path.name}: no chart on its page"
    assert "Traceback" not in raw


@pytest.mark.notebook
def test_the_api_reference_and_measured_figures_are_on_the_site(site: Path) -> None:
    api = text_of(site, "reference/api")
    assert "submit_job" in api and "scenario_json_schema" in api
    assert "Measured (" in text_of(site, "validation")


@pytest.mark.notebook
def test_every_public_member_of_the_scheduler_is_in_the_api_reference(site: Path) -> None:
    """``Scheduler`` is assembled from parts in modules of their own (``recover`` comes from
    :mod:`aiqsim.scheduler.recovery`): the reference lists what they give it, too."""
    from aiqsim.scheduler.scheduler import Scheduler

    raw = (site / "reference/api/index.html").read_text(encoding="utf-8")
    public = [name for name in dir(Scheduler) if not name.startswith("_")]
    assert "recover" in public
    missing = [name for name in public if f'id="aiqsim.scheduler.scheduler.Scheduler.{name}"' not in raw]
    assert missing == []


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    pages = {"broken.md": "Read [the missing page](nowhere.md).\n", "reference/api.md": "# API\n"}
    done = build(tmp_path, NOTEBOOKS, nav=["index.md", "broken.md"], pages=pages)
    assert done.returncode != 0
    assert "nowhere.md" in done.stdout + done.stderr


def test_an_unresolved_api_reference_fails_the_strict_build(tmp_path: Path) -> None:
    pages = {"reference/api.md": "# API\n\n::: aiqsim.no_such_module\n"}
    done = build(tmp_path, NOTEBOOKS, nav=["index.md", "reference/api.md"], pages=pages)
    assert done.returncode != 0
    assert "no_such_module" in done.stdout + done.stderr


def test_a_notebook_page_says_when_its_outputs_were_computed_in_fast_mode(tmp_path: Path) -> None:
    """The site shows FAST-mode runs, whose decisions can differ from full mode: the page must say so,
    and must not show the paths of the machine that built it."""
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        from hooks import ROOT as HOOKS_ROOT
        from hooks import with_mode_note
    finally:
        sys.path.remove(str(ROOT / "docs"))
    book = nbformat.v4.new_notebook()
    book.cells = [
        nbformat.v4.new_markdown_cell("# Title"),
        nbformat.v4.new_code_cell("FAST = False"),
        nbformat.v4.new_code_cell("FAST = True"),
        nbformat.v4.new_code_cell("print(1)"),
    ]
    book.cells[3].outputs = [nbformat.v4.new_output("stream", text=f"read {HOOKS_ROOT}/scenarios/x.toml\n")]
    noted = nbformat.reads(with_mode_note(nbformat.writes(book), "x.ipynb"), as_version=4)
    assert noted.cells[1].cell_type == "markdown" and "computed in FAST mode" in noted.cells[1].source
    assert "notebooks/x.ipynb" in noted.cells[1].source
    assert noted.cells[-1].outputs[0]["text"] == "read scenarios/x.toml\n"
    full = nbformat.v4.new_notebook()
    full.cells = [nbformat.v4.new_markdown_cell("# Title"), nbformat.v4.new_code_cell("FAST = False")]
    assert len(nbformat.reads(with_mode_note(nbformat.writes(full), "x.ipynb"), as_version=4).cells) == 2


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOK_PATHS, ids=lambda p: p.stem)
def test_every_notebook_page_names_the_mode_of_its_outputs(site: Path, path: Path) -> None:
    page = text_of(site, f"notebooks/{path.stem}")
    assert "Outputs computed in FAST mode." in page
    assert str(ROOT) not in page
