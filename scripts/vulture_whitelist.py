"""Names `make lint`'s vulture cannot see read, each read by a library or through `vars()`.
(Framework hooks found by their decorator or name are in `[tool.vulture]`, pyproject.toml.)"""

from psycopg2.extensions import connection

from lakehouse.tables.correction_result import CorrectionResult
from orchestration import defs as defs_package
from orchestration.components import PipelineComponent, PipelineScaffolder

# CorrectionResult.as_metadata reads every field through vars(self).
_ = (CorrectionResult.finalized, CorrectionResult.changelog_repaired,
     CorrectionResult.beyond_horizon)
# psycopg2 reads the attribute lakehouse.tables.locks sets on its connection.
_ = connection.autocommit
# Dagster calls a component's hooks and scaffolder, and reads a defs module's __path__.
_ = (PipelineComponent.get_model_cls, PipelineScaffolder.scaffold, defs_package.__path__)
