"""The `replicad` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replicad import __version__
from replicad.errors import ConfigError, ReplicadError
from replicad.exits import (
    EX_CANTCREAT,
    EX_CONFIG,
    EX_FAILURE,
    EX_INTERRUPTED,
    EX_NOPERM,
    EX_OK,
    EX_OSERR,
    EX_USAGE,
)
from replicad.startup import (
    catch_early_stop,
    early_stop_signal,
    keep_test_libraries_out,
    keep_tls_out,
)

if TYPE_CHECKING:
    from replicad.config.model import ServeSecurityConfig


# Flags of `run` that set one config path as given (when given).
_RUN_FLAGS = {
    "bootstrap_servers": "source.bootstrap_servers",
    "data_dir": "data_dir",
    "control_socket": "control.socket",
    "start_from": "topics.start_from",
    "log_format": "logging.format",
    "serve_listen": "serve.listen",
    "serve_advertised": "serve.advertised",
}


# serve's coordinator: --group-KEY (milliseconds) sets what groups.KEY sets in a config
# file, with the config model's default.
_GROUP_FLAGS = (
    "min_session_timeout_ms",
    "max_session_timeout_ms",
    "initial_rebalance_delay_ms",
    "consumer_session_timeout_ms",
    "consumer_heartbeat_interval_ms",
)


def _run_overrides(args: argparse.Namespace) -> dict[str, object]:
    """Flags that override the config file, as dotted config paths."""
    overrides: dict[str, object] = {}
    for name, path in _RUN_FLAGS.items():
        if getattr(args, name):
            overrides[path] = getattr(args, name)
    if args.topics:
        # --topic is repeatable and each may be a comma list, as Kafka's tools take them.
        names = [t.strip() for given in args.topics for t in given.split(",")]
        overrides["topics.include"] = [t for t in names if t]
        overrides["topics.regex"] = None
    if args.topics_regex:
        overrides["topics.regex"] = args.topics_regex
        overrides["topics.include"] = []
    if args.serve_allow_follower:
        overrides["serve.allowed_followers"] = list(args.serve_allow_follower)
    for name, path in _SERVE_SECURITY_FLAGS.items():
        value = getattr(args, "serve_" + name)
        if value is not None:
            overrides[path] = value
    return overrides


def _cmd_run(args: argparse.Namespace) -> int:
    from replicad.config import Config, load_config

    try:
        config = load_config(Path(args.config) if args.config else None, _run_overrides(args))
    except ConfigError as exc:
        _print_config_error(exc)
        return EX_CONFIG
    from replicad.config.preflight import preflight

    problems = preflight(config)
    for problem in problems:
        print(f"replicad: {problem.line()}", file=sys.stderr)
    if problems:
        return problems[0].exit_code
    if args.check_config:
        print(
            f"configuration OK (data_dir {config.data_dir}, control.socket {config.control.socket})"
        )
        return EX_OK
    if early_stop_signal() is not None:
        return EX_OK  # stopped before it started: nothing to flush
    # Before asyncio (and anything importing it) is: asyncio imports ssl if it can.
    keep_tls_out(config)
    import asyncio

    from replicad.daemon import run_daemon
    from replicad.logs import configure_logging

    configure_logging(str(config.logging.level), str(config.logging.format))

    def relog(new: Config) -> None:
        configure_logging(str(new.logging.level), str(new.logging.format))

    try:
        return asyncio.run(
            run_daemon(
                config,
                config_path=Path(args.config) if args.config else None,
                overrides=_run_overrides(args),
                reconfigure_logging=relog,
            )
        )
    except ReplicadError as exc:  # another daemon holding the data dir among them
        print(f"replicad: {exc}", file=sys.stderr)
        return EX_FAILURE
    except OSError as exc:
        # What preflight could not foresee (a disk that went read-only, a race): one line.
        print(f"replicad: {_os_error_line(exc)}", file=sys.stderr)
        return _os_error_exit_code(exc)
    except KeyboardInterrupt:
        return EX_INTERRUPTED


def _print_config_error(exc: ConfigError) -> None:
    """One line per problem, each naming where and which key (`replicad.yaml:7: fetch...`),
    as preflight's problems are: a start-up failure reads the same whatever found it."""
    for line in str(exc).splitlines():
        print(f"replicad: {line}", file=sys.stderr)


def _os_error_line(exc: OSError) -> str:
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


