"""What the evaluation runs inside the session's kernel: its source is sent there once, as a cell.

Nothing here imports taskweaver_lite: the kernel may be sandboxed or on another machine. The cell
defines one hidden name, `_twl_eval`, so the agent's variable list never shows it. It holds:
TaskWeaver's `chat_history` (message objects with `.content`, the classes `eval_code` names),
`eval_code` run in a namespace of its own, and DSEval's checks (a reference namespace, the names a
request added, changed or deleted, the value a cell showed, and the result comparison).
"""

from __future__ import annotations

import json
import math
import types
from typing import Any


class Message:
    """One message of TaskWeaver's chat history: `.content`, and `.type` as LangChain names it."""

    type = "generic"

    def __init__(self, content: str) -> None:
        self.content = content

    def __repr__(self) -> str:
        return f"{type(self).__name__}(content={self.content!r})"


class SystemMessage(Message):
    """The examiner's instructions."""

    type = "system"


class HumanMessage(Message):
    """What the agent said (to the examiner model, the agent is its human)."""

    type = "human"


class AIMessage(Message):
    """What the examiner said."""

    type = "ai"


_KINDS: dict[str, type[Message]] = {"system": SystemMessage, "human": HumanMessage, "ai": AIMessage}
_IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "open"})


def chat_history(records: list[list[str]]) -> list[Message]:
    """The message objects from [kind, content] pairs."""
    return [_KINDS[kind](content) for kind, content in records]


def run_eval_code(code: str, records_json: str) -> None:
    """Run one scoring point's `eval_code` with `chat_history` and the message classes in scope; it raises when the point is missed."""
    scope: dict[str, Any] = {
        "__name__": "__eval_code__",
        "json": json,
        "chat_history": chat_history(json.loads(records_json)),
        "Message": Message,
        "SystemMessage": SystemMessage,
        "HumanMessage": HumanMessage,
        "AIMessage": AIMessage,
    }
    exec(compile(code, "<eval_code>", "exec"), scope)


def _shell() -> Any:
    from IPython import get_ipython

    return get_ipython()


def user_names() -> dict[str, Any]:
    """The user's variables: no hidden names, no IPython plumbing, no modules."""
    namespace = _shell().user_ns
    return {
        name: value for name, value in namespace.items() if not name.startswith("_") and name not in _IPYTHON_NAMES and not isinstance(value, types.ModuleType)
    }


def fingerprint(value: Any) -> str:
    """A cheap digest of a value's content, to tell a variable changed in place."""
    try:
        if hasattr(value, "to_numpy") and hasattr(value, "shape"):  # pandas objects
            import pandas as pd  # type: ignore[import-untyped]  # no stubs are installed for it

            return f"{type(value).__name__}{value.shape}{int(pd.util.hash_pandas_object(value, index=True).sum())}"
        if hasattr(value, "tobytes") and hasattr(value, "shape"):  # numpy arrays
            return f"ndarray{value.shape}{hash(value.tobytes())}"
        return f"{type(value).__name__}:{hash(repr(value)[:100_000])}"
    except Exception:  # noqa: BLE001 - a value that cannot be digested is compared by identity only
        return f"{type(value).__name__}@{id(value)}"


