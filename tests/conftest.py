from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.broker import NativeBroker, native_broker_available
from devtools.s3_server import S3ServerError

from .kafka import BrokerUnavailable, kafka_broker, unavailable
from .payloads import Large, large_deployment
from .s3 import S3Endpoint, s3_server
from .s3 import unavailable as s3_unavailable
from .support import Embedded

# Every `keyload run` a test starts serves its HTTP API on a free port (DATA/server.json names it), so
# services of concurrent tests never compete for the default one.
os.environ.setdefault("KEYLOAD_LISTEN", "127.0.0.1:0")


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Embedded]:
    deployment = Embedded(tmp_path / "data")
    yield deployment
    deployment.close()


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One broker for the whole session: starting one costs seconds."""
    try:
        with kafka_broker(tmp_path_factory.mktemp("kafka")) as bootstrap:
            yield bootstrap
    except BrokerUnavailable as e:
        unavailable(str(e))


@pytest.fixture
def native_broker(tmp_path: Path) -> Iterator[NativeBroker]:
    """A broker of the test's own, for tests that stop, restart or kill it."""
    problem = native_broker_available()
    if problem is not None:
        unavailable(problem)
    with NativeBroker(tmp_path / "kafka", quick_jit=True) as broker:
        yield broker


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    """KEYLOAD_S3_ENDPOINT, else one moto server process for the whole session."""
    try:
        with s3_server(tmp_path_factory.mktemp("s3")) as endpoint:
            yield endpoint
    except S3ServerError as e:
        s3_unavailable(str(e))


@pytest.fixture
def large(tmp_path: Path) -> Iterator[Large]:
    """An embedded deployment with a payload gateway and queue `payloads.Q`."""
    with large_deployment(tmp_path / "data") as deployment:
        yield deployment
