"""TaskWeaver's own names (`taskweaver.role.Role`, `Post`, `Memory`, `Conversation`...) for role classes written for
TaskWeaver, registered under TaskWeaver's module names by `role.provide_modules()`."""
