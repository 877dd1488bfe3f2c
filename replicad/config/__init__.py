"""replicad's configuration: a validated, immutable `Config` from a YAML file and CLI overrides.

    from replicad.config import load_config, Config
    config = load_config(Path("/etc/replicad/replicad.yaml"), {"data_dir": "/srv/replica"})

Bad input raises `replicad.errors.ConfigErrors` (a `ConfigError`) listing every problem.
"""

from replicad.config.loader import config_from_mapping, load_config
from replicad.config.model import (
    Config,
    ControlConfig,
    FetchConfig,
    HostPort,
    IsolationLevel,
    LogFormat,
    LoggingConfig,
    LogLevel,
    OnGap,
    ServeConfig,
    SourceConfig,
    StartFrom,
    TopicsConfig,
)

__all__ = [
    "Config",
    "ControlConfig",
    "FetchConfig",
    "HostPort",
    "IsolationLevel",
    "LogFormat",
    "LogLevel",
    "LoggingConfig",
    "OnGap",
    "ServeConfig",
    "SourceConfig",
    "StartFrom",
    "TopicsConfig",
    "config_from_mapping",
    "load_config",
]
