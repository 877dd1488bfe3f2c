"""`replicad run`: the daemon's shell — signals, systemd, control socket, metrics,
reload, around the replicator."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import resource
import signal
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from replicad.clock import monotonic_ms
from replicad.config import Config, load_config
from replicad.control.health import assess
from replicad.control.loop_watch import LoopWatch
from replicad.control.notify import SystemdNotifier, watchdog_loop
from replicad.control.protocol import JsonRows
from replicad.control.server import ControlServer
from replicad.control.stalls import (
    StallChange,
    StallWatch,
    one_line_each,
    partition_name,
    summary_names,
)
from replicad.control.status_view import render_status_line
from replicad.errors import ConfigError, ReplicadError
from replicad.follower.replicator import Replicator, ReplicatorSettings
from replicad.follower.status import RateMeter, build_snapshot, partition_row, partition_rows
from replicad.protocol.metadata import TopicSelection
from replicad.recent_warnings import RECENT
from replicad.startup import LoopSignals, let_tls_in
from replicad.types import TopicPartition

if TYPE_CHECKING:
    # Imported when `mirror:` is on (mirror_settings_from_config): a follower without a
    # mirror does not load the mirror, its Kafka producer schemas or the groups reader.
    from replicad.archive.uploader import Archiver
    from replicad.leader.source_group_sync import SourceGroupSync
    from replicad.mirror.shell import Mirror, MirrorSettings
    from replicad.verify.continuous import ContinuousVerifier

log = structlog.get_logger("replicad.daemon")

STATUS_INTERVAL_S = 2.0
# How long `replicad mirror promote` waits for the last data by default.
DEFAULT_PROMOTE_TIMEOUT_S = 60.0
# Exit status when the `serve:` listener cannot start (address taken, TLS files gone).
EXIT_SERVE_FAILED = 1
# Exit status when one of the daemon's tasks (serve, mirror, archive, verify, status,
# watchdog) ended with an error: the daemon stops cleanly and systemd restarts it
# (Restart=on-failure), rather than replicating on without it -- an archive task that
# died unseen kept every local segment that waits for the bucket until the disk filled.
EXIT_TASK_FAILED = 1

# Descriptors besides segment files: sockets (leaders, serve's clients, control), the
# data directory's lock and checkpoints, the interpreter's own.
OPEN_FILES_HEADROOM = 256

# glibc mallopt(3) parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Allocations from this size on get their own mmap, unmapped (returned to the OS) on free.
# Fetch response frames (up to replica.fetch.response.max.bytes each) are far above it;
# the per-partition objects of the log store and follower far below.
MALLOC_MMAP_THRESHOLD = 128 * 1024
# Free heap top beyond this is returned to the OS at once (glibc's own default).
MALLOC_TRIM_THRESHOLD = 128 * 1024


def mirror_settings_from_config(config: Config) -> MirrorSettings | None:
    """The `mirror:` section as the mirror's settings (None: mirroring is off)."""
    mirror = config.mirror
    if mirror is None:
        return None
    from replicad.mirror.shell import MirrorSettings

    return MirrorSettings.from_config(config)


