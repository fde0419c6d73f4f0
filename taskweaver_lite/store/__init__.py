"""Durable sessions: the SQLite database, its schema and migrations, the one-process lock, and export.

`database.SessionStore` records every event as it happens; `schema` holds the versioned schema;
`lock.SessionLock` keeps a session to one process; `export` writes a stored session as a notebook
or Markdown.
"""
