"""The pipeline's own settings, from the environment (prefix IGNIS_, as the core's ignis.settings): what the
`ignis pipeline` commands let Spark print. The store settings stay the core's (IGNIS_STORE, ...)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ignis.errors import InvalidInputError

# log4j's levels, quietest first (Spark's SparkContext.setLogLevel takes the same names).
SPARK_LOG_LEVELS = ("OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL")
QUIET = "OFF"
VERBOSE = "WARN"  # `--verbose`: at least what Spark itself shows a driver like this one (its shell default)


class PipelineSettings(BaseSettings):
    """IGNIS_SPARK_LOG_LEVEL: the level of Spark's own log lines on an `ignis pipeline` command's stderr."""

    model_config = SettingsConfigDict(env_prefix="IGNIS_", extra="ignore")

    spark_log_level: str = Field(
        QUIET, description="Spark's log lines an `ignis pipeline` command shows: OFF (the default: only the "
        "command's own output), FATAL, ERROR, WARN, INFO, DEBUG, TRACE or ALL; `--verbose` shows at least WARN")

    @field_validator("spark_log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.strip().upper()
        if level not in SPARK_LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(SPARK_LOG_LEVELS)}")
        return level


def load_pipeline_settings(**overrides: Any) -> PipelineSettings:
    """Settings from the environment plus overrides; a bad value is an InvalidInputError naming the variable."""
    try:
        return PipelineSettings(**overrides)
    except ValidationError as exc:
        problems = [f"IGNIS_{'_'.join(map(str, e['loc'])).upper()}={e.get('input')!r}: "
                    f"{str(e['msg']).removeprefix('Value error, ')}" for e in exc.errors(include_url=False)]
        raise InvalidInputError("invalid settings: " + "; ".join(problems)) from None


def spark_log_level(verbose: bool = False) -> str:
    """The level of Spark's logs for a command: IGNIS_SPARK_LOG_LEVEL, and at least VERBOSE with `--verbose`."""
    level = load_pipeline_settings().spark_log_level
    if verbose and SPARK_LOG_LEVELS.index(level) < SPARK_LOG_LEVELS.index(VERBOSE):
        return VERBOSE
    return level
