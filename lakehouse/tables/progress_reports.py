"""Spark's streaming progress reports (`StreamingQueryProgress`), parsed in one place: the
service's log lines and metrics, the `stream_progress` rows and a catch-up's run metadata all
read them through `BatchReport`. No Spark import: a report is JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def as_dict(report: Any) -> dict:
    """A report as a dict: a `StreamingQueryProgress` (its `.json`), a JSON string or a dict."""
    if hasattr(report, "json"):
        return json.loads(report.json)
    return _json(report) if isinstance(report, str) else dict(report)


def partition_offsets(offsets: Any) -> dict[int, int]:
    """A source's offsets (`{"topic": {"0": 12}}`, or its JSON) per partition ({} when absent)."""
    offsets = _json(offsets)
    by_partition = next(iter(offsets.values()), None) if isinstance(offsets, dict) else None
    if not isinstance(by_partition, dict):
        return {}
    return {int(p): int(o) for p, o in by_partition.items()}


@dataclass(frozen=True)
class BatchReport:
    raw: dict

    @classmethod
    def of(cls, report: Any) -> BatchReport:
        return cls(as_dict(report))

    @property
    def query_id(self) -> str | None:
        return self.raw.get("id")

    @property
    def batch_id(self) -> int:
        return int(self.raw["batchId"])

    @property
    def stamp(self) -> str:
        """The trigger's timestamp as Spark wrote it (ISO-8601, sorts in time order)."""
        return self.raw.get("timestamp") or ""

    @property
    def timestamp(self) -> datetime | None:
        return _time(self.raw.get("timestamp"))

    @property
    def durations(self) -> dict:
        return self.raw.get("durationMs") or {}

    @property
    def executed(self) -> bool:
        """Whether a batch ran (an idle trigger's report has no `addBatch`)."""
        return "addBatch" in self.durations

    @property
    def trigger_ms(self) -> int:
        return int(self.durations.get("triggerExecution", 0))

    @property
    def input_rows(self) -> int:
        return int(self.raw.get("numInputRows") or 0)

    @property
    def input_rate(self) -> float:
        return float(self.raw.get("inputRowsPerSecond") or 0.0)

    @property
    def processed_rate(self) -> float:
        return float(self.raw.get("processedRowsPerSecond") or 0.0)

    @property
    def source(self) -> dict:
        return (self.raw.get("sources") or [{}])[0]

    @property
    def start_offsets(self) -> Any:
        return self.source.get("startOffset")

    @property
    def end_offsets(self) -> Any:
        return self.source.get("endOffset")

    @property
    def processed(self) -> dict[int, int]:
        """The source's end offsets per partition: where the query is after this batch."""
        return partition_offsets(self.end_offsets)

    @property
    def state_operators(self) -> list[dict]:
        return self.raw.get("stateOperators") or []

    @property
    def watermark(self) -> datetime | None:
        return _time((self.raw.get("eventTime") or {}).get("watermark"))