def _os_error_exit_code(exc: OSError) -> int:
    if isinstance(exc, PermissionError):
        return EX_NOPERM
    if isinstance(exc, FileNotFoundError | NotADirectoryError | IsADirectoryError):
        return EX_CANTCREAT
    return EX_OSERR


def _positive_seconds(text: str) -> float:
    """A --timeout: seconds, above 0."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be above 0 seconds: {text!r}")
    return seconds


def _status_socket(args: argparse.Namespace) -> Path:
    if args.socket:
        return Path(args.socket)
    from replicad.config import load_config

    if args.config:
        try:
            return load_config(Path(args.config), {}).control.socket
        except ConfigError as exc:
            from replicad.control.health import EXIT_UNREACHABLE

            # status exits as a monitoring plugin does: a config it cannot read leaves the
            # daemon's state unknown (3), whatever run would exit with.
            _print_config_error(exc)
            raise SystemExit(EXIT_UNREACHABLE) from exc
    from replicad.config.defaults import control_socket_candidates

    # This user's own daemon, else the service's (config/defaults.py).
    candidates = control_socket_candidates()
    return next((c for c in candidates if c.exists()), candidates[0])


def _cmd_status(args: argparse.Namespace) -> int:
    """Exit codes as a monitoring plugin's: 0 healthy, 1 degraded, 2 down, 3 the daemon
    cannot be asked (not running, no permission, no answer)."""
    from replicad.control.client import query
    from replicad.control.health import EXIT_UNREACHABLE
    from replicad.control.status_view import health_of, render_json, render_table, watch
    from replicad.errors import ControlError, DaemonNotRunning

    path = _status_socket(args)
    if args.watch:
        return watch(
            lambda: query(path, timeout_s=args.timeout),
            args.interval,
            sys.stdout,
            all_partitions=args.all,
        )
    try:
        snapshot = query(path, timeout_s=args.timeout)
    except DaemonNotRunning as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_UNREACHABLE
    except ControlError as exc:
        print(f"replicad: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    out = render_json(snapshot) if args.json else render_table(snapshot, all_partitions=args.all)
    print(out)
    return health_of(snapshot).health.exit_code


# `replicad mirror ...`: the daemon could not be asked (as `replicad status`'s 3), and how
# much longer than the command's own wait the answer may take.
EXIT_DAEMON_UNREACHABLE = 3
MIRROR_COMMAND_MARGIN_S = 30.0


def _mirror_command(args: argparse.Namespace, cmd: str, request: dict[str, object]) -> dict | None:
    """Send a mirror command to the running daemon; None (after saying why) if it failed."""
    from replicad.control.client import query
    from replicad.errors import ControlError, DaemonNotRunning

    timeout_s = float(request.get("timeout_s", 0) or 0) + MIRROR_COMMAND_MARGIN_S
    try:
        return query(_status_socket(args), cmd, timeout_s=timeout_s, args=request)
    except DaemonNotRunning as exc:
        print(str(exc), file=sys.stderr)
    except ControlError as exc:
        print(f"replicad: {exc}", file=sys.stderr)
    return None


def _cmd_mirror_groups_resume(args: argparse.Namespace) -> int:
    result = _mirror_command(args, "mirror.groups.resume", {"group": args.group})
    if result is None:
        return EXIT_DAEMON_UNREACHABLE
    if result.get("resumed"):
        print(f"group {args.group}: synced again from the next round")
        return 0
    print(f"group {args.group}: not failed over (state {result.get('state')}); nothing to do")
    return 0


def _cmd_mirror_promote(args: argparse.Namespace) -> int:
    import json

    request: dict[str, object] = {"timeout_s": args.timeout, "force": args.force}
    if args.topics:
        request["topics"] = [t.strip() for t in args.topics.split(",") if t.strip()]
    result = _mirror_command(args, "mirror.promote", request)
    if result is None:
        return EXIT_DAEMON_UNREACHABLE
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(_promotion_text(result))
    return 0 if result.get("promoted") else 1


def _promotion_text(result: dict) -> str:
    topics = ", ".join(result.get("topics") or ())
    if not result.get("promoted"):
        lines = [f"not promoted ({topics}): timed out waiting for"]
        lines += [f"  {tp}: {why}" for tp, why in sorted((result.get("waiting") or {}).items())]
        lines.append("nothing changed; try again with a longer --timeout, or --force")
        return "\n".join(lines)
    how = "forced" if result.get("forced") else "complete"
    lines = [f"promoted ({how}): {topics}", ""]
    lines.append(
        f"{'partition':<40} {'source hw':>10} {'mirrored':>10} {'dest end':>10} {'behind':>8}"
    )
    for p in result.get("partitions") or ():
        name = f"{p['topic']}-{p['partition']} -> {p['destination_topic']}"
        lines.append(
            f"{name:<40} {p['source_high_watermark']:>10} {p['mirrored_offset']:>10} "
            f"{p['destination_log_end']!s:>10} {p['left_behind']:>8}"
        )
    groups = result.get("groups") or {}
    if groups:
        lines += ["", "final group offsets at the destination:"]
        for group, offsets in sorted(groups.items()):
            shown = ", ".join(f"{tp}={o}" for tp, o in sorted(offsets.items()))
            lines.append(f"  {group}: {shown}")
    for tp, why in sorted((result.get("left_behind") or {}).items()):
        lines.append(f"left behind: {tp}: {why}")
    return "\n".join(lines)


# `replicad serve`'s security flags and the config keys they set (serve.security.*).
_SERVE_SECURITY_FLAGS = {
    "tls_cert_file": "serve.security.tls.cert_file",
    "tls_key_file": "serve.security.tls.key_file",
    "tls_key_password_file": "serve.security.tls.key_password_file",
    "tls_ca_file": "serve.security.tls.ca_file",
    "tls_client_auth": "serve.security.tls.client_auth",
    "sasl_mechanism": "serve.security.sasl.mechanisms",
    "sasl_users_file": "serve.security.sasl.users_file",
    "follower_principal": "serve.security.follower_principals",
}


def _serve_security(args: argparse.Namespace) -> ServeSecurityConfig:
    """The flags' `serve.security`, checked like the config file's; a ConfigError names
    each bad flag."""
    from replicad.errors import ConfigErrors
    from replicad.leader.settings import serve_security_from_options

    options: dict[str, object] = {"serve.allowed_followers": list(args.allow_follower or ())}
    flags = {"serve.allowed_followers": "--allow-follower"}
    for name, path in _SERVE_SECURITY_FLAGS.items():
        flags[path] = "--" + name.replace("_", "-")
        if getattr(args, name) is not None:
            options[path] = getattr(args, name)
    try:
        return serve_security_from_options(options)
    except ConfigErrors as errors:
        lines = [
            f"{flags.get(problem.path.split('[')[0], problem.path)} ({problem.path}): "
            f"{problem.message}"
            for problem in errors.problems
        ]
        raise ConfigError("", "\n".join(lines)) from None


def _serve_remote(args: argparse.Namespace) -> Any:
    """`--archive URL`: a maker of serve's remote reads (boto3 is imported only then)."""
    if args.archive is None:
        return None
    from replicad.archive.store import ArchiveError, settings_from_url

    problems = []
    if args.archive_read_cache_bytes < 0:
        problems.append("--archive-read-cache-bytes (archive.read_cache_bytes): below 0")
    if not 1 <= args.archive_read_threads <= 64:
        problems.append("--archive-read-threads (archive.read_threads): not within 1..64")
    try:
        bucket = settings_from_url(args.archive, endpoint=args.s3_endpoint, region=args.s3_region)
    except ArchiveError as error:
        problems.append(f"--archive: {error}")
    if problems:
        raise ConfigError("", "\n".join(problems))
    from replicad.clock import monotonic_ms
    from replicad.leader.remote_fetch import remote_fetch_for

    return lambda: remote_fetch_for(
        bucket,
        cache_bytes=args.archive_read_cache_bytes,
        threads=args.archive_read_threads,
        now_ms=monotonic_ms,
    )


