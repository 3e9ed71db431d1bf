"""`aiqsim calibrate` and `aiqsim tune` from the command line: the happy path writes what it says, and
bad input is one message with exit status 2 before any simulation."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from aiqsim.cli import main
from aiqsim.sim import simulate

pytest.importorskip("optuna")

ROOT = Path(__file__).resolve().parent.parent
STORM = ROOT / "scenarios" / "retry_storm_429.toml"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "small.toml"
    path.write_text(STORM.read_text().replace("duration_s = 120", "duration_s = 20"))
    return path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--param", "retry.nonsense=1:2"], "retry.nonsense"),
        (["--param", "retry.base_s=5:0.1:log"], "LOW < HIGH"),
        (["--param", "retry.base_s=0.1:5", "--constraint", "success_latency_p99_s=30"], "METRIC<=BOUND"),
        (["--param", "retry.base_s=0.1:5", "--constraint", "speed<=30"], "unknown metric"),
        (["--param", "retry.base_s=0.1:5", "--objective", "speed"], "unknown summary key"),
        ([], "--param"),
        (["--param", "retry.base_s=0.1:5", "--engine", "local", "--workers", "-1"], "--workers -1: expected"),
        (["--param", "retry.base_s=0.1:5", "--engine", "dask", "--address", "bogus://x"], "scheme 'bogus'"),
        (["--param", "retry.base_s=0.1:5", "--address", "tcp://127.0.0.1:1"], "with --engine dask"),
        (
            ["--param", "providers.llm.timeout_prob=0:0.1", "--param", "providers[0].timeout_prob=0.2,0.3"],
            "providers[0].timeout_prob: addresses the same field as providers.llm.timeout_prob",
        ),
    ],
)
def test_tune_refuses_bad_input_with_status_2(
    small: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    out = tmp_path / "tune.csv"
    assert main(["tune", str(small), *argv, "--trials", "3", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing was run or written


def test_tune_writes_trials_patch_and_resumes(
    small: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tune.csv"
    params = [
        "retry.base_s=0.1:5:log",
        "quotas.llm.requests_per_min=60:200:int",
        "quotas.llm.request_burst=1:60:int",
        "dispatch.policy=fifo,sjf,sjf_aging",
    ]
    argv = [
        "tune",
        str(small),
        *(arg for p in params for arg in ("--param", p)),
        "--objective",
        "rate_limited",
    ]
    argv += [
        "--constraint",
        "success_latency_p99_s<=60",
        "--seeds",
        "2",
        "--seed",
        "1",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main([*argv, "--trials", "3"]) == 0
    assert main([*argv, "--trials", "5"]) == 0  # resumed: 3 kept, 2 more
    printed = capsys.readouterr().out
    trials = pd.read_csv(out)
    assert len(trials) == 5
    patch = tomllib.loads((tmp_path / "tune.csv.best.toml").read_text())
    set_line = [line.strip() for line in printed.splitlines() if line.strip().startswith("--set")][-1]
    overrides = dict(item.split("=", 1) for item in set_line.replace("--set ", "").split())
    assert set(overrides) == {p.split("=")[0] for p in params}
    assert patch["dispatch"]["policy"] == overrides["dispatch.policy"]
    # fewest 429s; among equals (the default tie-break) the lowest success p99, then the earliest
    best = trials[trials["feasible"]].sort_values(["rate_limited", "success_latency_p99_s", "trial"]).iloc[0]
    assert patch["quotas"]["llm"]["request_burst"] == best["quotas.llm.request_burst"]
    # the --set line reproduces the trial's figures (mean over the two replication seeds)
    again = [
        simulate(small, seed=s, overrides={k: patch_value(v) for k, v in overrides.items()}) for s in (0, 1)
    ]
    assert sum(r.summary["rate_limited"] for r in again) / 2 == best["rate_limited"]


def patch_value(text: str) -> object:
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def test_two_objectives_give_a_pareto_front_on_local_processes(small: Path, tmp_path: Path) -> None:
    from aiqsim.lab.tune import tune

    objective = ["rate_limited", "success_latency_p95_s"]
    result = tune(small, ["retry.base_s=0.05:5:log"], objective=objective, trials=6,
                  seeds=2, engine="local", workers=2, progress=False)  # fmt: skip
    front = result.pareto
    assert len(front) >= 1
    for _, row in front.iterrows():  # nothing in the front is dominated by any trial
        dominated = (result.trials["rate_limited"] <= row["rate_limited"]) & (
            result.trials["success_latency_p95_s"] <= row["success_latency_p95_s"]
        ) & ((result.trials["rate_limited"] < row["rate_limited"]) | (
            result.trials["success_latency_p95_s"] < row["success_latency_p95_s"]))  # fmt: skip
        assert not dominated.any()


def test_calibrate_cli_writes_a_scenario_validate_accepts_and_a_report(small: Path, tmp_path: Path) -> None:
    simulate(small, seed=2).call_log.write(tmp_path / "log")
    out, report = tmp_path / "mine.toml", tmp_path / "report.html"
    done = subprocess.run(
        [sys.executable, "-m", "aiqsim", "calibrate", str(tmp_path / "log"), "--out", str(out), "--report",
         str(report), "--settings", str(small)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert main(["validate", str(out)]) == 0
    text = report.read_text()
    assert "QQ" not in text or "data:image/png;base64," in text
    assert text.count("data:image/png;base64,") >= 2


def test_calibrate_cli_refuses_a_folder_without_a_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["calibrate", str(tmp_path), "--out", str(tmp_path / "x.toml")]) == 2
    assert "tasks.csv" in capsys.readouterr().err
    assert not (tmp_path / "x.toml").exists()


def test_calibrate_write_failures_leave_earlier_files_whole(
    small: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: --out and --report were written in place, so a failed write left them truncated."""
    simulate(small, seed=2).call_log.write(tmp_path / "log")
    out, report = tmp_path / "mine.toml", tmp_path / "report.html"
    out.write_text("# the earlier scenario\n")
    report.write_text("<p>the earlier report</p>\n")
    write_text = Path.write_text

    def fail_for(ending: str) -> None:
        def patched(self: Path, *args: object, **kwargs: object) -> object:
            return _fail_half_way(self) if ending in self.name else write_text(self, *args, **kwargs)

        monkeypatch.setattr(Path, "write_text", patched)

    argv = ["calibrate", str(tmp_path / "log"), "--settings", str(small)]
    fail_for(".toml")
    assert main([*argv, "--out", str(out)]) == 2
    assert f"cannot write {out}" in capsys.readouterr().err
    fail_for(".html")
    assert main([*argv, "--out", str(tmp_path / "new.toml"), "--report", str(report)]) == 2
    assert f"cannot write the report {report}" in capsys.readouterr().err
    assert out.read_bytes() == b"# the earlier scenario\n"
    assert report.read_bytes() == b"<p>the earlier report</p>\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log", "mine.toml", "new.toml", "report.html"]


