"""Which Kafka broker the tests use: one given by the environment, a Docker container, or a native JVM broker.

With none available, Kafka tests fail under CI (a broken setup) and skip elsewhere, saying why.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from devtools.broker import SINGLE_NODE_SETTINGS, NativeBroker, native_broker_available, wait_serving

from .support import unavailable_in_ci

BOOTSTRAP_ENV = "KEYLOAD_KAFKA_BOOTSTRAP"


class BrokerUnavailable(Exception):
    """No way to get a broker here; the message lists why each way failed."""


def docker_problem() -> str | None:
    """None when testcontainers is installed and a Docker engine answers a ping, else the reason."""
    try:
        from testcontainers.core.docker_client import DockerClient
    except ImportError:
        return "testcontainers is not installed (pip install -e '.[docker]')"
    try:  # testcontainers' own client, so this pings the very engine (DOCKER_HOST, context) it would use
        DockerClient(timeout=2).client.ping()
    except Exception as e:  # the SDK raises several types for "no engine": missing socket, refused, timeout
        return f"no Docker engine answers ({type(e).__name__})"
    return None


@contextmanager
def kafka_broker(workdir: Path) -> Iterator[str]:
    """Yield the bootstrap of the first broker available, in the order the module docstring gives."""
    given = os.environ.get(BOOTSTRAP_ENV)
    if given:
        yield given
        return
    reasons = []
    problem = docker_problem()
    if problem is None:
        from testcontainers.community.kafka import KafkaContainer

        container = KafkaContainer().with_kraft()
        for key, value in SINGLE_NODE_SETTINGS.items():  # the image maps KAFKA_A_B to property a.b
            container.with_env("KAFKA_" + key.upper().replace(".", "_"), value)
        with container:
            bootstrap = container.get_bootstrap_server()
            wait_serving(bootstrap, NativeBroker.START_TIMEOUT_S)  # the container's own wait only reads its log
            yield bootstrap
        return
    reasons.append(problem)
    problem = native_broker_available()
    if problem is None:
        with NativeBroker(workdir) as broker:  # long-lived: C2 pays off (quick_jit is for brokers that restart)
            yield broker.bootstrap
        return
    reasons.append(problem)
    raise BrokerUnavailable(f"{BOOTSTRAP_ENV} is not set; " + "; ".join(reasons))


def unavailable(reason: str) -> NoReturn:
    """Fail under CI, where a missing broker is a broken setup; skip elsewhere."""
    unavailable_in_ci("Kafka broker", reason)
