"""The topic fixes the pipeline prints name the configured brokers and the project's own tool,
and say when the brokers need security options the tool must be given."""

import shlex

from lakehouse.config.settings import Settings
from lakehouse.kafka.topic_checks import KAFKA_CONFIGS, alter_topic_command, retention_shortfall

DAY_MS = 24 * 3600 * 1000


def test_the_retention_fix_is_the_projects_tool_with_the_brokers_and_the_config():
    settings = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "b1:9092,b2:9092",
                                  "EVENTS_TOPIC": "events"})
    command = retention_shortfall(settings, DAY_MS).split("Raise it: ", 1)[1]
    assert KAFKA_CONFIGS.is_file() and KAFKA_CONFIGS.stat().st_mode & 0o111
    assert shlex.split(command) == [
        str(KAFKA_CONFIGS), "--bootstrap-server", "b1:9092,b2:9092", "--alter", "--entity-type",
        "topics", "--entity-name", "events", "--add-config", f"retention.ms={8 * DAY_MS}"]


def test_with_security_options_the_fix_says_the_tool_needs_them():
    settings = Settings.from_env({"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                                  "KAFKA_SASL_MECHANISM": "PLAIN"})
    command = alter_topic_command(settings, "events", "retention.ms=1")
    assert command.startswith("(the brokers need sasl.mechanism, security.protocol: write them to "
                              "a client properties file and add --command-config <file>) ")
    assert command.endswith("--entity-name events --add-config retention.ms=1")
