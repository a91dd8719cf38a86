"""Which S3-compatible server the tests use: one given by the environment, else a moto server process of our own.

With neither available, S3 tests fail under CI (a broken setup) and skip elsewhere, saying why.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from devtools.s3_server import MotoS3Server, S3ServerError, moto_server_available
from keyload.storage.object_store import S3ObjectStore

from .support import unavailable_in_ci

ENDPOINT_ENV = "KEYLOAD_S3_ENDPOINT"


@dataclass(frozen=True)
class S3Endpoint:
    url: str
    client_options: dict[str, Any] = field(default_factory=dict)  # moto takes any credentials; a given server, env's

    def fresh_store(self, prefix: str = "") -> S3ObjectStore:
        """A store in a new bucket, so tests never see each other's objects."""
        bucket = f"keyload-test-{uuid.uuid4().hex[:16]}"
        return S3ObjectStore(bucket, prefix, endpoint_url=self.url, **self.client_options)


@contextmanager
def s3_server(workdir: Path) -> Iterator[S3Endpoint]:
    given = os.environ.get(ENDPOINT_ENV)
    if given:
        yield S3Endpoint(given, {"region_name": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")})
        return
    problem = moto_server_available()
    if problem is not None:
        raise S3ServerError(f"{ENDPOINT_ENV} is not set; {problem}")
    with MotoS3Server(workdir) as server:
        yield S3Endpoint(
            server.endpoint,
            {"region_name": "us-east-1", "aws_access_key_id": "keyload", "aws_secret_access_key": "keyload"},
        )


def unavailable(reason: str) -> NoReturn:
    """Fail under CI, where a missing S3 server is a broken setup; skip elsewhere."""
    unavailable_in_ci("S3 server", reason)
