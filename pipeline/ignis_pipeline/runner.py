"""The spark-submit entry of the job modules: `spark-submit .../ignis_pipeline/jobs/export.py ARGS` runs
`ignis pipeline export ARGS` through the core CLI (store from IGNIS_STORE / IGNIS_CLIENT_ID /
IGNIS_FARM_ID), so a job submitted to a cluster parses its arguments and reports its errors as the
command does.

Its own module so that the jobs (`jobs/*`) and the CLI (`cli.py`, which runs the jobs) never import each
other: the CLI imports the jobs, the jobs import this.
"""

from __future__ import annotations

from collections.abc import Sequence


def run_job(job: str, argv: Sequence[str]) -> int:
    """Run `ignis pipeline JOB ARGV...` and return its exit code."""
    from ignis.cli.app import run

    return run(["pipeline", job, *argv])
