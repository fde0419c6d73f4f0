"""What a session knows beyond the conversation: the project's documents and the experience of earlier sessions.

`passages` reads a document into passages with their lines; `doc_index` keeps them in an SQLite FTS5
index beside the store and searches it by BM25; `tips` and `experience` hold the tips distilled from
sessions (`distil`) and handcrafted ones, and pick the few that fit a request; `fts` has what both
searches share.
"""
