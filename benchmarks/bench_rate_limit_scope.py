"""What a 429 pause should reach, on the virtual clock: the evidence for the default.

Both sides of the choice, for every ``retry.rate_limit_scope`` (``lane``, ``task``, ``adaptive``), with the
production scheduler on SimPy (:mod:`aiqsim.validation.rate_limit_scope_study`):

1. 2,000 tasks through an instant provider with a client quota of 100 requests/s; 5% random 429s with
   Retry-After 1 s. Target: >= 80% of the throughput of the same run without 429s.
2. Poisson arrivals at 15/s for 120 s against a server quota of 600 requests/min, the client's own quota at
   1,200/min (2x the server's). Target: near-zero server 429s after the first. Run twice: the server's 429s
   say the quota is spent (as ``x-ratelimit-remaining-requests: 0`` does), and a server that does not say.

Run: ``python benchmarks/bench_rate_limit_scope.py [--seeds N]`` (about 10 s a seed on an idle core).
Virtual-clock figures: they do not depend on the machine's load, only on the seed.
"""

from __future__ import annotations

import argparse
import statistics

from aiqsim.scheduler.rate_limit_scope import DEFAULT_RATE_LIMIT_SCOPE
from aiqsim.validation.rate_limit_scope_study import rate_limit_scope_study


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    study = rate_limit_scope_study(range(args.seeds))
    base = statistics.fmean(run.tasks_per_s for run in study["baseline"])
    print(f"default scope: {DEFAULT_RATE_LIMIT_SCOPE}; {args.seeds} seeds, means (min-max)\n")
    print(f"1. 5% random 429s, Retry-After 1 s; no-429 throughput {base:.1f} tasks/s\n")
    print("| scope | tasks/s | vs no 429s (goal >= 0.80) | 429s | lane pauses |")
    print("|---|---|---|---|---|")
    for scope, runs in study["random_429"].items():
        rates = [run.tasks_per_s for run in runs]
        print(
            f"| {scope} | {statistics.fmean(rates):.1f} ({min(rates):.1f}-{max(rates):.1f}) | "
            f"{statistics.fmean(rates) / base:.2f} | {statistics.fmean(r.rate_limited for r in runs):.0f} | "
            f"{statistics.fmean(r.lane_pauses for r in runs):.1f} |"
        )
    for key, label in (("overrun", "429s say the quota is spent"), ("overrun_unreported", "429s do not say")):
        print(f"\n2. client quota 2x the server's, {label}\n")
        print("| scope | 429s after the first | per accepted | lane pauses | tasks failed | tasks/s |")
        print("|---|---|---|---|---|---|")
        for scope, runs in study[key].items():
            after = [run.rate_limited_after_first for run in runs]
            share = statistics.fmean(run.rate_limited_after_first / run.accepted for run in runs)
            print(
                f"| {scope} | {statistics.fmean(after):.0f} ({min(after)}-{max(after)}) | {share:.3f} | "
                f"{statistics.fmean(r.lane_pauses for r in runs):.1f} | "
                f"{statistics.fmean(r.tasks_failed for r in runs):.1f} | "
                f"{statistics.fmean(r.tasks_per_s for r in runs):.2f} |"
            )


if __name__ == "__main__":
    main()
