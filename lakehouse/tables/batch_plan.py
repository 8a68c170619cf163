"""What an ingest micro-batch needs to know from the Delta logs before it writes, read once.

A batch decides from committed state only: whether it already ran (its bronze commit is the
newest stream commit: a re-run after a crash), the watermark it judges lateness by (the one the
previous stream commit left), which bronze version its dedup looks behind, whether its
aggregates commit already landed, and, only when the batch has bad or late records, whether its
quarantine or late-lane append already did. Each table's log is opened at most once per batch
(`BatchPlan.read`, then `appended` on demand), and the batch's steps act on this value: the
stream is the one writer of these tables (under the checkpoint lock), so nothing it reads here
changes under it except by its own writes. No Spark: the planning is tested on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lakehouse.config.settings import Settings
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import BRONZE, STREAMING
from lakehouse.tables.commit_tags import StreamCommit, batch_of, stream_commit_in

# A re-run batch's own commits are among a table's newest few: only the stream appends to these
# tables (under the checkpoint lock), and nothing but maintenance commits in between.
RECENT_COMMITS = 16


def tagged(commits: list[dict], query: str, batch_id: int) -> bool:
    """Whether one of `commits` (commit infos) was made by batch `batch_id` of query `query`."""
    return any(batch_of(c.get("userMetadata")) == (query, batch_id) for c in commits)


@dataclass
class BatchPlan:
    """One batch's reading of the logs. `newest`: bronze's newest stream commit (this batch's
    own when `done`); `bronze_version`: bronze's newest version (-1: no table); `published`:
    `streaming_aggregates` holds this batch's commit."""

    query: str
    batch_id: int
    newest: StreamCommit | None
    bronze_version: int
    published: bool
    _appended: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def read(cls, settings: Settings, query: str, batch_id: int) -> BatchPlan:
        """Bronze's log, opened once; the aggregates' log only for a re-run whose bronze commit
        landed: a batch publishes after its bronze commit, so without that commit it published
        nothing (a new batch, the usual case, never opens it)."""
        bronze = delta_log.open_table(settings, BRONZE.name)
        newest = None if bronze is None else stream_commit_in(bronze)
        plan = cls(query, batch_id, newest, -1 if bronze is None else bronze.version(), False)
        if plan.done is not None:
            plan.published = tagged(delta_log.commits(settings, STREAMING.name, RECENT_COMMITS),
                                    query, batch_id)
        return plan

    @property
    def done(self) -> StreamCommit | None:
        """This batch's bronze commit when it landed (bronze is a batch's last append: all its
        appends are then done), else None."""
        n = self.newest
        return n if n is not None and (n.query, n.batch_id) == (self.query, self.batch_id) else None

    @property
    def previous(self) -> StreamCommit | None:
        """The stream commit before this batch (None for a re-run whose appends all landed, and
        before the stream's first commit)."""
        return None if self.done is not None else self.newest

    @property
    def watermark_ms(self) -> int:
        """The watermark the batch judges lateness by: the one stamped on its own commit for a
        re-run, else the one the previous stream commit left (0 before the first)."""
        if self.done is not None:
            return self.done.watermark_ms
        return self.newest.next_watermark_ms if self.newest is not None else 0

    @property
    def earlier_version(self) -> int:
        """Bronze's version before this batch (its dedup looks there); -1 when no stream commit
        precedes it (nothing earlier counts)."""
        if self.done is not None:
            return self.done.version - 1
        return self.bronze_version if self.newest is not None else -1

    def appended(self, settings: Settings, table: str) -> bool:
        """Whether `table` (quarantine, late lane) holds this batch's append: its log read on
        the first question only (a clean batch never asks)."""
        if table not in self._appended:
            self._appended[table] = tagged(delta_log.commits(settings, table, RECENT_COMMITS),
                                           self.query, self.batch_id)
        return self._appended[table]
