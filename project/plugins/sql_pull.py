"""The `sql_pull` plugin: rows from an SQLite file as a DataFrame, opened read-only."""

import sqlite3
from pathlib import Path

from taskweaver.plugin import Plugin, register_plugin


@register_plugin
class SqlPull(Plugin):
    """Runs one read-only query; the file must exist (sqlite3 would otherwise create an empty one)."""

    def __call__(self, database: str, query: str, max_rows: int = 100_000):
        import pandas as pd  # imported on first use, so loading the plugin costs the kernel nothing

        path = Path(database).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(f"sql_pull: no SQLite file at {path}; /load it into the working folder first")
        # mode=ro: even a query with side effects cannot write; the URI form needs the path quoted.
        uri = f"{path.as_uri()}?mode=ro"
        with sqlite3.connect(uri, uri=True, timeout=float(self.config.get("timeout_seconds", 30))) as connection:
            cursor = connection.execute(query)
            columns = [c[0] for c in cursor.description or ()]
            rows = cursor.fetchmany(max_rows + 1)
        if len(rows) > max_rows:
            rows = rows[:max_rows]
            self.log("warning", f"the result was cut to the first {max_rows} rows; raise max_rows or aggregate in SQL")
        self.log("info", f"{len(rows)} rows x {len(columns)} columns from {path.name}")
        return pd.DataFrame.from_records(rows, columns=columns)
