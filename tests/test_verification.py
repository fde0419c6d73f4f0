"""Code verification: a static check refuses bypass attempts and lets ordinary analysis through.

The corpus is what an attacker scripting the model would try first. Each entry is refused, or
listed in OUT_OF_REACH with the reason a static check cannot see it (the sandbox's job).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from helpers import make_project

from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import DEFAULT_BLOCKED_FUNCTIONS
from taskweaver_lite.safety.verification import CodeVerifier
from taskweaver_lite.session.assembly import open_session
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

pytestmark = pytest.mark.kernel

BYPASSES: Mapping[str, str] = {
    "plain import": "import os\nos.listdir('/')",
    "import as": "import subprocess as sp\nsp.run(['id'])",
    "from import": "from os import system\nsystem('id')",
    "from import renamed": "from os import system as s\ns('id')",
    "dotted import": "import os.path\nprint(os.path.expanduser('~'))",
    "relative import": "from . import secrets",
    "__import__ call": "__import__('os').system('id')",
    "__import__ computed": "m = 'o' + 's'\n__import__(m)",
    "importlib": "import importlib\nimportlib.import_module('os')",
    "import_module from an allowed module's attribute": "pd.io.common.importlib.import_module('os')",
    "builtins module": "import builtins\nbuiltins.eval('1')",
    "eval": "eval('1 + 1')",
    "exec": "exec('x = 1')",
    "compile": "code = compile('1', 'x', 'eval')",
    "alias of eval": "f = eval\nf('1')",
    "eval passed as an argument": "list(map(eval, ['1']))",
    "eval as a default argument": "def g(f=eval):\n    return f('1')",
    "eval as a decorator": "@eval\ndef g():\n    pass",
    "getattr with a blocked name": "import pandas as pd\ngetattr(pd.io.common.os, 'system')('id')",
    "getattr on builtins": "getattr(print, '__self__')",
    "globals lookup": "globals()['__builtins__']['eval']('1')",
    "__builtins__ subscript": "__builtins__['exec']('x = 1')",
    "__subclasses__ escape": "().__class__.__base__.__subclasses__()",
    "__mro__ escape": "[].__class__.__mro__[1].__subclasses__()",
    "function globals": "(lambda: 0).__globals__['__builtins__']",
    "frame walk": "import sys\nsys._getframe().f_back.f_globals",
    "generator frame": "g = (x for x in [1])\ng.gi_frame.f_globals",
    "os through pandas": "import pandas as pd\npd.io.common.os.system('id')",
    "format string attributes": "'{0.__class__.__mro__}'.format(1)",
    "f-string attributes": "x = 1\nprint(f'{x.__class__.__mro__}')",
    "shell line": "!cat ~/.ssh/id_rsa",
    "shell assignment": "files = !ls ~",
    "line magic": "%system id",
    "cell magic": "%%bash\ncat /etc/shadow",
    "get_ipython": "get_ipython().system('id')",
    "open": "open('/etc/shadow').read()",
    "io.open": "import io\nio.open('/etc/shadow').read()",
    "setattr escape": "setattr(object, '__class__', int)",
    "operator.attrgetter": "import operator\noperator.attrgetter('__globals__')(len)",
    "vars": "vars()['__builtins__']",
    "breakpoint": "breakpoint()",
    "ctypes": "import ctypes\nctypes.CDLL(None)",
    "pickle": "import pickle\npickle.loads(b'')",
    "a string annotation typing evaluates": "import typing\ndef f(x: \"__import__('os').system('id')\"):\n    pass\ntyping.get_type_hints(f)",
    "an expression pandas evaluates": "import pandas as pd\ndf = pd.DataFrame({'a': [1]})\ndf.query(\"@pd.io.common.os.system('id') == 0\", engine='python')",
    # These once ran with verification on; each is refused by what it reaches, not how it is spelled.
    "once ran: from-import of os out of a package": "from pandas.io.common import os\nos.listdir('/')",
    "once ran: from-import of subprocess out of matplotlib": "from matplotlib import subprocess\nsubprocess.run(['id'])",
    "once ran: a private alias of os": "import random\nrandom._os.mkdir('/tmp/x')",
    "once ran: a private alias of sys": "import collections\ncollections._sys.modules['os'].listdir('/')",
    "once ran: import_optional_dependency": "import pandas as pd\npd.compat._optional.import_optional_dependency('subprocess').run(['id'])",
    "once ran: computed getattr on builtins": "from numpy.core.numeric import builtins\ngetattr(builtins, 'ex' + 'ec')('x = 1')",
    "once ran: computed getattr on a module": "import numpy as np\ngetattr(np, 'o' + 's')",
    "once ran: a bytes-decoded name into exec": "from numpy.core.numeric import builtins as b\ngetattr(b, bytes([101, 120, 101, 99]).decode())('x = 1')",
    # More of the same kinds.
    "getattr with a computed name": "getattr(pd.io.common, 'o' + 's')",
    "getattr passed to reduce": "import functools\nfunctools.reduce(getattr, ['io', 'common', 'os'], pd)",
    "getattr renamed": "g = getattr\ng(pd, 'io')",
    "methodcaller with a computed name": "import operator\noperator.methodcaller('sys' + 'tem', 'id')(pd.io.common.os)",
    "import_optional_dependency renamed": "from pandas.compat._optional import import_optional_dependency as load\nload('os')",
    "import_optional_dependency passed": "import pandas as pd\nf = pd.compat._optional.import_optional_dependency\nf('os')",
    "tarfile through pandas": "import pandas as pd\npd.io.common.tarfile.open('x.tar', 'w')",
    "a private alias of subprocess": "import pandas as pd\npd.io.common._subprocess.run(['id'])",
    "from-import of a private alias": "from random import _os\n_os.system('id')",
    "getattr with a constant risky module": "import numpy as np\ngetattr(np.lib.npyio, 'pickle').loads(b'')",
    "a query string built at run time": "import pandas as pd\ndf = pd.DataFrame()\nq = '@pd.io.' + 'common.os.getcwd()'\ndf.query(q, engine='python')",
    "exec reached with a computed string": "import pandas as pd\npd.io.common.__builtins__['exec'](bytes([120, 61, 49]).decode())",
    "gc reaches every object": "import pandas as pd\npd.core.common.gc.get_objects()",
    "__getattr__ of a module": "import pandas as pd\npd.io.common.__getattribute__('os')",
}

# Out of reach of a static check, on purpose; what stops each instead.
OUT_OF_REACH: Mapping[str, str] = {
    "an object leading elsewhere with no risky name on the way": "import pandas as pd\npd.io.common.get_handle('/etc/shadow', 'r')",  # paths: the sandbox
    "an allowed library reading any path": "import pandas as pd\npd.read_csv('/etc/shadow')",  # paths: the sandbox
    "an allowed library's unsafe loader": "import pandas as pd\npd.read_pickle('payload.pkl')",  # code in data: the sandbox
}

ORDINARY_CELLS: Mapping[str, str] = {
    "analysis": (
        "import pandas as pd\nimport numpy as np\ndf = pd.DataFrame({'region': ['a', 'b'], 'sales': [1.5, 2.0]})\n"
        "top = df.groupby('region')['sales'].sum().sort_values(ascending=False)\nprint(top.head())\ntop"
    ),
    "plot": "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2], [3, 4])\nplt.savefig('p.png')\nplt.show()",
    "operators that look like magics": "x = 10 % 3\ny = x != 2\nprint(f'{x!r} {y}', '%d%%' % 5)",
    "type names": "import pandas as pd\nprint(type(pd.DataFrame()).__name__, len([1, 2]))",
    "a syntax error is the kernel's to report": "print('unclosed'",
    "strings that mention rules": "note = 'do not eval or exec here; !rm is shell'\nprint(note)",
    "a query on columns": "import pandas as pd\ndf = pd.DataFrame({'units': [1, 5]})\nprint(df.query('units > 3 and units < 9'))",
    "attributes named like harmless modules": "import pandas as pd\ns = pd.Series([1])\nprint(s.copy().array, pd.api.types.is_numeric_dtype(s))",
    "getattr and hasattr with written-out names": "import pandas as pd\nprint(getattr(pd, 'DataFrame'), hasattr(pd, 'Series'))",
    "hasattr with a computed name": "import pandas as pd\ncol = 'a'\nprint(hasattr(pd.DataFrame({'a': [1]}), col))",
    "time and datetime modules": "import time, datetime\nprint(time.time(), datetime.datetime.now().date())",
}


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(BYPASSES))
def test_each_bypass_attempt_is_refused(name: str) -> None:
    assert CodeVerifier().check(BYPASSES[name]), f"the bypass {name!r} passed verification"


@pytest.mark.unit
@pytest.mark.parametrize("name", DEFAULT_BLOCKED_FUNCTIONS)
def test_each_blocked_function_is_refused_called_by_name_through_a_module_or_renamed(name: str) -> None:
    # The corpus above calls only some of them; every one of the program's blocked functions is checked here.
    for code, said in ((f"{name}('x')", f"`{name}`"), (f"import pandas as pd\npd.{name}('x')", f"`.{name}`"), (f"f = {name}", f"`{name}`")):
        rules = [v.rule for v in CodeVerifier().check(code)]
        assert any(said in rule for rule in rules), f"{code!r} passed verification (rules broken: {rules})"


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(OUT_OF_REACH))
def test_what_is_out_of_reach_is_documented_and_really_passes(name: str) -> None:
    # Listed here so the README's list stays honest: if the check learns to catch one, move it up.
    assert not CodeVerifier().check(OUT_OF_REACH[name]), f"{name!r} is now refused: move it to BYPASSES"


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(ORDINARY_CELLS))
def test_ordinary_analysis_passes(name: str) -> None:
    assert CodeVerifier().check(ORDINARY_CELLS[name]) == [], f"an ordinary cell ({name}) was refused"


@pytest.mark.unit
def test_a_refusal_names_the_rule_and_the_line() -> None:
    found = CodeVerifier().check("import pandas as pd\nx = 1\nimport socket")
    assert [v.line for v in found] == [3] and "socket" in found[0].rule and "allowed modules: pandas" in found[0].rule


@pytest.mark.unit
def test_an_empty_allowed_list_means_no_imports_and_none_means_any() -> None:
    assert CodeVerifier(allowed_modules=()).check("import math")
    assert CodeVerifier(allowed_modules=None).check("import os") == []
    assert CodeVerifier(allowed_modules=None, blocked_functions=()).check("eval('1')") == []


def test_a_refused_cell_does_not_run_and_the_code_generator_revises_with_the_rule(tmp_path: Path, server: ScriptedServer) -> None:
    marker = tmp_path / "ran.txt"
    server.enqueue("planner", planner_reply("Count the files in the working folder."), planner_reply("Done.", send_to="User"))
    server.enqueue(
        "code_generator",
        code_reply(f"import os\nopen({str(marker)!r}, 'w').write('x')\nprint(len(os.listdir('.')))"),
        code_reply("import pandas as pd\nprint('counted', 0)"),
    )
    project = make_project(tmp_path, server.url, code_interpreter={"code_verification_on": True})
    with open_session(load_config(project)) as session:
        rnd = session.ask("How many files are there?")
    assert not marker.exists(), "a cell that broke the rules ran anyway"
    assert rnd.state == "finished"
    revision = [r.messages for r in server.requests if r.role == "code_generator"][1]
    feedback = "\n".join(m["content"] for m in revision[1:])
    assert "was not run" in feedback and "line 1: importing `os` is not allowed" in feedback, "the CodeGenerator must get the rule and its line"
    assert "`open` is a blocked function" in feedback


def test_after_the_last_refusal_the_planner_is_told(tmp_path: Path, server: ScriptedServer) -> None:
    server.enqueue("planner", planner_reply("List the home folder."), planner_reply("That is not allowed here.", send_to="User"))
    server.enqueue("code_generator", *[code_reply("import os\nprint(os.listdir('/root'))") for _ in range(2)])
    project = make_project(tmp_path, server.url, code_interpreter={"code_verification_on": True, "max_retry_count": 1})
    with open_session(load_config(project)) as session:
        session.ask("What is in the home folder?")
    report = [r.messages for r in server.requests if r.role == "planner"][1][-1]["content"]
    assert "not run" in report and "verification rules" in report and "importing `os`" in report
