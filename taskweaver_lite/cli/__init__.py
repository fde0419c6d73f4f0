"""The `taskweaver-lite` command line: `main` parses arguments, `chat` runs the chat loop and its
slash commands, `console` renders session events, `demo` plays the bundled offline demo.

Nothing is imported here, so `taskweaver-lite --help` loads only `main`.
"""
