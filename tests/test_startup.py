"""replicad/startup.py: the daemons' signals in one place -- the loop's handlers call the
daemon's stop and reload, say whether a stop came early, and give the signals back."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest

from replicad import startup
from replicad.startup import LoopSignals


async def _until(event: asyncio.Event) -> None:
    await asyncio.wait_for(event.wait(), 30)  # a hang, not a duration, reaches this


async def test_the_loop_stops_and_reloads_on_its_signals_and_gives_them_back():
    # (SIGINT is left out: asyncio's runner has its own handler, which a loop's removal
    # does not restore.)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    stopped: list[signal.Signals] = []
    stop, reload = asyncio.Event(), asyncio.Event()

    def on_stop(signum: signal.Signals) -> None:
        stopped.append(signum)
        stop.set()

    signals = LoopSignals(asyncio.get_running_loop(), on_stop, on_reload=reload.set)
    assert signals.install() is None
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        await _until(reload)
        assert stopped == []
        os.kill(os.getpid(), signal.SIGTERM)
        await _until(stop)
        assert stopped == [signal.SIGTERM]
    finally:
        signals.remove()
    assert {s: signal.getsignal(s) for s in before} == before


async def test_a_stop_before_the_loop_took_over_is_said(monkeypatch):
    monkeypatch.setattr(startup, "_received", int(signal.SIGTERM))
    signals = LoopSignals(asyncio.get_running_loop(), lambda _s: None)
    try:
        assert signals.install() is signal.SIGTERM
    finally:
        signals.remove()


@pytest.mark.parametrize("reload", [False, True])
async def test_without_a_reload_sighup_is_left_alone(reload):
    before = signal.getsignal(signal.SIGHUP)
    signals = LoopSignals(
        asyncio.get_running_loop(), lambda _s: None, on_reload=(lambda: None) if reload else None
    )
    signals.install()
    try:
        assert (signal.getsignal(signal.SIGHUP) is before) is not reload
    finally:
        signals.remove()


async def test_a_signal_its_parent_ignored_is_ignored_again_after_the_loop(monkeypatch):
    # nohup, or a supervisor, starts the daemon with SIGHUP ignored; the loop's own removal
    # would leave it at the default, which kills the process at the next hang-up.
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        signals = LoopSignals(asyncio.get_running_loop(), lambda _s: None, on_reload=lambda: None)
        signals.install()
        assert signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN  # the loop's, meanwhile
        signals.remove()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


# A daemon's first steps, in a process of its own: `replicad run --help` goes through
# main's start (the early-stop catch, the test libraries kept out) and exits in argparse.
_DAEMON_IMPORTS = """
import sys
sys.argv = ["replicad", {command!r}, "--help"]
from replicad import cli
try:
    cli.main()
except SystemExit:
    pass
import kio.static.primitive  # what imports hypothesis.strategies where it can
print("hypothesis" in sys.modules and sys.modules["hypothesis"] is not None)
"""


@pytest.mark.parametrize("command", ["run", "serve", "status", "mirror", "verify", "dump-log"])
def test_a_command_never_imports_the_test_libraries_kio_would(command):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _DAEMON_IMPORTS.format(command=command)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    # Every command keeps it out (the venv has hypothesis: that is what makes this fail if
    # the line is gone; until this commit only the daemons did).
    assert out[-1] == "False"


# What `replicad run` imports before its first fetch, in a process of its own: the daemon's
# modules, as `--check-config` leaves them after loading and checking the configuration.
_RUN_IMPORTS = """
import sys
sys.modules["hypothesis"] = None  # as installed (see the test above)
sys.argv = ["replicad", "run", "--check-config", "--bootstrap-servers", "127.0.0.1:9",
            "--topics", "t", "--data-dir", sys.argv[1]]
