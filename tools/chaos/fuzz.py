"""The long fuzz run over every decoder (the suite runs a bounded, derandomized slice).

    python -m tools.chaos.fuzz                      # every target, 10 minutes each
    python -m tools.chaos.fuzz --target fetch-response --seconds 3600
    python -m tools.chaos.fuzz --engine hypothesis  # without atheris

Engines:
- atheris (coverage-guided libFuzzer, `pip install atheris`; in the `fuzz` extra): each
  target runs in a child process with replicad's modules instrumented, its corpus kept
  in --workdir and seeded from `tools.chaos.fuzz_targets`. An input that crashes the
  child (an escaped exception, or a native abort) ends it; the supervisor here checks
  the input in a forked child, sorts it into a known finding (KNOWN_FINDINGS: reported
  and pinned by an xfail test) or a new one, and starts the target again where the
  corpus left off.
- mutation (always available; `--engine hypothesis` selects it): batches of mutated
  seeds (tools.chaos.mutate), each input in a forked child, until the time is up. The
  hypothesis-driven structured generation runs in the suite (tests/fuzz).

The exit status is 1 when anything new was found; new crashing inputs are kept under
--workdir/<target>/new/.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_WORKDIR = Path(__file__).resolve().parents[2] / ".cache" / "chaos" / "fuzz"
RSS_LIMIT_MB = 4096
HYPOTHESIS_BATCH = 200
RESTART_PAUSE_S = 0.2


def atheris_available() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def _atheris_child(target: str, seconds: int, corpus: Path, artifacts: Path) -> None:
    """Runs in the child process; never returns (libFuzzer exits)."""
    import atheris

    with atheris.instrument_imports(include=["replicad"]):
        from tools.chaos import fuzz_targets
    run = fuzz_targets.TARGETS[target].run
    atheris.Setup(
        [
            sys.argv[0],
            str(corpus),
            f"-max_total_time={seconds}",
            f"-rss_limit_mb={RSS_LIMIT_MB}",
            f"-artifact_prefix={artifacts}/",
            "-print_final_stats=1",
        ],
        run,
    )
    atheris.Fuzz()


def _seed_corpus(target: str, corpus: Path) -> None:
    from tools.chaos.fuzz_targets import seeds

    corpus.mkdir(parents=True, exist_ok=True)
    for seed in seeds(target):
        name = hashlib.sha1(seed).hexdigest()
        (corpus / name).write_bytes(seed)


def _classify(target: str, data: bytes) -> str:
    """'known: ...', 'new: ...' or 'flaky' for a crashing input, rechecked in isolation."""
    from tools.chaos.fuzz_targets import fuzz_inputs

    report = fuzz_inputs(target, [data])
    if report.unexpected:
        outcome = report.unexpected[0]
        return f"new: {outcome.kind} {outcome.detail.strip()[-300:]}"
    if report.known:
        return "known: native allocation abort (kio)"
    return "flaky"


def run_atheris(target: str, seconds: float, workdir: Path) -> FuzzRun:
    """Fuzz one target until `seconds` are used; (known findings, new findings)."""
    corpus = workdir / target / "corpus"
    artifacts = workdir / target / "artifacts"
    new_dir = workdir / target / "new"
    for path in (artifacts, new_dir):
        path.mkdir(parents=True, exist_ok=True)
    _seed_corpus(target, corpus)
    deadline = time.monotonic() + seconds
    known = new = 0
    while (left := int(deadline - time.monotonic())) > 0:
        before = set(artifacts.iterdir())
        subprocess.run(
            [
                sys.executable,
                "-m",
                "tools.chaos.fuzz",
                "--atheris-child",
                target,
                str(left),
                str(corpus),
                str(artifacts),
            ],
            check=False,
        )
        for crash in sorted(set(artifacts.iterdir()) - before):
            verdict = _classify(target, crash.read_bytes())
            print(f"[{target}] {crash.name}: {verdict}", flush=True)
            if verdict.startswith("new"):
                new += 1
                shutil.copy(crash, new_dir / crash.name)
            elif verdict.startswith("known"):
                known += 1
            crash.unlink()
        time.sleep(RESTART_PAUSE_S)
    return FuzzRun(target, "atheris", seconds, None, known, new)


@dataclass(frozen=True, slots=True)
class FuzzRun:
    target: str
    engine: str
    seconds: float
    inputs: int | None  # None: the engine does not say (atheris prints it)
    known: int
    new: int


def run_hypothesis(target: str, seconds: float, seed: int) -> FuzzRun:
    """Mutated seeds in batches, each input in a forked child, until `seconds` are used."""
    from tools.chaos.fuzz_targets import fuzz_inputs, seeds
    from tools.chaos.mutate import mutate

    pool = seeds(target)
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    known = new = runs = 0
    while time.monotonic() < deadline:
        inputs = [mutate(rng.choice(pool), rng, max_mutations=8) for _ in range(HYPOTHESIS_BATCH)]
        report = fuzz_inputs(target, inputs)
        runs += len(inputs)
        known += len(report.known)
        if report.unexpected:
            new += len(report.unexpected)
            print(report.describe(inputs), flush=True)
    print(f"[{target}] {runs} inputs, {known} known findings, {new} new", flush=True)
    return FuzzRun(target, "mutation", seconds, runs, known, new)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--atheris-child"]:
        _, target, seconds, corpus, artifacts = args
        _atheris_child(target, int(seconds), Path(corpus), Path(artifacts))
        return 0
    parser = argparse.ArgumentParser(description="Long fuzz run over replicad's decoders.")
    parser.add_argument("--target", default="all", help="a target name or 'all'")
    parser.add_argument("--seconds", type=float, default=600, help="per target")
    parser.add_argument("--engine", choices=["auto", "atheris", "hypothesis"], default="auto")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    parser.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "big"))
    options = parser.parse_args(args)
    from tools.chaos.fuzz_targets import TARGETS

    engine = options.engine
    if engine == "auto":
        engine = "atheris" if atheris_available() else "hypothesis"
    if engine == "atheris" and not atheris_available():
        parser.error("atheris is not installed (pip install -e '.[fuzz]')")
    targets = list(TARGETS) if options.target == "all" else [options.target]
    print(f"engine {engine}, targets {targets}, {options.seconds:.0f} s each", flush=True)
    total_new = 0
    for target in targets:
        if engine == "atheris":
            run = run_atheris(target, options.seconds, options.workdir)
        else:
            run = run_hypothesis(target, options.seconds, options.seed)
        print(f"== {target}: {run.known} known findings, {run.new} new", flush=True)
        total_new += run.new
    return 1 if total_new else 0


if __name__ == "__main__":
    sys.exit(main())
