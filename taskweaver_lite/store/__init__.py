"""Durable sessions: one store interface, two backends (SQLite, PostgreSQL), the schemas and migrations.

`interface.Store` is what every store offers; `sql.SqlStore` holds the queries both backends share;
`database.SessionStore` is the project's SQLite file (the default) with `schema` its versions;
`postgres.PostgresStore` keeps everything in PostgreSQL (`store.url`) with `postgres_schema`;
`opening.open_store(config)` picks one. `recorder.StoreRecorder` writes a session's events as they
happen; `users` makes and checks tokens; `lock.SessionLock` keeps an SQLite session to one process.
"""
