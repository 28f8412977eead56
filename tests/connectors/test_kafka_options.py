"""One spelling of Kafka client options for both clients (pure: no broker, no client)."""

import pytest

from rayflow.connectors.kafka.options import for_client
from rayflow.errors import ConfigError

SASL_DOTTED = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
               "sasl.username": "u", "sasl.password": "p", "ssl.ca.location": "/ca.pem",
               "ssl.certificate.location": "/c.pem", "ssl.key.location": "/k.pem",
               "client.id": "me"}
SASL_KP = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
           "sasl_plain_username": "u", "sasl_plain_password": "p", "ssl_cafile": "/ca.pem",
           "ssl_certfile": "/c.pem", "ssl_keyfile": "/k.pem", "client_id": "me"}


def test_security_options_translate_both_ways_and_pass_in_their_own_spelling():
    assert for_client("kafka-python", SASL_DOTTED) == SASL_KP
    assert for_client("confluent", SASL_KP) == SASL_DOTTED
    assert for_client("confluent", SASL_DOTTED) == SASL_DOTTED
    assert for_client("kafka-python", SASL_KP) == SASL_KP


def test_values_follow_the_client():
    # librdkafka takes strings; kafka-python wants ints, bools and None
    assert for_client("kafka-python", {"linger.ms": "7", "acks": "1", "fetch.min.bytes": 9,
                                       "compression.type": "none",
                                       "ssl.endpoint.identification.algorithm": "https"}) == \
        {"linger_ms": 7, "acks": 1, "fetch_min_bytes": 9, "compression_type": None,
         "ssl_check_hostname": True}
    assert for_client("kafka-python", {"acks": "all"}) == {"acks": "all"}
    assert for_client("confluent", {"ssl_check_hostname": False, "compression_type": None}) \
        == {"ssl.endpoint.identification.algorithm": "none", "compression.type": "none"}
    with pytest.raises(ConfigError, match="ssl.endpoint.identification.algorithm='yes'"):
        for_client("kafka-python", {"ssl.endpoint.identification.algorithm": "yes"})


def test_librdkafkas_plural_alias_is_the_same_option():
    assert for_client("kafka-python", {"sasl.mechanisms": "PLAIN"}) == \
        {"sasl_mechanism": "PLAIN"}
    assert for_client("confluent", {"sasl.mechanisms": "PLAIN"}) == \
        {"sasl.mechanism": "PLAIN"}


def test_an_option_without_a_counterpart_is_an_error_naming_it_and_where():
    with pytest.raises(ConfigError, match="kafka.options: option 'enable.ssl.certificate."
                                          "verification' has no kafka-python counterpart"):
        for_client("kafka-python", {"enable.ssl.certificate.verification": False},
                   "kafka.options")
    with pytest.raises(ConfigError, match="option 'api_version_auto_timeout_ms' is "
                                          "kafka-python's and has no librdkafka"):
        for_client("confluent", {"api_version_auto_timeout_ms": 1})


def test_one_option_in_both_spellings_must_agree():
    assert for_client("confluent", {"security.protocol": "SSL", "security_protocol": "SSL"}) \
        == {"security.protocol": "SSL"}
    with pytest.raises(ConfigError, match="'security.protocol'='SSL' and "
                                          "'security_protocol'='PLAINTEXT' set the same"):
        for_client("confluent", {"security.protocol": "SSL",
                                 "security_protocol": "PLAINTEXT"})


def test_one_word_options_pass_and_an_unknown_client_is_an_error():
    assert for_client("confluent", {"debug": "broker"}) == {"debug": "broker"}
    with pytest.raises(ConfigError, match="Kafka client 'rdkafka'"):
        for_client("rdkafka", {})


@pytest.mark.parametrize("make, message", [
    (lambda: __import__("rayflow").KafkaSource("t", bootstrap="b", start="earliestt"),
     "KafkaSource: start='earliestt' is not one of .*; did you mean 'earliest'"),
    (lambda: __import__("rayflow").KafkaSource("t", bootstrap="b", start="Latest"),
     "KafkaSource: start='Latest' .*did you mean 'latest'"),
    (lambda: __import__("rayflow").KafkaSource("t", bootstrap="b", commit_interval_s=0),
     "KafkaSource: commit_interval_s must be a number > 0"),
    (lambda: __import__("rayflow").KafkaSource("t", bootstrap="b", deserializer="json"),
     "KafkaSource: deserializer must be a function or None, got 'json'"),
    (lambda: __import__("rayflow").KafkaSink("t", bootstrap="b", key=5),
     "KafkaSink\\('t'\\): key must be a function or None, got 5"),
    (lambda: __import__("rayflow").KafkaSink("t", bootstrap="b", serializer="json"),
     "KafkaSink\\('t'\\): serializer must be a function"),
    (lambda: __import__("rayflow").KafkaSink("t", bootstrap="b", max_message_bytes=0),
     "KafkaSink\\('t'\\): max_message_bytes must be a number > 0"),
    (lambda: __import__("rayflow.connectors.images", fromlist=["x"]).KafkaImageSource(
        "t", bootstrap="b", start="lates"),
     "KafkaImageSource: start='lates' .*did you mean 'latest'"),
    (lambda: __import__("rayflow.connectors.images", fromlist=["x"]).KafkaImageSource(
        "t", bootstrap="b", max_pending_bytes=0),
     "KafkaImageSource: max_pending_bytes must be a number > 0"),
])
def test_a_misspelt_start_or_a_bad_setting_is_an_error_where_it_is_made(make, message):
    """Not read as the default (a misspelt ``start`` read the topic from its beginning), nor
    met record by record (a key that is not a function)."""
    with pytest.raises(ValueError, match=message):
        make()