class Daemon:
    def __init__(
        self,
        config: Config,
        *,
        config_path: Path | None = None,
        overrides: Mapping[str, object] | None = None,
        reconfigure_logging: Callable[[Config], None] | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.overrides = dict(overrides or {})
        self._reconfigure_logging = reconfigure_logging
        self.replicator = Replicator(ReplicatorSettings.from_config(config))
        mirror = mirror_settings_from_config(config)
        self.mirror: Mirror | None = None
        if mirror is not None:
            from replicad.mirror.shell import Mirror

            self.mirror = Mirror(mirror, self.replicator)
        # Rolled segments uploaded to the bucket (`archive:`); boto3 is imported only then.
        self.archiver: Archiver | None = None
        if config.archive is not None:
            from replicad.archive.uploader import Archiver, ArchiverSettings

            self.archiver = Archiver(ArchiverSettings.from_config(config.archive))
        # The replica compared with its source again and again (`verify:` enabled).
        self.verifier: ContinuousVerifier | None = None
        if config.verify.enabled:
            from replicad.verify.continuous import ContinuousSettings, ContinuousVerifier

            self.verifier = ContinuousVerifier(ContinuousSettings.from_config(config))
        # Who hears of a partition's appends: serve's reader wake-ups and the mirror's.
        self._partition_listeners: list[Callable[[TopicPartition], None]] = []
        if self.mirror is not None:
            self._partition_listeners.append(self.mirror.partition_changed)
        # serve's sync of the source's group offsets (`serve:` with groups.enabled).
        self.serve_sync: SourceGroupSync | None = None
        self.notifier = SystemdNotifier.from_env()
        self.stop = asyncio.Event()
        # Non-zero when a part the config asks for could not start (the `serve:` listener):
        # the daemon stops and says so, so systemd sees a failed unit, not a half-running one.
        self.exit_code = 0
        self.started_ms = monotonic_ms()
        self._total_rate = RateMeter()
        self._leader_rates: dict[int, RateMeter] = {}
        self._rates: dict[int, float] = {}
        self._reloading = asyncio.Lock()
        self.stalls = StallWatch(config.control.stall_after_ms)
        self.loop_watch = LoopWatch()
        # The control socket's server, once started (None: not started, or unavailable).
        self.control: ControlServer | None = None

    # -- state for status / metrics / STATUS= ---------------------------------

    def status_reply(self) -> dict[str, Any]:
        """The snapshot `replicad status` is answered with: every partition's row, made one
        at a time as the reply is encoded (JsonRows), not 10,000 rows held at once (issue
        32: the reply was the daemon's peak); health from the rows it could name, which
        gives the same health (see build_snapshot)."""
        now_ms = monotonic_ms()
        snap = self.snapshot(rows_for_health_only=True, now_ms=now_ms)
        snap["partitions"] = JsonRows(partition_rows(self.replicator, now_ms))
        return snap

    def snapshot(
        self,
        *,
        problems_only: bool = False,
        rows_for_health_only: bool = False,
        now_ms: int | None = None,
    ) -> dict[str, Any]:
        """The status snapshot (`replicad status`, metrics); `problems_only`: with only the
        partition rows health and the stall watch read, the mirror's included (the status
        loop's: every row of 10,000 partitions is 10 MiB, every 2 s), the same totals and
        health. `rows_for_health_only`: only the replicator's rows are so (status_reply)."""
        snap = build_snapshot(
            self.replicator,
            uptime_s=(monotonic_ms() - self.started_ms) / 1000,
            rates=self._rates,
            total_rate=self._total_rate.rate,
            problems_after_ms=(
                self.stalls.stall_after_ms if problems_only or rows_for_health_only else None
            ),
            now_ms=now_ms,
        )
        server = getattr(self, "server", None)
        if server is not None:
            snap["serve"] = {
                "listen": f"{server.advertised[0]}:{server.advertised[1]}",
                **server.metrics(),
                **({"group_sync": self.serve_sync.snapshot()} if self.serve_sync else {}),
            }
        if self.mirror is not None:
            snap["mirror"] = self.mirror.snapshot(problems_only=problems_only)
        if self.archiver is not None:
            snap["archive"] = self.archiver.snapshot()
        if self.verifier is not None:
            snap["verify"] = self.verifier.snapshot()
        snap["recent_warnings"] = RECENT.latest()
        # As of the last check (every STATUS_INTERVAL_S).
        snap["stalls"] = self.stalls.status()
        snap["event_loop"] = self.loop_watch.status()
        control = self.control
        # Requests whose client was gone before their reply was built (control/server.py):
        # a client's timeout shorter than the reply takes to build, at 10,000 partitions.
        snap["control"] = {"abandoned": control.abandoned if control is not None else 0}
        totals = snap["totals"]
        totals["partitions_stalled"] = snap["stalls"]["stalled"]
        totals["stalls_total"] = snap["stalls"]["stalls_total"]
        totals["control_abandoned"] = snap["control"]["abandoned"]
        totals["event_loop_max_block_ms"] = snap["event_loop"]["max_block_ms"]
        totals["event_loop_recent_max_block_ms"] = snap["event_loop"]["recent_max_block_ms"]
        snap["health"] = assess(snap).as_dict()
        return snap

    def _sample_rates(self) -> None:
        now = monotonic_ms()
        total = 0
        for node_id, fetcher in self.replicator.fetchers.items():
            meter = self._leader_rates.setdefault(node_id, RateMeter())
            self._rates[node_id] = meter.sample(fetcher.stats.bytes_appended, now)
            total += fetcher.stats.bytes_appended
        self._total_rate.sample(total, now)

    async def _status_loop(self) -> None:
        while not self.stop.is_set():
            self._sample_rates()
            now_ms = monotonic_ms()
            snap = self.snapshot(problems_only=True, now_ms=now_ms)
            change = self.stalls.check(snap["partitions"], snap["leaders"])
            self._report_stalls(change, snap, now_ms)
            del change
            # Also before READY: a daemon whose source is down says so in STATUS=.
            line = render_status_line(snap)
            # Not kept through the wait: while the next one was built, two were held (a
            # catch-up of 10,000 partitions names most of them stalled: ~10 MiB of rows).
            del snap
            await self.notifier.status(line)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), STATUS_INTERVAL_S)

    def _report_stalls(self, change: StallChange, snap: dict[str, Any], now_ms: int) -> None:
        """Once per stall, everything needed to debug it: the partition's phase and
        counters (its full row, made for these few: the snapshot's rows are the slim
        ProblemRows), and its leader's last request and response."""
        leaders = {int(leader["node_id"]): leader for leader in snap["leaders"]}
        began, began_rest = one_line_each(change.began)
        for slim in began:
            tp = TopicPartition(str(slim.get("topic")), int(slim.get("partition", -1)))
            p = partition_row(self.replicator, tp, now_ms) or slim
            leader = leaders.get(int(p.get("leader", -1)), {})
            log.warning(
                "partition stalled: lagging, its leader connected, its log not moving",
                tp=f"{p.get('topic')}-{p.get('partition')}",
                stall_after_ms=self.stalls.stall_after_ms,
                state=p.get("state"),
                idle_ms=p.get("idle_ms"),
                lag=p.get("lag"),
                log_end_offset=p.get("log_end_offset"),
                high_watermark=p.get("high_watermark"),
                last_error=p.get("last_error"),
                errors=p.get("errors"),
                consecutive_failures=p.get("consecutive_failures"),
                # The stall rules' own inputs (control/stalls.py): turns of a leader fetched
                # in shares, and the last full disk's refusal and retry.
                answers_since_move=p.get("answers_since_move"),
                turns_since_move=p.get("turns_since_move"),
                disk_full_ago_ms=p.get("disk_full_ago_ms"),
                disk_retry_ago_ms=p.get("disk_retry_ago_ms"),
                leader=p.get("leader"),
                leader_address=leader.get("address"),
                session_id=leader.get("session_id"),
                session_epoch=leader.get("epoch"),
                leader_requests=leader.get("requests"),
                last_fetch_latency_ms=leader.get("last_fetch_latency_ms"),
                last_request_bytes=leader.get("last_request_bytes"),
                last_response_bytes=leader.get("last_response_bytes"),
                leader_last_error=leader.get("last_error"),
            )
        if began_rest:
            log.warning(
                "more partitions stalled in the same check (one line each for the first)",
                partitions=len(began_rest),
                tps=summary_names([partition_name(p) for p in began_rest]),
                stall_after_ms=self.stalls.stall_after_ms,
            )
        ended, ended_rest = one_line_each(change.ended)
        for name in ended:
            log.info("partition moving again after a stall", tp=name)
        if ended_rest:
            log.info(
                "more partitions moving again after a stall (one line each for the first)",
                partitions=len(ended_rest),
                tps=summary_names(ended_rest),
            )

    async def _watch_loop(self) -> None:
        """Wakes every LoopWatch.interval_ms; waking late is the loop having been blocked."""
        interval_s = self.loop_watch.interval_ms / 1000
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), interval_s)
            self.loop_watch.tick(monotonic_ms())

    # -- reload ---------------------------------------------------------------

    async def reload(self, _request: dict[str, Any] | None = None) -> dict[str, Any]:
        """Re-read the config (SIGHUP or `reload` on the control socket). A config
        that does not validate is rejected and the running one is kept."""
        async with self._reloading:
            await self.notifier.reloading()
            let_tls_in()  # the new config's TLS files are checked as it loads
            try:
                new = load_config(self.config_path, self.overrides)
            except ConfigError as exc:
                log.error(
                    "reload rejected: invalid configuration; keeping the running one",
                    errors=str(exc),
                )
                await self.notifier.ready()
                return {"reloaded": False, "error": str(exc)}
            tls = self._reload_tls()
            changed = _restart_needed(self.config, new)
            if changed:
                log.warning("reload: these settings take effect only after a restart", keys=changed)
            old_sel = TopicSelection.from_config(self.config.topics)
            new_sel = TopicSelection.from_config(new.topics)
            self.config = new
            if self._reconfigure_logging is not None:
                self._reconfigure_logging(new)
            if new_sel != old_sel:
                self.replicator.reconfigure_topics(new_sel)
            log.info("configuration reloaded", topics_changed=new_sel != old_sel)
            await self.notifier.ready()
            return {"reloaded": True, "restart_needed_for": changed, "tls": tls}

    def _reload_tls(self) -> list[dict[str, Any]]:
        """The running sections' TLS files read again into their live contexts (a rotated
        certificate, same paths); refused files leave those in use. On the loop: a few KiB,
        just read once more by the config's own check of the same files."""
        from replicad.config.tls import reload_tls_files

        reloads = reload_tls_files(self.config)
        for r in reloads:
            if r.error is not None:
                log.error("TLS files refused; keeping the ones in use", error=r.error)
            elif r.contexts:
                log.info("TLS files read again", section=r.section, contexts=r.contexts)
        return [{"section": r.section, "contexts": r.contexts, "error": r.error} for r in reloads]

    # -- the mirror's operator commands (replicad mirror ...) -------------------

    def _running_mirror(self) -> Mirror:
        if self.mirror is None:
            raise ReplicadError("this daemon has no mirror: section")
        return self.mirror

    async def mirror_groups_resume(self, request: dict[str, Any]) -> dict[str, Any]:
        """Sync a group that failed over at the destination again."""
        group = request.get("group")
        if not isinstance(group, str) or not group:
            raise ReplicadError("give the group id to resume")
        return await self._running_mirror().groups.resume(group)

    async def mirror_promote(self, request: dict[str, Any]) -> dict[str, Any]:
        """Cut mirrored topics over to the destination (replicad/mirror/promotion.py)."""
        topics = request.get("topics")
        timeout_s = request.get("timeout_s", DEFAULT_PROMOTE_TIMEOUT_S)
        if topics is not None and (
            not isinstance(topics, list) or not all(isinstance(t, str) for t in topics)
        ):
            raise ReplicadError("topics must be a list of topic names")
        if not isinstance(timeout_s, int | float) or timeout_s < 0:
            raise ReplicadError("timeout_s must be a number of seconds >= 0")
        return await self._running_mirror().promote(
            topics or None, float(timeout_s), bool(request.get("force", False))
        )

    # -- run -------------------------------------------------------------------

    async def run(self) -> int:
        signals = LoopSignals(
            asyncio.get_running_loop(),
            self._on_stop_signal,
            on_reload=lambda: asyncio.ensure_future(self.reload()),
        )
        early = signals.install()
        if early is not None:
            # Stopped while starting up (before this loop took the signals over): nothing
            # has been opened yet, so there is nothing to flush.
            log.info("stopped before start", signal=early.name)
            signals.remove()
            return 0
        control = self.control = await self._start_control()
        metrics = self._start_metrics()
        self.server: Any = None
        tasks: list[asyncio.Task[Any]] = []

        def start(coro: Coroutine[Any, Any, Any], name: str) -> None:
            task = asyncio.create_task(coro, name=name)
            task.add_done_callback(self._task_ended)
            tasks.append(task)

        start(watchdog_loop(self.notifier, self.stop), "watchdog")
        start(self._status_loop(), "status")
        start(self._watch_loop(), "loop-watch")
        if self.config.serve is not None:
            start(self._serve(), "serve")
        self.replicator.partition_listener = self._partition_changed
        if self.mirror is not None:
            start(self.mirror.run(self.stop), "mirror")
        if self.archiver is not None:
            start(self.archiver.run(lambda: self.replicator.logs, self.stop), "archive")
        if self.verifier is not None:
            start(self.verifier.run(lambda: self.replicator.logs, self.stop), "verify")

        def on_ready() -> None:
            self._sample_rates()
            snap = self.snapshot(problems_only=True)
            log.info(
                "replicating",
                partitions=len(self.replicator.states),
                leaders=len(self.replicator.fetchers),
                data_dir=str(self.config.data_dir),
            )
            start(self.notifier.ready(render_status_line(snap)), "ready")

        self.replicator.on_ready = on_ready
        try:
            await self.replicator.run(self.stop)
        finally:
            await self.notifier.stopping()
            self.stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.replicator.partition_listener = None
            if self.server is not None:
                await self.server.close()
            if control is not None:
                await control.close()
            if metrics is not None:
                await asyncio.to_thread(metrics.close)
            self.notifier.close()
            signals.remove()
        return self.exit_code

    def _task_ended(self, task: asyncio.Task[Any]) -> None:
        """A task that ended with an error stops the daemon with EXIT_TASK_FAILED, named in
        the log with its error (one that ended without one, or was cancelled, is done)."""
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        log.error(
            "a task of the daemon failed; stopping",
            task=task.get_name(),
            error=f"{type(error).__name__}: {error}",
            # Our own errors name their cause (a bucket, a setting): no traceback for those;
            # anything else is a bug, whose traceback is what a report needs.
            exc_info=None if isinstance(error, ReplicadError) else error,
        )
        if self.exit_code == 0:
            self.exit_code = EXIT_TASK_FAILED
        self.stop.set()

    async def _serve(self) -> None:
        """The `serve:` section: serve the replica over the Kafka protocol while
        replicating, from the same (already recovered) logs."""
        from replicad.leader.server import LeaderServer, server_security
        from replicad.leader.settings import ServeSettings

        serve = self.config.serve
        assert serve is not None
        await self.replicator.logs_ready.wait()
        assert self.replicator.logs is not None
        from replicad.groups.coordinator import CoordinatorConfig
        from replicad.leader.source_group_sync import SourceGroupSync, read_only_groups
        from replicad.leader.topic_configs import TopicConfigSync

        settings = ServeSettings.from_config(serve)
        remote = None
        if self.config.archive is not None:
            # Offsets below local retention answered from the archive's bucket.
            from replicad.archive.uploader import ArchiverSettings
            from replicad.leader.remote_fetch import remote_fetch_for

            archive = self.config.archive
            bucket = dataclasses.replace(
                ArchiverSettings.from_config(archive).bucket, max_attempts=3
            )
            remote = await asyncio.to_thread(
                remote_fetch_for,
                bucket,
                cache_bytes=archive.read_cache_bytes,
                threads=archive.read_threads,
                now_ms=monotonic_ms,
            )
        server = LeaderServer(
            self.replicator.logs,
            settings,
            node_id=serve.node_id,
            allowed_followers=frozenset(serve.allowed_followers),
            security=server_security(serve.security, frozenset(serve.allowed_followers)),
            read_only_groups=read_only_groups(self.config.groups),
            group_config=CoordinatorConfig.from_config(self.config.groups),
            consumer_group_protocol=self.config.groups.consumer_protocol,
            remote=remote,
        )
        try:
            await server.start()
        except OSError as exc:
            log.error(
                "serve: could not listen; stopping",
                listen=f"{serve.listen.host}:{serve.listen.port}",
                error=str(exc),
            )
            self.exit_code = EXIT_SERVE_FAILED
            self.stop.set()
            return
        self.server = server
        self._partition_listeners.append(server.partition_changed)
        # DescribeConfigs on serve answers with the source's topic configs.
        configs = TopicConfigSync(
            self.replicator.client,
            server.topic_configs,
            lambda: sorted({tp.topic for tp in self.replicator.states}),
        )
        loops = [configs.run(self.stop)]
        if self.config.groups.enabled:
            # In this process, beside serve's coordinator: why, in that module's docstring.
            self.serve_sync = SourceGroupSync(
                self.config.groups, self.replicator.client, server.groups
            )
            loops.append(self.serve_sync.run(self.stop))
        await asyncio.gather(*loops)  # cancelled with this task at shutdown

    def _partition_changed(self, tp: TopicPartition) -> None:
        for listener in self._partition_listeners:
            listener(tp)

    def _on_stop_signal(self, signum: signal.Signals) -> None:
        if not self.stop.is_set():
            log.info("shutting down", signal=signum.name)
            self.stop.set()

    async def _start_control(self) -> ControlServer | None:
        commands = {
            "reload": self.reload,
            "mirror.groups.resume": self.mirror_groups_resume,
            "mirror.promote": self.mirror_promote,
        }
        server = ControlServer(self.config.control.socket, self.status_reply, commands)
        try:
            await server.start()
        except (ReplicadError, OSError) as exc:
            # Replication matters more than the status socket: keep going, say so.
            log.warning(
                "control socket unavailable; `replicad status` will not work",
                socket=str(self.config.control.socket),
                error=str(exc),
            )
            return None
        return server

    def _start_metrics(self) -> Any:
        listen = self.config.control.metrics_listen
        if listen is None:
            return None
        from replicad.metrics import start_metrics_server

        server = start_metrics_server(
            listen.host,
            listen.port,
            self.snapshot,
            per_topic=self.config.control.metrics_per_topic,
            loop=asyncio.get_running_loop(),
        )
        log.info("metrics endpoint listening", address=f"{server.host}:{server.port}")
        return server