from replicad import cli
assert cli.main() == 0
import replicad.follower.fetcher  # the fetch loop: imported with the daemon
print(" ".join(sorted(sys.modules)))
"""

# Nothing a follower without SASL, a mirror, serve, the archive or Spark uses, nor what only
# other parts need (issue 32: imports were about half of a short run's CPU).
NOT_FOR_A_PLAIN_FOLLOWER = (
    "importlib.metadata",  # the crc32c package's version string
    "kio.schema.sasl_handshake",
    "kio.schema.sasl_authenticate",
    "kio.schema.api_versions.v0",  # only for a broker without ApiVersions v3
    "cramjam",  # record codecs: the follower copies batches, it never decodes them
    "replicad.records.records",
    "scramp",
    "replicad.leader",
    "replicad.mirror",
    "replicad.archive",
    "replicad.spark",
    "replicad.groups",
    "pyspark",
)


def test_replicad_run_imports_only_what_a_follower_needs(tmp_path):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _RUN_IMPORTS, str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    assert "replicad.follower.fetcher" in out
    loaded = [
        m
        for m in out
        if m in NOT_FOR_A_PLAIN_FOLLOWER
        or m.startswith(tuple(f"{name}." for name in NOT_FOR_A_PLAIN_FOLLOWER))
    ]
    assert loaded == []


# -- ssl left out of a follower without TLS ---------------------------------------------


def _config(**parts):
    from replicad.config.model import (
        ArchiveConfig,
        Config,
        ControlConfig,
        HostPort,
        MirrorConfig,
        SecurityConfig,
        SecurityProtocol,
        ServeConfig,
        SourceConfig,
    )

    made = {
        "source_tls": {
            "source": SourceConfig(security=SecurityConfig(protocol=SecurityProtocol.SSL))
        },
        # SCRAM over plaintext: scramp imports ssl (its channel binding).
        "source_sasl": {
            "source": SourceConfig(
                security=SecurityConfig(protocol=SecurityProtocol.SASL_PLAINTEXT)
            )
        },
        "serve": {"serve": ServeConfig(listen=HostPort("127.0.0.1", 9092))},
        "mirror": {"mirror": MirrorConfig()},
        "archive": {"archive": ArchiveConfig()},
        "metrics": {"control": ControlConfig(metrics_listen=HostPort("127.0.0.1", 9100))},
    }
    return Config(**{k: v for part in parts for k, v in made[part].items()})


@pytest.mark.parametrize(
    "part", ["source_tls", "source_sasl", "serve", "mirror", "archive", "metrics"]
)
def test_ssl_is_left_out_only_when_nothing_configured_can_use_tls(part, monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "ssl")  # given back as it was after the test
    assert startup.keep_tls_out(_config(**{part: True})) is False
    assert "ssl" not in sys.modules
    assert startup.keep_tls_out(_config()) is True  # plaintext, nothing else
    assert "ssl" in sys.modules and sys.modules["ssl"] is None  # `import ssl` fails at once
    startup.let_tls_in()
    assert "ssl" not in sys.modules  # may be imported again


def test_ssl_is_never_left_out_once_loaded():
    assert startup.keep_tls_out(_config()) is False  # this process has it: kept


def _maps_name_openssl(pid: int) -> bool:
    text = Path(f"/proc/{pid}/maps").read_text()
    return "libssl" in text or "libcrypto" in text


def test_replicad_run_without_tls_loads_no_openssl_and_reloads_a_tls_config(tmp_path, free_port):
    """Issue 32: a plaintext follower without OpenSSL (~4 MiB of RSS at start). The old code
    mapped libssl and libcrypto through asyncio. A reload to a config naming TLS files loads
    them for the config's own check, and the daemon goes on (TLS only after a restart)."""
    from tools.peers.pki import make_test_pki
    from tools.replica import ReplicadProcess, status_json

    sock, data_dir, config = tmp_path / "c.sock", tmp_path / "data", tmp_path / "r.yaml"
    common = (
        f"topics:\n  include: [t]\ndata_dir: {data_dir}\ncontrol:\n  socket: {sock}\n"
        "logging:\n  format: json\n"
    )
    # Nothing listens on free_port: the follower keeps asking for metadata, in plaintext.
    source = f"source:\n  bootstrap_servers: ['127.0.0.1:{free_port}']\n"
    config.write_text(source + common)
    daemon = ReplicadProcess(
        ["run", "-c", str(config)], log_path=tmp_path / "replicad.log", as_installed=True
    )
    with daemon:
        daemon.wait_for(lambda: status_json(sock) is not None, timeout_s=120, what="status")
        assert not _maps_name_openssl(daemon.pid)

        pki = make_test_pki(tmp_path / "pki")
        config.write_text(
            source + f"  security:\n    protocol: ssl\n    tls:\n      ca_file: {pki.ca}\n" + common
        )
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for(
            lambda: daemon.logged("configuration reloaded"),
            timeout_s=120,
            what="the reload",
        )
        said = [json.loads(line) for line in daemon.output().splitlines() if line.startswith("{")]
        assert {"source"} <= {
            k for e in said if "only after a restart" in e["event"] for k in e["keys"]
        }
        daemon.wait_for(lambda: status_json(sock) is not None, timeout_s=120, what="status")
        assert daemon.running
    assert "Traceback" not in daemon.output()
