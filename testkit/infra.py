"""The server scripts under infra/ (plain files run by the Makefile, not a package), loaded by
path: one way for the tests and the drills to start a broker of their own."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

INFRA = Path(__file__).resolve().parents[1] / "infra"


def infra_module(relative: str) -> ModuleType:
    """`infra/<relative>` (e.g. "kafka/broker.py") as a module named by its stem (the name
    sasl_broker.py looks for its sibling under), loaded once per process."""
    path = INFRA / relative
    name = path.stem
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def broker_module() -> ModuleType:
    """infra/kafka/broker.py: `Broker` (a KRaft broker on given ports), `_answers`."""
    return infra_module("kafka/broker.py")


def sasl_broker_module() -> ModuleType:
    """infra/kafka/sasl_broker.py: `SaslBroker` (SASL/SCRAM-SHA-512 users)."""
    return infra_module("kafka/sasl_broker.py")


def registry_module() -> ModuleType:
    """infra/registry/registry.py: `Registry` (Apicurio on a given port and state folder)."""
    return infra_module("registry/registry.py")
