"""`ignis pipeline export|replay|redrive|stats`: the jobs on Spark, `local[*]` unless `--master URL`; every
`--conf k=v` goes to the SparkSession. A plug-in of the core CLI (entry point `ignis.cli`): pyspark is
imported only when a job runs, so `ignis --help` works without the `spark` extra.

Every argument that can be checked without Spark is checked before any of Spark is imported or started
(ignis_pipeline.usage, the master's form and host, the queues' existence): bad usage is one line within a
moment. Spark's own logs stay off the terminal unless `--verbose` or IGNIS_SPARK_LOG_LEVEL asks for them
(ignis_pipeline.spark_logs).

Under spark-submit the job modules (`ignis_pipeline/jobs/*.py`) run the same commands through the core
CLI (runner.run_job); they never import this module, which imports them.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ignis.cli import render
from ignis.cli.render import OutputFormat, emit_json, emit_line
from ignis.errors import IgnisError, InvalidInputError, QueueNotFound
from ignis.settings import load_settings
from ignis_pipeline import usage

OutputOpt = Annotated[OutputFormat, typer.Option(
    "--output", "-o", case_sensitive=False,
    help="table for people; json prints one JSON document on stdout and nothing else there.")]
WhereOpt = Annotated[str | None, typer.Option(
    "--where", show_default=False, help="SQL condition on the data source's columns, e.g. \"reason = 'timeout'\"")]
RateOpt = Annotated[float | None, typer.Option(
    "--rate", min=0.001, show_default=False, help="at most N messages per second, across all tasks")]
CanaryOpt = Annotated[int | None, typer.Option(
    "--canary", min=1, show_default=False,
    help="publish the first N, wait until they are settled, and go on only if at least 95% were acked")]
CanaryTimeoutOpt = Annotated[float, typer.Option(
    "--canary-timeout", min=1, help="seconds to wait for the canary to settle (unsettled ones count as failed)")]


class Magazine(StrEnum):
    MAIN = "main"
    SIDELINE = "sideline"
    DEAD = "dead"
    ALL = "all"


class Source(StrEnum):
    DEAD = "dead"
    SIDELINE = "sideline"


class Format(StrEnum):
    PARQUET = "parquet"
    JSON = "json"


pipeline_app = typer.Typer(
    help="Bulk jobs over queue data on Spark (Java 17+ and the spark extra): export to Parquet, replay an "
         "export, redrive dead letters, backlog stats.",
    no_args_is_help=True, rich_markup_mode="markdown")


def register(app: typer.Typer, groups: Mapping[str, typer.Typer]) -> None:
    """Entry point `ignis.cli`: add `ignis pipeline ...`."""
    app.add_typer(pipeline_app, name="pipeline")


@pipeline_app.callback()
def pipeline(
    ctx: typer.Context,
    master: Annotated[str | None, typer.Option(
        "--master", show_default=False, help="Spark master URL [default: local[*], or spark-submit's]")] = None,
    conf: Annotated[list[str] | None, typer.Option(
        "--conf", show_default=False, help="Spark setting KEY=VALUE (repeatable)")] = None,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="show Spark's own log lines (at least WARN) on stderr; IGNIS_SPARK_LOG_LEVEL sets "
                                "the level [default: OFF: only the command's own output]")] = False,
) -> None:
    """Bulk jobs over queue data (and topics' retained logs) on Spark: export, replay, redrive, stats."""
    ctx.meta["ignis.spark"] = (master, conf or [], verbose)


def _job_session_conf() -> dict[str, dict[str, str]]:
    from ignis_pipeline.jobs import export

    return {"export": export.SESSION_CONF}


def _session_args(ctx: typer.Context) -> tuple[str | None, dict[str, str], str]:
    """The master, the --conf settings and the level of Spark's logs, every one checked (no Spark needed)."""
    from ignis_pipeline.session import check_master_url, parse_conf
    from ignis_pipeline.settings import spark_log_level

    master, conf, verbose = ctx.meta.get("ignis.spark", (None, [], False))
    given = parse_conf(conf)
    if master is not None:
        check_master_url(master)
    if given.get("spark.master"):
        check_master_url(given["spark.master"], "--conf spark.master=")
    return master, given, spark_log_level(verbose)


def _session(master: str | None, settings: dict[str, str], job: str, log_level: str) -> Any:
    from ignis_pipeline.session import build_session

    return build_session(f"ignis-pipeline-{job}", master, settings, log_level=log_level)


def _store(ctx: typer.Context) -> dict[str, str]:
    """The store options of every job: the CLI's --store/--client-id/--farm-id, else the environment."""
    from ignis_pipeline.options import SourceOptions

    state = ctx.find_root().obj
    settings = state.settings() if hasattr(state, "settings") else load_settings()
    parsed = SourceOptions.parse({"store": settings.store, "farmId": settings.farm_id,
                                  "clientId": settings.client_id, "queue": "*"})
    return {"store": parsed.store, "farmId": parsed.farm_id, "clientId": parsed.client_id}


_OUR_ERROR = re.compile(r"\b(InvalidInputError|QueueNotFound|TopicNotFound|QueueInactive|PayloadTooLarge|"
                        r"StoreUnavailable|StoreFull|StoreError|StaleEpoch|CanaryFailed|InvalidSpecError): (.+)")


def _load(job: str) -> Callable[..., dict[str, Any]]:
    """The function of a job (ignis_pipeline.jobs.JOB.JOB), imported when it runs: it imports pyspark."""
    fn: Callable[..., dict[str, Any]] = getattr(importlib.import_module(f"ignis_pipeline.jobs.{job}"), job)
    return fn


def _job(ctx: typer.Context, name: str, *args: Any, queues: Sequence[str] = (), topics: Sequence[str] = (),
         **kwargs: Any) -> dict[str, Any]:
    """Run job `name`; a failure inside Spark comes back as one line naming the problem. Before anything of Spark
    is imported or started: the session's arguments, Spark and Java being there, where the store can be reached
    from (an lmdb store and a master on other hosts), that the master answers, and that the named `queues`
    exist (and the named `topics`)."""
    from ignis_pipeline.session import check_master, check_master_answers, check_runtime, effective_master

    store = _store(ctx)
    master, given, log_level = _session_args(ctx)
    check_runtime()
    chosen = effective_master(master, given)
    check_master(chosen, store["store"])
    check_master_answers(chosen)
    usage.require_queues(store, queues)
    usage.require_topics(store, topics)
    # Our own progress line replaces Spark's console bar. Failures come back as exceptions, turned into one
    # `error:` line by the core CLI, so Spark's own logs (its stack traces included) stay off unless asked for.
    settings = {"spark.ui.showConsoleProgress": "false", **_job_session_conf().get(name, {}), **given}
    fn = _load(name)
    spark = _session(master, settings, name, log_level)
    try:
        return fn(spark, store, *args, **kwargs)
    except IgnisError:
        raise
    except Exception as exc:
        found = _OUR_ERROR.search(str(exc))
        if found is None:
            from pyspark.errors import AnalysisException

            if isinstance(exc, AnalysisException):  # bad input as Spark sees it: a path, a --where
                raise InvalidInputError(f"Spark: {str(exc).splitlines()[0]}") from None
            raise
        message = found.group(2).strip()
        if found.group(1) in ("QueueNotFound", "TopicNotFound", "QueueInactive"):
            raise _NotFound(message) from None
        raise InvalidInputError(message) from None
    finally:
        spark.stop()


class _NotFound(QueueNotFound):
    def __init__(self, message: str) -> None:
        IgnisError.__init__(self, message)


@pipeline_app.command()
def export(
    ctx: typer.Context,
    queues: Annotated[list[str] | None, typer.Argument(
        metavar="[QUEUE]...", show_default=False, help="queues to export [default: every queue of the client]")] = None,
    to: Annotated[str, typer.Option("--to", show_default=False, help="output directory (any Spark path)")] = "",
    topic: Annotated[str | None, typer.Option(
        "--topic", show_default=False, help="export this topic's retained log instead of queues")] = None,
    subject_filter: Annotated[str | None, typer.Option(
        "--subject-filter", show_default=False,
        help="with --topic: only the subjects this filter selects (MQTT wildcards: + one level, # the rest)")] = None,
    magazine: Annotated[Magazine | None, typer.Option(
        "--magazine", case_sensitive=False, show_default=False, help="[default: main]")] = None,
    fmt: Annotated[Format, typer.Option("--format", case_sensitive=False)] = Format.PARQUET,
    since: Annotated[str | None, typer.Option(
        help="load time from (ISO-8601 or epoch ms); with --topic: publish time from")] = None,
    until: Annotated[str | None, typer.Option(
        help="load time up to (ISO-8601 or epoch ms); with --topic: publish time before (exclusive)")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace PATH if it exists")] = False,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Snapshot queue messages to Parquet (or JSON), partitioned by queue and magazine; or, with --topic, a topic's
    retained log, partitioned by topic. Nothing is consumed."""
    if not to:
        raise InvalidInputError("--to PATH is required: where to write the export")
    if topic is not None:
        topic = usage.topic_name(topic, queues, magazine, subject_filter)
        usage.topic_times(since, until)
        usage.new_output(to, overwrite)
        doc = _job(ctx, "export", [], to, topics=[topic], fmt=fmt.value, since=since, until=until,
                   overwrite=overwrite, topic=topic, subject_filter=subject_filter)
        _emit(doc, output, f"exported {doc['exported']} message(s) of topic {topic} to {doc['path']} "
                           f"({doc['format']})")
        return
    if subject_filter is not None:
        raise InvalidInputError("--subject-filter selects a topic's messages: give --topic too")
    names = usage.queue_list(queues)
    usage.load_times(since, until)
    usage.new_output(to, overwrite)
    doc = _job(ctx, "export", names, to, queues=names, magazine=(magazine or Magazine.MAIN).value, fmt=fmt.value,
               since=since, until=until, overwrite=overwrite)
    _emit(doc, output, f"exported {doc['exported']} message(s) to {doc['path']} ({doc['format']})")


@pipeline_app.command()
def replay(
    ctx: typer.Context,
    source: Annotated[str, typer.Option("--from", show_default=False, help="an export's directory")] = "",
    queue: Annotated[str, typer.Option("--to", show_default=False, help="queue to publish into")] = "",
    fmt: Annotated[Format, typer.Option("--format", case_sensitive=False)] = Format.PARQUET,
    where: WhereOpt = None,
    rate: RateOpt = None,
    canary: CanaryOpt = None,
    canary_timeout: CanaryTimeoutOpt = 300.0,
    magazine: Annotated[Magazine, typer.Option(
        "--magazine", case_sensitive=False,
        help="which of the export's rows to publish: main (the default), or also failed messages: sideline, dead "
             "or all")] = Magazine.MAIN,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Publish an export into a queue again, ids, keys and headers kept. Only the export's main rows unless
    --magazine asks for the sideline or the dead letters."""
    if not source or not queue:
        raise InvalidInputError("--from PATH and --to QUEUE are both required")
    queue = usage.queue_name(queue, "--to")
    usage.existing_input(source)
    doc = _job(ctx, "replay", source, queue, queues=[queue], fmt=fmt.value, where=where, rate=rate, canary=canary,
               canary_timeout=canary_timeout, magazine=magazine.value)
    line = f"replayed {doc['published']} message(s) from {source} into {queue}"
    if doc["leftOut"]:
        line += (f"; left out {doc['leftOut']} row(s) of other magazines than {magazine.value} "
                 "(--magazine all to publish them too)")
    if doc.get("unreadable"):
        line += f"; left out {doc['unreadable']} row(s) of records that were no IgnisMQ message (codec unreadable)"
    _emit(doc, output, line + _canary(doc))


@pipeline_app.command()
def redrive(
    ctx: typer.Context,
    queue: Annotated[str, typer.Argument(metavar="QUEUE", show_default=False)],
    source: Annotated[Source, typer.Option("--from", case_sensitive=False)] = Source.DEAD,
    where: WhereOpt = None,
    rate: RateOpt = None,
    canary: CanaryOpt = None,
    canary_timeout: CanaryTimeoutOpt = 300.0,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Move dead letters (or sidelined messages) matching --where back to main: ids kept, attempts reset,
    each moved once."""
    queue = usage.queue_name(queue, "QUEUE")
    doc = _job(ctx, "redrive", queue, source.value, queues=[queue], where=where, rate=rate, canary=canary,
               canary_timeout=canary_timeout)
    line = f"moved {doc['moved']} message(s) from the {source.value} of {queue} back to main"
    if doc["gone"]:
        line += f"; {doc['gone']} had been moved or expired meanwhile"
    _emit(doc, output, line + _canary(doc))


@pipeline_app.command()
def stats(
    ctx: typer.Context,
    queues: Annotated[list[str] | None, typer.Argument(
        metavar="[QUEUE]...", show_default=False, help="queues [default: every queue of the client]")] = None,
    plot: Annotated[Path | None, typer.Option(
        "--plot", show_default=False, help="also draw the backlog-age distribution and depth per shard (PNG)")] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Backlog analytics per queue and magazine: stored, depth (not claimed yet, as `ignis stats`), in flight,
    ages (oldest, p50/p90/p99), attempts, reasons, top keys, messages stored per shard; delayed messages (not
    due yet) on each queue's main row."""
    names = usage.queue_list(queues)
    if plot is not None and plot.suffix.lower() != ".png":
        raise InvalidInputError(f"--plot {plot}: the file name must end in .png")
    if plot is not None and plot.is_dir():
        raise InvalidInputError(f"--plot {plot}: a directory, not a file name")
    doc = _job(ctx, "stats", names, queues=names)
    if plot is not None:
        from ignis_pipeline.jobs.plot import plot as draw

        doc["plot"] = str(draw(doc, plot))
    if output is OutputFormat.JSON:
        emit_json(doc)
        return
    render.out.print(_stats_table(doc))
    if plot is not None:
        render.err.print(f"plot written to {plot}", markup=False)


def _canary(doc: dict[str, Any]) -> str:
    report = doc.get("canary")
    return "" if not report else (f" (canary: {report['acked']}/{report['published']} acked in "
                                  f"{report['seconds']:.0f} s)")


def _emit(doc: dict[str, Any], output: OutputFormat, line: str) -> None:
    if output is OutputFormat.JSON:
        emit_json(doc)
    else:
        emit_line(line)


def _stats_table(doc: dict[str, Any]) -> Table:
    table = Table(title="backlog")
    counts = ("stored", "depth", "in flight", "delayed")
    for column in ("queue", "magazine", *counts, "oldest", "p50", "p90", "p99", "attempts", "reasons", "top keys"):
        table.add_column(column, justify="right" if column in counts else "left")

    def age(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}s"

    for row in doc["magazines"]:
        table.add_row(row["queue"], row["magazine"], str(row["stored"]), str(row["depth"]), str(row["inFlight"]),
                      str(row["delayed"]) if "delayed" in row else "-", age(row["oldestAgeSeconds"]),
                      age(row["ageSeconds"]["p50"]), age(row["ageSeconds"]["p90"]), age(row["ageSeconds"]["p99"]),
                      " ".join(f"{k}:{v}" for k, v in row["attempts"].items()) or "-",
                      " ".join(f"{k}:{v}" for k, v in row["reasons"].items()) or "-",
                      " ".join(f"{k['key']}:{k['count']}" for k in row["topKeys"][:3]) or "-")
    return table