# What a reload applies in place: the topic selection and logging. Every other setting is
# read when the part that uses it starts (fetch sizes when a fetcher starts, start_from and
# on_gap at a partition's first fetch), so a reload that changes it says a restart is needed.
# A section added to Config is such a setting until it is made reloadable here.
_RELOADED = frozenset({"topics", "logging"})
_TOPICS_READ_AT_START = ("start_from", "on_gap")


def _restart_needed(old: Config, new: Config) -> list[str]:
    changed = [
        f.name
        for f in dataclasses.fields(old)
        if f.name not in _RELOADED and getattr(old, f.name) != getattr(new, f.name)
    ]
    changed += [
        f"topics.{key}"
        for key in _TOPICS_READ_AT_START
        if getattr(old.topics, key) != getattr(new.topics, key)
    ]
    return changed


def raise_open_file_limit() -> int:
    """Lift the soft RLIMIT_NOFILE to the hard one: a replica of many partitions needs
    many segment files (the log store's own cap, log.max_open_files, stays in force)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def fix_malloc_thresholds() -> str | None:
    """Pin glibc's mmap and trim thresholds; returns the C library's name when set, None
    where there is no glibc (musl, macOS: left as they are).

    glibc raises its mmap threshold dynamically to the size of any mmapped block freed
    (up to 32 MiB), so after the first few response frames are freed, later frames of
    the same size come from the heap, and a freed frame there is not returned to the
    OS while anything above it is live: measured at 10,000 partitions, up to ~60 MiB of
    freed frames stayed resident on top of the pool's own bound. Setting the thresholds
    explicitly turns the dynamic rise off (mallopt(3)), so every frame is mapped on
    its own and unmapped when released.
    """
    try:
        # The process's own symbols, the C library's among them: find_library("c") ran
        # `ldconfig -p` in a forked child on every start to name the library already loaded.
        libc = ctypes.CDLL(None)
        gnu_get_libc_version = libc.gnu_get_libc_version  # glibc only
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    gnu_get_libc_version.restype = ctypes.c_char_p
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if not (
        mallopt(M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)
        and mallopt(M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD)
    ):
        return None
    return f"glibc {gnu_get_libc_version().decode()}"


async def run_daemon(
    config: Config,
    *,
    config_path: Path | None = None,
    overrides: Mapping[str, object] | None = None,
    reconfigure_logging: Callable[[Config], None] | None = None,
) -> int:
    """Replicate until SIGTERM/SIGINT; then finish the in-flight append, flush,
    checkpoint and return 0 (EXIT_SERVE_FAILED when the `serve:` listener could not start)."""
    libc = fix_malloc_thresholds()
    log.debug("malloc thresholds", libc=libc, mmap_threshold=MALLOC_MMAP_THRESHOLD)
    # Run from a shell, the soft limit is often 1,024, below log.max_open_files' default
    # (4,096) plus serve's connections: the log store would close files under EMFILE
    # pressure. systemd's unit sets both limits itself (LimitNOFILE).
    open_files = raise_open_file_limit()
    if open_files < config.log.max_open_files + OPEN_FILES_HEADROOM:
        log.warning(
            "open file limit is low for log.max_open_files; segment files will be closed "
            "and reopened more often",
            limit=open_files,
            max_open_files=config.log.max_open_files,
        )
    daemon = Daemon(
        config,
        config_path=config_path,
        overrides=overrides,
        reconfigure_logging=reconfigure_logging,
    )
    return await daemon.run()