def test_tune_write_failures_leave_earlier_files_whole_and_folders_are_refused_up_front(
    small: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the trials CSV and OUT.best.toml were written in place (a failed write truncated
    them), and a folder at OUT.best.toml raised IsADirectoryError only after every trial had run."""
    out = tmp_path / "tune.csv"
    patch = tmp_path / "tune.csv.best.toml"
    argv = ["tune", str(small), "--param", "retry.base_s=0.1:5:log", "--seeds", "1", "--trials", "2",
            "--out", str(out), "--no-progress"]  # fmt: skip
    patch.mkdir()
    assert main(argv) == 2
    assert f"{patch}: is a directory" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "tune.csv.optuna.db").exists()  # before any trial
    patch.rmdir()
    assert main(argv) == 0
    capsys.readouterr()
    before = {path: path.read_bytes() for path in (out, patch)}
    with monkeypatch.context() as failing:
        failing.setattr(pd.DataFrame, "to_csv", lambda self, target, *a, **k: _fail_half_way(target))
        assert main(argv) == 2  # resumed: no new trials, only the writes
    assert f"{out}: cannot write (File too large); the trials are kept in" in capsys.readouterr().err
    with monkeypatch.context() as failing:
        failing.setattr(Path, "write_text", lambda self, *a, **k: _fail_half_way(self))
        assert main(argv) == 2
    assert f"{patch}: cannot write (File too large)" in capsys.readouterr().err
    assert {path: path.read_bytes() for path in (out, patch)} == before
    names = ["tune.csv", "tune.csv.best.toml", "tune.csv.optuna.db"]
    assert sorted(p.name for p in tmp_path.iterdir()) == names  # and no temporary files


def _fail_half_way(target: object) -> None:
    import errno

    Path(str(target)).write_bytes(b"trunc")
    raise OSError(errno.EFBIG, "File too large")


def _optuna_db_cut_short(path: Path) -> None:
    import optuna

    optuna.create_study(storage=f"sqlite:///{path}", study_name="cut")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _unrelated_sqlite_db(path: Path) -> None:
    import sqlite3

    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    connection.close()


def _optuna_lookalike_db(path: Path) -> None:
    """Two of Optuna's table names and nothing else: Optuna added its other tables, then failed."""
    import sqlite3

    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE studies (x)")
        connection.execute("CREATE TABLE version_info (y)")
    connection.close()


def _optuna_db_edited(sql: str) -> Any:
    """A study this very command made, then changed by ``sql`` (as by hand)."""

    def make(path: Path) -> None:
        import sqlite3

        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(storage=f"sqlite:///{path}", study_name="edited")
        study.optimize(lambda trial: trial.suggest_float("retry.base_s", 0.1, 5), n_trials=1)
        with sqlite3.connect(path) as connection:
            connection.execute(sql)
        connection.close()

    return make


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda path: path.write_bytes(bytes(range(256)) * 8), "is not an SQLite database"),
        (_optuna_db_cut_short, "is not a readable SQLite database"),
        (_unrelated_sqlite_db, "is an SQLite database that is not Optuna's (its tables: invoices"),
        (
            _optuna_lookalike_db,
            "is an SQLite database that is not Optuna's (its tables: studies, version_info",
        ),
        (
            _optuna_db_edited("UPDATE alembic_version SET version_num = 'v9.9.9'"),
            "Optuna cannot open the study in it (RuntimeError",
        ),
    ],
    ids=["random_bytes", "truncated_optuna_db", "unrelated_sqlite_db", "lookalike", "future_schema"],
)
def test_tune_refuses_a_storage_file_that_is_not_optunas_and_leaves_it_alone(
    small: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any, problem: str
) -> None:
    """Regression: a corrupt OUT.optuna.db died with a sqlalchemy DatabaseError traceback, and an
    unrelated SQLite database there silently got Optuna's tables added to it."""
    out = tmp_path / "tune.csv"
    storage = tmp_path / "tune.csv.optuna.db"
    make(storage)
    before = storage.read_bytes()
    argv = ["tune", str(small), "--param", "retry.base_s=0.1:5", "--seeds", "1", "--trials", "1",
            "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"tuning storage {storage}: {problem}" in err and err.count("\n") == 1, err
    assert storage.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tune.csv.optuna.db"]  # nothing else written


@pytest.mark.parametrize(
    ("sql", "problem"),
    [
        ("UPDATE trials SET state = 'BOGUS'", "Optuna cannot open the study in it (LookupError"),
        (
            "UPDATE trial_params SET param_value = 1e6",
            "trial 0 holds retry.base_s = 1000000.0, outside the searched",
        ),
    ],
    ids=["unknown_state", "value_outside_the_search"],
)
def test_tune_refuses_its_own_study_changed_by_hand_and_leaves_it_alone(
    small: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], sql: str, problem: str
) -> None:
    """A bare LookupError traceback; and a best.toml with base_s = 1e6 from a search of 0.1:5."""
    import sqlite3

    out = tmp_path / "tune.csv"
    storage = tmp_path / "tune.csv.optuna.db"
    argv = ["tune", str(small), "--param", "retry.base_s=0.1:5", "--seeds", "1", "--trials", "1",
            "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    with sqlite3.connect(storage) as connection:
        connection.execute(sql)
    connection.close()
    before = storage.read_bytes()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"tuning storage {storage}: {problem}" in err and err.count("\n") == 1, err
    assert storage.read_bytes() == before


def test_calibrate_refuses_more_arrival_bins_than_it_can_use_before_reading_the_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: --arrival-bins had no upper bound; 100000000 ran for minutes building one workload
    per bin. The flag is named on the command line, the argument in the library."""
    from aiqsim.core.errors import ConfigurationError
    from aiqsim.lab.calibrate import calibrate

    argv = ["calibrate", str(tmp_path), "--arrival-bins", "10001", "--out", str(tmp_path / "x.toml")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        err == "aiqsim calibrate: error: --arrival-bins: expected an integer in [1, 10,000] "
        "(one workload per bin), got 10001\n"
    )
    with pytest.raises(ConfigurationError, match=r"^arrival_bins: expected an integer in \[1, 10,000\]"):
        calibrate(tmp_path, arrival_bins=100_000_000)
    assert list(tmp_path.iterdir()) == []
