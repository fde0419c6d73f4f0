"""A session's life: the turn loop (`session.Session`), opening, resuming and deleting one (`assembly`), the
project opened once (`workspace.Workspace`), `/undo` (`undo`), which model each part calls (`model_choice`), and
export as a notebook or Markdown (`export`)."""