def snapshot(names: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """Each variable's identity and content digest."""
    return {name: (id(value), fingerprint(value)) for name, value in names.items()}


def diff(before: dict[str, tuple[int, str]], after: dict[str, tuple[int, str]]) -> dict[str, str]:
    """Each name a step added, updated (rebound or changed in place) or deleted."""
    changes = {name: "added" for name in after if name not in before}
    changes.update({name: "updated" for name in after if name in before and after[name] != before[name]})
    changes.update({name: "deleted" for name in before if name not in after})
    return changes


def run_code(code: str, namespace: dict[str, Any]) -> Any:
    """Run `code` in `namespace` the way a notebook cell runs: the value of a last bare expression is returned."""
    import ast

    tree = ast.parse(code)
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body.pop()
    exec(compile(tree, "<reference>", "exec"), namespace)
    return eval(compile(ast.Expression(last.value), "<reference>", "eval"), namespace) if last is not None else None


class Problems:
    """DSEval's side of a session: the reference namespace beside the user's, and each problem's verdict."""

    def __init__(self) -> None:
        self.reference: dict[str, Any] = {}
        self.mark = 0
        self.before: dict[str, tuple[int, str]] = {}

    def context(self, code: str) -> None:
        """A section without a question: it sets the scene in both namespaces."""
        run_code(code, self.reference)
        run_code(code, _shell().user_ns)

    def begin(self) -> None:
        """Note the user's namespace and the cell count before the agent answers a question."""
        self.mark = _shell().execution_count
        self.before = snapshot(user_names())

    def judge(self, code: str, config_json: str, crashed: bool, crash_reason: str) -> None:
        """Print one JSON verdict for the question whose reference solution is `code`."""
        config = json.loads(config_json)
        before_reference = snapshot(_visible(self.reference))
        expected = run_code(code, self.reference)
        reference = {"result": expected, "diff": diff(before_reference, snapshot(_visible(self.reference))), "names": _visible(self.reference)}
        outputs = _shell().user_ns.get("Out", {})
        shown = [outputs[number] for number in sorted(outputs) if number >= self.mark]
        names = user_names()
        submission = {"result": shown[-1] if shown else None, "diff": diff(self.before, snapshot(names)), "names": names}
        checks = [_check(kind, options, reference, submission, crashed, crash_reason) for kind, options in config.items()]
        failed = [reason for ok, reason in checks if not ok]
        print(json.dumps({"correct": not failed, "reasons": failed}))


def _visible(namespace: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in namespace.items() if not name.startswith("_") and not isinstance(value, types.ModuleType)}


def _check(kind: str, options: Any, reference: dict[str, Any], submission: dict[str, Any], crashed: bool, crash_reason: str) -> tuple[bool, str]:
    """One validator of DSEval's: (passed, why not)."""
    if kind == "crash":
        return (not crashed, f"the code crashed: {crash_reason}")
    if kind == "namespace_intact":
        return _intact(options or {}, reference["diff"], submission["diff"])
    if kind == "result":
        if reference["result"] is None:
            return (True, "")
        if submission["result"] is None:
            return (False, "no result was shown (the last cell ended without an expression)")
        return compare(reference["result"], submission["result"], options or {})
    if kind == "namespace_check":
        return _named(options or {}, reference, submission)
    return (False, f"validator {kind} is not supported")


def _intact(options: dict[str, Any], reference: dict[str, str], submission: dict[str, str]) -> tuple[bool, str]:
    """DSEval's default: new names are fine; updates and deletions only where the reference made them too."""
    allowed = {"added": options.get("addition", True), "updated": options.get("update"), "deleted": options.get("deletion")}
    for name, change in submission.items():
        rule = allowed[change]
        if rule is None:
            rule = [ref_name for ref_name, ref_change in reference.items() if ref_change == change]
        if rule is False or (isinstance(rule, list) and name not in rule):
            return (False, f"unexpected variable {change}: {name}")
    return (True, "")


def _named(options: dict[str, Any], reference: dict[str, Any], submission: dict[str, Any]) -> tuple[bool, str]:
    """DSEval's namespace_check: each named variable exists and matches the reference's."""
    for name, compare_options in options.items():
        if name not in submission["names"]:
            return (False, f"variable {name} not found")
        ok, reason = compare(reference["names"].get(name), submission["names"][name], compare_options or {})
        if not ok:
            return (False, f"variable {name}: {reason}")
    return (True, "")


def compare(expected: Any, found: Any, options: Any) -> tuple[bool, str]:
    """DSEval's result comparison, under its matcher's options or a compare_fn.

    Options: ignore_order, ignore_index, ignore_names, ignore_dtypes, value_only, type_only, atol, rtol.
    """
    if isinstance(options, str) or (isinstance(options, dict) and isinstance(options.get("compare_fn"), str)):
        return _custom(options if isinstance(options, str) else options["compare_fn"], expected, found)
    if isinstance(options, dict) and isinstance(options.get("compare_fn"), dict):
        options = options["compare_fn"]
    options = options if isinstance(options, dict) else {}
    try:
        return _match(expected, found, options)
    except Exception as exc:  # noqa: BLE001 - a comparison that fails is a mismatch, said with its reason
        return (False, f"cannot compare: {type(exc).__name__}: {exc}")


def _custom(source: str, expected: Any, found: Any) -> tuple[bool, str]:
    scope: dict[str, Any] = {}
    exec(compile(source, "<compare_fn>", "exec"), scope)
    outcome = scope["compare_fn"](expected, found)
    if isinstance(outcome, dict):
        return (bool(outcome.get("match")), str(outcome.get("reason", "")))
    return (bool(outcome), "compare_fn said no")


def _match(expected: Any, found: Any, options: dict[str, Any]) -> tuple[bool, str]:
    if options.get("type_only"):
        return (type(expected) is type(found), f"expected a {type(expected).__name__}, found a {type(found).__name__}")
    if hasattr(expected, "to_numpy") and hasattr(expected, "shape"):
        return _frames(expected, found, options)
    if hasattr(expected, "shape") and hasattr(expected, "dtype"):
        import numpy as np

        array = np.asarray(found)
        close = array.shape == expected.shape and np.allclose(array, expected, atol=options.get("atol", 1e-8), rtol=options.get("rtol", 1e-5))
        same = bool(close)
        return (same, "the arrays differ")
    if isinstance(expected, (int, float)) and not isinstance(expected, bool) and isinstance(found, (int, float)):
        close = math.isclose(float(expected), float(found), rel_tol=options.get("rtol", 1e-5), abs_tol=options.get("atol", 1e-8))
        return (close, f"expected {expected!r}, found {found!r}")
    if isinstance(expected, (list, tuple)) and isinstance(found, (list, tuple)):
        left, right = (sorted(map(repr, expected)), sorted(map(repr, found))) if options.get("ignore_order") else (expected, found)
        if len(left) != len(right):
            return (False, f"expected {len(left)} items, found {len(right)}")
        for one, other in zip(left, right, strict=True):
            ok, reason = _match(one, other, options)
            if not ok:
                return (False, reason)
        return (True, "")
    return (expected == found, f"expected {expected!r:.200}, found {found!r:.200}")


def _frames(expected: Any, found: Any, options: dict[str, Any]) -> tuple[bool, str]:
    """pandas objects, compared with pandas' own testing functions under DSEval's options."""
    import pandas as pd

    if not hasattr(found, "to_numpy"):
        return (False, f"expected a {type(expected).__name__}, found a {type(found).__name__}")
    if options.get("value_only"):
        expected, found = pd.DataFrame(expected.to_numpy()), pd.DataFrame(pd.DataFrame(found).to_numpy())
    if options.get("ignore_index"):
        expected, found = expected.reset_index(drop=True), found.reset_index(drop=True)
    if options.get("ignore_order") and isinstance(expected, pd.DataFrame) and isinstance(found, pd.DataFrame):
        expected, found = expected.sort_index(axis=1), found.sort_index(axis=1)
    check = pd.testing.assert_frame_equal if isinstance(expected, pd.DataFrame) else pd.testing.assert_series_equal
    try:
        check(
            expected,
            found,
            check_dtype=not options.get("ignore_dtypes"),
            check_names=not options.get("ignore_names"),
            check_like=bool(options.get("ignore_order")) and isinstance(expected, pd.DataFrame),
            atol=options.get("atol", 1e-8),
            rtol=options.get("rtol", 1e-5),
        )
    except AssertionError as exc:
        return (False, " ".join(str(exc).split())[:300])
    return (True, "")


def install_cell(source: str) -> str:
    """The cell that loads this module's `source` into the kernel as the hidden module `_twl_eval`."""
    return (
        "import types as _twl_types\n"
        "_twl_eval = _twl_types.ModuleType('_twl_eval')\n"
        f"exec(compile({source!r}, '<taskweaver_lite.eval.probe>', 'exec'), _twl_eval.__dict__)\n"
        "_twl_eval.problems = _twl_eval.Problems()\n"
        "del _twl_types\n"
    )
