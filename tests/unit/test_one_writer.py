"""Every commit to a Delta table goes through the one writer (`spark_jobs.writer`, with its
delta-rs half `lakehouse.tables.local_writes`): nothing else in the product calls Delta's write
or commit APIs, so no writer can commit without the lock check, the tag and the engine choice
it makes. Read from the source (the AST), so a new call site fails here before it runs."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("orchestration", "assets", "spark_jobs", "expectations", "lakehouse")
THE_WRITER = {"spark_jobs/writer.py", "lakehouse/tables/local_writes.py"}

# Spark SQL that commits to a table.
COMMITTING_SQL = re.compile(
    r"^\s*(MERGE\s+INTO|DELETE\s+FROM|INSERT\s+(INTO|OVERWRITE)|UPDATE\s|OPTIMIZE\s|VACUUM\s|"
    r"ALTER\s+TABLE|CREATE\s+(OR\s+REPLACE\s+)?TABLE|REPLACE\s+TABLE|RESTORE\s|DROP\s+TABLE|"
    r"TRUNCATE\s|CONVERT\s+TO\s+DELTA|REORG\s)", re.IGNORECASE)
DELTA_RS_COMMITS = {"write_deltalake", "create_write_transaction", "create_table_with_add_actions"}
DELTA_TABLE_DML = {"merge", "delete", "update", "optimize", "restore", "convertToDelta",
                   "upgradeTableProtocol", "addFeatureSupport"}


def _chain(node: ast.AST) -> list[str]:
    """The attribute names of a call chain, outermost last (`df.write.format(..).save` ->
    [..., 'write', 'format', 'save'])."""
    names = []
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        else:
            if isinstance(node, ast.Name):
                names.append(node.id)
            return names[::-1]


def _leading_text(arg: ast.AST) -> str:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr):
        return "".join(v.value for v in arg.values
                       if isinstance(v, ast.Constant) and isinstance(v.value, str))[:40]
    return ""


def commits_outside_the_writer() -> list[str]:
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in THE_WRITER:
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if not isinstance(node, ast.Call):
                    continue
                chain = _chain(node)
                last = chain[-1] if chain else ""
                where = f"{rel}:{node.lineno}"
                if last in ("save", "saveAsTable", "insertInto") and "write" in chain:
                    found.append(f"{where}: a Spark write ({'.'.join(chain[-4:])})")
                elif last in DELTA_RS_COMMITS:
                    found.append(f"{where}: a delta-rs commit ({last})")
                elif last == "sql" and node.args and COMMITTING_SQL.match(
                        _leading_text(node.args[0])):
                    found.append(f"{where}: committing SQL "
                                 f"({_leading_text(node.args[0]).split()[0]} ...)")
                elif "DeltaTable" in chain and last in DELTA_TABLE_DML:
                    found.append(f"{where}: DeltaTable.{last}")
                elif last == "vacuum" and any(  # delta-rs' vacuum is a dry run by default
                        k.arg == "dry_run" and not (isinstance(k.value, ast.Constant)
                                                    and k.value.value is True)
                        for k in node.keywords):
                    found.append(f"{where}: a vacuum that deletes")
    return found


def test_nothing_but_the_writer_commits_to_a_delta_table():
    assert commits_outside_the_writer() == []


def test_the_scan_sees_each_kind_of_commit(tmp_path, monkeypatch):
    """The scan is not blind: a module with one commit of each kind is flagged for each."""
    room = tmp_path / "spark_jobs"
    room.mkdir()
    (room / "rogue.py").write_text(
        "def f(df, spark, t, path):\n"
        "    df.write.format('delta').mode('append').save(path)\n"
        "    write_deltalake(t, df)\n"
        "    spark.sql(f'MERGE INTO {path} AS t USING s ON x')\n"
        "    spark.sql('  vacuum x')\n"
        "    DeltaTable.forPath(spark, path).delete('x')\n"
        "    t.vacuum(1, dry_run=False)\n"
        "    t.vacuum(1, dry_run=True)\n"  # reads only
        "    spark.sql('SELECT 1')\n")       # reads only
    for package in PRODUCT[:2] + PRODUCT[3:]:
        (tmp_path / package).mkdir()
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    kinds = [line.split(": ", 1)[1].split(" (")[0] for line in commits_outside_the_writer()]
    assert kinds == ["a Spark write", "a delta-rs commit", "committing SQL", "committing SQL",
                     "DeltaTable.delete", "a vacuum that deletes"]
