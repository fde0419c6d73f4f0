"""Opening the store a config names: the project's SQLite file, or PostgreSQL when `store.url` is set.

    store = open_store(config)            # SessionStore (SQLite) or PostgresStore
    rows = stored_sessions(config)        # read-only listing; none when there is no store yet

The PostgreSQL backend is imported only when `store.url` asks for it: its driver comes with
`pip install 'taskweaver-lite[team]'`, and the base install does not need it.
"""

from __future__ import annotations

from taskweaver_lite.config.settings import Config
from taskweaver_lite.config.store_url import redact
from taskweaver_lite.errors import StoreError
from taskweaver_lite.store.database import SessionStore
from taskweaver_lite.store.interface import SessionEntry, Store


def open_store(config: Config, *, read_only: bool = False) -> Store:
    """The store `config` names, opened (and migrated, unless `read_only`)."""
    url = store_url(config)
    if url is None:
        return SessionStore(config.store_path, read_only=read_only)
    try:
        from taskweaver_lite.store.postgres import PostgresStore
    except ImportError as exc:
        raise StoreError(
            f"store.url names a PostgreSQL store ({redact(url)}) but its driver is not installed ({exc.name}); "
            "install it with pip install 'taskweaver-lite[team]', or unset store.url to use the project's SQLite file"
        ) from None
    return PostgresStore(url, pool_size=config.store.pool_size)


def store_url(config: Config) -> str | None:
    """The PostgreSQL URL of `config`'s store; None for the SQLite file."""
    return config.store.url.get_secret_value() if config.store.url is not None else None


def store_place(config: Config) -> str:
    """Where the store is, for messages: the SQLite file's path, or the URL without its password."""
    url = store_url(config)
    return str(config.store_path) if url is None else redact(url)


def has_store(config: Config) -> bool:
    """Whether there is a store to read yet (a PostgreSQL store always is; the SQLite file once made)."""
    return store_url(config) is not None or config.store_path.exists()


def store_has_users(config: Config) -> bool:
    """Whether `config`'s store has users (then a server needs no --token: each request names its user)."""
    if not has_store(config):
        return False
    store = open_store(config)  # not read-only: an older store is upgraded here, as the server would
    try:
        return store.has_users()
    finally:
        store.close()


def stored_sessions(config: Config, *, owner: str | None = None) -> list[SessionEntry]:
    """The stored sessions (of `owner` only, when given), most recently active first; none when there is no store yet."""
    if not has_store(config):
        return []
    store = open_store(config, read_only=True)
    try:
        return store.list_sessions(owner=owner)
    finally:
        store.close()
