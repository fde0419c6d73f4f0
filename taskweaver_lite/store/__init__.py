"""Durable sessions: one store interface, two backends (SQLite, PostgreSQL), the schemas and migrations, and export.

`interface.Store` is what every store offers; `sql.SqlStore` holds the queries both backends share;
`database.SessionStore` is the project's SQLite file (the default) with `schema` its versions;
`postgres.PostgresStore` keeps everything in PostgreSQL (`store.url`) with `postgres_schema`;
`opening.open_store(config)` picks one. `recorder.StoreRecorder` writes a session's events as they
happen; `users` makes and checks tokens; `url` hides the store's password; `lock.SessionLock`
keeps an SQLite session to one process; `export` writes a stored session as a notebook or Markdown.
"""
