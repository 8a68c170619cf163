"""Names `make lint`'s vulture cannot see read, each read by a library or through `vars()`.
(Framework hooks found by their decorator or name are in `[tool.vulture]`, pyproject.toml.)"""

from psycopg2.extensions import connection

from lakehouse.tables.correction_result import CorrectionResult

# CorrectionResult.as_metadata reads every field through vars(self).
_ = (CorrectionResult.finalized, CorrectionResult.changelog_repaired,
     CorrectionResult.beyond_horizon)
# psycopg2 reads the attribute lakehouse.tables.locks sets on its connection.
_ = connection.autocommit