def _milliseconds(text: str) -> int:
    """A flag's count of milliseconds: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of ms") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is below 0")
    return value


def _cmd_serve(args: argparse.Namespace) -> int:
    import asyncio

    from replicad.config.model import GroupsConfig
    from replicad.daemon import raise_open_file_limit
    from replicad.groups.coordinator import CoordinatorConfig
    from replicad.leader.server import serve_forever
    from replicad.leader.settings import ServeSettings
    from replicad.logs import configure_logging

    try:
        security = _serve_security(args)
        remote = _serve_remote(args)
    except ConfigError as exc:
        print(f"replicad serve: invalid options:\n{exc}", file=sys.stderr)
        return EX_USAGE
    if early_stop_signal() is not None:
        return EX_OK
    configure_logging("info", args.log_format)
    # As `run` does: a shell's soft limit (often 1,024) would cap serve's connections.
    raise_open_file_limit()
    try:
        return asyncio.run(
            serve_forever(
                Path(args.data_dir),
                args.listen,
                advertised=args.advertised,
                node_id=args.node_id,
                allowed_followers=frozenset(args.allow_follower or ()),
                security=security,
                settings=ServeSettings(downconversion_enable=args.message_downconversion),
                group_config=CoordinatorConfig.from_config(
                    GroupsConfig(**{key: getattr(args, f"group_{key}") for key in _GROUP_FLAGS})
                ),
                consumer_group_protocol=args.group_consumer_protocol,
                remote=remote,
            )
        )
    except ValueError as exc:
        print(f"replicad serve: {exc}", file=sys.stderr)
        return EX_USAGE
    except (OSError, ReplicadError) as exc:
        # OSError: the address is taken, or a TLS file changed since it was checked.
        print(f"replicad serve: {exc}", file=sys.stderr)
        return EX_FAILURE
    except KeyboardInterrupt:
        return EX_INTERRUPTED


def _cmd_dump_log(args: argparse.Namespace) -> int:
    from replicad.archive.store import is_bucket_url
    from replicad.log.dump import dump_log

    if is_bucket_url(args.path):
        from replicad.archive.check import dump_bucket

        return _on_bucket(
            "dump-log",
            args,
            args.path,
            lambda store, path: dump_bucket(store, path, deep=args.deep, out=sys.stdout),
        )
    return dump_log(Path(args.path), deep=args.deep, out=sys.stdout)


def _on_bucket(command: str, args: argparse.Namespace, url: str, run: Any) -> int:
    """`run(store, key path)` over the bucket of `url` (s3://bucket/path), its errors as
    `verify DATA_DIR`'s: 1 for what cannot be read."""
    from replicad.archive.store import ArchiveError, ObjectStore, settings_from_url

    try:
        settings = settings_from_url(url, endpoint=args.s3_endpoint, region=args.s3_region)
        return int(run(ObjectStore(settings), settings.prefix))
    except ImportError:
        print(f"replicad {command}: reading a bucket needs replicad[archive] (boto3)",
              file=sys.stderr)  # fmt: skip
        return EX_FAILURE
    except (ArchiveError, OSError, ReplicadError) as exc:
        print(f"replicad {command}: {exc}", file=sys.stderr)
        return EX_FAILURE


def _cmd_verify(args: argparse.Namespace) -> int:
    from replicad.archive.store import is_bucket_url

    if is_bucket_url(args.data_dir):
        if args.against_source:
            print("replicad verify: --against-source takes a data directory, not a bucket",
                  file=sys.stderr)  # fmt: skip
            return EX_USAGE
        from replicad.archive.check import verify_bucket

        return _on_bucket(
            "verify", args, args.data_dir, lambda store, _path: verify_bucket(store, sys.stdout)
        )
    if args.against_source:
        return _cmd_verify_against_source(args)
    from replicad.log.verify import verify_data_dir

    return verify_data_dir(Path(args.data_dir), out=sys.stdout)


def _cmd_verify_against_source(args: argparse.Namespace) -> int:
    import asyncio
    import random

    from replicad.protocol.client import ClientSettings
    from replicad.verify.report import dumps, exit_code, partition_line, summary_line
    from replicad.verify.source import SourceVerifier, VerifyOptions

    bootstrap: list[str] = []
    settings = ClientSettings()
    try:
        if args.config:
            from replicad.config import load_config

            config = load_config(Path(args.config), {})
            bootstrap = [str(hp) for hp in config.source.bootstrap_servers]
            settings = ClientSettings.from_config(config.source)
        if args.bootstrap_servers:
            bootstrap = [s for s in args.bootstrap_servers.split(",") if s.strip()]
    except ConfigError as exc:
        _print_config_error(exc)
        return EX_CONFIG
    if not bootstrap:
        print(
            "replicad verify: --against-source needs --bootstrap-servers or -c CONFIG",
            file=sys.stderr,
        )
        return EX_USAGE
    if not Path(args.data_dir).is_dir():
        print(f"replicad verify: {args.data_dir}: not a directory", file=sys.stderr)
        return EX_USAGE
    seed = None
    if args.sample is not None:
        seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    topics = [t.strip() for given in args.topics or () for t in given.split(",") if t.strip()]
    options = VerifyOptions(
        topics=tuple(topics),
        sample=args.sample,
        seed=seed or 0,
        fetch_max_bytes=args.fetch_max_bytes,
        max_bytes_per_second=args.max_bytes_per_second,
        resume=Path(args.resume) if args.resume else None,
        **(
            {"partitions_per_fetch": args.partitions_per_fetch} if args.partitions_per_fetch else {}
        ),
    )

    def show(result: object) -> None:
        if not args.json:
            print(partition_line(result), flush=True)  # type: ignore[arg-type]

    verifier = SourceVerifier(Path(args.data_dir), bootstrap, settings, options, on_result=show)
    try:
        results = asyncio.run(verifier.run())
    except (OSError, ReplicadError) as exc:
        # Nothing compared (the source unreachable, say): "unknown", never "a mismatch".
        from replicad.verify.report import EXIT_UNVERIFIED

        print(f"replicad verify: nothing compared: {exc}", file=sys.stderr)
        return EXIT_UNVERIFIED
    except KeyboardInterrupt:
        return EX_INTERRUPTED
    if args.json:
        print(dumps(results, seed=seed))
    else:
        print(summary_line(results, seed=seed))
    return exit_code(results)


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's default in its help, unless the help already says it or there is none
    worth showing (None, False, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is False
            or default == argparse.SUPPRESS
            or default == []
            or not action.option_strings
        ):
            return text
        return f"{text} (default: {default})"


class Parser(argparse.ArgumentParser):
    """replicad's parsers: no abbreviated options (a typo is an error, not a guess at
    another option), and defaults shown in the help. Nested subcommands get the same class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)


def _command(
    sub: argparse._SubParsersAction[Any], name: str, summary: str, description: str
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=summary, description=description)
    return parser


def _add_serve_security(group: argparse._ArgumentGroup, prefix: str = "") -> None:
    """serve.security's flags, for `serve` and (prefixed "serve-") for `run`."""
    flag = f"--{prefix}"
    group.add_argument(
        f"{flag}tls-cert-file", metavar="PATH", help="server certificate chain (PEM): turns TLS on"
    )
    group.add_argument(
        f"{flag}tls-key-file", metavar="PATH", help="its private key (PEM), if not in the cert file"
    )
    group.add_argument(
        f"{flag}tls-key-password-file", metavar="PATH", help="file holding the key's password"
    )
    group.add_argument(
        f"{flag}tls-ca-file", metavar="PATH", help="CAs that sign client certificates (PEM)"
    )
    group.add_argument(
        f"{flag}tls-client-auth",
        choices=["none", "requested", "required"],
        help="ask TLS clients for a certificate (mutual TLS); default: none",
    )
    group.add_argument(
        f"{flag}sasl-mechanism",
        action="append",
        choices=["plain", "scram-sha-256", "scram-sha-512"],
        help="a SASL mechanism to serve: turns SASL on; repeatable",
    )
    group.add_argument(
        f"{flag}sasl-users-file",
        metavar="PATH",
        help="YAML file of users: name -> {password_file: PATH} or {password_env: NAME}",
    )
    group.add_argument(
        f"{flag}follower-principal",
        action="append",
        metavar="PRINCIPAL",
        help='who may fetch as a follower, e.g. "User:replica"; repeatable',
    )


LOG_FORMAT_HELP = (
    "log lines as JSON (json), for a terminal (console), or json unless stderr is a terminal (auto)"
)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; `command`: the sub-command about to run, when known (a
    daemon's parser leaves out what only other commands import)."""
    parser = Parser(
        prog="replicad",
        description="Replicate Kafka topics to local Kafka-format log segments, serve them over "
        "the Kafka protocol, mirror them into another Kafka.",
    )
    parser.add_argument(
        "-V", "--version", action="version", version=f"replicad {__version__}",
        help="print replicad's version and exit",
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = _command(
        sub,
        "run",
        "run the replication daemon (foreground)",
        "Replicate the source's topics into the data directory, in the foreground (systemd "
        "runs it). Flags override the config file.",
    )
    run.add_argument(
        "-c", "--config", metavar="PATH", help="YAML config file (flags below override it)"
    )
    run.add_argument(
        "--bootstrap-server",
        "--bootstrap-servers",
        dest="bootstrap_servers",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="brokers of the source cluster (source.bootstrap_servers)",
    )
    choice = run.add_mutually_exclusive_group()
    choice.add_argument(
        "--topic",
        "--topics",
        dest="topics",
        action="append",
        metavar="TOPIC[,TOPIC...]",
        help="a topic to replicate; repeatable, or a comma-separated list (topics.include)",
    )
    choice.add_argument(
        "--include",
        "--topics-regex",
        dest="topics_regex",
        metavar="REGEX",
        help="replicate every topic whose whole name matches this regex (topics.regex)",
    )
    run.add_argument(
        "--data-dir",
        metavar="DIR",
        help="where the replica's log segments go (default: $STATE_DIRECTORY/data under "
        "systemd, /var/lib/replicad/data as root, else ~/.local/state/replicad/data)",
    )
    run.add_argument(
        "--control-socket",
        metavar="PATH",
        help="path of the control socket (default: $RUNTIME_DIRECTORY/control.sock under "
        "systemd, /run/replicad/control.sock as root, else "
        "$XDG_RUNTIME_DIR/replicad/control.sock)",
    )
    run.add_argument(
        "--start-from",
        choices=["earliest", "latest"],
        help="where a partition with nothing on disk starts (topics.start_from; default: earliest)",
    )
    run.add_argument(
        "--log-format",
        choices=["auto", "json", "console"],
        help=LOG_FORMAT_HELP + " (logging.format; default: auto)",
    )
    run.add_argument(
        "--check-config",
        action="store_true",
        help="validate the config, check that its directories and files can be used, and exit",
    )
    serving = run.add_argument_group(
        "serving while replicating",
        "serve the replica over the Kafka protocol from this process (the serve: section)",
    )
    serving.add_argument(
        "--serve-listen", metavar="HOST:PORT", help="turns serving on: the address to listen on"
    )
    serving.add_argument(
        "--serve-advertised", metavar="HOST:PORT", help="told to clients (default: the listen one)"
    )
    serving.add_argument(
        "--serve-allow-follower",
        type=int,
        action="append",
        metavar="ID",
        help="a replica id allowed to fetch as a follower (privileged session); repeatable",
    )
    _add_serve_security(serving, prefix="serve-")
    run.set_defaults(func=_cmd_run)

    serve = _command(
        sub,
        "serve",
        "serve a replica over the Kafka protocol (read-only)",
        "Serve a data directory over the Kafka protocol, read-only: consumers and other "
        "replicads read it as they would read a broker.",
    )
    serve.add_argument("--data-dir", required=True, help="the replica's data directory")
    serve.add_argument(
        "--listen",
        default="127.0.0.1:9092",
        metavar="HOST:PORT",
        help="address to listen on (a local Kafka on 9092 needs another port)",
    )
    serve.add_argument(
        "--advertised", metavar="HOST:PORT", help="told to clients (default: --listen)"
    )
    serve.add_argument("--node-id", type=int, default=0, help="this node's broker id")
    serve.add_argument(
        "--allow-follower",
        type=int,
        action="append",
        metavar="ID",
        help="a replica id allowed to fetch as a follower (privileged session); repeatable",
    )
    secured = serve.add_argument_group(
        "security", "TLS and SASL on the listener (the serve.security keys of the config file)"
    )
    _add_serve_security(secured)
    serve.add_argument(
        "--message-downconversion",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="convert records for consumers of the old protocol (Fetch v0-v3, KIP-283's "
        "message.downconversion.enable); off, they get UNSUPPORTED_VERSION (default: on)",
    )
    coordinating = serve.add_argument_group(
        "groups", "the group coordinator (the groups.* keys of the config file of the same names)"
    )
    from replicad.config.model import GroupsConfig, defaults_of

    group_defaults = defaults_of(GroupsConfig)
    coordinating.add_argument(
        "--group-consumer-protocol",
        action=argparse.BooleanOptionalAction,
        default=group_defaults["consumer_protocol"],
        help="also answer the consumer group protocol (KIP-848: Java clients with "
        "group.protocol=consumer) (default: on, as Kafka 4 brokers; "
        "--no-group-consumer-protocol: the classic protocol only)",
    )
    for key in _GROUP_FLAGS:
        default = group_defaults[key]
        coordinating.add_argument(
            f"--group-{key.replace('_', '-')}",
            type=_milliseconds,
            default=default,
            metavar="MS",
            help=f"groups.{key} (default: {default})",
        )
    archived = serve.add_argument_group(
        "archive",
        "offsets below the local log start answered from the archive's bucket (KIP-405's "
        "remote fetch; credentials from the AWS chain: AWS_ACCESS_KEY_ID...)",
    )
    archived.add_argument(
        "--archive", metavar="s3://BUCKET/PREFIX", help="the bucket `replicad run` archives into"
    )
    archived.add_argument(
        "--s3-endpoint", help="the S3 endpoint, http(s)://host:port (default: AWS's own)"
    )
    archived.add_argument("--s3-region", help="the bucket's region")
    archived.add_argument(
        "--archive-read-cache-bytes",
        type=int,
        default=64 * 1024 * 1024,
        metavar="BYTES",
        help="archive.read_cache_bytes (default: 64 MiB)",
    )
    archived.add_argument(
        "--archive-read-threads",
        type=int,
        default=2,
        metavar="N",
        help="archive.read_threads: reads of the bucket at once (default: 2)",
    )
    serve.add_argument(
        "--log-format", choices=["auto", "json", "console"], default="auto", help=LOG_FORMAT_HELP
    )
    serve.set_defaults(func=_cmd_serve)

    status = _command(
        sub,
        "status",
        "live state of a running daemon; exit 0 healthy, 1 degraded, 2 down, 3 not reachable",
        "Ask a running daemon for its state through its control socket. Exit codes as a "
        "monitoring plugin's: 0 healthy, 1 degraded, 2 down, 3 the daemon cannot be asked "
        "(not running, a stale socket, no permission, a config that does not load).",
    )
    status.add_argument("--socket", help="control socket (default: from -c, else the default)")
    status.add_argument("-c", "--config", help="read the control socket path from this config")
    status.add_argument("--json", action="store_true", help="the full snapshot as JSON")
    status.add_argument("--watch", action="store_true", help="refresh until interrupted")
    status.add_argument(
        "--interval", type=float, default=2.0, help="seconds between --watch refreshes"
    )
    status.add_argument("--all", action="store_true", help="every partition, not the top 50")
    status.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=5.0,
        metavar="SECONDS",
        help="seconds to wait for the answer (5; a daemon of 10,000 partitions under load "
        "may need longer)",
    )
    status.set_defaults(func=_cmd_status)

    mirror = _command(
        sub,
        "mirror",
        "operate a running daemon's mirror: group sync, cut-over",
        "Commands to the mirror of a running daemon, through its control socket (docs/mirror.md).",
    )
    mirror_sub = mirror.add_subparsers(dest="mirror_command", required=True, metavar="COMMAND")

    def daemon_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--socket", help="control socket (default: from -c, else the default)")
        p.add_argument("-c", "--config", help="read the control socket path from this config")

    groups = _command(
        mirror_sub,
        "groups",
        "consumer groups synced to the destination",
        "The consumer groups whose offsets the mirror commits at the destination.",
    )
    groups_sub = groups.add_subparsers(dest="groups_command", required=True, metavar="COMMAND")
    resume = _command(
        groups_sub,
        "resume",
        "sync a group that failed over at the destination again",
        "A group that had members at the destination (or commits there) is no longer "
        "synced; this syncs it again from the next round.",
    )
    resume.add_argument("group", help="the group id")
    daemon_flags(resume)
    resume.set_defaults(func=_cmd_mirror_groups_resume)
    promote = _command(
        mirror_sub,
        "promote",
        "cut over: wait for the last data, sync groups once more, stop mirroring",
        "Hand mirrored topics over to the destination: wait until the replica holds the "
        "source's high watermark and the mirror has produced it all, sync the groups a last "
        "time, then stop mirroring those topics for good and report the final offsets. "
        "Exit 0 promoted, 1 not (timed out: nothing changed), 3 the daemon cannot be asked.",
    )
    promote.add_argument("--topics", help="comma-separated source topics (default: all)")
    promote.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for the last data (60)"
    )
    promote.add_argument(
        "--force", action="store_true", help="stop at once with what is there; report the rest"
    )
    promote.add_argument("--json", action="store_true", help="the report as JSON")
    daemon_flags(promote)
    promote.set_defaults(func=_cmd_mirror_promote)

    dump = _command(
        sub,
        "dump-log",
        "print the batches of a segment or partition dir",
        "Print each batch of a segment file, or of every segment of a partition directory: "
        "offsets, epochs, codecs, CRCs, and how its index agrees.",
    )
    dump.add_argument(
        "path",
        help="a .log segment file or a partition directory (topic-N); or in an archive's "
        "bucket, s3://BUCKET/PREFIX/topic-N or s3://.../TOPIC_ID/BASE.log",
    )
    dump.add_argument("--deep", action="store_true", help="decode every record too")
    _add_bucket_flags(dump)
    dump.set_defaults(func=_cmd_dump_log)

    if command not in OWN_COMMANDS:
        # No pyspark import until a job runs. Only `pipeline` (or help, or a word that names
        # no command) loads the module at all: it imports the archive's store and the config
        # loader, two thirds of the start of a `replicad status` that the tests run thousands
        # of times and a monitoring plugin every minute.
        from replicad.spark.pipeline import add_pipeline_parser

        add_pipeline_parser(sub)

    verify = _command(
        sub,
        "verify",
        "check a data dir: offsets, CRCs, indexes",
        "Check every partition of a data directory: offsets continuous, every batch's CRC, "
        "indexes and checkpoints consistent. Exits non-zero on any problem.",
    )
    verify.add_argument(
        "data_dir",
        help="replicad's data directory (the one `run` writes), or an archive's bucket "
        "(s3://BUCKET/PREFIX, checked the same way)",
    )
    _add_bucket_flags(verify)
    proof = verify.add_argument_group(
        "against the source",
        "--against-source fetches every replicated partition from the source at the "
        "replica's offsets and compares them batch by batch, byte for byte. Exit 0 identical "
        "where both have the data, 1 a mismatch, 3 some partition not compared to its end.",
    )
    proof.add_argument(
        "--against-source", action="store_true", help="compare with the source cluster"
    )
    proof.add_argument(
        "--bootstrap-servers", "--bootstrap-server", help="the source, HOST:PORT[,...]"
    )
    proof.add_argument(
        "-c", "--config", help="take the source (and its TLS/SASL settings) from this file"
    )
    proof.add_argument(
        "--topics",
        "--topic",
        action="append",
        help="only these topics (comma-separated, repeatable)",
    )
    proof.add_argument(
        "--sample", type=int, help="compare N batches a partition, drawn at random (seeded)"
    )
    proof.add_argument("--seed", type=int, help="the sample's seed (printed; default random)")
    proof.add_argument(
        "--fetch-max-bytes", type=int, default=1 << 20, help="bytes asked of the source a fetch"
    )
    proof.add_argument(
        "--max-bytes-per-second", type=int, help="bound the load on the source (default none)"
    )
    proof.add_argument(
        "--partitions-per-fetch",
        type=int,
        help="at most this many partitions walked at once, those of one leader asked in one "
        "fetch (default: verify's, 100)",
    )
    proof.add_argument(
        "--resume",
        help="a JSON file keeping each partition's verified offset: a later run goes on from it",
    )
    proof.add_argument("--json", action="store_true", help="the report as JSON")
    verify.set_defaults(func=_cmd_verify)
    return parser


def _add_bucket_flags(parser: argparse.ArgumentParser) -> None:
    """Where the bucket of an s3:// path is (credentials: the AWS chain, AWS_ACCESS_KEY_ID...)."""
    parser.add_argument(
        "--s3-endpoint", help="the S3 endpoint, http(s)://host:port (default: AWS's own)"
    )
    parser.add_argument("--s3-region", help="the bucket's region")


# argparse's exit code for a usage error.
ARGPARSE_USAGE_EXIT = 2

# Daemons: a stop signal during their start-up is a clean stop (replicad/startup.py).
_DAEMON_COMMANDS = ("run", "serve")
# The commands this module's parser holds itself; `pipeline` comes from replicad.spark.
OWN_COMMANDS = ("run", "serve", "status", "mirror", "dump-log", "verify")


def main(argv: Sequence[str] | None = None) -> int:
    # Only as a process of its own (argv from the command line), never inside a caller's.
    if argv is None:
        # Every command: none uses hypothesis, which kio imports where it is installed
        # (about 1.4 s of start in the test venv, for `verify`, `dump-log`, `mirror`).
        keep_test_libraries_out()
        if sys.argv[1:2] and sys.argv[1] in _DAEMON_COMMANDS:
            catch_early_stop()
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(_command_of(words)).parse_args(words)
    except SystemExit as exc:
        # A usage error of `status` is "unknown" to a monitoring plugin (3), never argparse's
        # 2, which status means "down".
        if exc.code == ARGPARSE_USAGE_EXIT and _command_of(words) == "status":
            from replicad.control.health import EXIT_UNREACHABLE

            raise SystemExit(EXIT_UNREACHABLE) from None
        raise
    return int(args.func(args))


def _command_of(words: Sequence[str]) -> str | None:
    return next((word for word in words if not word.startswith("-")), None)


if __name__ == "__main__":
    sys.exit(main())
