"""`aiqsim tune` takes every numeric summary key the tuned scenario reports (job, per-deployment,
per-tenant keys included) as objective, constraint or tie-break, and refuses any other one up front
(exit status 2, nothing run or written) naming the keys this scenario offers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from aiqsim.cli import main
from aiqsim.core.errors import ConfigurationError
from aiqsim.lab.tune import Constraint, metric_keys, tune
from aiqsim.sim import simulate
from aiqsim.sim.scenario import load_scenario
from aiqsim.sim.streaming_run import scenario_metric_keys

pytest.importorskip("optuna")

ROOT = Path(__file__).resolve().parent.parent / "scenarios"


def _shortened(tmp_path: Path, name: str, old: str, new: str) -> Path:
    text = (ROOT / name).read_text()
    assert old in text
    path = tmp_path / name
    path.write_text(text.replace(old, new))
    return path


@pytest.fixture
def pipeline(tmp_path: Path) -> Path:
    return _shortened(tmp_path, "ai_edit_pipeline.toml", "duration_s = 1200", "duration_s = 300")


@pytest.fixture
def deployments(tmp_path: Path) -> Path:
    return _shortened(tmp_path, "multi_deployment_tenants.toml", "duration_s = 300", "duration_s = 60")


def _tune(scenario: Path, out: Path, *argv: str) -> int:
    options = ["--trials", "2", "--seeds", "1", "--out", str(out), "--no-progress"]
    return main(["tune", str(scenario), *argv, *options])


@pytest.mark.parametrize("mode", ["full", "summary"])
def test_the_derived_keys_are_a_runs_numeric_summary_keys(tmp_path: Path, mode: str) -> None:
    """Without a run, the keys match what a run reports (deployments and jobs here), in its order."""
    path = _shortened(tmp_path, "pipeline_over_deployments.toml", "duration_s = 300", "duration_s = 30")
    scenario = load_scenario(path)
    summary = simulate(scenario, seed=0, records=mode).summary
    numeric = [k for k, v in summary.items() if isinstance(v, int | float) and not isinstance(v, bool)]
    assert list(scenario_metric_keys(scenario)) == numeric
    assert {"job_latency_p99_s", "deployment_east_success_latency_p99_s"} <= set(numeric)
    assert "bottleneck_stage" not in numeric  # text: nothing to minimise


def test_a_job_key_is_a_pipelines_objective(pipeline: Path, tmp_path: Path) -> None:
    out = tmp_path / "tune.csv"
    assert _tune(pipeline, out, "--param", "retry.base_s=0.1:2", "--objective", "job_latency_p99_s") == 0
    trials = pd.read_csv(out)
    assert len(trials) == 2 and trials["job_latency_p99_s"].gt(0).all()


def test_deployment_and_tenant_keys_bound_and_break_ties(deployments: Path) -> None:
    result = tune(
        deployments,
        ["routes.gpt.weights.cheap=0.5:3"],
        objective="cost_total",
        constraints=["deployment_fast_success_latency_p99_s<=600"],
        tie_break="tenant_acme_success_latency_p99_s",
        trials=2,
        seeds=1,
        progress=False,
    )
    assert result.feasible and result.tie_break == "tenant_acme_success_latency_p99_s:min"
    assert result.trials["deployment_fast_success_latency_p99_s"].between(0, 600).all()
    assert result.pick is not None
    assert [check.metric for check in result.pick.constraints] == ["deployment_fast_success_latency_p99_s"]


@pytest.mark.parametrize(
    ("name", "argv", "message", "offered"),
    [
        ("retry_storm_429.toml", ["--objective", "job_latency_p99_s"],
         "objective 'job_latency_p99_s': unknown summary key: scenario 'retry_storm_429' has no such key "
         "(job keys need a job workload)", "success_latency_p99_s"),
        ("multi_deployment_tenants.toml", ["--constraint", "deployment_fats_success_latency_p99_s<=30"],
         "unknown metric 'deployment_fats_success_latency_p99_s'", "deployment_fast_success_latency_p99_s"),
        ("multi_deployment_tenants.toml", ["--tie-break", "tenant_acme_p99"],
         "tie-break 'tenant_acme_p99'", "tenant_acme_success_latency_p99_s"),
    ],
)  # fmt: skip
def test_a_key_the_scenario_lacks_is_refused_naming_what_it_offers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, argv: list[str], message: str, offered: str
) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    assert _tune(ROOT / name, folder / "tune.csv", "--param", "retry.base_s=0.1:2", *argv) == 2
    err = capsys.readouterr().err
    assert message in err and "it offers: tasks_submitted, " in err and offered in err
    assert err.count("\n") == 1
    assert not list(folder.iterdir())  # nothing was run or written


def test_a_constraint_object_is_checked_too(deployments: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"unknown metric 'job_latency_p99_s'.*job workload"):
        tune(deployments, ["retry.base_s=0.1:2"], constraints=[Constraint("job_latency_p99_s", "<=", 1.0)],
             trials=1, progress=False)  # fmt: skip


def test_without_a_scenario_the_task_keys_are_offered() -> None:
    keys = metric_keys()
    assert "success_latency_p99_s" in keys and not any(k.startswith(("job", "deployment_")) for k in keys)
