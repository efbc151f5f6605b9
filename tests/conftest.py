"""Fixtures shared by every tier."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from duplex_dev.launch.jaeger import JaegerMissing, JaegerProcess, jaeger_binary
from duplex_dev.launch.redis import RedisServer

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "hack" / "build-image.sh"
# A cold build on two busy cores: the base about 1 minute, the dependencies 1 to 5 (measured); `make test` builds
# before pytest starts, so this matters only when a tier that needs the image runs alone.
BUILD_TIMEOUT = 1800.0

# Property tests check behaviour, not speed: no per-example deadline and no too-slow health check, which on a shared
# 2-core machine fail for reasons that have nothing to do with the code (speed lives in the benchmarks).
settings.register_profile("duplex", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("duplex")


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port. Missing is a failure, never a skip: hack/setup.sh installs it."""
    if not RedisServer.available():
        pytest.fail(
            "redis-server is missing: run hack/setup.sh (it installs Debian's redis-server); "
            "the Redis store is tested against a real server, never skipped",
            pytrace=False,
        )
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def jaeger_path() -> Path:
    """The real Jaeger v2 binary. Missing is a failure, never a skip: hack/build-tools.sh builds it (the test level
    of hack/setup.sh)."""
    try:
        return jaeger_binary()
    except JaegerMissing as err:
        ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
        where = "CI: .ci/run's `make test` must have built it. " if ci else ""
        pytest.fail(f"{where}{err}; traces are tested against a real Jaeger, never skipped", pytrace=False)


@pytest.fixture(scope="module")
def jaeger(jaeger_path: Path) -> Iterator[JaegerProcess]:
    """A real Jaeger v2 all-in-one on free loopback ports."""
    with JaegerProcess(binary=jaeger_path) as process:
        yield process


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The image's name (duplex.IMAGE), built or confirmed current by hack/build-image.sh: one build for the image
    tier and the e2e tier. buildah or mmdebstrap missing is a failure, never a skip: hack/setup.sh installs both."""
    missing = [tool for tool in ("buildah", "mmdebstrap") if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} missing: run hack/setup.sh (it installs the Debian packages buildah and "
            "mmdebstrap); the image tier builds and runs the real image, it is never skipped",
            pytrace=False,
        )
    if os.geteuid() != 0:
        pytest.fail("the image tier needs root (buildah's root storage, mmdebstrap --mode=root)", pytrace=False)
    log = tmp_path_factory.mktemp("image") / "build-image.log"
    with open(log, "w") as err:
        proc = subprocess.run(
            ["bash", str(BUILD)],
            cwd=ROOT,
            env={**os.environ, "PY": sys.executable},
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-40:])
        pytest.fail(f"hack/build-image.sh exited {proc.returncode}; log {log}:\n{tail}", pytrace=False)
    return proc.stdout.split()[-1]
