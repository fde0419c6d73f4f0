"""The sandboxed gateway's rules that need no kernel: which folder a start request names, what environment a kernel gets, when the gateway refuses to start."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.kernel.gateway.launch import check_can_start, gateway_arguments, is_loopback
from taskweaver_lite.kernel.gateway.provisioner import KernelRefused, kernel_environment, kernelspec, session_name

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("given", ["..", ".", "../alice", "a/b", "/etc", "x" * 101, "-rf", "a\nb"])
def test_a_session_id_that_is_not_a_plain_name_is_refused(given: str) -> None:
    with pytest.raises(KernelRefused) as refused:
        session_name({"KERNEL_TASKWEAVER_SESSION": given}, kernel_id="k1")
    assert refused.value.status_code == 403 and "KERNEL_TASKWEAVER_SESSION" in str(refused.value.log_message)


def test_a_session_id_names_the_folder_and_without_one_the_kernel_id_does() -> None:
    assert session_name({"KERNEL_TASKWEAVER_SESSION": "20261128-101500-ab12cd"}, kernel_id="k1") == "20261128-101500-ab12cd"
    assert session_name({}, kernel_id="k1") == "k1"


def test_a_kernel_gets_the_requests_kernel_variables_and_nothing_secret_of_the_gateways() -> None:
    gateway = {
        "PATH": "/usr/bin", "LANG": "C.UTF-8", "KG_AUTH_TOKEN": "t0ken", "DATABASE_URL": "postgresql://u:p@h/db", "HOME": "/root",
        "KERNEL_USERNAME": "ana", "KERNEL_TASKWEAVER_SESSION": "s1", "KERNEL_API_KEY": "k", "MY_SETTING": "1",
    }  # fmt: skip
    kept = kernel_environment(gateway, allowed=["MY_SETTING"])
    assert {"PATH", "LANG", "KERNEL_USERNAME", "KERNEL_TASKWEAVER_SESSION", "MY_SETTING"} <= set(kept)
    assert not {"KG_AUTH_TOKEN", "DATABASE_URL", "HOME", "KERNEL_API_KEY"} & set(kept)


def test_the_gateway_will_not_listen_beyond_loopback_without_a_token(tmp_path: Path) -> None:
    config = load_config(tmp_path)
    with pytest.raises(ConfigError, match="KG_AUTH_TOKEN"):
        check_can_start(config, ip="0.0.0.0", environ={})
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and not is_loopback("10.0.0.5")


def test_a_gateway_without_the_sandbox_says_so_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "taskweaver_config.yaml").write_text("execution: {sandbox: none}\n", encoding="utf-8")
    said = check_can_start(load_config(tmp_path), ip="127.0.0.1", environ={"KG_AUTH_TOKEN": "t"})
    assert len(said) == 1 and "unsandboxed" in said[0] and "\n" not in said[0]


def test_a_gateway_on_loopback_without_a_token_says_so_in_one_line_naming_the_variable(tmp_path: Path) -> None:
    said = check_can_start(load_config(tmp_path), ip="127.0.0.1", environ={})
    assert len(said) == 1 and "KG_AUTH_TOKEN" in said[0] and "\n" not in said[0]
    assert check_can_start(load_config(tmp_path), ip="127.0.0.1", environ={"KG_AUTH_TOKEN": "t"}) == ()


def test_only_our_kernelspec_starts_idle_kernels_are_culled_and_the_token_is_not_an_argument(tmp_path: Path) -> None:
    config = load_config(tmp_path)
    args = gateway_arguments(config, root=tmp_path / "gateway", ip="127.0.0.1", port=8888)
    assert "--KernelGatewayApp.force_kernel_name=taskweaver-lite" in args and "--KernelSpecManager.allowed_kernelspecs=taskweaver-lite" in args
    assert f"--MappingKernelManager.cull_idle_timeout={config.gateway.cull_idle_timeout}" in args and config.gateway.cull_idle_timeout > 0
    assert not any("token" in arg.lower() for arg in args)
    assert "--SandboxPersonality.list_kernels=False" in args and not any("list_kernels=True" in arg for arg in args)
    spec = kernelspec(project_dir=tmp_path, root=tmp_path / "gateway")
    assert spec["metadata"]["kernel_provisioner"]["provisioner_name"] == "taskweaver-lite-sandbox" and spec["interrupt_mode"] == "message"
