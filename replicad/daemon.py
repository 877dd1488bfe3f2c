"""`replicad run`: the daemon's shell — logging, signals, the replicator."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import structlog

from replicad.follower.fetcher import FetchSettings
from replicad.follower.metadata import TopicSelection
from replicad.follower.replicator import Replicator, ReplicatorSettings
from replicad.protocol.client import ClientSettings

log = structlog.get_logger("replicad.daemon")


def settings_from_config(config: Any) -> ReplicatorSettings:
    """Translate the validated user config into the replicator's settings."""
    src, topics, fetch = config.source, config.topics, config.fetch
    return ReplicatorSettings(
        bootstrap_servers=tuple(str(hp) for hp in src.bootstrap_servers),
        data_dir=config.data_dir,
        selection=TopicSelection(include=tuple(topics.include), regex=topics.regex),
        client=ClientSettings(
            client_id=src.client_id,
            connect_timeout_s=src.connect_timeout_ms / 1000,
            request_timeout_s=src.request_timeout_ms / 1000,
            reconnect_backoff_ms=src.reconnect_backoff_ms,
            reconnect_backoff_max_ms=src.reconnect_backoff_max_ms,
        ),
        fetch=FetchSettings(
            response_max_bytes=fetch.response_max_bytes,
            partition_max_bytes=fetch.partition_max_bytes,
            wait_max_ms=fetch.wait_max_ms,
            min_bytes=fetch.min_bytes,
            backoff_ms=fetch.backoff_ms,
            sessions=fetch.sessions,
            replica_id=fetch.replica_id,
            isolation_level=fetch.isolation_level.wire_value,
            rack_id=src.rack_id,
            start_from=str(topics.start_from),
            on_gap=str(topics.on_gap),
            request_timeout_ms=src.request_timeout_ms,
            reconnect_backoff_ms=src.reconnect_backoff_ms,
            reconnect_backoff_max_ms=src.reconnect_backoff_max_ms,
        ),
        log=config.log,
        metadata_max_age_ms=src.metadata_max_age_ms,
        checkpoint_interval_ms=config.checkpoint_interval_ms,
    )


async def run_daemon(config: Any) -> int:
    """Replicate until SIGTERM/SIGINT; then finish the in-flight append, flush,
    checkpoint and return 0."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            return
        log.info("shutting down", signal=signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    replicator = Replicator(settings_from_config(config))
    replicator.on_ready = lambda: log.info(
        "replicating",
        partitions=len(replicator.states),
        leaders=len(replicator.fetchers),
        data_dir=str(config.data_dir),
    )
    try:
        await replicator.run(stop)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    return 0
