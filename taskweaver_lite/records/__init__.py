"""The ground floor: records several layers share, as frozen values with explicit JSON shapes and no behaviour
beyond them. A cell's result (`execution`), the conversation (`conversation`), the session's events (`events`,
`event_json`), a model call's usage (`model_calls`), a tip (`tips`), a plugin's spec (`plugin_spec`).
Imports nothing of the package but the errors."""
