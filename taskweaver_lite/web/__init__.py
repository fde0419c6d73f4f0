"""`serve`: the web page and the HTTP API over the library."""
