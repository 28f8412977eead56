"""One spelling of Kafka client options for both clients.

Users write client options once, in Kafka's own dotted names (``security.protocol``,
``sasl.mechanism``, ``ssl.ca.location``: the names of librdkafka, of the Java client and of
Flink's and Bytewax's Kafka connectors) or in kafka-python's (``security_protocol``,
``sasl_mechanism``, ``ssl_cafile``). :func:`for_client` turns them into the names of the
client a connector builds, so a job's security settings reach either client. An option
that has no counterpart in the other client is an error that names it, never dropped.

Pure: no client library is imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rayflow.errors import ConfigError

CLIENTS = ("confluent", "kafka-python")


def _int(v: Any) -> Any:
    return int(v) if isinstance(v, str) and v.strip().lstrip("-").isdigit() else v


def _none_if_none(v: Any) -> Any:
    return None if isinstance(v, str) and v.lower() == "none" else v


def _none_to_str(v: Any) -> Any:
    return "none" if v is None else v


def _hostname_check_to_kp(v: Any) -> Any:
    # librdkafka: ssl.endpoint.identification.algorithm = "https" | "none"
    if isinstance(v, str) and v.lower() in ("https", "none"):
        return v.lower() == "https"
    raise ConfigError(f"Kafka option ssl.endpoint.identification.algorithm={v!r}: use "
                      f"'https' or 'none'")


def _hostname_check_to_rd(v: Any) -> Any:
    if isinstance(v, bool):
        return "https" if v else "none"
    raise ConfigError(f"Kafka option ssl_check_hostname={v!r}: use true or false")


# (Kafka/librdkafka name, kafka-python name, value for kafka-python, value for librdkafka)
_Conv = Callable[[Any], Any] | None
_PAIRS: list[tuple[str, str, _Conv, _Conv]] = [
    ("client.id", "client_id", None, None),
    ("security.protocol", "security_protocol", None, None),
    ("sasl.mechanism", "sasl_mechanism", None, None),
    ("sasl.username", "sasl_plain_username", None, None),
    ("sasl.password", "sasl_plain_password", None, None),
    ("sasl.kerberos.service.name", "sasl_kerberos_service_name", None, None),
    ("ssl.ca.location", "ssl_cafile", None, None),
    ("ssl.certificate.location", "ssl_certfile", None, None),
    ("ssl.key.location", "ssl_keyfile", None, None),
    ("ssl.key.password", "ssl_password", None, None),
    ("ssl.crl.location", "ssl_crlfile", None, None),
    ("ssl.cipher.suites", "ssl_ciphers", None, None),
    ("ssl.endpoint.identification.algorithm", "ssl_check_hostname",
     _hostname_check_to_kp, _hostname_check_to_rd),
    ("request.timeout.ms", "request_timeout_ms", _int, None),
    ("metadata.max.age.ms", "metadata_max_age_ms", _int, None),
    ("connections.max.idle.ms", "connections_max_idle_ms", _int, None),
    ("reconnect.backoff.ms", "reconnect_backoff_ms", _int, None),
    ("reconnect.backoff.max.ms", "reconnect_backoff_max_ms", _int, None),
    ("retry.backoff.ms", "retry_backoff_ms", _int, None),
    ("socket.send.buffer.bytes", "send_buffer_bytes", _int, None),
    ("socket.receive.buffer.bytes", "receive_buffer_bytes", _int, None),
    # producers
    ("acks", "acks", _int, None),
    ("retries", "retries", _int, None),
    ("linger.ms", "linger_ms", _int, None),
    ("batch.size", "batch_size", _int, None),
    ("compression.type", "compression_type", _none_if_none, _none_to_str),
    ("message.max.bytes", "max_request_size", _int, None),
    ("transaction.timeout.ms", "transaction_timeout_ms", _int, None),
    ("max.in.flight.requests.per.connection", "max_in_flight_requests_per_connection",
     _int, None),
    # consumers
    ("fetch.min.bytes", "fetch_min_bytes", _int, None),
    ("fetch.wait.max.ms", "fetch_max_wait_ms", _int, None),
    ("fetch.max.bytes", "fetch_max_bytes", _int, None),
    ("max.partition.fetch.bytes", "max_partition_fetch_bytes", _int, None),
    ("session.timeout.ms", "session_timeout_ms", _int, None),
    ("heartbeat.interval.ms", "heartbeat_interval_ms", _int, None),
    ("isolation.level", "isolation_level", None, None),
    ("auto.offset.reset", "auto_offset_reset", None, None),
    ("check.crcs", "check_crcs", None, None),
]
_ALIASES = {"sasl.mechanisms": "sasl.mechanism"}  # librdkafka takes both
_TO_KP = {rd: (kp, conv) for rd, kp, conv, _ in _PAIRS}
_TO_RD = {kp: (rd, conv) for rd, kp, _, conv in _PAIRS}


def _spelling(name: str) -> str:
    """``dotted`` (Kafka's names), ``underscored`` (kafka-python's) or ``word`` (both)."""
    if "." in name:
        return "dotted"
    return "underscored" if "_" in name else "word"


def for_client(client: str, options: Mapping[str, Any], where: str = "Kafka options"
               ) -> dict[str, Any]:
    """``options``, in either spelling, in the names of ``client`` (``confluent`` or
    ``kafka-python``).

    A name already in the client's spelling, or a one-word name (``acks``), passes as it
    is, and the client itself rejects one it does not know. A name in the other client's
    spelling is translated when it has a counterpart and is an error when it has none.

    Raises:
        ConfigError: an unknown client, an option with no counterpart in ``client``, or one
            option given in both spellings with different values. The message names
            ``where`` the options came from.
    """
    if client not in CLIENTS:
        raise ConfigError(f"Kafka client {client!r}: use 'confluent' or 'kafka-python'")
    out: dict[str, Any] = {}
    given: dict[str, str] = {}  # the target name -> the name the user wrote
    for name, value in options.items():
        name = _ALIASES.get(name, name)
        kind = _spelling(name)
        target, conv = name, None
        if client == "kafka-python" and kind == "dotted":
            if name not in _TO_KP:
                raise ConfigError(
                    f"{where}: option {name!r} has no kafka-python counterpart that rayflow "
                    f"knows; use client='confluent', or write it in kafka-python's name "
                    f"(the names rayflow translates: docs/streams.md, 'Kafka clients and options')")
            target, conv = _TO_KP[name]
        elif client == "confluent" and kind == "underscored":
            if name not in _TO_RD:
                raise ConfigError(
                    f"{where}: option {name!r} is kafka-python's and has no librdkafka "
                    f"counterpart that rayflow knows; write it in librdkafka's dotted name "
                    f"(the names rayflow translates: docs/streams.md, 'Kafka clients and options')")
            target, conv = _TO_RD[name]
        elif kind == "word" and client == "kafka-python" and name in _TO_KP:
            conv = _TO_KP[name][1]
        value = conv(value) if conv is not None else value
        if target in out and out[target] != value:
            raise ConfigError(f"{where}: {given[target]!r}={out[target]!r} and {name!r}="
                              f"{value!r} set the same option to different values")
        out[target], given[target] = value, name
    return out
