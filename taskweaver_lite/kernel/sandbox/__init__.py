"""The sandbox a kernel runs in: bubblewrap's namespaces and mounts, the syscall filter, the limits set
before it starts, the disk watcher, the uid it gets, the paths it hides and the guard inside it."""
