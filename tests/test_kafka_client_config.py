"""$KEYLOAD_KAFKA_CLIENT_CONFIG: each process's own Kafka settings (its user), read from a file."""

from __future__ import annotations

from pathlib import Path

import pytest

from keyload.storage.datadir import KAFKA_CLIENT_CONFIG_ENV, DataDir, DataDirError, KafkaConfig, kafka_client_config


def configured(monkeypatch: pytest.MonkeyPatch, path: Path, text: str) -> None:
    path.write_text(text)
    monkeypatch.setenv(KAFKA_CLIENT_CONFIG_ENV, str(path))


def test_the_file_is_key_value_lines_with_comment_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    configured(
        monkeypatch, tmp_path / "c", "# the processors' user\n security.protocol = SASL_SSL\n\nsasl.password=a=b#c\n"
    )
    assert kafka_client_config() == {"security.protocol": "SASL_SSL", "sasl.password": "a=b#c"}


def test_no_file_named_is_no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KAFKA_CLIENT_CONFIG_ENV, raising=False)
    assert kafka_client_config() == {}
    monkeypatch.setenv(KAFKA_CLIENT_CONFIG_ENV, "")
    assert kafka_client_config() == {}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("security.protocol\n", "line 1 is not key=value"),
        ("=SASL_SSL\n", "line 1 is not key=value"),
        ("a=1\na=2\n", "line 2: a is given twice"),
        ("bootstrap.servers=elsewhere:9092\n", "line 1: bootstrap.servers is keyload's own setting"),
        ("group.id=mine\n", "line 1: group.id is keyload's own setting"),
        ("# another name\nmetadata.broker.list=elsewhere:9092\n", "line 2: metadata.broker.list is keyload's own"),
    ],
)
def test_a_line_keyload_cannot_take_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, error: str
) -> None:
    configured(monkeypatch, tmp_path / "c", text)
    with pytest.raises(DataDirError, match=error):
        kafka_client_config()


def test_a_missing_file_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KAFKA_CLIENT_CONFIG_ENV, str(tmp_path / "missing"))
    with pytest.raises(DataDirError, match="cannot read"):
        kafka_client_config()


def test_every_kafka_client_of_the_data_directory_gets_the_settings_and_no_repr_shows_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = DataDir.create(tmp_path / "data", 2, kafka=KafkaConfig("127.0.0.1:9", "kl"), object_store=tmp_path / "o")
    configured(monkeypatch, tmp_path / "c", "sasl.username=processor\nsasl.password=hunter2\n")
    settings = DataDir.open(data.root).kafka_settings()
    assert settings.client_config == {"sasl.username": "processor", "sasl.password": "hunter2"}
    assert "hunter2" not in repr(settings)
