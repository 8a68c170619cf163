"""A child's JVM in a test or drill compiles with C1 only, on top of the options it was given."""

from spark_jobs.session import SHORT_RUN_JAVA_OPTIONS
from testkit.faults import DRIVER_JAVA_OPTIONS, short_lived


def test_the_option_is_added_to_a_copy_and_given_options_are_kept():
    env = {"A": "1", DRIVER_JAVA_OPTIONS: "-Dx=1"}
    child = short_lived(env)
    assert child[DRIVER_JAVA_OPTIONS] == f"-Dx=1 {SHORT_RUN_JAVA_OPTIONS}"
    assert child["A"] == "1" and env[DRIVER_JAVA_OPTIONS] == "-Dx=1"  # the caller's env untouched


def test_an_env_without_options_gets_only_the_option_and_twice_is_once():
    child = short_lived({})
    assert child == {DRIVER_JAVA_OPTIONS: SHORT_RUN_JAVA_OPTIONS}
    assert short_lived(child) == child
