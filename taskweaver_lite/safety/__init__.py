"""Guards around what the model writes: the static code check (`verification`), a person's confirm (`confirm`),
files a kernel can write handled without following planted links (`workfiles`), and terminal-safe text (`terminal`)."""
