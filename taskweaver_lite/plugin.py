"""What a plugin file imports: `from taskweaver_lite.plugin import Plugin, register_plugin`.

Inside the kernel this name (and TaskWeaver's `taskweaver.plugin`) resolves to the in-kernel module
`kernel/plugin_runtime.py` itself; this module re-exports it for editors, type checkers and tests.
"""

from __future__ import annotations

from taskweaver_lite.kernel.plugin_runtime import Plugin, PluginContext, register_plugin, test_plugin

__all__ = ["Plugin", "PluginContext", "register_plugin", "test_plugin"]
